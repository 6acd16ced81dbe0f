"""Runtime defects of issue 31 on real tiny exports run by ONNX Runtime, and specdec-run's: a
relabelled role, an --interface qeff TLM whose prefill length is one of its decode widths,
hand-edited manifests (nested objects, sizes, nesting depth), repeated --prompt, --eos-id and
--dlm with --target-only, the stop reason, --progress's help, the README's Python snippet.
Each test failed before the fix."""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from runtime_helpers import make_tokenizer, one_line_error, run

from specdec_compile import cli as compile_cli
from specdec_compile.cli import run as run_cli
from specdec_compile.errors import SpecdecError
from specdec_compile.runtime import SpecDecoder, TargetOnlyDecoder
from specdec_compile.artifact.reader import load_artifact
from specdec_compile.runtime.backends import Backend
from specdec_compile.runtime.backends.ort.runner import OrtBackend
from specdec_compile.runtime.drafts.ngram import NgramDraft
from specdec_compile.runtime.testing import fake_artifact

ROOT = Path(__file__).resolve().parents[2]
PROMPTS = [[3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 1], [5, 6, 7], [9, 4, 9, 120, 33, 17]]


@pytest.fixture(scope="module")
def arts(fixture_path, tmp_path_factory):
    """tlm: k 3 with widths 0, 1, 3 (seq_lens 1, 2, 3, 4, 8); dlm; tlmq: --full-batch-size 4 (continuous
    batching), prefill 4 at batch 1 and decode widths 1 and 4 at batch 4 (the prefill length is a decode width)."""
    src = str(fixture_path("llama_gqa"))
    d = tmp_path_factory.mktemp("issue31")
    common = ["--prefill-len", "8", "--ctx-len", "64", "--target", "ort"]
    for name, extra in (("tlm", ["--role", "tlm", "--k", "3", "--k-list", "0,1,3", *common]),
                        ("dlm", ["--role", "dlm", *common]),
                        ("tlmq", ["--role", "tlm", "--k", "3", "--k-list", "0", "--full-batch-size", "4", "--target",
                                  "ort", "--prefill-len", "4", "--ctx-len", "64"])):
        assert compile_cli.main([src, *extra, "-o", str(d / name), "-q"]) == 0
    make_tokenizer(d / "tok")
    return d


def _edited(arts, tmp_path, name: str, edit, specs=None) -> Path:
    """A copy of artifact ``name`` with its manifest edited by ``edit(dict)`` (and the specializations)."""
    out = tmp_path / f"{name}_edited{len(list(tmp_path.iterdir()))}"
    shutil.copytree(arts / name, out)
    m = json.loads((out / "manifest.json").read_text())
    edit(m)
    (out / "manifest.json").write_text(json.dumps(m))
    if specs is not None:
        s = json.loads((out / "specializations.json").read_text())
        for e in s["specializations"]:
            e.update(specs)
        (out / "specializations.json").write_text(json.dumps(s))
    return out


# ----------------------------------------------------------------------------- 6. qeff prefill width

def test_a_qeff_tlm_whose_prefill_length_is_a_decode_width_runs(arts):
    assert load_artifact(arts / "tlmq").shapes() == [(1, 4), (4, 1), (4, 4)]
    want = [TargetOnlyDecoder(OrtBackend(arts / "tlm")).generate(p, max_new_tokens=16).generated_ids
            for p in PROMPTS]
    tlmq = OrtBackend(arts / "tlmq")
    for dec in (TargetOnlyDecoder(tlmq), SpecDecoder(tlmq, draft=NgramDraft(3))):
        assert [r.generated_ids for r in dec.generate_many(PROMPTS, max_new_tokens=16)] == want
        assert dec.generate(PROMPTS[0], max_new_tokens=16).generated_ids == want[0]


# ----------------------------------------------------------------------------- 3, 7. the manifest's claims

def _as_dlm(m):
    m.update(role="dlm", k=None, k_list=None)


def _as_tlm(m):
    m.update(role="tlm", k=1, k_list=[1])


