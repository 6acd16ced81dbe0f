"""Pass tile_to_expand (qaic): Tile becomes Expand where every repeated axis is 1,
else Unsqueeze/Expand/Reshape; either way exact."""
from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs
import pytest
from pass_helpers import serialized, session
from qaic_helpers import assert_same_outputs, pipeline_until

from specdec_compile import passes
from specdec_compile.passes import PassContext


@pytest.mark.parametrize("name", ["gptj", "codegen"])
def test_gptj_position_tiles_become_expands(fixture_path, name):
    """The shape-derived position Tile (PR #1189's pattern) and repeat_interleave's Tile."""
    g, ctx = pipeline_until(fixture_path(name), "tile_to_expand")
    assert any(n.op == "Tile" for n in g.nodes)
    before = serialized(g)
    out = passes.tile_to_expand(g, ctx)
    assert serialized(g) == before
    assert not any(n.op == "Tile" for n in out.nodes)
    assert_same_outputs(g, out)


def _tile(x_shape, unsqueeze, repeats):
    x = gs.Variable("x", np.float32, x_shape)
    y = gs.Variable("y", np.float32)
    nodes, src = [], x
    if unsqueeze is not None:
        src = gs.Variable("u")
        nodes.append(gs.Node("Unsqueeze", name="u", inputs=[x, gs.Constant("ax", np.array(unsqueeze))],
                             outputs=[src]))
    n = gs.Variable("n", np.int64, [1])
    reps = gs.Variable("reps")
    nodes += [gs.Node("Concat", name="reps", attrs={"axis": 0},
                      inputs=[gs.Constant(f"r{i}", np.array([r])) if r is not None else n
                              for i, r in enumerate(repeats)], outputs=[reps]),
              gs.Node("Tile", name="tile", inputs=[src, reps], outputs=[y])]
    return gs.Graph(nodes=nodes, inputs=[x, n], outputs=[y], opset=17)


@pytest.mark.parametrize("x_shape,unsqueeze,repeats,expands", [
    ([2, 3], [-1], [1, 1, None], True),    # repeat the new last axis by a runtime count
    ([2, 3], [0], [None, 1, 1], True),
    ([2, 3], None, [None, 1], False),      # axis 0 has size 2: Expand would differ, so decompose
    (["b", 3], None, [1, None], False),    # axis 1 has size 3
    ([1, 3], None, [None, 1], True),       # a static size-1 axis
])
def test_expand_where_provably_equal_else_unsqueeze_expand_reshape(x_shape, unsqueeze, repeats, expands):
    g = _tile(x_shape, unsqueeze, repeats)
    out = passes.tile_to_expand(g, PassContext())
    ops = [n.op for n in out.nodes]
    assert "Tile" not in ops
    assert ("Reshape" not in ops) is expands, ops
    x = np.arange(np.prod([d if isinstance(d, int) else 2 for d in x_shape]), dtype=np.float32)
    feeds = {"x": x.reshape([d if isinstance(d, int) else 2 for d in x_shape]), "n": np.array([4])}
    np.testing.assert_array_equal(session(out).run(None, feeds)[0], session(g).run(None, feeds)[0])


def test_a_rank3_tile_with_constant_repeats_is_decomposed_exactly():
    x = gs.Variable("x", np.float32, ["a", 3, 2])
    y = gs.Variable("y", np.float32)
    g = gs.Graph(nodes=[gs.Node("Tile", name="tile", inputs=[x, gs.Constant("r", np.array([2, 3, 1]))], outputs=[y])],
                 inputs=[x], outputs=[y], opset=17)
    out = passes.tile_to_expand(g, PassContext())
    assert "Tile" not in [n.op for n in out.nodes]
    feeds = {"x": np.arange(24, dtype=np.float32).reshape(4, 3, 2)}
    np.testing.assert_array_equal(session(out).run(None, feeds)[0], np.tile(feeds["x"], (2, 3, 1)))
