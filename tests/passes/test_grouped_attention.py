"""Pass grouped_attention (ort): the repeated KV heads (Reshape(Expand(Unsqueeze(cache, [2]))))
are gone, the queries and attention weights are grouped instead; exact, and only where the
repeat is proven (every other form left alone, with the reason)."""
from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs
import pytest
from pass_helpers import serialized, session
from qaic_helpers import assert_same_outputs, pipeline_until

from specdec_compile import passes
from specdec_compile.graph_utils import producer
from specdec_compile.passes import PassContext
from specdec_compile.passes.grouped_attention import find_groups
from specdec_compile.options import Options


def _repeats(g: gs.Graph) -> int:
    return sum(1 for n in g.nodes if n.op == "Expand" and producer(n.inputs[0]) is not None
               and producer(n.inputs[0]).op == "Unsqueeze")


@pytest.mark.parametrize("name", ["llama_gqa", "llama_dynamo"])
def test_gqa_fixtures_read_the_cache_as_it_is(fixture_path, name):
    """optimum's SDPA form (Transpose, scalar scale) and the dynamo export's; keys and values,
    every layer; the outputs equal the repeated form's."""
    g, ctx = pipeline_until(fixture_path(name), "grouped_attention", target="ort")
    groups, skipped = find_groups(g, ctx)
    assert len(groups) == 2 * ctx.detection.info.num_layers and not skipped
    before = serialized(g)
    out = passes.grouped_attention(g, ctx)
    assert serialized(g) == before
    assert _repeats(g) - _repeats(out) == len(groups)
    assert not {grp.expand.name for grp in groups} & {n.name for n in out.nodes}
    caches = {t.name for t in out.outputs if t.name.endswith("_RetainedState")}
    for n in out.nodes:   # the products read the caches themselves (keys through their transpose)
        if n.op == "MatMul" and any(t.name in caches for t in n.inputs):
            assert n.inputs[1].name in caches
    assert_same_outputs(g, out)            # bit for bit: the same product per head


def test_no_grouped_heads_is_a_no_op(fixture_path):
    g, ctx = pipeline_until(fixture_path("gpt2"), "grouped_attention", target="ort")
    assert find_groups(g, ctx) == ([], [])
    out = passes.grouped_attention(g, ctx)
    assert serialized(out) == serialized(g)


def _attention(target=(1, 1, 2, 1, 1), q_heads=4, consumers=1, q_scale=None):
    """scores = q @ transpose(repeat(cache)) * 0.5 on a hand-made graph: cache [B, 2, S, 4]
    (``q_scale``: q scaled first, as SDPA exports do)."""
    cache = gs.Variable("cache", np.float32, ["B", 2, "S", 4])
    q_in = gs.Variable("q", np.float32, ["B", q_heads, "s", 4])
    q = q_in
    t = {k: gs.Variable(k) for k in ("u", "e", "r", "t", "m")}
    y = gs.Variable("y", np.float32)
    nodes = []
    if q_scale is not None:
        q = gs.Variable("qs", np.float32, ["B", q_heads, "s", 4])
        nodes.append(gs.Node("Mul", name="q_scale", inputs=[q_in, gs.Constant("qk", np.array(q_scale, np.float32))],
                             outputs=[q]))
    nodes += [gs.Node("Unsqueeze", name="unsq", inputs=[cache, gs.Constant("ax", np.array([2]))], outputs=[t["u"]]),
             gs.Node("Expand", name="expand", inputs=[t["u"], gs.Constant("tg", np.array(target))], outputs=[t["e"]]),
             gs.Node("Reshape", name="reshape", inputs=[t["e"], gs.Constant("sh", np.array([0, 4, -1, 4]))],
                     outputs=[t["r"]]),
             gs.Node("Transpose", name="tr", attrs={"perm": [0, 1, 3, 2]}, inputs=[t["r"]], outputs=[t["t"]]),
             gs.Node("Mul", name="scale", inputs=[t["t"], gs.Constant("half", np.array(0.5, np.float32))],
                     outputs=[t["m"]]),
             gs.Node("MatMul", name="scores", inputs=[q, t["m"]], outputs=[y])]
    outs = [y]
    if consumers == 2:
        z = gs.Variable("z", np.float32)
        nodes.append(gs.Node("Neg", name="other", inputs=[t["r"]], outputs=[z]))
        outs.append(z)
    return gs.Graph(nodes=nodes, inputs=[cache, q_in], outputs=outs, opset=17)