def test_a_relabelled_role_is_refused_at_load(arts, tmp_path, capsys):
    tlm_as_dlm = _edited(arts, tmp_path, "tlm", _as_dlm)
    dlm_as_tlm = _edited(arts, tmp_path, "dlm", _as_tlm)
    load_artifact(tlm_as_dlm), load_artifact(dlm_as_tlm)          # the manifests alone look fine
    with pytest.raises(SpecdecError, match="role dlm"):
        OrtBackend(tlm_as_dlm)
    with pytest.raises(SpecdecError, match="role tlm"):
        OrtBackend(dlm_as_tlm)
    for argv in (["--tlm", tlm_as_dlm, "--target-only"], ["--tlm", dlm_as_tlm, "--draft", "ngram"],
                 ["--tlm", arts / "tlm", "--dlm", tlm_as_dlm], ["--tlm", dlm_as_tlm, "--target-only"]):
        code, out, err = run(argv + ["--prompt-ids", "1,5,9", "--max-new-tokens", 4], capsys)
        one_line_error(code, err, "the manifest does not describe this graph")


def test_logits_of_the_wrong_role_are_refused_on_any_backend():
    class Wrong(Backend):                    # a backend whose model gives a TLM's logits under a DLM's role
        def _run(self, ids, pos):
            return np.zeros((*ids.shape, 23), np.float32)

        def _reset(self):
            pass

    b = Wrong(fake_artifact("dlm"))
    with pytest.raises(SpecdecError, match="role dlm"):
        b.warmup()
    with pytest.raises(SpecdecError, match="role dlm"):
        b.run(np.zeros((1, 8), np.int64), np.arange(8)[None])


def _fd(**kw):
    rec = {"target_layers": [-1], "width": 64, "input": "hidden_states", "draft_output": "draft_hidden_states",
           "draft_width": 64}
    rec.update(kw)
    return {k: v for k, v in rec.items() if v is not None}


def _hs(**kw):
    rec = {"layers": [-1], "layer_indices": [1], "hidden_size": 64, "width": 64, "output": "hidden_states"}
    rec.update(kw)
    return {k: v for k, v in rec.items() if v is not None}


FEATURE = {"k": 3, "k_list": [3]}
EDITS = [
    ("dlm", lambda m: m.update(FEATURE, feature_draft=_fd(width=None)), "feature_draft.width"),
    ("dlm", lambda m: m.update(FEATURE, feature_draft=_fd(width="wide")), "feature_draft.width"),
    ("dlm", lambda m: m.update(FEATURE, feature_draft=_fd(target_layers=-1)), "feature_draft.target_layers"),
    ("dlm", lambda m: m.update(FEATURE, feature_draft=_fd(draft_width=None)), "feature_draft.draft_width"),
    ("dlm", lambda m: m.update(FEATURE, feature_draft=_fd(input="logits")), "feature_draft.input"),
    ("tlm", lambda m: m.update(hidden_states=_hs(width=None)), "hidden_states.width"),
    ("tlm", lambda m: m.update(hidden_states=_hs(output="logits")), "hidden_states.output"),
    ("tlm", lambda m: m.update(hidden_states=_hs(output="past_key.0_RetainedState")), "hidden_states.output"),
    ("tlm", lambda m: m.update(hidden_states=_hs(layer_indices=[7])), "hidden_states.layer_indices"),
    ("tlm", lambda m: m.update(hidden_states=_hs(layers="last")), "hidden_states.layers"),
]


@pytest.mark.parametrize("i", range(len(EDITS)))
def test_hand_edited_nested_records_are_one_line_errors(arts, tmp_path, capsys, i):
    name, edit, needle = EDITS[i]
    bad = _edited(arts, tmp_path, name, edit)
    with pytest.raises(SpecdecError, match=re.escape(needle)):
        load_artifact(bad)
    argv = ["--tlm", bad, "--target-only"] if name == "tlm" else ["--tlm", arts / "tlm", "--dlm", bad]
    code, out, err = run(argv + ["--prompt-ids", "1,5,9", "--max-new-tokens", 4], capsys)
    one_line_error(code, err, needle)


def test_model_dims_a_manifest_claims_are_checked_against_the_graph(arts, tmp_path, capsys):
    for key, value in (("num_kv_heads", 3), ("head_dim", 8)):
        bad = _edited(arts, tmp_path, "tlm", lambda m: m.update({key: value}))
        code, out, err = run(["--tlm", bad, "--target-only", "--prompt-ids", "1,5,9"], capsys)
        one_line_error(code, err, key, "the manifest says")


def test_sizes_a_manifest_claims_are_bounded(arts, tmp_path, capsys):
    huge = _edited(arts, tmp_path, "tlm", lambda m: m.update(ctx_len=10 ** 9), specs={"ctx_len": 10 ** 9})
    code, out, err = run(["--tlm", huge, "--target-only", "--prompt-ids", "1,5,9"], capsys)
    one_line_error(code, err, "ctx_len")
    wide = _edited(arts, tmp_path, "tlm", lambda m: m.update(batch_size=10 ** 6), specs={"batch_size": 10 ** 6})
    code, out, err = run(["--tlm", wide, "--target-only", "--prompt-ids", "1,5,9"], capsys)
    one_line_error(code, err, "batch_size")


