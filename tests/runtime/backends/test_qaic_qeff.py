"""The Cloud AI 100 backend drives --interface qeff artifacts (contract section 7), both of
QEfficient's interfaces, against the FAKE qaicrt of test_qaic.py with a FAKE QPC built as
QEfficient's programs are. Continuous batching (--full-batch-size): bindings from the artifact's interface record, the cache in full_batch_size rows in every
specialization, a prompt prefilled at batch 1 into the row batch_index names (num_logits_to_keep
[1, 1]: one column of logits), decode calls of every row (batch_index [B, 1]); the names are those
of QEfficient's cloud_infer.py (QAICInferenceSession). The plain interface: every call at
full batch, no batch_index, the prefill keeping one column. The fake device runs model.onnx."""
from __future__ import annotations

import json

import numpy as np
import pytest
from test_qaic import (FLOAT_16_TYPE, FLOAT_TYPE, INP, INT64_I_TYPE, OUT, CL, IDS, PL, backend, write_fake_qpc)

from specdec_compile import cli as compile_cli
from specdec_compile.errors import SpecdecError
from specdec_compile.runtime import OrtBackend, SpecDecoder, TargetOnlyDecoder

FBS, K = 2, 3
PROMPTS = [IDS, [5, 9, 33, 7, 5, 9, 33, 7, 5, 9], [1, 2, 3]]


def write_fake_qeff_qpc(art_dir, drop=()):
    """A FAKE QPC of an --interface qeff artifact: one binding per entry of the manifest's
    interface record (KV float16, as custom_io.yaml asks), one allowed shape set per
    specialization as written (its symbols resolve the dims); ``drop``: binding names left out."""
    m = json.loads((art_dir / "manifest.json").read_text())
    specs = m["qeff"]["specializations"]
    ios = [(io, INP) for io in m["interface"]["inputs"]] + [(io, OUT) for io in m["interface"]["outputs"]]
    ios = [(io, d) for io, d in ios if io["name"] not in drop]

    def dims(io, spec):
        return [int(spec.get(x, x)) if isinstance(x, str) else x for x in io["shape"]]

    def kind(io):
        if io["dtype"] == "int64":
            return INT64_I_TYPE
        return FLOAT_TYPE if io["name"] == "logits" else FLOAT_16_TYPE

    bindings = [{"name": io["name"], "dir": d, "type": kind(io), "dims": dims(io, specs[-1])} for io, d in ios]
    allowed = [[dims(io, spec) for io, _ in ios] for spec in specs]
    (art_dir / "qpc").mkdir(exist_ok=True)
    (art_dir / "qpc" / "programqpc.bin").write_text(json.dumps(
        {"model": str(art_dir / "model.onnx"), "bindings": bindings, "allowed_shapes": allowed}))


@pytest.fixture(scope="module")
def arts(fixture_path, tmp_path_factory):
    root = tmp_path_factory.mktemp("qaic_qeff")
    out = {}
    for name, extra in (("tlm", ["--role", "tlm", "--k", str(K), "--full-batch-size", str(FBS)]),
                        ("tlmq", ["--role", "tlm", "--k", str(K), "--interface", "qeff"]),
                        ("dlmq", ["--role", "dlm", "--interface", "qeff"]),
                        ("dlmcb", ["--role", "dlm", "--full-batch-size", str(FBS)]),
                        ("dlm", ["--role", "dlm"])):
        d = out[name] = root / name
        assert compile_cli.main([str(fixture_path("llama_gqa")), "--target", "qaic", "--prefill-len", str(PL),
                                 "--ctx-len", str(CL), "--batch-size", str(FBS), "-o", str(d), *extra]) == 0
    for name in ("tlm", "tlmq", "dlmq", "dlmcb"):
        write_fake_qeff_qpc(out[name])
    write_fake_qpc(out["dlm"])
    return out


