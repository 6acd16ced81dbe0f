"""Pass gather_rotate_half (ort): each rotary ``rotate_half(x) * sin`` becomes
``Gather(x, perm) * (sin * sign)``, bit for bit the export's products (both layouts), the signed
sin computed once per call; anything not exactly that form is left alone with the reason."""
from __future__ import annotations

import dataclasses

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import onnxruntime as ort
import pytest
from pass_helpers import serialized, session
from qaic_helpers import assert_same_outputs, pipeline_until

from specdec_compile import passes, pipeline
from specdec_compile.passes import PassContext
from specdec_compile.passes.gather_rotate_half import find_sites, permutation
from specdec_compile.verify import verify
from specdec_compile.options import Options

ROTARY = ["llama_gqa", "llama_dynamo", "qwen2", "mistral", "phi3", "gpt_neox", "llama3_rope", "qwen2_yarn"]


def _count(g, op: str) -> int:
    return sum(1 for n in g.nodes if n.op == op)


@pytest.mark.parametrize("name", ROTARY)
def test_every_rotation_gathers_and_is_bit_for_bit(fixture_path, name):
    """q and k of every layer (partial rotary included: Phi-3's and GPT-NeoX's slices); the input
    graph untouched; no Neg left; every output (logits, each cache, padding included) the same
    bits as before the pass."""
    g, ctx = pipeline_until(fixture_path(name), "gather_rotate_half", target="ort")
    sites, skipped = find_sites(g)
    assert len(sites) == 2 * ctx.detection.info.num_layers and not skipped, skipped
    before = serialized(g)
    out = passes.gather_rotate_half(g, ctx)
    assert serialized(g) == before
    assert _count(out, "Neg") == 0 and _count(out, "Gather") - _count(g, "Gather") == len(sites)
    assert len(out.nodes) - len(g.nodes) <= -3 * len(sites) + len({id(s.other) for s in sites})
    assert_same_outputs(g, out, atol=0.0)


def _pairs(sin_last: int = 4):
    """y = rotate_pairs(x) * s, Cohere's layout (stack((-x[..., 1::2], x[..., ::2]), -1).flatten(-2))
    on x [B, 2, S, 4], s [B, 1, S, sin_last]."""
    x = gs.Variable("x", np.float32, ["B", 2, "S", 4])
    s = gs.Variable("s", np.float32, ["B", 1, "S", sin_last])
    t = {k: gs.Variable(k, np.float32) for k in ("o", "e", "n", "u1", "u2", "c", "r")}
    y = gs.Variable("y", np.float32)
    c = lambda name, v: gs.Constant(name, np.array(v, np.int64))  # noqa: E731
    nodes = [gs.Node("Slice", name="odd", inputs=[x, c("o0", [1]), c("o1", [4]), c("oa", [-1]), c("os", [2])],
                     outputs=[t["o"]]),
             gs.Node("Slice", name="even", inputs=[x, c("e0", [0]), c("e1", [4]), c("ea", [-1]), c("es", [2])],
                     outputs=[t["e"]]),
             gs.Node("Neg", name="neg", inputs=[t["o"]], outputs=[t["n"]]),
             gs.Node("Unsqueeze", name="u1", inputs=[t["n"], c("a1", [-1])], outputs=[t["u1"]]),
             gs.Node("Unsqueeze", name="u2", inputs=[t["e"], c("a2", [-1])], outputs=[t["u2"]]),
             gs.Node("Concat", name="cat", attrs={"axis": -1}, inputs=[t["u1"], t["u2"]], outputs=[t["c"]]),
             gs.Node("Reshape", name="flat", inputs=[t["c"], c("shape", [0, 2, 0, 4])], outputs=[t["r"]]),
             gs.Node("Mul", name="rot", inputs=[s, t["r"]], outputs=[y])]
    return gs.Graph(nodes=nodes, inputs=[x, s], outputs=[y], opset=17)


def test_the_interleaved_layout_too():
    """Cohere's rotate_half over interleaved pairs: pairs swapped by the Gather, odd signs; bit for bit."""
    g = _pairs()
    sites, skipped = find_sites(g)
    assert len(sites) == 1 and sites[0].interleaved and not skipped, skipped
    out = passes.gather_rotate_half(g, PassContext())
    assert _count(out, "Neg") == 0
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 2, 3, 4)).astype(np.float32)
    s = rng.standard_normal((2, 1, 3, 4)).astype(np.float32)
    want = s * np.stack([-x[..., 1::2], x[..., 0::2]], -1).reshape(2, 2, 3, 4)
    got = session(out).run(None, {"x": x, "s": s})[0]
    assert got.tobytes() == want.tobytes() == session(g).run(None, {"x": x, "s": s})[0].tobytes()


def test_cohere_whose_sin_width_inference_cannot_tell_is_left_alone():
    """Cohere (coverage row) builds its sin per call through repeat_interleave: shape inference
    cannot say its last axis is d (it could broadcast), so its rotations stay, with the reason."""
    from families import rows
    from matrix import export_row
    row = next(r for r in rows()[0] if r.id == "cohere")
    g, ctx = pipeline_until(export_row(row), "gather_rotate_half", target="ort")
    sites, skipped = find_sites(g)
    assert sites == [] and len(skipped) == 2 * ctx.detection.info.num_layers
    assert all("last axis is not" in why for _, why in skipped)


def test_permutation_and_sign_are_rotate_half():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 8)).astype(np.float32)
    perm, sign = permutation(8, False)
    np.testing.assert_array_equal(x[:, perm] * sign, np.concatenate([-x[:, 4:], x[:, :4]], -1))
    perm, sign = permutation(8, True)
    want = np.stack([-x[:, 1::2], x[:, 0::2]], -1).reshape(2, 8)
    np.testing.assert_array_equal(x[:, perm] * sign, want)