def test_a_deeply_nested_manifest_is_a_one_line_error(arts, tmp_path, capsys):
    for name in ("manifest.json", "specializations.json"):
        bad = tmp_path / f"deep_{name}"
        shutil.copytree(arts / "tlm", bad)
        (bad / name).write_text("[" * 100_000 + "]" * 100_000)
        code, out, err = run(["--tlm", bad, "--target-only", "--prompt-ids", "1,5,9"], capsys)
        one_line_error(code, err, name)


# ----------------------------------------------------------------------------- 2 and the smaller CLI items

def test_every_repeated_prompt_is_decoded(arts, capsys):
    tok = arts / "tok"
    argv = ["--tlm", arts / "tlm", "--draft", "ngram", "--tokenizer", tok, "--max-new-tokens", 8, "--json",
            "--prompt", "w3 w4 w3 w4", "--prompt", "w5 w6 w5 w6"]
    code, out, err = run(argv, capsys)
    assert code == 0, err
    res = json.loads(out)["results"]
    assert [r["prompt_ids"] for r in res] == [[3, 4, 3, 4], [5, 6, 5, 6]]
    one = []
    for p in ("w3 w4 w3 w4", "w5 w6 w5 w6"):
        code, out, err = run(argv[:-4] + ["--prompt", p], capsys)
        one += json.loads(out)["results"]
    assert [r["generated_ids"] for r in res] == [r["generated_ids"] for r in one]


def test_eos_id_outside_the_vocabulary_and_dlm_with_target_only_are_refused(arts, capsys):
    code, out, err = run(["--tlm", arts / "tlm", "--draft", "ngram", "--eos-id", 500, "--prompt-ids", "1,5"], capsys)
    one_line_error(code, err, "--eos-id 500", "211")
    code, out, err = run(["--tlm", arts / "tlm", "--dlm", arts / "dlm", "--target-only", "--prompt-ids", "1,5"],
                         capsys)
    one_line_error(code, err, "--target-only", "--dlm")


def test_the_cli_says_why_each_text_stopped(arts, capsys):
    base = ["--tlm", arts / "tlm", "--draft", "ngram", "--no-color", "--prompt-ids", "1,5,9", "--prompt-ids", "7,8"]
    code, out, err = run(base + ["--max-new-tokens", 6, "--eos-id", -1], capsys)
    assert code == 0, err
    assert err.count("[stopped: --max-new-tokens reached]") == 2
    first = TargetOnlyDecoder(OrtBackend(arts / "tlm")).generate([1, 5, 9], max_new_tokens=6).generated_ids
    code, out, err = run(base + ["--max-new-tokens", 6, "--eos-id", first[2]], capsys)
    assert code == 0, err
    assert "[stopped: end of sequence (EOS token)]" in err


def test_the_cli_printer_ends_with_a_trailing_incomplete_character(capsys):
    class Tok:   # a UTF-8 byte per id: the text's last character is cut in two
        def decode(self, ids, **kw):
            return bytes(ids).decode("utf-8", errors="replace")

    p = run_cli._Printer(Tok(), color=False)
    text = "Voilà: é".encode()[:-1]
    p.start(list(b"x"), 0, 1)
    p.on_tokens(list(text), ["target"] * len(text))
    p.end("max_new_tokens")
    out, err = capsys.readouterr()
    assert out == "x" + "Voilà: \ufffd" + "\n"
    assert "max-new-tokens" in err


def test_progress_help_names_what_specdec_run_reports():
    action = next(a for a in run_cli.build_parser()._actions if a.dest == "progress")
    assert "pass" not in action.help and "detect" not in action.help and "loaded" in action.help


def test_the_readme_snippet_imports_options_from_options_and_writes_a_fresh_directory():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    quick = readme.split("## Quick start", 1)[1].split("```")[1]
    snippet = readme.split("```python", 1)[1].split("```", 1)[0]
    assert "from specdec_compile.options import Options" in snippet
    assert "artifacts import Options" not in snippet
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:   # one home, everywhere
        assert "artifacts import Options" not in page.read_text(encoding="utf-8"), page
    written = re.findall(r"write_artifact\(.*,\s*\"([^\"]+)\"\)", snippet)
    assert written and not set(written) & set(re.findall(r"-o (\S+)", quick)), written
