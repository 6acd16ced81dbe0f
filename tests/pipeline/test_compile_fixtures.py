"""Every fixture x role x target: onnx.checker, exactly the contract's
interface, and verify (numerical equivalence with the original export, padded
prefill keeping every valid slot, no NaN/Inf ever written) at <= 1e-4."""
from __future__ import annotations

import json

import onnx
import pytest

from conftest import DECODERS
from specdec_compile import cli
from specdec_compile.contract import interface
from specdec_compile.pipeline import compile_model, rewrite
from specdec_compile.graph_checks import _without_external, interface_problems
from specdec_compile.verify import verify
from specdec_compile.options import Options

K, PL, CL = 7, 32, 128


@pytest.fixture(scope="module")
def compiled(fixture_path, tmp_path_factory):
    cache = {}

    def get(name, role, target):
        key = (name, role, target)
        if key not in cache:
            out = tmp_path_factory.mktemp(f"{name}-{role}-{target}") / "art"
            argv = [str(fixture_path(name)), "--role", role, "--target", target, "--prefill-len", str(PL),
                    "--ctx-len", str(CL), "-o", str(out)]
            if role == "tlm":
                argv += ["--k", str(K)]
            assert cli.main(argv) == 0
            cache[key] = out
        return cache[key]

    return get


@pytest.mark.parametrize("target", ["qaic", "ort"])
@pytest.mark.parametrize("role", ["tlm", "dlm"])
@pytest.mark.parametrize("name", DECODERS)
def test_rewrite_is_checked_exact_interface_and_equivalent(fixture_path, compiled, name, role, target):
    out = compiled(name, role, target)
    model = onnx.load(str(out / "model.onnx"), load_external_data=False)
    onnx.checker.check_model(_without_external(model), full_check=True)
    assert model.opset_import[0].version == (17 if target == "qaic" else 24)
    ins, outs = interface(2)
    assert [i.name for i in model.graph.input] == ins
    assert [o.name for o in model.graph.output] == outs
    kv = 2 if name.startswith("llama") else 4
    assert interface_problems(model, role, 2, kv, 16, 211) == []
    if target == "qaic":
        assert {(o.domain, o.version) for o in model.opset_import} == {("", 17), ("com.qualcomm.cloud", 1)}
        assert [f.name for f in model.functions] == ["CtxScatter"]
        assert sum(n.op_type == "CtxScatter" for n in model.graph.node) == 4
    else:
        assert sum(n.op_type == "TensorScatter" for n in model.graph.node) == 4
    report = verify(fixture_path(name), out / "model.onnx", k=K, prefill_len=PL, ctx_len=CL)
    labels = {c.label for c in report.checks}
    assert {"prefill", "prefill (padded)", "seq_len 1", "seq_len 2", "seq_len k", "seq_len k+1",
            "rollback k+1", "rollback 2", "ctx end (padded)"} <= labels
    assert report.role == role
    assert report.ok, report.per_shape()
    assert report.max_logits_diff <= 1e-4
    assert not any(c.history_changed or c.non_finite for c in report.checks)


def test_batch_of_rows_with_different_lengths(fixture_path, compiled):
    """Rows of one call carry different prompt lengths (so different padding)."""
    out = compiled("llama_gqa", "tlm", "ort")
    report = verify(fixture_path("llama_gqa"), out / "model.onnx", k=K, prefill_len=PL, ctx_len=CL, batch_size=3)
    assert report.ok and report.batch_size == 3


def test_verify_fails_a_wrong_rewrite(fixture_path, compiled, tmp_path):
    """verify can fail: pair a model with a rewrite of *another* model (same
    shapes, other weights). (llama_gqa and llama_dynamo share their weights.)"""
    report = verify(fixture_path("codegen"), compiled("gpt2", "tlm", "ort") / "model.onnx",
                    k=K, prefill_len=PL, ctx_len=CL)
    assert not report.ok and report.max_logits_diff > 1e-2


def test_verify_cli_reports_per_shape_and_exit_codes(fixture_path, compiled, capsys):
    out = compiled("gpt2", "dlm", "qaic")
    assert cli.main(["verify", str(fixture_path("gpt2")), str(out / "model.onnx")]) == 0
    text = capsys.readouterr().out
    assert "prefill (padded)" in text and "PASS" in text and f"CL={CL}" in text  # defaults from manifest
    assert cli.main(["verify", str(fixture_path("gpt2")), str(out / "model.onnx"), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["ok"] and data["role"] == "dlm" and len(data["shapes"]) >= 9
    wrong = compiled("codegen", "dlm", "qaic") / "model.onnx"
    assert cli.main(["verify", str(fixture_path("gpt2")), str(wrong)]) == 1
    assert "FAIL" in capsys.readouterr().out


def test_compile_model_api_is_deterministic_and_keeps_weights(fixture_path):
    a = compile_model(str(fixture_path("llama_gqa")), Options(role="dlm", target="qaic"))
    b = compile_model(str(fixture_path("llama_gqa")), Options(role="dlm", target="qaic"))
    assert a.SerializeToString(deterministic=True) == b.SerializeToString(deterministic=True)
    original = onnx.load(str(fixture_path("llama_gqa")), load_external_data=False)
    weights = {t.name: t.raw_data for t in original.graph.initializer if t.raw_data}
    kept = {t.name: t.raw_data for t in a.graph.initializer if t.name in weights}
    assert kept and all(kept[n] == weights[n] for n in kept)


def test_record_gives_one_snapshot_per_pass(fixture_path):
    res = rewrite(str(fixture_path("gpt2")), Options(role="tlm", target="ort", k=3), record=True)
    assert [n for n, _ in res.snapshots] == ["original"] + res.passes
    assert res.info.num_heads == 4 and res.info.num_layers == 2
