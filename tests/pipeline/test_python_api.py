"""The public Python API: paths, onnx.ModelProto and onnx_ir.Model in (the same kind
out), the pass-by-pass API for both targets with the context built from the CLI's
Options, write_artifact from a graph rewritten pass by pass, and docs/compiler.md's
block run as written."""
from __future__ import annotations

import json
import re
from pathlib import Path

import onnx
import pytest

from specdec_compile import passes, pipeline
from specdec_compile.artifact.writer import write_artifact
from specdec_compile.errors import SpecdecError
from specdec_compile.options import Options
from specdec_compile.verify import verify
from test_bad_inputs import _external

ir = pytest.importorskip("onnx_ir")
DOCS = Path(__file__).resolve().parents[2] / "docs" / "compiler.md"


def _doc_block(heading: str) -> str:
    text = DOCS.read_text()
    section = text[text.index(heading):]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


@pytest.fixture
def ext_model(fixture_path, tmp_path):
    """The tiny Llama with its weights in an external data file."""
    return _external(fixture_path("llama_gqa"), tmp_path / "export")


@pytest.mark.parametrize("target", ["qaic", "ort"])
def test_the_documented_block_runs_for_both_targets(ext_model, tmp_path, target):
    code = _doc_block("## Python API").replace('target="qaic"', f'target="{target}"')
    code = code.replace("export/tlm/model.onnx", str(ext_model)).replace("out/tlm", str(tmp_path / "art"))
    scope: dict = {}
    exec(compile(code, str(DOCS), "exec"), scope)
    assert isinstance(scope["model"], onnx.ModelProto) and isinstance(scope["ir_out"], ir.Model)
    assert scope["res"].passes == [p.name for p in passes.select("tlm", target)]
    rep = verify(ext_model, tmp_path / "art" / "model.onnx", k=4, prefill_len=16, ctx_len=128)
    assert rep.ok, rep.max_logits_diff
    # pass by pass is rewrite: the same bytes
    same = pipeline.rewrite(ext_model, scope["opts"]).model
    assert same.SerializeToString(deterministic=True) == \
        scope["written"].out.joinpath("model.onnx").read_bytes()


@pytest.mark.parametrize("target", ["qaic", "ort"])
def test_onnx_ir_in_onnx_ir_out(ext_model, tmp_path, target):
    opts = Options(role="tlm", k=3, target=target, ctx_len=64)
    want = pipeline.compile_model(ext_model, opts)
    got = pipeline.compile_model(ir.load(str(ext_model)), opts)
    assert isinstance(got, ir.Model)
    proto = ir.to_proto(got)   # the same graph (onnx_ir writes the proto in its own field order)
    for part in ("node", "input", "output", "initializer"):
        assert [x.name for x in getattr(proto.graph, part)] == [x.name for x in getattr(want.graph, part)]
    assert [n.op_type for n in proto.graph.node] == [n.op_type for n in want.graph.node]
    ext = [v.const_value for v in got.graph.initializers.values() if isinstance(v.const_value, ir.ExternalTensor)]
    assert ext and all(Path(t.base_dir) == ext_model.parent.resolve() for t in ext)
    assert ext[0].numpy().size                                   # readable where the weights are
    # (the artifact copies the data file; with --link-weights onnx.load would refuse it: several links)
    # a proto given: a proto back; in-memory weights (no external data) too
    assert isinstance(pipeline.rewrite(onnx.load(str(ext_model), load_external_data=True), opts).as_given(),
                      onnx.ModelProto)
    res = pipeline.rewrite(ir.load(str(ext_model)), opts)
    assert res.input_kind == "ir" and res.source_dir == ext_model.parent.resolve()
    out = tmp_path / "art"
    write_artifact(res, Options(role="tlm", k=3, target=target, ctx_len=64, prefill_len=8), out)
    assert (out / "model.onnx.data").exists()
    assert verify(ext_model, out / "model.onnx", k=3, prefill_len=8, ctx_len=64).ok
    # verify takes models in memory too: a proto (with the file it came from) and an ir model
    rep = verify(onnx.load(str(ext_model), load_external_data=False), res.as_given(), k=3, prefill_len=8,
                 ctx_len=64, original_source=ext_model)
    assert rep.ok and rep.max_logits_diff <= 1e-4


