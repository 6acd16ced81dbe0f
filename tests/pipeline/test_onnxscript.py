"""onnxscript's optimizer and the compile: before it, supported (the rewrite of the
optimized export verifies against the original); after it, a qaic artifact whose
CtxScatter was inlined into a ScatterND is refused by verify and the runtime, one line."""
from __future__ import annotations

import onnx
import pytest

from specdec_compile import cli, pipeline
from specdec_compile.artifact.writer import write_artifact
from specdec_compile.artifact.cache_writes import cache_write_problem
from specdec_compile.cli import run as run_cli
from specdec_compile.errors import SpecdecError
from specdec_compile.options import Options
from specdec_compile.runtime import OrtBackend, load_artifact
from specdec_compile.verify import verify

ir = pytest.importorskip("onnx_ir")
onnxscript = pytest.importorskip("onnxscript")


def _one_line(err: str, prog: str) -> str:
    lines = [x for x in err.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"{prog}: error: "), err
    return lines[0]


@pytest.mark.parametrize("target", ["qaic", "ort"])
def test_optimizing_before_the_compile_verifies(fixture_path, tmp_path, target):
    src = fixture_path("llama_gqa")
    m = ir.load(str(src))
    before = len(m.graph)
    onnxscript.optimizer.optimize(m)
    assert len(m.graph) < before * 0.75           # constants and shape arithmetic folded
    res = pipeline.rewrite(m, Options(role="tlm", k=3, target=target, ctx_len=64))
    assert cache_write_problem(res.model, target) is None
    out = tmp_path / "art"
    write_artifact(res, Options(role="tlm", k=3, target=target, ctx_len=64, prefill_len=8), out)
    rep = verify(src, out / "model.onnx", k=3, prefill_len=8, ctx_len=64)
    assert rep.ok, rep.max_logits_diff


@pytest.fixture
def optimized_after(fixture_path, tmp_path):
    """A qaic artifact, then onnxscript's optimizer run on its model.onnx."""
    out = tmp_path / "art"
    assert cli.main([str(fixture_path("llama_gqa")), "--role", "tlm", "--k", "3", "--ctx-len", "64",
                     "--prefill-len", "8", "-o", str(out)]) == 0
    m = ir.load(str(out / "model.onnx"))
    onnxscript.optimizer.optimize(m)
    ir.save(m, str(out / "model.onnx"))
    ops = {n.op_type for n in onnx.load(str(out / "model.onnx")).graph.node}
    assert "CtxScatter" not in ops and "ScatterND" in ops       # what the optimizer does
    return out


def test_verify_refuses_an_artifact_optimized_afterwards(fixture_path, optimized_after, capsys):
    capsys.readouterr()
    code = cli.main(["verify", str(fixture_path("llama_gqa")), str(optimized_after / "model.onnx")])
    line = _one_line(capsys.readouterr().err, "specdec-compile")
    assert code == 2 and "com.qualcomm.cloud::CtxScatter is gone" in line and "ScatterND" in line
    assert "Optimize before compiling" in line


def test_the_runtime_refuses_it(optimized_after, capsys):
    assert load_artifact(optimized_after).target == "qaic"          # the directory itself reads
    with pytest.raises(SpecdecError, match="CtxScatter is gone"):
        OrtBackend(optimized_after)
    capsys.readouterr()
    code = run_cli.main(["--tlm", str(optimized_after), "--target-only", "--prompt-ids", "1,2,3",
                         "--max-new-tokens", "2"])
    assert code == 2 and "CtxScatter is gone" in _one_line(capsys.readouterr().err, "specdec-run")


def test_a_call_of_an_undefined_function_is_refused(fixture_path):
    res = pipeline.rewrite(fixture_path("llama_gqa"), Options(role="dlm", target="qaic", ctx_len=64))
    assert cache_write_problem(res.model, "qaic") is None
    del res.model.functions[:]
    assert "is not defined in the model" in cache_write_problem(res.model, "qaic")
    assert cache_write_problem(res.model, None) is None            # a graph that names no target