def test_the_compiled_graph_is_the_export_bit_for_bit(fixture_path):
    """The whole default ort pipeline against the original export: max |diff| 0 (the pass changes no
    rounding); one signed sin for every layer's q and k; no Neg in what ONNX Runtime runs."""
    model = pipeline.compile_model(str(fixture_path("llama_gqa")), Options(role="tlm", target="ort", k=3, ctx_len=64))
    nodes = model.graph.node
    assert not any(n.op_type == "Neg" for n in nodes)
    assert sum(n.op_type == "Mul" and "signed" in n.name for n in nodes) == 1
    report = verify(fixture_path("llama_gqa"), model, k=3, prefill_len=16, ctx_len=64,
                    original_source=fixture_path("llama_gqa"))
    assert report.ok and report.max_logits_diff == 0.0, report.per_shape()


def test_onnx_runtime_runs_it_as_gathers(fixture_path, tmp_path):
    model = pipeline.compile_model(str(fixture_path("llama_gqa")), Options(role="dlm", target="ort", ctx_len=64))
    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    ops = [n.op_type for n in onnx.load(str(tmp_path / "optimized.onnx")).graph.node]
    assert "Neg" not in ops and ops.count("Gather") >= 4


def test_with_fuse_rotary_on_nothing_is_left_for_it(fixture_path):
    """fuse_rotary (opt-in) runs first and takes every rotation it fuses."""
    model = pipeline.compile_model(str(fixture_path("llama_gqa")),
                                   Options(role="dlm", target="ort", ctx_len=64), fuse_rotary=True)
    assert sum(n.op_type == "RotaryEmbedding" for n in model.graph.node) == 4
    assert not any("rotate_half" in n.name for n in model.graph.node)


def _hand_made(sin_last: int = 4, extra_reader: bool = False):
    """y = rotate_half(x) * s on x [B, 2, S, 4], s [B, 1, S, sin_last]."""
    x = gs.Variable("x", np.float32, ["B", 2, "S", 4])
    s = gs.Variable("s", np.float32, ["B", 1, "S", sin_last])
    t = {k: gs.Variable(k, np.float32) for k in ("a", "b", "n", "c")}
    y = gs.Variable("y", np.float32)
    c = lambda name, v: gs.Constant(name, np.array(v, np.int64))  # noqa: E731
    nodes = [gs.Node("Slice", name="hi", inputs=[x, c("h0", [2]), c("h1", [4]), c("ax", [-1])], outputs=[t["a"]]),
             gs.Node("Slice", name="lo", inputs=[x, c("l0", [0]), c("l1", [2]), c("ax2", [-1])], outputs=[t["b"]]),
             gs.Node("Neg", name="neg", inputs=[t["a"]], outputs=[t["n"]]),
             gs.Node("Concat", name="cat", attrs={"axis": -1}, inputs=[t["n"], t["b"]], outputs=[t["c"]]),
             gs.Node("Mul", name="rot", inputs=[t["c"], s], outputs=[y])]
    outs = [y]
    if extra_reader:
        z = gs.Variable("z", np.float32)
        nodes.append(gs.Node("Abs", name="other", inputs=[t["c"]], outputs=[z]))
        outs.append(z)
    return gs.Graph(nodes=nodes, inputs=[x, s], outputs=outs, opset=17)


def test_a_hand_made_rotation_with_negative_zeros_and_infinities():
    """Bit for bit even where -0.0 and inf meet the sign; NaN stays NaN."""
    g = _hand_made()
    out = passes.gather_rotate_half(g, PassContext())
    assert _count(out, "Neg") == 0
    x = np.array([0.0, -0.0, np.inf, 3.0, -1.5, 0.0, -np.inf, np.nan] * 3, np.float32).reshape(1, 2, 3, 4)
    s = np.array([1.0, -0.0, 2.0, -3.0, np.inf, 0.5] * 2, np.float32).reshape(1, 1, 3, 4)
    got = session(out).run(None, {"x": x, "s": s})[0]
    want = session(g).run(None, {"x": x, "s": s})[0]
    nan = np.isnan(want)
    assert np.array_equal(nan, np.isnan(got))            # a NaN stays a NaN (its sign bit means nothing)
    assert got[~nan].tobytes() == want[~nan].tobytes()   # every number, -0.0 and inf included, the same bits


@pytest.mark.parametrize("kwargs,why", [
    ({"sin_last": 1}, "last axis is not 4"),          # a broadcast sin: the sign would belong on x's side
    ({"extra_reader": True}, "read elsewhere too"),
])
def test_anything_else_is_left_alone_with_the_reason(kwargs, why):
    g = _hand_made(**kwargs)
    sites, skipped = find_sites(g)
    assert sites == [] and len(skipped) == 1 and why in skipped[0][1], skipped
    assert serialized(passes.gather_rotate_half(g, PassContext())) == serialized(g)


def test_no_rotate_half_is_a_no_op(fixture_path):
    g, ctx = pipeline_until(fixture_path("gpt2"), "gather_rotate_half", target="ort")
    assert find_sites(g) == ([], [])
    assert passes.gather_rotate_half(g, ctx) is g


def test_needs_only_a_context():
    with pytest.raises(TypeError, match="PassContext"):
        passes.gather_rotate_half(None, None)
    assert passes.get("gather_rotate_half").targets == ("ort",)      # openvino fuses the export's form
    assert dataclasses.is_dataclass(PassContext())
