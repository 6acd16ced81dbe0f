"""``specdec-compile import-head``: speculators EAGLE-3 checkpoints (tests/eagle3_data, made by
speculators' own API: scripts/record_eagle3.py) compiled as feature drafts, checked against the
library's own recorded forward, and the layer convention against transformers."""
from __future__ import annotations

import json

import numpy as np
import pytest

from eagle3_models import DATA, TARGETS, cases, target_export
from models import build_hf_model
from specdec_compile import cli
from specdec_compile.runtime import OrtBackend

PL, CL = 16, 64
CASES = cases()


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    """imported(case, target="ort") -> the artifact import-head wrote for a recorded head (built once)."""
    root = tmp_path_factory.mktemp("eagle3")
    made = {}

    def get(case, target="ort"):
        if (case, target) not in made:
            out = root / f"{case}-{target}"
            tlm = target_export(CASES[case]["target"])
            assert cli.main(["import-head", str(DATA / case), "--tlm", str(tlm), "--target", target, "--k", "3",
                             "--prefill-len", str(PL), "--ctx-len", str(CL), "-o", str(out), "--quiet"]) == 0
            made[case, target] = out
        return made[case, target]

    return get


def _target_ids(case) -> np.ndarray:
    from specdec_compile.eagle3.safetensors import read_safetensors
    t = read_safetensors(DATA / case / "model.safetensors")
    vd = CASES[case]["draft_vocab"]
    return np.arange(vd) + (t["d2t"] if "d2t" in t else 0)


def _rows(b: OrtBackend, ids, pos, feats) -> dict:
    """One call of width PL (padded): logits and draft_hidden_states of the given rows."""
    n = len(ids)
    call_ids, call_pos = np.zeros((1, PL), np.int64), np.full((1, PL), -1, np.int64)
    x = np.zeros((1, PL, feats.shape[-1]), np.float32)
    call_ids[0, :n], call_pos[0, :n], x[0, :n] = ids, pos, feats
    out = b.run_outputs(call_ids, call_pos, inputs={"hidden_states": x})
    return {k: v[0, :n] for k, v in out.items()}


def _compare(got_logits, got_h, want_logits, want_h, tids, vt):
    """Our logits over the target vocabulary against speculators' over the draft's: equal on
    the draft's ids (i + d2t[i]), the pad value (probability 0) everywhere else."""
    assert np.max(np.abs(got_logits[..., tids] - want_logits)) <= 1e-5
    assert np.max(np.abs(got_h - want_h)) <= 1e-5
    rest = np.setdiff1d(np.arange(vt), tids)
    if rest.size:
        assert np.all(got_logits[..., rest] == np.float32(-1.0e4))


@pytest.mark.parametrize("case", sorted(CASES))
def test_compiled_draft_equals_the_speculators_forward(imported, case):
    """Step 1 (every row reads fc(target features)) and step 2 (a drafted row reading the head's own
    output of the row before, one position later) of speculators' forward, to 1e-5. The recording's
    positions start at 1, ours at 0: rotary attention depends only on position differences."""
    c, ref = CASES[case], np.load(DATA / case / "reference.npz")
    ids, feats, n = ref["input_ids"], ref["features"], len(ref["input_ids"])
    b = OrtBackend(imported(case))
    H, nh = c["hidden"], feats.shape[1]
    x = np.concatenate([feats, np.zeros((n, H), np.float32)], -1)
    tids = _target_ids(case)
    nxt = np.append(ids[1:], 0)       # speculators' step 2 reads the next token (teacher forcing), 0 at the end
    for t in range(n):                # a DLM call returns the logits of its last row: one prefix per row
        b.reset()
        step1 = _rows(b, ids[:t + 1], np.arange(t + 1), x[:t + 1])
        _compare(step1["logits"][-1], step1["draft_hidden_states"], ref["logits_1"][t], ref["h_1"][:t + 1],
                 tids, c["vocab"])
        own = np.zeros((1, nh + H), np.float32)
        own[0, nh:] = step1["draft_hidden_states"][t]
        out = b.run_outputs(np.array([[nxt[t]]]), np.array([[t + 1]]), inputs={"hidden_states": own[None]})
        _compare(out["logits"][0, -1], out["draft_hidden_states"][0, 0], ref["logits_2"][t], ref["h_2"][t],
                 tids, c["vocab"])
    b.close()


