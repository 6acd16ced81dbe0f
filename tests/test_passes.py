"""Each pass on its own: one job, input graph untouched, checked numerically
where the pass alone gives a runnable graph."""
from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import onnxruntime as ort
import pytest
from onnx import TensorProto as T
from onnx import helper as h

from specdec_compile import passes
from specdec_compile.contract import CACHE_WRITE, FP16_MAX, QAIC_DOMAIN, SPECDEC_DOMAIN
from specdec_compile.detect import detect
from specdec_compile.graph_utils import name_unnamed_nodes
from specdec_compile.passes.lowering import _ctx_scatter_function


def _load(path):
    g = gs.import_onnx(onnx.load(str(path), load_external_data=False))
    name_unnamed_nodes(g)
    return g, detect(g)


def _session(graph_or_model):
    m = gs.export_onnx(graph_or_model) if isinstance(graph_or_model, gs.Graph) else graph_or_model
    so = ort.SessionOptions()
    so.log_severity_level = 3
    return ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])


def _bytes(g):
    return gs.export_onnx(g).SerializeToString()


def test_retained_kv_replaces_each_concat_with_a_cache_write(fixture_path):
    g, det = _load(fixture_path("llama_gqa"))
    before = _bytes(g)
    out = passes.retained_kv(g, det)
    assert _bytes(g) == before, "a pass must not modify its input graph"
    writes = [n for n in out.nodes if n.op == CACHE_WRITE and n.domain == SPECDEC_DOMAIN]
    assert [n.outputs[0].name for n in writes] == [
        "past_key.0_RetainedState", "past_value.0_RetainedState",
        "past_key.1_RetainedState", "past_value.1_RetainedState"]
    names = {t.name: t for t in out.inputs}
    assert names["past_key.1"].shape == ["batch_size", 2, "ctx_len", 16]
    assert not any(n.op == "Concat" and n.inputs and n.inputs[0].name.startswith("past_") for n in out.nodes)
    assert not [t.name for t in out.outputs if t.name.startswith("present")]


def test_retained_kv_gives_surviving_past_shapes_a_virtual_length(fixture_path):
    """The dynamo export computes the GQA Expand from Shape(past)+seq: after the
    pass no Shape reads a cache input directly."""
    g, det = _load(fixture_path("llama_dynamo"))
    assert any(n.op == "Shape" for t in g.inputs if t.name.startswith("past_") for n in t.outputs)
    out = passes.retained_kv(g, det)
    for t in out.inputs:
        if t.name.startswith("past_"):
            direct = [n for n in t.outputs if n.op == "Shape" and "virtual_past" not in n.name]
            assert not direct


def test_position_mask_alone_matches_the_original(fixture_path):
    """On the original (concatenating) graph, the position-derived mask equals
    the exporter's mask for an unpadded history: same logits, no attention_mask."""
    path = fixture_path("llama_gqa")
    g, det = _load(path)
    masked = passes.position_mask(g, det)
    assert "attention_mask" not in [t.name for t in masked.inputs]
    assert "attention_mask" in [t.name for t in g.inputs]
    rng = np.random.default_rng(0)
    past_len, s = 5, 3
    feeds = {"input_ids": rng.integers(0, 211, (1, s)),
             "position_ids": np.arange(past_len, past_len + s)[None]}
    for i in range(2):
        for kind in ("key", "value"):
            feeds[f"past_key_values.{i}.{kind}"] = rng.standard_normal((1, 2, past_len, 16)).astype(np.float32)
    want = _session(onnx.load(str(path)))
    ref = want.run(["logits"], {**feeds, "attention_mask": np.ones((1, past_len + s), np.int64)})[0]
    got = _session(masked).run(["logits"], feeds)[0]
    np.testing.assert_allclose(got, ref, atol=1e-5)


