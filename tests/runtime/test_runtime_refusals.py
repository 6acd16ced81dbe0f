"""Defects found reading compiled artifacts and running them (real tiny exports in ONNX Runtime,
and specdec-run): a manifest that claims --interface qeff over a plain graph, a feature draft's
``target_width`` / ``own_offset`` of the wrong kind, a stdout that cannot take the output,
non-integer ids given to a backend, a ``k`` that is not a whole number, ``--dlm-tokenizer``
without a draft model. Each was an internal error (exit 3) or passed silently before the fix."""
from __future__ import annotations

import errno
import json
import shutil
import sys

import numpy as np
import pytest
from runtime_helpers import make_tokenizer, one_line_error, run

from specdec_compile import cli as compile_cli
from specdec_compile.artifact.reader import load_artifact
from specdec_compile.errors import SpecdecError
from specdec_compile.runtime import SpecDecoder, TargetOnlyDecoder
from specdec_compile.runtime.backends.ort.runner import OrtBackend

PROMPT = "3,4,5,6,7,8,9,10,11,12,1"


@pytest.fixture(scope="module")
def arts(fixture_path, tmp_path_factory):
    """tlm: k 3 with widths 0, 1, 3; dlm; tok: the word-level tokenizer."""
    src = str(fixture_path("llama_gqa"))
    d = tmp_path_factory.mktemp("runtime_refusals")
    common = ["--prefill-len", "8", "--ctx-len", "64", "--target", "ort", "-q"]
    for name, extra in (("tlm", ["--role", "tlm", "--k", "3", "--k-list", "0,1,3"]), ("dlm", ["--role", "dlm"])):
        assert compile_cli.main([src, *extra, *common, "-o", str(d / name)]) == 0
    make_tokenizer(d / "tok")
    return d


def _edited(arts, tmp_path, name: str, edit):
    out = tmp_path / f"{name}_edited"
    shutil.copytree(arts / name, out)
    m = json.loads((out / "manifest.json").read_text())
    edit(m)
    (out / "manifest.json").write_text(json.dumps(m))
    return out


def test_a_qeff_manifest_over_a_plain_graph_is_refused_at_load(arts, tmp_path, capsys):
    bad = _edited(arts, tmp_path, "tlm", lambda m: m.update(qeff={"batch_size": 1}))
    with pytest.raises(SpecdecError, match="num_logits_to_keep"):
        OrtBackend(bad)
    for argv in (["--target-only"], ["--draft", "ngram"]):
        code, out, err = run(["--tlm", bad, *argv, "--prompt-ids", PROMPT, "--max-new-tokens", 4, "--no-warmup"],
                             capsys)
        one_line_error(code, err, "--interface qeff", "num_logits_to_keep", "does not describe this graph")


@pytest.mark.parametrize("edit", [lambda l: l[::-1], lambda l: l[:-1], lambda l: l + [9]])
def test_a_manifest_listing_other_specializations_is_refused(arts, tmp_path, capsys, edit):
    """verify and pair read the manifest's seq_lens: a list the specializations file does not have is
    a manifest that does not describe its artifact."""
    bad = _edited(arts, tmp_path, "tlm", lambda m: m.update(specializations=edit(m["specializations"])))
    with pytest.raises(SpecdecError, match="lists the seq_lens"):
        load_artifact(bad)
    code, out, err = run(["--tlm", bad, "--target-only", "--prompt-ids", PROMPT, "--max-new-tokens", 4], capsys)
    one_line_error(code, err, "lists the seq_lens", "specializations.json has")


def _feature(**kw):
    rec = {"target_layers": [-1], "width": 64, "input": "hidden_states", "draft_output": "draft_hidden_states",
           "draft_width": 64, **kw}
    return lambda m: m.update(k=3, k_list=[3], feature_draft=rec)


@pytest.mark.parametrize("key, value", [("own_offset", "a"), ("target_width", "64"), ("target_width", 0),
                                        ("own_offset", 65), ("target_width", [64])])
def test_a_feature_drafts_slice_widths_are_checked_as_integers(arts, tmp_path, capsys, key, value):
    bad = _edited(arts, tmp_path, "dlm", _feature(**{key: value}))
    with pytest.raises(SpecdecError, match=f"feature_draft.{key}"):
        load_artifact(bad)
    code, out, err = run(["--tlm", arts / "tlm", "--dlm", bad, "--prompt-ids", PROMPT, "--max-new-tokens", 4], capsys)
    one_line_error(code, err, f"feature_draft.{key}")


class _Full:
    """A stdout on a full disk."""

    def write(self, text):
        raise OSError(errno.ENOSPC, "No space left on device")

    def flush(self):
        pass

    def isatty(self):
        return False