def test_qeff_target_decodes_as_onnx_runtime_one_prompt_and_a_batch(arts):
    ev = []
    tlm, dlm = backend(arts["tlm"], ev, device_ids=[0]), backend(arts["dlm"], ev, device_ids=[1])
    ort_tlm, ort_dlm = OrtBackend(arts["tlm"]), OrtBackend(arts["dlm"])
    for got, ref in ((TargetOnlyDecoder(tlm), TargetOnlyDecoder(ort_tlm)), (SpecDecoder(tlm, dlm), SpecDecoder(ort_tlm, ort_dlm))):
        assert got.generate(IDS, max_new_tokens=20).generated_ids == ref.generate(IDS, max_new_tokens=20).generated_ids
        g = [r.generated_ids for r in got.generate_many(PROMPTS, max_new_tokens=14)]
        w = [r.generated_ids for r in ref.generate_many(PROMPTS, max_new_tokens=14)]
        assert g == w
    assert not any(e[0] == "error" for e in ev)


def test_qeff_calls_are_qefficients_prefill_and_decode(arts):
    ev = []
    tlm = backend(arts["tlm"], ev)
    TargetOnlyDecoder(tlm).generate(IDS, max_new_tokens=6)
    calls = [e[1] for e in ev if e[0] == "setData"]
    prefill = [c for c in calls if c["input_ids"] == [1, PL]]
    decode = [c for c in calls if c["input_ids"] != [1, PL]]
    assert prefill and decode
    for c in prefill:       # a prompt at batch 1 into its cache row; one column of logits
        assert c["batch_index"] == [1, 1] and c["num_logits_to_keep"] == [1, 1] and c["logits"] == [1, 1, 211]
    for c in decode:        # every row; every column of the width kept
        S = c["input_ids"][1]
        assert c["input_ids"] == [FBS, S] and c["batch_index"] == [FBS, 1] and c["num_logits_to_keep"] == [S, 1]
        assert c["logits"] == [FBS, S, 211]
    # the cache stays on the device in full_batch_size rows, uploaded (zeros) only after a reset
    kv = [c["past_key.0"] for c in calls]
    assert all(d in ([0], [FBS, 2, CL, 16]) for d in kv) and kv.count([FBS, 2, CL, 16]) == 1


def test_a_prefill_gives_the_last_valid_column_and_nothing_else(arts):
    tlm = backend(arts["tlm"], [])
    ids = np.array([IDS[:5] + [0] * (PL - 5)])
    pos = np.array([list(range(5)) + [-1] * (PL - 5)])
    got = tlm.run(ids, pos, rows=[1])
    want = OrtBackend(arts["tlm"]).run(ids, pos, rows=[1])
    assert got.shape == want.shape == (1, PL, 211)
    assert np.abs(got[0, 4] - want[0, 4]).max() < 1e-2          # float16 cache on the device
    assert np.isnan(np.delete(got[0], 4, axis=0)).all()           # the columns the device did not give


def test_bad_rows_and_a_qpc_of_the_other_interface(arts, tmp_path):
    import shutil
    ev = []
    tlm = backend(arts["tlm"], ev)
    ids, pos = np.array([IDS[:PL]]), np.arange(PL)[None]
    for rows, needle in (([FBS], "out of range"), ([0, 1], "must be 1 integers")):
        with pytest.raises(SpecdecError, match=needle):
            tlm.run(ids, pos, rows=rows)
    assert not [e for e in ev if e[0] == "setData"]
    d = tmp_path / "t"
    shutil.copytree(arts["tlm"], d)
    write_fake_qeff_qpc(d, drop=("batch_index",))
    with pytest.raises(SpecdecError, match="no batch_index binding"):
        backend(d, [])
    write_fake_qeff_qpc(d, drop=("num_logits_to_keep",))
    with pytest.raises(SpecdecError, match="no num_logits_to_keep binding"):
        backend(d, [])
    d2 = _with_batch_index_binding(arts["dlm"], tmp_path / "dlm")   # a default-interface DLM's QPC
    with pytest.raises(SpecdecError, match="batch_index binding but the artifact was compiled without"):
        backend(d2, [])


