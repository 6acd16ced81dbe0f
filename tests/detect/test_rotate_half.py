"""Finder: x*cos + rotate_half(x)*sin with cos/sin gathered from constant tables (the form
rotary_tables leaves), found exactly; every other form skipped with the reason."""
from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs
import pytest

from specdec_compile.detect.rotate_half import find_rotate_half

D, M = 8, 16


def _tables(halves_equal=True, dtype=np.float32):
    ang = np.random.default_rng(0).standard_normal((M, D // 2))
    second = ang if halves_equal else ang + 0.5
    both = np.concatenate([ang, second], -1)
    return np.cos(both).astype(dtype), np.sin(both).astype(dtype)


def _rotation(*, halves_equal=True, axes=1, neg_first=True, sin_row_other=False, dtype=np.float32,
              swap_mul=False, first_end=D // 2):
    """A graph with one rotation of x [B, 2, S, D] (options break one fact each)."""
    x = gs.Variable("x", np.float32, ["B", 2, "S", D])
    pos = gs.Variable("position_ids", np.int64, ["B", "S"])
    y = gs.Variable("y", np.float32, ["B", 2, "S", D])
    cos, sin = _tables(halves_equal, dtype)
    v = {k: gs.Variable(k) for k in ("row", "row2", "cr", "sr", "cu", "su", "x1", "x2", "n", "r", "a", "b")}
    c = lambda name, val: gs.Constant(name, np.array(val, np.int64))  # noqa: E731
    nodes = [gs.Node("Max", "max", inputs=[pos, c("zero", 0)], outputs=[v["row"]]),
             gs.Node("Max", "max2", inputs=[pos, c("zero2", 0)], outputs=[v["row2"]]),
             gs.Node("Gather", "gc", {"axis": 0}, [gs.Constant("COS", cos), v["row"]], [v["cr"]]),
             gs.Node("Gather", "gs", {"axis": 0}, [gs.Constant("SIN", sin), v["row2" if sin_row_other else "row"]],
                     [v["sr"]]),
             gs.Node("Unsqueeze", "uc", inputs=[v["cr"], c("ax", [axes])], outputs=[v["cu"]]),
             gs.Node("Unsqueeze", "us", inputs=[v["sr"], c("ax2", [axes])], outputs=[v["su"]]),
             gs.Node("Slice", "s1", inputs=[x, c("s1a", [0]), c("s1b", [first_end]), c("s1c", [-1]), c("s1d", [1])],
                     outputs=[v["x1"]]),
             gs.Node("Slice", "s2", inputs=[x, c("s2a", [D // 2]), c("s2b", [2**63 - 1]), c("s2c", [-1]),
                                            c("s2d", [1])], outputs=[v["x2"]]),
             gs.Node("Neg", "neg", inputs=[v["x2" if neg_first else "x1"]], outputs=[v["n"]]),
             gs.Node("Concat", "cat", {"axis": -1},
                     [v["n"], v["x1"]] if neg_first else [v["x2"], v["n"]], [v["r"]]),
             gs.Node("Mul", "mc", inputs=[v["cu"], x] if swap_mul else [x, v["cu"]], outputs=[v["a"]]),
             gs.Node("Mul", "ms", inputs=[v["r"], v["su"]], outputs=[v["b"]]),
             gs.Node("Add", "add", inputs=[v["b"], v["a"]] if swap_mul else [v["a"], v["b"]], outputs=[y])]
    return gs.Graph(nodes=nodes, inputs=[x, pos], outputs=[y], opset=24), pos


def _dims(g):
    return {"x": ["B", 2, "S", D], "position_ids": ["B", "S"], "y": ["B", 2, "S", D]}


@pytest.mark.parametrize("swap_mul", [False, True])
def test_finds_the_rotation_and_its_half_tables(swap_mul):
    g, pos = _rotation(swap_mul=swap_mul)
    sites, skipped = find_rotate_half(g, pos, _dims(g))
    assert skipped == [] and len(sites) == 1
    s = sites[0]
    cos, sin = _tables()
    assert s.add.name == "add" and s.x.name == "x" and s.dim == D
    np.testing.assert_array_equal(s.cos, cos[:, :D // 2])
    np.testing.assert_array_equal(s.sin, sin[:, :D // 2])


@pytest.mark.parametrize("kwargs, why", [
    ({"halves_equal": False}, "halves differ"),
    ({"axes": 2}, "not [1]"),
    ({"neg_first": False}, "not negated"),
    ({"sin_row_other": True}, "different rows"),
    ({"dtype": np.float16}, "only float32"),
    ({"first_end": D // 2 + 1}, "not the half"),
])
def test_anything_else_is_skipped_with_the_reason(kwargs, why):
    g, pos = _rotation(**kwargs)
    sites, skipped = find_rotate_half(g, pos, _dims(g))
    assert sites == [] and len(skipped) == 1 and why in skipped[0][1], skipped


def test_unknown_shapes_are_skipped():
    g, pos = _rotation()
    dims = _dims(g)
    dims["x"] = ["B", 2, "S", None]
    assert find_rotate_half(g, pos, dims)[0] == []
    dims = _dims(g)
    dims["y"] = ["B", 2, 3, D]      # the Add broadcasts: not x's shape
    sites, skipped = find_rotate_half(g, pos, dims)
    assert sites == [] and "do not share" in skipped[0][1]


def test_a_row_that_is_not_the_clamped_positions_is_skipped():
    g, pos = _rotation()
    other = gs.Variable("other", np.int64, ["B", "S"])
    g.inputs.append(other)
    next(n for n in g.nodes if n.name == "max").inputs[0] = other
    sites, skipped = find_rotate_half(g, pos, _dims(g))
    assert sites == [] and "Max(position_ids, 0)" in skipped[0][1]


def _interleaved(pairs_equal=True, odd_negated=True):
    """Cohere's layout: rotate = flatten(stack((-x[..., 1::2], x[..., ::2]), -1)), tables with
    each even column equal to the next (``repeat_interleave``)."""
    x = gs.Variable("x", np.float32, ["B", 2, "S", D])
    pos = gs.Variable("position_ids", np.int64, ["B", "S"])
    y = gs.Variable("y", np.float32, ["B", 2, "S", D])
    ang = np.random.default_rng(1).standard_normal((M, D // 2))
    both = np.repeat(ang, 2, axis=1) + (0 if pairs_equal else np.tile([0, 0.5], D // 2))
    cos, sin = np.cos(both).astype(np.float32), np.sin(both).astype(np.float32)
    v = {k: gs.Variable(k) for k in ("row", "cr", "sr", "cu", "su", "ev", "od", "n", "ue", "un", "c", "r", "a", "b")}
    c = lambda name, val: gs.Constant(name, np.array(val, np.int64))  # noqa: E731
    first, second = ("od", "ev") if odd_negated else ("ev", "od")
    nodes = [gs.Node("Max", "max", inputs=[pos, c("zero", 0)], outputs=[v["row"]]),
             gs.Node("Gather", "gc", {"axis": 0}, [gs.Constant("COS", cos), v["row"]], [v["cr"]]),
             gs.Node("Gather", "gs", {"axis": 0}, [gs.Constant("SIN", sin), v["row"]], [v["sr"]]),
             gs.Node("Unsqueeze", "uc", inputs=[v["cr"], c("ax", [1])], outputs=[v["cu"]]),
             gs.Node("Unsqueeze", "us", inputs=[v["sr"], c("ax2", [1])], outputs=[v["su"]]),
             gs.Node("Slice", "se", inputs=[x, c("a0", [0]), c("a1", [2**63 - 1]), c("a2", [-1]), c("a3", [2])],
                     outputs=[v["ev"]]),
             gs.Node("Slice", "so", inputs=[x, c("b0", [1]), c("b1", [2**63 - 1]), c("b2", [-1]), c("b3", [2])],
                     outputs=[v["od"]]),
             gs.Node("Neg", "neg", inputs=[v[first]], outputs=[v["n"]]),
             gs.Node("Unsqueeze", "un_", inputs=[v["n"], c("m1", [-1])], outputs=[v["un"]]),
             gs.Node("Unsqueeze", "ue_", inputs=[v[second], c("m2", [-1])], outputs=[v["ue"]]),
             gs.Node("Concat", "cat", {"axis": -1}, [v["un"], v["ue"]], [v["c"]]),
             gs.Node("Reshape", "flat", inputs=[v["c"], c("shape", [0, 0, 0, D])], outputs=[v["r"]]),
             gs.Node("Mul", "mc", inputs=[x, v["cu"]], outputs=[v["a"]]),
             gs.Node("Mul", "ms", inputs=[v["r"], v["su"]], outputs=[v["b"]]),
             gs.Node("Add", "add", inputs=[v["a"], v["b"]], outputs=[y])]
    g = gs.Graph(nodes=nodes, inputs=[x, pos], outputs=[y], opset=24)
    return g, pos, {**_dims(g), "r": ["B", 2, "S", D]}


def test_finds_the_interleaved_rotation_and_its_even_columns():
    g, pos, dims = _interleaved()
    sites, skipped = find_rotate_half(g, pos, dims)
    assert skipped == [] and len(sites) == 1 and sites[0].interleaved
    cos = next(n for n in g.nodes if n.name == "gc").inputs[0].values
    np.testing.assert_array_equal(sites[0].cos, cos[:, 0::2])


@pytest.mark.parametrize("kwargs, why", [({"pairs_equal": False}, "column pairs differ"),
                                         ({"odd_negated": False}, "not x[..., 1::2]")])
def test_an_interleaved_rotation_that_differs_is_skipped(kwargs, why):
    g, pos, dims = _interleaved(**kwargs)
    sites, skipped = find_rotate_half(g, pos, dims)
    assert sites == [] and why in skipped[0][1], skipped
    g, pos, dims = _interleaved()
    dims["r"] = ["B", 2, 1, D]
    assert "not x's shape" in find_rotate_half(g, pos, dims)[1][0][1]