def test_role_logits_dlm_picks_last_valid_before_the_head(fixture_path):
    path = fixture_path("llama_gqa")
    g, det = _load(path)
    dlm = passes.role_logits(g, det, "dlm")
    logits = next(t for t in dlm.outputs if t.name == "logits")
    head = logits.inputs[0]
    assert head.op == "MatMul", "the last row is picked before the LM head"
    assert head.inputs[0].inputs[0].op == "GatherElements"
    # numerically: DLM logits == TLM logits at the last valid (largest) position
    rng = np.random.default_rng(1)
    feeds = {"input_ids": rng.integers(0, 211, (1, 4)), "position_ids": np.arange(4)[None],
             "attention_mask": np.ones((1, 4), np.int64)}
    for i in range(2):
        for kind in ("key", "value"):
            feeds[f"past_key_values.{i}.{kind}"] = np.zeros((1, 2, 0, 16), np.float32)
    full = _session(onnx.load(str(path))).run(["logits"], feeds)[0]
    last = _session(dlm).run(["logits"], feeds)[0]
    assert last.shape == (1, 1, 211)
    np.testing.assert_allclose(last[0, 0], full[0, -1], atol=1e-5)


def test_role_logits_dlm_without_a_plain_head_gathers_logits(fixture_path):
    """CodeGen's head has a bias and a Cast: the gather is still before the head."""
    g, det = _load(fixture_path("codegen"))
    dlm = passes.role_logits(g, det, "dlm")
    assert [t.shape for t in dlm.outputs if t.name == "logits"] == [["batch_size", 1, 211]]


def test_canonical_dims_gives_exactly_the_contract_interface(fixture_path):
    g, det = _load(fixture_path("llama_dynamo"))
    g = passes.role_logits(passes.position_mask(passes.retained_kv(g, det), det), det, "tlm")
    out = passes.canonical_dims(g, det)
    assert [t.name for t in out.inputs] == ["input_ids", "position_ids", "past_key.0", "past_value.0",
                                            "past_key.1", "past_value.1"]
    assert [t.name for t in out.outputs] == ["logits", "past_key.0_RetainedState", "past_value.0_RetainedState",
                                             "past_key.1_RetainedState", "past_value.1_RetainedState"]
    assert out.inputs[0].shape == ["batch_size", "seq_len"]
    assert out.outputs[0].shape == ["batch_size", "seq_len", 211]
    assert out.outputs[1].shape == ["batch_size", 2, "ctx_len", 16]


def _const_graph(values, external=False):
    c = gs.Constant("fill", np.asarray(values, np.float32))
    x = gs.Variable("x", dtype=np.float32, shape=[len(values)])
    y = gs.Variable("y", dtype=np.float32, shape=[len(values)])
    return gs.Graph(nodes=[gs.Node("Add", inputs=[x, c], outputs=[y])], inputs=[x], outputs=[y], opset=17)


def test_fp16_safe_clamps_fills_and_keeps_nan():
    g = _const_graph([np.finfo(np.float32).min, -np.inf, 3.0, np.nan, 1e9])
    out = passes.fp16_safe(g)
    vals = out.tensors()["fill"].values
    assert vals[0] == -FP16_MAX and vals[1] == -FP16_MAX and vals[2] == 3.0 and np.isnan(vals[3])
    assert vals[4] == FP16_MAX
    assert g.tensors()["fill"].values[0] == np.finfo(np.float32).min, "input graph untouched"
    assert np.all(np.abs(vals[~np.isnan(vals)]) <= FP16_MAX)
    with np.errstate(over="ignore"):
        assert np.all(np.isfinite(vals[~np.isnan(vals)].astype(np.float16)))