def test_prepared_single_pass_leaves_the_graph_untouched(fixture_path):
    prep = pipeline.prepare(fixture_path("llama_gqa"), Options(role="dlm", target="qaic", ctx_len=64,
                                                               prefill_len=8))
    before = len(prep.graph.nodes)
    g1 = passes.position_mask(prep.graph, prep.ctx)
    assert g1 is not prep.graph and len(prep.graph.nodes) == before
    assert prep.ctx.ctx_len == 64 and prep.ctx.role == "dlm" and prep.detection is prep.ctx.detection
    g, snaps = prep.run(record=True)
    assert [n for n, _ in snaps] == ["original"] + [p.name for p in prep.passes]
    assert prep.finish(g).model.graph.node


@pytest.mark.parametrize("bad, needle", [
    (123, "expected a model path, an onnx.ModelProto or an onnx_ir.Model, got int"),
])
def test_a_model_of_another_kind_is_one_line(bad, needle):
    with pytest.raises(SpecdecError, match=re.escape(needle)):
        pipeline.rewrite(bad, Options(role="dlm"))


def test_verify_of_a_proto_without_its_source_is_one_line(ext_model):
    proto = onnx.load(str(ext_model), load_external_data=False)
    with pytest.raises(SpecdecError, match="source directory is unknown"):
        verify(proto, ext_model, k=3, prefill_len=8, ctx_len=64)
    with pytest.raises(SpecdecError, match="expected a model path"):
        verify(123, ext_model, k=3, prefill_len=8, ctx_len=64)


def test_options_are_checked_like_the_cli(fixture_path):
    with pytest.raises(SpecdecError, match="--k is required"):
        pipeline.prepare(fixture_path("llama_gqa"), Options(role="tlm"))
    with pytest.raises(SpecdecError, match="options= must be"):
        pipeline.rewrite(fixture_path("llama_gqa"), options={"role": "dlm"})


def test_one_compile_checks_its_options_once(fixture_path, tmp_path, monkeypatch):
    """The options are checked where the ``Options`` is built; rewrite, the passes and the
    writer trust it (before: ``check_options`` ran six times per compile)."""
    from specdec_compile import options as options_module
    calls = []
    real = options_module.check_options

    def counted(*args, **kwargs):
        calls.append(args)
        return real(*args, **kwargs)

    for module in (options_module, passes, passes._context):  # every name it is called by
        monkeypatch.setattr(module, "check_options", counted)
    opts = Options(role="tlm", k=3, target="ort", ctx_len=64, prefill_len=8)
    res = pipeline.rewrite(fixture_path("llama_gqa"), opts)
    write_artifact(res, opts, tmp_path / "art")
    assert len(calls) == 1
    # a context built by hand is still checked (it did not come from an Options)
    with pytest.raises(SpecdecError, match="unknown role"):
        passes.PassContext(role="draft")


@pytest.mark.parametrize("target", ["qaic", "ort"])
def test_a_proto_given_is_not_changed_and_explain_claims_no_opset_it_lacked(fixture_path, target):
    """onnx-graphsurgeon kept the model's own opset list, and the export added ai.specdec to it: the
    caller's proto gained an opset, and --explain's first pass then reported 'opset ai.specdec: 1 ->
    (none)', an opset the export never had."""
    from specdec_compile.explain import explain_result
    model = onnx.load(str(fixture_path("llama_gqa")))
    before = [(o.domain, o.version) for o in model.opset_import]
    given = model.SerializeToString(deterministic=True)
    res = pipeline.rewrite(model, Options(role="tlm", target=target, k=3), record=True)
    assert [(o.domain, o.version) for o in model.opset_import] == before
    # and byte for byte: the export set name "" on the attribute tensors it shared with the proto
    assert model.SerializeToString(deterministic=True) == given
    rep = explain_result(res)
    # the passes that use ai.specdec add it and lower removes it; the first pass and the whole compile do not
    added = [p["pass"] for p in rep["passes"] if {"field": "opset ai.specdec", "before": None, "after": 1}
             in p["metadata"]]
    assert added and added[0] != rep["passes"][0]["pass"], added
    claims = json.dumps([rep["passes"][0]["metadata"], rep["total"]["metadata"]])
    assert "opset ai.specdec" not in claims, claims