def test_manifest_records_the_checkpoint_and_the_target(imported):
    from specdec_compile.model_io import sha256_file
    out = imported("llama")
    m = json.loads((out / "manifest.json").read_text())
    fd = m["feature_draft"]
    rec = fd["eagle3"]
    assert rec["checkpoint"]["sha256"] == sha256_file(DATA / "llama" / "model.safetensors")
    assert rec["checkpoint"]["path"] == str((DATA / "llama").resolve())
    assert rec["checkpoint"]["verifier"]["name_or_path"] == CASES["llama"]["verifier"]
    tlm = target_export("eagle3_llama")
    assert rec["paired_target"]["sha256"] == sha256_file(tlm) == fd["target"]["sha256"]
    assert rec["aux_hidden_state_layer_ids"] == [1, 2, 4] and fd["target_layers"] == [0, 1, 3]
    assert (fd["width"], fd["target_width"], fd["own_offset"], fd["draft_width"]) == (256, 192, 192, 64)


@pytest.mark.parametrize("case", ["qwen", "llama"])
def test_qaic_artifact_is_written_with_ops_of_device_precedent(imported, case):
    import onnx

    from specdec_compile.artifact.qaic_ops import without_precedent
    out = imported(case, "qaic")
    m = json.loads((out / "manifest.json").read_text())
    assert m["target"] == "qaic" and (out / "compile.sh").is_file() and (out / "specializations.json").is_file()
    assert m["feature_draft"]["eagle3"]["family"] == CASES[case]["family"]
    assert {i["name"] for i in m["interface"]["inputs"]} >= {"input_ids", "position_ids", "hidden_states"}
    assert [u.describe() for u in without_precedent(onnx.load(str(out / "model.onnx")))] == []


@pytest.mark.parametrize("name", sorted(TARGETS))
def test_aux_id_i_is_transformers_hidden_states_i(tmp_path, name):
    """The convention import-head relies on: aux id i = the hidden state entering decoder layer i =
    transformers' output_hidden_states[i] = the output of layer i-1 = our --hidden-states i-1."""
    import torch
    ids = [1, 2, 4] if name == "eagle3_llama" else [2, 3, 4]
    out = tmp_path / "tlm"
    assert cli.main([str(target_export(name)), "--role", "tlm", "--k", "3", "--target", "ort", "--hidden-states",
                     ",".join(str(i - 1) for i in ids), "--prefill-len", str(PL), "--ctx-len", str(CL),
                     "-o", str(out), "--quiet"]) == 0
    model = build_hf_model(TARGETS[name])
    tokens = np.random.default_rng(0).integers(0, 211, size=11)
    last = {}
    layers = model.model.layers
    hook = layers[-1].register_forward_hook(lambda m, a, o: last.setdefault("h", o[0] if isinstance(o, tuple) else o))
    with torch.inference_mode():
        hs = model(input_ids=torch.tensor(tokens)[None], output_hidden_states=True).hidden_states
    hook.remove()
    L = len(layers)
    # id L: vLLM (which makes speculators' training data) takes the last layer's output before the final
    # norm; transformers' hidden_states[L] is after it
    assert not np.allclose(hs[L][0].numpy(), last["h"][0].numpy())
    want = np.concatenate([(hs[i] if i < L else last["h"])[0].numpy() for i in ids], -1)
    b = OrtBackend(out)
    call_ids, pos = np.zeros((1, PL), np.int64), np.full((1, PL), -1, np.int64)
    call_ids[0, :11], pos[0, :11] = tokens, np.arange(11)
    got = b.run_outputs(call_ids, pos)["hidden_states"][0, :11]
    b.close()
    assert np.max(np.abs(got - want)) <= 1e-4 * max(1.0, float(np.abs(want).max()))