def test_cli_backend_qaic_with_a_qeff_target(arts, monkeypatch, capsys):
    import sys

    from test_qaic import fake_aicapi, fake_qaicrt

    from specdec_compile.cli import run as run_cli
    monkeypatch.setitem(sys.modules, "qaicrt", fake_qaicrt([]))
    monkeypatch.setitem(sys.modules, "QAicApi_pb2", fake_aicapi())
    argv = ["--tlm", str(arts["tlm"]), "--dlm", str(arts["dlm"]), "--prompt-ids", ",".join(map(str, IDS)),
            "--prompt-ids", "5,9,33", "--max-new-tokens", "12", "--json", "--full-batch-size", str(FBS)]
    capsys.readouterr()
    assert run_cli.main(argv + ["--backend", "qaic"]) == 0
    got = [r["generated_ids"] for r in json.loads(capsys.readouterr().out)["results"]]
    assert run_cli.main(argv + ["--backend", "ort"]) == 0
    assert [r["generated_ids"] for r in json.loads(capsys.readouterr().out)["results"]] == got


@pytest.mark.parametrize("tlm_name,dlm_name", [("tlmq", "dlm"), ("tlmq", "dlmq"), ("tlm", "dlmcb"), ("tlmq", "dlmcb")])
def test_plain_qeff_target_and_qeff_drafts_decode_as_onnx_runtime(arts, tlm_name, dlm_name):
    """QEfficient's plain TLM (no batch_index), and qeff drafts of either interface: the tokens
    ONNX Runtime gives, one prompt and more prompts than rows."""
    ev = []
    tlm, dlm = backend(arts[tlm_name], ev, device_ids=[0]), backend(arts[dlm_name], ev, device_ids=[1])
    got, ref = SpecDecoder(tlm, dlm), SpecDecoder(OrtBackend(arts[tlm_name]), OrtBackend(arts[dlm_name]))
    assert got.generate(IDS, max_new_tokens=20).generated_ids == ref.generate(IDS, max_new_tokens=20).generated_ids
    g = [r.generated_ids for r in got.generate_many(PROMPTS, max_new_tokens=14)]
    assert g == [r.generated_ids for r in ref.generate_many(PROMPTS, max_new_tokens=14)]
    assert not any(e[0] == "error" for e in ev)


def test_plain_qeff_calls_are_qefficients(arts):
    """The plain TLM: every call at batch FBS, no batch_index buffer; the prefill keeps one column,
    a verification every column of its width; a call holding a verifying row never runs at PL."""
    ev = []
    tlm = backend(arts["tlmq"], ev)
    SpecDecoder(tlm, backend(arts["dlmq"], ev)).generate_many(PROMPTS, max_new_tokens=10)
    calls = [e[1] for e in ev if e[0] == "setData" and "num_logits_to_keep" in e[1]]
    assert calls and all("batch_index" not in c and c["input_ids"][0] == FBS for c in calls)
    for c in calls:
        S = c["input_ids"][1]
        assert c["num_logits_to_keep"] == ([1, 1] if S == PL else [S, 1]) and c["logits"][1] == c["num_logits_to_keep"][0]
    d = [e[1] for e in ev if e[0] == "setData" and "num_logits_to_keep" not in e[1]]
    assert d and all(c["input_ids"] in ([FBS, PL], [FBS, 1]) and "batch_index" not in c for c in d)


def test_plain_qpc_with_a_batch_index_binding_is_refused(arts, tmp_path):
    d = _with_batch_index_binding(arts["tlmq"], tmp_path / "t")
    with pytest.raises(SpecdecError, match="batch_index binding but the artifact was compiled without --full-batch-size"):
        backend(d, [])


def _with_batch_index_binding(art, d):
    """A copy of the artifact ``art`` at ``d`` whose FAKE QPC has a batch_index binding too."""
    import shutil
    shutil.copytree(art, d)
    f = d / "qpc" / "programqpc.bin"
    q = json.loads(f.read_text())
    q["bindings"].append({"name": "batch_index", "dir": INP, "type": INT64_I_TYPE, "dims": [FBS, 1]})
    for a in q["allowed_shapes"]:
        a.append([FBS, 1])
    f.write_text(json.dumps(q))
    return d