@pytest.mark.parametrize("q_scale", [None, 0.35355339])
def test_a_hand_made_repeat_is_grouped_and_equals_numpy(q_scale):
    g = _attention(q_scale=q_scale)
    out = passes.grouped_attention(g, PassContext(ctx_len=16))
    assert _repeats(out) == 0
    rng = np.random.default_rng(0)
    cache = rng.standard_normal((2, 2, 16, 4)).astype(np.float32)
    q = rng.standard_normal((2, 4, 3, 4)).astype(np.float32)
    want = (q * (q_scale or 1.0)) @ np.repeat(cache, 2, axis=1).transpose(0, 1, 3, 2) * 0.5
    got = session(out).run(None, {"cache": cache, "q": q})[0]
    np.testing.assert_allclose(got, want, atol=1e-5)
    np.testing.assert_array_equal(got, session(g).run(None, {"cache": cache, "q": q})[0])   # bit for bit
    assert not any(n.op == "Unsqueeze" for n in out.nodes)    # keys: [B, kvh, g*s, d] against the cache itself
    mm = next(n for n in out.nodes if n.op == "MatMul")
    assert mm.inputs[1].inputs[0].op == "Mul" and mm.inputs[1].inputs[0].inputs[0].inputs[0].op == "Transpose"
    if q_scale is not None:   # the scale stays right before the product (ORT folds it there), under the Reshape
        mm = next(n for n in out.nodes if n.op == "MatMul")
        scale = mm.inputs[0].inputs[0]
        assert scale.op == "Mul" and scale.inputs[0].inputs[0].op == "Reshape"


@pytest.mark.parametrize("kwargs,why", [
    ({"target": (2, 1, 2, 1, 1)}, "not [B, kvh, g, S, d]"),        # the batch axis could be broadcast too
    ({"target": (1, 1, 1, 1, 1)}, "repeat count is not static"),    # no repeat at all
    ({"q_heads": 1}, "first operand is not [B, 4"),                  # queries broadcast over the heads
    ({"consumers": 2}, "2 consumers"),                               # the repeated heads are read elsewhere too
])
def test_anything_not_exactly_the_repeat_is_left_alone_with_the_reason(kwargs, why):
    g = _attention(**kwargs)
    groups, skipped = find_groups(g, PassContext(ctx_len=16))
    assert groups == [] and len(skipped) == 1 and why in skipped[0][1], skipped
    assert serialized(passes.grouped_attention(g, PassContext(ctx_len=16))) == serialized(g)


def test_onnx_runtime_runs_the_products_on_the_cache_itself(fixture_path, tmp_path):
    """What the session actually runs (its optimized model dump): each cache is read through one
    FusedMatMul (the key product, its transpose and scale fused in), or through one Unsqueeze (a
    view) by the value product, a MatMul; nothing else reads a cache (no Expand, no copy)."""
    import onnx
    import onnxruntime as ort

    from specdec_compile import pipeline
    model = pipeline.compile_model(str(fixture_path("llama_gqa")), Options(role="dlm", target="ort", ctx_len=64))
    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.intra_op_num_threads = 1
    so.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    nodes = onnx.load(str(tmp_path / "optimized.onnx")).graph.node
    consumers: dict[str, list] = {}
    for n in nodes:
        for i in n.input:
            consumers.setdefault(i, []).append(n)
    caches = [o.name for o in model.graph.output if o.name.endswith("_RetainedState")]
    assert caches
    for name in caches:
        readers = consumers.get(name, [])
        if "key" in name:    # scores: the queries as [B, kvh, g*s, d] against the cache itself
            assert [n.op_type for n in readers] == ["FusedMatMul"], (name, [n.op_type for n in readers])
            assert {a.name: a.i for a in readers[0].attribute}["transB"] == 1
        else:                # values: the weights as [B, kvh, g, s, S] against a view of the cache
            assert [n.op_type for n in readers] == ["Unsqueeze"], (name, [n.op_type for n in readers])
            products = consumers.get(readers[0].output[0], [])
            assert [n.op_type for n in products] == ["MatMul"], (name, [n.op_type for n in products])
