"""``specdec-compile MODEL ... --verify``: the rewrite checked against its export before OUT is
written (what ``pair`` runs on every model it compiles), all or nothing."""
from __future__ import annotations

import json

import numpy as np
import pytest
from onnx import numpy_helper

from specdec_compile import cli, pipeline


def _run(argv, capsys):
    rc = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def test_verify_passes_and_says_so(fixture_path, tmp_path, capsys):
    out = tmp_path / "tlm"
    rc, so, se = _run([fixture_path("llama_gqa"), "--role", "tlm", "--k", "3", "--target", "ort",
                       "--verify", "-o", out], capsys)
    assert rc == 0, se
    assert "PASS, the rewrite against its export on this host: max |Δ logits|" in so
    assert (out / "model.onnx").is_file() and (out / "manifest.json").is_file()


def test_verify_numbers_in_the_json_summary(fixture_path, tmp_path, capsys):
    rc, so, se = _run([fixture_path("llama_gqa"), "--role", "dlm", "--verify", "--json", "-o", tmp_path / "d"],
                      capsys)
    assert rc == 0, se
    v = json.loads(so)["verify"]
    assert v["ok"] is True and v["max_logits_diff"] <= v["tol"] == 1e-4


def test_no_verify_key_means_not_run(fixture_path, tmp_path, capsys):
    rc, so, _ = _run([fixture_path("llama_gqa"), "--role", "dlm", "--json", "-o", tmp_path / "d"], capsys)
    assert rc == 0 and json.loads(so)["verify"] is None


def _corrupting(monkeypatch):
    """The real rewrite, then one weight of its graph moved: a rewrite that is not its export."""
    real = pipeline.rewrite

    def rewrite(model, options, **kw):
        res = real(model, options, **kw)
        init = next(t for t in res.model.graph.initializer if t.data_type == 1 and np.prod(t.dims) > 64)
        init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init) + np.float32(0.5), init.name))
        return res

    monkeypatch.setattr(pipeline, "rewrite", rewrite)


def test_a_rewrite_that_differs_exits_1_and_writes_nothing(fixture_path, tmp_path, capsys, monkeypatch):
    _corrupting(monkeypatch)
    out = tmp_path / "sub" / "tlm"
    rc, so, se = _run([fixture_path("llama_gqa"), "--role", "tlm", "--k", "3", "--verify", "-o", out], capsys)
    assert rc == 1 and so == ""
    assert se.count("\n") == 1 and "verify: the compiled model differs from its export" in se
    assert "nothing written (--verify)" in se
    assert not out.exists() and not out.parent.exists()


def test_a_failed_verify_leaves_the_old_out_with_force(fixture_path, tmp_path, capsys, monkeypatch):
    out = tmp_path / "tlm"
    assert _run([fixture_path("llama_gqa"), "--role", "dlm", "-o", out], capsys)[0] == 0
    before = sorted((p.name, p.stat().st_size) for p in out.iterdir())
    _corrupting(monkeypatch)
    rc, _, se = _run([fixture_path("llama_gqa"), "--role", "tlm", "--k", "3", "--verify", "--force", "-o", out],
                     capsys)
    assert rc == 1, se
    assert sorted((p.name, p.stat().st_size) for p in out.iterdir()) == before
    assert json.loads((out / "manifest.json").read_text())["role"] == "dlm"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tlm.")]


def test_shapes_verify_cannot_run_are_refused_as_its_own(fixture_path, tmp_path, capsys):
    out = tmp_path / "tlm"
    rc, _, se = _run([fixture_path("llama_gqa"), "--role", "tlm", "--k", "7", "--ctx-len", "24",
                      "--prefill-len", "8", "--verify", "-o", out], capsys)
    assert rc == 2 and se.count("\n") == 1
    assert se.startswith("specdec-compile: error: --verify: ctx_len 24 too small for the verification scenario")
    assert se.rstrip().endswith("nothing written") and not out.exists()


@pytest.mark.parametrize("extra", [["--interface", "qeff", "--k-list", "0"], ["--hidden-states", "-1"]],
                         ids=["qeff", "hidden-states"])
def test_verify_runs_on_other_interfaces(fixture_path, tmp_path, capsys, extra):
    rc, so, se = _run([fixture_path("llama_gqa"), "--role", "tlm", "--k", "3", *extra, "--verify", "-o",
                       tmp_path / "t"], capsys)
    assert rc == 0, se
    assert "PASS, the rewrite against its export" in so
