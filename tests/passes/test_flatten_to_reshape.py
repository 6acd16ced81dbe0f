"""Pass flatten_to_reshape (qaic): Flatten becomes Reshape with one side's static
product and -1 for the other; a Flatten whose dims allow neither is left alone."""
from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs
import pytest
from pass_helpers import serialized, session

from specdec_compile import passes
from specdec_compile.passes import PassContext


def _flatten(shape, axis):
    x = gs.Variable("x", np.float32, shape)
    y = gs.Variable("y", np.float32)
    return gs.Graph(nodes=[gs.Node("Flatten", name="flat", attrs={"axis": axis}, inputs=[x], outputs=[y])],
                    inputs=[x], outputs=[y], opset=17)


@pytest.mark.parametrize("shape,axis,target,run", [
    (["t", 2, 1], 2, [-1, 1], [5, 2, 1]),      # the MoE weight table: [T, K, 1] -> [T*K, 1]
    (["t", 2], 2, [-1, 1], [5, 2]),            # axis = rank: the trailing product is 1
    (["t", 3, 4], 1, [-1, 12], [2, 3, 4]),
    (["t", 3, 4], -1, [-1, 4], [2, 3, 4]),
    ([2, 3, "s"], 2, [6, -1], [2, 3, 5]),      # trailing dim symbolic: the leading side is static
    (["b", 3, "s"], 0, [1, -1], [2, 3, 5]),    # axis 0: nothing before it, so [1, -1]
    (["b", 3, "s"], 1, None, None),            # neither side static: left alone
])
def test_flatten_becomes_reshape_with_the_same_result(shape, axis, target, run):
    g = _flatten(shape, axis)
    before = serialized(g)
    out = passes.flatten_to_reshape(g, PassContext())
    assert serialized(g) == before
    if run is None:  # neither side static: left alone
        assert [n.op for n in out.nodes] == ["Flatten"]
        return
    node = next(n for n in out.nodes if n.op == "Reshape")
    assert node.inputs[1].values.tolist() == target
    x = np.arange(np.prod(run), dtype=np.float32).reshape(run)
    np.testing.assert_array_equal(session(out).run(None, {"x": x})[0], session(g).run(None, {"x": x})[0])


def test_unknown_rank_and_zero_sized_sides_are_left_alone():
    assert [n.op for n in passes.flatten_to_reshape(_flatten(None, 1), PassContext()).nodes] == ["Flatten"]
    assert [n.op for n in passes.flatten_to_reshape(_flatten(["t", 0], 1), PassContext()).nodes] == ["Flatten"]
