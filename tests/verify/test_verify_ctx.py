"""verify and a qaic graph's fixed context: the default history (lengthened past sliding
windows) stays within the context the graph was compiled for, and an explicit longer one is
refused in one line (the qaic rotary tables hold exactly ctx_len rows)."""
from __future__ import annotations

import json

import numpy as np
import onnx
import pytest

from specdec_compile import cli
from specdec_compile.contract import CTX_LEN_KEY


def _compile(src, out, target, capsys):
    code = cli.main([str(src), "--role", "tlm", "--k", "3", "--target", target, "--prefill-len", "8",
                     "--ctx-len", "64", "-o", str(out)])
    capsys.readouterr()
    assert code == 0
    return out / "model.onnx"


def test_qaic_graph_records_its_context_and_verify_stays_within_it(fixture_path, tmp_path, capsys):
    src = fixture_path("mistral")          # a 4096-token sliding window: the default history would exceed 64
    model = _compile(src, tmp_path / "qaic", "qaic", capsys)
    meta = {p.key: p.value for p in onnx.load(str(model), load_external_data=False).metadata_props}
    assert meta[CTX_LEN_KEY] == "64"
    assert cli.main(["verify", str(src), str(model), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ctx_len"] == 64

    assert cli.main(["verify", str(src), str(model), "--ctx-len", "128"]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and "compiled for ctx_len 64" in err[0] and "--ctx-len <= 64" in err[0]


def test_ort_graph_has_no_fixed_context(fixture_path, tmp_path, capsys):
    src = fixture_path("llama_gqa")
    model = _compile(src, tmp_path / "ort", "ort", capsys)
    meta = {p.key for p in onnx.load(str(model), load_external_data=False).metadata_props}
    assert CTX_LEN_KEY not in meta
    assert cli.main(["verify", str(src), str(model), "--ctx-len", "96", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["ctx_len"] == 96


def test_verify_calls_every_specialization_of_the_artifact(fixture_path, tmp_path, capsys):
    """The manifest's widths (here --k-list 5's 6, wider than k+1) are each called once."""
    src = fixture_path("llama_gqa")
    out = tmp_path / "tlm"
    assert cli.main([str(src), "--role", "tlm", "--k", "3", "--k-list", "0,5", "--target", "ort",
                     "--prefill-len", "8", "--ctx-len", "64", "-o", str(out)]) == 0
    capsys.readouterr()
    assert cli.main(["verify", str(src), str(out / "model.onnx"), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    widths = {s["seq_len"] for s in report["shapes"]}
    assert widths >= {8, 1, 4, 6}, widths


class _WidthDependentExport:
    """Stands in for verify's OriginalModel: logits per position, plus ``shift`` on token 3 in any
    call of more than one token (as int8 activations quantized per call do)."""

    def __init__(self, shift: float, vocab: int = 7):
        self.base = np.random.default_rng(1).normal(size=(64, vocab)).astype(np.float32)
        self.shift = shift

    def empty(self):
        return []

    def run(self, tokens, start, past):
        out = self.base[start:start + len(tokens)].copy()
        if len(tokens) > 1:
            out[:, 3] += self.shift
        return out, past, None


def test_width_dependence_is_measured_and_fails_verify_only_past_the_tolerance():
    from specdec_compile.verify.replay import ShapeCheck, VerifyReport, _width_dependence
    tokens = np.arange(40)
    export = _WidthDependentExport(50.0)
    diff, flips = _width_dependence(export, tokens, 8, 5)
    # token 3 wins every position of the wide call: the others' top token changes
    assert abs(diff - 50.0) < 1e-4 and flips == int(np.sum(export.base[8:13].argmax(-1) != 3)) > 0
    assert _width_dependence(_WidthDependentExport(0.0), tokens, 8, 5) == (0.0, 0)
    good = [ShapeCheck("seq_len 1", 1, 0.0, 0.0)]

    def report(diff, flips):
        return VerifyReport("tlm", 4, 8, 64, 1, 1e-4, checks=good, width_max_abs_diff=diff,
                            width_top_token_changes=flips)
    assert not report(1.9, 4).ok and report(1.9, 4).width_dependent
    assert report(1.9, 0).ok                 # logits move, no top token does: greedy output unchanged
    assert report(5e-5, 1).ok                # a near tie within float noise is not a finding
    assert report(None, None).ok             # a DLM: not checked


def test_verify_reports_the_width_check_of_a_tlm(fixture_path, tmp_path, capsys):
    model = _compile(fixture_path("llama_gqa"), tmp_path / "ort", "ort", capsys)
    assert cli.main(["verify", str(fixture_path("llama_gqa")), str(model), "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["width_top_token_changes"] == 0 and 0 <= r["width_max_abs_diff"] <= 1e-4
    assert cli.main(["verify", str(fixture_path("llama_gqa")), str(model)]) == 0
    assert "top token differs at 0 of 4 positions" in capsys.readouterr().out


@pytest.mark.parametrize("prefill_len, ctx_len, batch", [(32, 256, 2), (1, 64, 3), (8, 64, 5)])
def test_verify_runs_every_batch_size(prefill_len, ctx_len, batch, fixture_path, tmp_path, capsys):
    """The rows of a batch start at other positions; every call still has one width for all of
    them (an artifact's defaults, 32/256, at --batch-size 2 once failed with an internal error)."""
    src, out = fixture_path("llama_gqa"), tmp_path / "tlm"
    assert cli.main([str(src), "--role", "tlm", "--k", "3", "--target", "ort", "--prefill-len", str(prefill_len),
                     "--ctx-len", str(ctx_len), "--batch-size", str(batch), "-o", str(out)]) == 0
    capsys.readouterr()
    assert cli.main(["verify", str(src), str(out), "--batch-size", str(batch), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["batch_size"] == batch and report["ok"]
    # without --batch-size: the artifact's own batch, every compiled row (it replayed row 0 alone)
    assert cli.main(["verify", str(src), str(out), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["batch_size"] == batch and report["ok"]


@pytest.mark.parametrize("key, value", [("ctx_len", 48), ("role", "dlm"), ("target", "ort")])
def test_verify_refuses_a_manifest_that_is_not_the_graphs(key, value, fixture_path, tmp_path, capsys):
    """A manifest beside the rewrite that says another ctx_len, role or target than the graph says of
    itself is refused in one line (a PASS would vouch for an artifact that does not exist)."""
    src = fixture_path("llama_gqa")
    model = _compile(src, tmp_path / "qaic", "qaic", capsys)
    manifest = tmp_path / "qaic" / "manifest.json"
    record = json.loads(manifest.read_text())
    record[key] = value
    if key == "role":
        record["k"] = record["k_list"] = None
    if key == "target":   # an ort manifest records no Cloud AI 100 compile options
        record.update(precision=None, num_cores=None, num_devices=None, hw_version=None, logits_dtype=None)
    manifest.write_text(json.dumps(record))
    assert cli.main(["verify", str(src), str(model)]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and f"{key} {value}, but" in err[0] and "manifest.json" in err[0]


def test_verify_refuses_a_manifest_listing_other_widths(fixture_path, tmp_path, capsys):
    """The widths verify checks are the manifest's: a list the specializations file does not have is
    refused (a PASS would cover widths the artifact was not compiled for, or miss ones it was)."""
    src = fixture_path("llama_gqa")
    model = _compile(src, tmp_path / "qaic", "qaic", capsys)
    manifest = tmp_path / "qaic" / "manifest.json"
    record = json.loads(manifest.read_text())
    record["specializations"] = record["specializations"][:-1]
    manifest.write_text(json.dumps(record))
    assert cli.main(["verify", str(src), str(model)]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and "lists the seq_lens" in err[0] and "specializations.json has" in err[0]