def test_ctx_scatter_function_is_a_scatter_over_batch_head_position():
    """The qaic cache write, run on ONNX Runtime (which inlines the function)."""
    fn = _ctx_scatter_function()
    data = gs.Variable("data", np.float32, [2, 3, 8, 4])
    pos = gs.Variable("pos", np.int64, [2, 2])
    upd = gs.Variable("upd", np.float32, [2, 3, 2, 4])
    out = gs.Variable("out", np.float32, [2, 3, 8, 4])
    node = gs.Node("CtxScatter", domain=QAIC_DOMAIN, inputs=[data, pos, upd], outputs=[out])
    g = gs.Graph(nodes=[node], inputs=[data, pos, upd], outputs=[out], functions=[fn], opset=17,
                 import_domains=[h.make_opsetid("", 17), h.make_opsetid(QAIC_DOMAIN, 1)])
    rng = np.random.default_rng(0)
    d = rng.standard_normal((2, 3, 8, 4)).astype(np.float32)
    u = rng.standard_normal((2, 3, 2, 4)).astype(np.float32)
    p = np.array([[5, 6], [0, 7]])
    got = _session(g).run(None, {"data": d, "pos": p, "upd": u})[0]
    want = d.copy()
    for b in range(2):
        for j in range(2):
            want[b, :, p[b, j]] = u[b, :, j]
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("target,opset", [("qaic", 17), ("ort", 24)])
def test_lower_sets_opset_and_cache_write_form(fixture_path, target, opset):
    g, det = _load(fixture_path("llama_dynamo"))  # opset 20, ReduceMean with an axes input
    g = passes.retained_kv(g, det)
    out = passes.lower(g, det, target, source_opset=20)
    assert out.opset == opset
    ops = [n.op for n in out.nodes]
    assert CACHE_WRITE not in ops
    if target == "qaic":
        assert ops.count("CtxScatter") == 4 and [f.name for f in out.functions] == ["CtxScatter"]
        assert all("axes" in n.attrs and len(n.inputs) == 1 for n in out.nodes if n.op == "ReduceMean")
    else:
        scatters = [n for n in out.nodes if n.op == "TensorScatter"]
        assert len(scatters) == 4 and all(n.attrs["mode"] == "circular" for n in scatters)


def _gelu_graph(approx, dtype=np.float32):
    x = gs.Variable("x", dtype, [5])
    y = gs.Variable("y", dtype, [5])
    return gs.Graph(nodes=[gs.Node("Gelu", attrs={"approximate": approx}, inputs=[x], outputs=[y])],
                    inputs=[x], outputs=[y], opset=20)


@pytest.mark.parametrize("dtype,tol", [(np.float32, 1e-5), (np.float16, 2e-3)])
@pytest.mark.parametrize("approx", ["none", "tanh"])
def test_lower_qaic_decomposes_gelu(approx, dtype, tol):
    x = np.linspace(-3, 3, 5).astype(dtype)
    want = _session(_gelu_graph(approx)).run(None, {"x": x.astype(np.float32)})[0]
    low = passes.lower(_gelu_graph(approx, dtype), None, "qaic", source_opset=20)
    assert "Gelu" not in [n.op for n in low.nodes]
    got = _session(low).run(None, {"x": x})[0]
    assert got.dtype == dtype
    np.testing.assert_allclose(got.astype(np.float32), want, atol=tol)


def test_lower_qaic_refuses_ops_without_an_opset17_form():
    x = gs.Variable("x", np.float32, [2, 3])
    y = gs.Variable("y", np.float32, [2, 3])
    g = gs.Graph(nodes=[gs.Node("RMSNormalization", name="norm", inputs=[x, gs.Constant("s", np.ones(3, np.float32))],
                                outputs=[y])], inputs=[x], outputs=[y], opset=23)
    with pytest.raises(Exception, match="RMSNormalization.*no opset-17 form"):
        passes.lower(g, None, "qaic", source_opset=23)


def test_cleanup_removes_dead_nodes_and_sorts():
    x = gs.Variable("x", np.float32, [2])
    a = gs.Variable("a", np.float32, [2])
    dead = gs.Variable("dead", np.float32, [2])
    y = gs.Variable("y", np.float32, [2])
    nodes = [gs.Node("Relu", name="second", inputs=[a], outputs=[y]),
             gs.Node("Neg", name="unused", inputs=[x], outputs=[dead]),
             gs.Node("Abs", name="first", inputs=[x], outputs=[a])]
    g = gs.Graph(nodes=nodes, inputs=[x], outputs=[y], opset=17)
    out = passes.cleanup(g)
    assert [n.name for n in out.nodes] == ["first", "second"]
    assert len(g.nodes) == 3
