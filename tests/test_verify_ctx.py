"""verify and a qaic graph's fixed context: the default history (lengthened past sliding
windows) stays within the context the graph was compiled for, and an explicit longer one is
refused in one line (the qaic rotary tables hold exactly ctx_len rows)."""
from __future__ import annotations

import json

import onnx

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