@pytest.mark.parametrize("argv", [["--json"], [], ["--compare", "--dlm", "DLM"], ["--compare", "--dlm", "DLM", "--json"]])
def test_a_stdout_that_cannot_take_the_output_is_a_one_line_error(arts, capsys, monkeypatch, argv):
    argv = [str(arts / "dlm") if a == "DLM" else a for a in argv]
    mode = [] if "--compare" in argv else ["--target-only"]
    monkeypatch.setattr(sys, "stdout", _Full())
    code, out, err = run(["--tlm", arts / "tlm", *mode, *argv, "--prompt-ids", PROMPT, "--max-new-tokens", 4], capsys)
    one_line_error(code, err, "cannot write the output", "No space left on device")
    monkeypatch.setattr(sys, "stdout", None)       # a closed descriptor: refused before any work
    code, out, err = run(["--tlm", arts / "tlm", *mode, *argv, "--prompt-ids", PROMPT], capsys)
    one_line_error(code, err, "standard output is closed")


def test_a_backend_refuses_ids_and_positions_that_are_not_integers(arts):
    tlm = OrtBackend(arts / "tlm")
    pos = np.arange(8)[None]
    for ids in (np.full((1, 8), 1.7), np.full((1, 8), 3.0), np.ones((1, 8), bool)):
        with pytest.raises(SpecdecError, match="input_ids must be integers"):
            tlm.run(ids, pos)
    with pytest.raises(SpecdecError, match="position_ids must be integers"):
        tlm.run(np.ones((1, 8), np.int64), pos + 0.5)
    assert tlm.run(np.ones((1, 8), np.int32), pos.astype(np.uint8)).shape == (1, 8, 211)


def test_k_must_be_a_whole_number_of_drafts(arts):
    tlm, dlm = OrtBackend(arts / "tlm"), OrtBackend(arts / "dlm")
    for k in (3.0, True, "3", 2.5):
        with pytest.raises(SpecdecError, match="whole number of drafts"):
            SpecDecoder(tlm, dlm, k=k)
    want = TargetOnlyDecoder(tlm).generate([3, 4, 5], max_new_tokens=8).generated_ids
    assert SpecDecoder(tlm, dlm, k=np.int64(3)).generate([3, 4, 5], max_new_tokens=8).generated_ids == want


def test_dlm_tokenizer_without_a_draft_model_is_refused(arts, capsys):
    tok = arts / "tok"
    for mode in (["--draft", "ngram"], ["--draft", "suffix"], ["--target-only"]):
        code, out, err = run(["--tlm", arts / "tlm", *mode, "--tokenizer", tok, "--dlm-tokenizer", tok,
                              "--prompt", "w3 w4", "--max-new-tokens", 4], capsys)
        one_line_error(code, err, "--dlm-tokenizer", "--dlm")


@pytest.mark.parametrize("role", ["xyz", "TLM", "", 5])
def test_load_artifact_refuses_an_unknown_expect_role_as_a_programming_error(arts, role):
    """``load_artifact(DIR, expect_role="xyz")`` said "is a TLM artifact, expected a XYZ": the artifact
    was blamed for the caller's mistake. An unknown role is a ValueError naming the roles."""
    with pytest.raises(ValueError, match=r"expect_role must be one of 'tlm', 'dlm' or None \(got ") as e:
        load_artifact(arts / "tlm", expect_role=role)
    assert not isinstance(e.value, SpecdecError) and "\n" not in str(e.value)
    assert load_artifact(arts / "tlm", expect_role="tlm").role == "tlm"
    with pytest.raises(SpecdecError, match="is a TLM artifact, expected a DLM"):
        load_artifact(arts / "tlm", expect_role="dlm")


def test_a_draft_sources_size_past_2_63_is_refused_in_one_line():
    """A size past 2**64 is an integer: refused in one line (sizes are below 2**63, docs/runtime.md),
    never the TypeError np.isfinite raises for it (an internal error on the old code); a cap below
    that is taken as given."""
    from specdec_compile.runtime.drafts.ngram import NgramDraft
    from specdec_compile.runtime.drafts.suffix import SuffixDraft
    with pytest.raises(SpecdecError, match="at most"):
        NgramDraft(10 ** 6)
    for big in (lambda: NgramDraft(10 ** 20), lambda: SuffixDraft(cache_tokens=10 ** 20)):
        with pytest.raises(SpecdecError, match=r"magnitude below 2\*\*63"):
            big()
    assert SuffixDraft(cache_tokens=2 ** 62).cache_tokens == 2 ** 62
    for bad in (True, 2.5, float("inf"), "3"):
        with pytest.raises(SpecdecError, match="whole number"):
            NgramDraft(bad)