def test_a_checkpoint_without_embed_tokens_reads_the_targets_table(tmp_path):
    """speculators leaves embed_tokens out when it is the verifier's: import-head takes the target's
    (the Gather of input_ids in its graph). Same outputs as a checkpoint holding that very table;
    the recorded head's own (random) table gives others."""
    import shutil

    from specdec_compile.eagle3.safetensors import read_safetensors, write_safetensors
    from specdec_compile.eagle3.target import read_target, target_embedding
    table = target_embedding(read_target(target_export("eagle3_llama")))
    assert table.shape == (211, 64)
    outs = {}
    for name in ("without", "with_target_table", "recorded"):
        d = tmp_path / name
        shutil.copytree(DATA / "llama", d)
        t = dict(read_safetensors(d / "model.safetensors"))
        if name == "without":
            del t["embed_tokens.weight"]
        elif name == "with_target_table":
            t["embed_tokens.weight"] = table
        write_safetensors(d / "model.safetensors", t)
        out = tmp_path / f"art-{name}"
        assert cli.main(["import-head", str(d), "--tlm", str(target_export("eagle3_llama")), "--target", "ort",
                         "--k", "3", "--prefill-len", str(PL), "--ctx-len", str(CL), "-o", str(out), "--quiet"]) == 0
        ref = np.load(DATA / "llama" / "reference.npz")
        x = np.concatenate([ref["features"], np.zeros((9, 64), np.float32)], -1)
        b = OrtBackend(out)
        outs[name] = _rows(b, ref["input_ids"], np.arange(9), x)["draft_hidden_states"]
        b.close()
    assert np.array_equal(outs["without"], outs["with_target_table"])
    assert np.abs(outs["without"] - outs["recorded"]).max() > 1e-2


def test_committed_heads_load_in_speculators_and_reproduce_the_recording():
    """Live cross-check against the library, where a Python with speculators 0.9 is named by
    SPECDEC_SPECULATORS_PYTHON (a venv of its own: it needs transformers 5; docs/import-head.md):
    every committed checkpoint loads with Eagle3DraftModel.from_pretrained and its forward equals
    the recording. Skipped elsewhere; the comparisons above need only the recording."""
    import os
    import subprocess
    from pathlib import Path
    py = os.environ.get("SPECDEC_SPECULATORS_PYTHON")
    if not py:
        pytest.skip("SPECDEC_SPECULATORS_PYTHON (a python with speculators 0.9) is not set")
    root = Path(__file__).resolve().parents[2]
    res = subprocess.run([py, "-m", "scripts.record_eagle3", "--check", str(DATA)], cwd=root, capture_output=True,
                         text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"}, timeout=600)
    assert res.returncode == 0, (res.stdout + res.stderr)[-2000:]
    assert res.stdout.count("loaded by speculators") == len(CASES), res.stdout


def test_the_demos_committed_head_loads_in_speculators():
    """With SPECDEC_SPECULATORS_PYTHON: workshop/heads/smollm2-eagle3 loads with speculators'
    from_pretrained (verifier pointed at make demo's local conversion) and drafts. Skipped elsewhere."""
    import os
    import subprocess
    from pathlib import Path
    py = os.environ.get("SPECDEC_SPECULATORS_PYTHON")
    root = Path(__file__).resolve().parents[2]
    verifier = root / "build" / "demo" / "hf" / "tlm"
    if not py or not (verifier / "model.safetensors").is_file():
        pytest.skip("needs SPECDEC_SPECULATORS_PYTHON (speculators 0.9) and make demo's conversion")
    res = subprocess.run([py, "-m", "scripts.record_eagle3", "--load-head", "workshop/heads/smollm2-eagle3",
                          str(verifier)], cwd=root, capture_output=True, text=True,
                         env={**os.environ, "HF_HUB_OFFLINE": "1"}, timeout=600)
    assert res.returncode == 0, (res.stdout + res.stderr)[-2000:]
    assert "loaded by speculators" in res.stdout and res.stdout.rstrip().endswith("ok"), res.stdout


def test_the_logits_spread_is_a_scatter_on_a_cpu_and_a_gather_on_the_device(imported):
    """A draft vocabulary smaller than the target's: the CPU lowerings spread the logits with one
    ScatterElements (a Gather over the target's vocabulary costs about 8x more on ONNX Runtime's CPU
    kernels); the qaic graph keeps the Gather its device has precedent for. Both give the values
    test_compiled_draft_equals_the_speculators_forward checks (the ort artifact is the scatter one)."""
    import onnx
    for target, op in (("ort", "ScatterElements"), ("qaic", "Gather")):
        out = imported("llama", target)
        rec = json.loads((out / "manifest.json").read_text())["feature_draft"]["eagle3"]
        assert rec["draft_ids_spread"] and rec["logits_spread"] == ("scatter" if target == "ort" else "gather")
        g = onnx.load(str(out / "model.onnx"), load_external_data=False).graph
        ops = [n.op_type for n in g.node]
        assert (op == "ScatterElements") == ("ScatterElements" in ops), target
