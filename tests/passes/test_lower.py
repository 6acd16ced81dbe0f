"""Pass lower: the target form (qaic: opset 17 + CtxScatter; ort: opset 24 + TensorScatter;
openvino: opset 17 + ScatterElements)."""
from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs
import pytest
from onnx import helper as h
from pass_helpers import ctx, load, session

from specdec_compile import passes
from specdec_compile.contract import CACHE_WRITE, QAIC_DOMAIN
from specdec_compile.errors import SpecdecError
from specdec_compile.passes import PassContext
from specdec_compile.passes.lower import _ctx_scatter_function


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
    got = session(g).run(None, {"data": d, "pos": p, "upd": u})[0]
    want = d.copy()
    for b in range(2):
        for j in range(2):
            want[b, :, p[b, j]] = u[b, :, j]
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("target,opset", [("qaic", 17), ("ort", 24), ("openvino", 17)])
def test_lower_sets_opset_and_cache_write_form(fixture_path, target, opset):
    g, det = load(fixture_path("llama_dynamo"))  # opset 20, ReduceMean with an axes input
    g = passes.retained_kv(g, ctx(det))
    out = passes.lower(g, ctx(det, target=target, source_opset=20))
    assert out.opset == opset
    ops = [n.op for n in out.nodes]
    assert CACHE_WRITE not in ops
    if target == "qaic":
        assert ops.count("CtxScatter") == 4 and [f.name for f in out.functions] == ["CtxScatter"]
        assert all("axes" in n.attrs and len(n.inputs) == 1 for n in out.nodes if n.op == "ReduceMean")
    elif target == "openvino":   # ScatterElements over the slots, opset-17 forms, no function
        scatters = [n for n in out.nodes if n.op == "ScatterElements"]
        assert len(scatters) == 4 and all(n.attrs["axis"] == 2 for n in scatters) and not out.functions
        assert all(n.inputs[1].shape is None or len(n.inputs[1].shape) == 4 for n in scatters)
        assert all("axes" in n.attrs and len(n.inputs) == 1 for n in out.nodes if n.op == "ReduceMean")
        assert "TensorScatter" not in ops and "CtxScatter" not in ops
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
    want = session(_gelu_graph(approx)).run(None, {"x": x.astype(np.float32)})[0]
    low = passes.lower(_gelu_graph(approx, dtype), PassContext(target="qaic", source_opset=20))
    assert "Gelu" not in [n.op for n in low.nodes]
    got = session(low).run(None, {"x": x})[0]
    assert got.dtype == dtype
    np.testing.assert_allclose(got.astype(np.float32), want, atol=tol)


def test_lower_qaic_refuses_ops_without_an_opset17_form():
    x = gs.Variable("x", np.float32, [2, 3])
    y = gs.Variable("y", np.float32, [2, 3])
    g = gs.Graph(nodes=[gs.Node("RMSNormalization", name="norm", inputs=[x, gs.Constant("s", np.ones(3, np.float32))],
                                outputs=[y])], inputs=[x], outputs=[y], opset=23)
    with pytest.raises(Exception, match="RMSNormalization.*no opset-17 form"):
        passes.lower(g, PassContext(target="qaic", source_opset=23))


def test_lower_takes_the_source_opset_from_the_graph_when_the_context_has_none():
    """Without ctx.source_opset the graph's own opset is the source (here 20: Gelu is lowered)."""
    low = passes.lower(_gelu_graph("none"), PassContext(target="qaic"))
    assert low.opset == 17 and "Gelu" not in [n.op for n in low.nodes]


def test_lower_needs_a_target():
    with pytest.raises(SpecdecError, match=r"pass lower needs ctx\.target"):
        passes.lower(_gelu_graph("none"), PassContext())


def test_lower_qaic_split_num_outputs_takes_the_dim_from_shape_inference():
    """Split-18 num_outputs over a dim the graph does not annotate but inference knows
    (dynamo's Phi-3 gate_up split): Split-13 with equal sizes."""
    x = gs.Variable("x", np.float32, ["b", 3])
    h = gs.Variable("h")
    a, c = gs.Variable("a", np.float32), gs.Variable("c", np.float32)
    g = gs.Graph(nodes=[gs.Node("MatMul", inputs=[x, gs.Constant("w", np.ones((3, 8), np.float32))], outputs=[h]),
                        gs.Node("Split", name="split", attrs={"axis": 1, "num_outputs": 2}, inputs=[h],
                                outputs=[a, c])], inputs=[x], outputs=[a, c], opset=20)
    low = passes.lower(g, PassContext(target="qaic", source_opset=20))
    split = next(n for n in low.nodes if n.op == "Split")
    assert "num_outputs" not in split.attrs and split.inputs[1].values.tolist() == [4, 4]
    feeds = {"x": np.arange(6, dtype=np.float32).reshape(2, 3)}
    got = session(low).run(None, feeds)
    want = np.arange(6, dtype=np.float32).reshape(2, 3) @ np.ones((3, 8), np.float32)
    np.testing.assert_array_equal(got[0], want[:, :4])


@pytest.mark.parametrize("name", ["llama_gqa", "gpt2"])
def test_ort_guard_index_is_expanded_once_for_every_write(fixture_path, name):
    """ort: the padding guard's old-slot index is expanded to [B, kv_heads, S, d] once (K and V
    share their shape here), not per write; every guard gathers with it, and padding still leaves
    the cache as it was (qaic_helpers' feeds pad row 0; the comparison is with the export's
    own per-write form, computed by reading each update's shape)."""
    from qaic_helpers import assert_same_outputs, pipeline_until

    import importlib
    lower_mod = importlib.import_module("specdec_compile.passes.lower")
    g, c = pipeline_until(fixture_path(name), "lower", target="ort")
    out = passes.lower(g, c)
    gathers = [n for n in out.nodes if n.op == "GatherElements"]
    indices = {id(n.inputs[1]) for n in gathers}
    assert len(gathers) == 2 * c.detection.info.num_layers and len(indices) == 1
    assert not any(n.op == "Shape" and n.name.endswith("update_shape") for n in out.nodes)
    per_write = lower_mod._shared_index
    try:
        lower_mod._shared_index = lambda *a: None          # the per-write form, as before
        ref = passes.lower(g, c)
    finally:
        lower_mod._shared_index = per_write
    assert len({id(n.inputs[1]) for n in ref.nodes if n.op == "GatherElements"}) == len(gathers)
    assert_same_outputs(ref, out, atol=0.0)
