"""verify on OpenVINO: a ``--target openvino`` graph is replayed by default on OpenVINO's CPU
plugin with its cache in state variables, the state read back after every call: the copy path
(MakeStateful, the graph's own cache write) and, at batch 1 where the attention allows it, the
fused cache the runtime runs; the width check then also runs on the rewrite itself. A wrong cache
write fails it; batches and feature drafts run; a graph of another target is refused in one line."""
from __future__ import annotations

import json

import onnx
import pytest

from feature_draft_models import export_feature_draft
from specdec_compile import cli
from specdec_compile.verify import verify

pytest.importorskip("openvino")


def _compile(src, out, capsys, *extra, role="tlm", target="openvino"):
    argv = [str(src), "--role", role, "--target", target, "--prefill-len", "8", "--ctx-len", "64", "-o", str(out)]
    code = cli.main(argv + (["--k", "3"] if role == "tlm" or "--feature-layers" in extra else []) + list(extra))
    capsys.readouterr()
    assert code == 0
    return out / "model.onnx"


def _verify_json(argv, capsys):
    code = cli.main(["verify", *map(str, argv), "--json"])
    out = capsys.readouterr().out
    return code, json.loads(out) if out.strip() else None


@pytest.mark.parametrize("name", ["llama_gqa", "gpt2"])
def test_openvino_graph_verifies_on_openvino_by_default(fixture_path, tmp_path, capsys, name):
    src = fixture_path(name)
    for role in ("tlm", "dlm"):
        model = _compile(src, tmp_path / role, capsys, role=role)
        code, rep = _verify_json([src, model, "--batch-size", "2"], capsys)
        assert code == 0 and rep["ok"], rep
        assert rep["backend"] == "openvino" and rep["precision"] == "f32"
        assert rep["max_logits_diff"] <= 1e-4 and rep["max_cache_diff"] <= 1e-4
        if role == "tlm":    # the rewrite's own width check, on OpenVINO, at the graph's batch of 2
            assert rep["backend_width_top_token_changes"] == 0 and rep["backend_width_max_abs_diff"] <= 1e-4
        code, rep = _verify_json([src, model, "--backend", "ort"], capsys)
        assert code == 0 and rep["backend"] == "ort" and rep["backend_width_max_abs_diff"] is None


def test_a_wrong_cache_write_fails_on_openvino(fixture_path, tmp_path, capsys):
    """The replay reads the state variables: a write that adds to the slot (a rollback's slots
    hold old values) is caught; a write that cannot run is a one-line error, exit 2."""
    src = fixture_path("llama_gqa")
    model = _compile(src, tmp_path / "ok", capsys)
    m = onnx.load(str(model))
    node = next(n for n in m.graph.node if n.op_type == "ScatterElements")
    node.attribute.append(onnx.helper.make_attribute("reduction", "add"))
    bad = tmp_path / "bad.onnx"
    onnx.save(m, str(bad))
    code, rep = _verify_json([src, bad, "--k", "3", "--prefill-len", "8", "--ctx-len", "64"], capsys)
    assert code == 1 and rep["backend"] == "openvino" and not rep["ok"]
    assert rep["max_cache_diff"] > 1e-4
    next(a for a in node.attribute if a.name == "axis").i = 1      # heads instead of slots: out of range
    onnx.save(m, str(bad))
    assert cli.main(["verify", str(src), str(bad), "--k", "3", "--prefill-len", "8", "--ctx-len", "64"]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and "the rewrite failed on OpenVINO" in err[0]


def test_feature_draft_verifies_on_openvino(tmp_path, capsys):
    src = export_feature_draft(1)
    model = _compile(src, tmp_path / "head", capsys, "--feature-layers", "-1", role="dlm")
    report = verify(src, model, k=3, prefill_len=8, ctx_len=64)
    assert report.ok and report.backend == "openvino" and report.max_hidden_diff <= 1e-4


def test_openvino_backend_refuses_another_targets_graph(fixture_path, tmp_path, capsys):
    src = fixture_path("llama_gqa")
    model = _compile(src, tmp_path / "ort", capsys, target="ort")
    assert cli.main(["verify", str(src), str(model), "--backend", "openvino"]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and "lowered for --target ort; OpenVINO runs --target openvino graphs" in err[0]


def test_without_openvino_verify_says_how_to_install(fixture_path, tmp_path, capsys, monkeypatch):
    src = fixture_path("llama_gqa")
    model = _compile(src, tmp_path / "ov", capsys)
    monkeypatch.setitem(__import__("sys").modules, "openvino", None)     # not installed
    assert cli.main(["verify", str(src), str(model)]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and "pip install 'specdec-compile[openvino]'" in err[0]
    assert cli.main(["verify", str(src), str(model), "--backend", "ort", "--json"]) == 0   # ONNX Runtime reads it


@pytest.mark.parametrize("name", ["llama_gqa", "qwen2", "opt", "gpt_neox", "llama3_rope", "phi3", "gpt2", "codegen"])
def test_batch_1_replays_the_fused_cache_too(fixture_path, tmp_path, capsys, name):
    """At batch 1 verify replays the fused cache as well, where the matcher rebuilds the family's
    attention, and passes it at 1e-4 with the fixed cache's scenario (rollbacks, padding, every
    width, the width check); elsewhere it says why not and replays the copy path alone."""
    src = fixture_path(name)
    model = _compile(src, tmp_path / "tlm", capsys)
    code, rep = _verify_json([src, model], capsys)
    assert code == 0 and rep["ok"], rep
    labels = [c["shape"] for c in rep["shapes"]]
    fused = [x for x in labels if x.startswith("fused cache: ")]
    if name in ("gpt2", "codegen"):    # attention the matcher does not rebuild
        assert rep["caches"] == ["copy"] and rep["fused_note"] and not fused
    else:
        assert rep["caches"] == ["copy", "fused"] and rep["fused_note"] is None
        assert len(fused) == len(labels) // 2 and any("rollback" in x for x in fused)
        assert rep["backend_width_top_token_changes"] == 0
    code, rep = _verify_json([src, model, "--batch-size", "2"], capsys)
    assert code == 0 and rep["caches"] == ["copy"] and "batch 2" in rep["fused_note"]
