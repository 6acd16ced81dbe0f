"""Pass greater_compares (qaic): LessOrEqual(a, b) becomes GreaterOrEqual(b, a)."""
from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs
import pytest
from pass_helpers import serialized, session
from qaic_helpers import assert_same_outputs, pipeline_until

from specdec_compile import passes
from specdec_compile.passes import PassContext


def _with_less_or_equal(g):
    """The position mask in its earlier form: ``c <= p`` as LessOrEqual(slots, query)
    instead of GreaterOrEqual(query, slots)."""
    for n in g.nodes:
        if n.op == "GreaterOrEqual" and n.name.startswith("specdec/mask/visible"):
            a, b = n.inputs[0], n.inputs[1]
            n.op = "LessOrEqual"
            n.inputs[0], n.inputs[1] = b, a
    return g


@pytest.mark.parametrize("name", ["llama_gqa", "gpt2", "codegen", "mistral"])
def test_the_position_mask_compares_with_greater_or_equal(fixture_path, name):
    g, ctx = pipeline_until(fixture_path(name), "greater_compares")
    g = _with_less_or_equal(g)
    assert any(n.op == "LessOrEqual" for n in g.nodes)
    before = serialized(g)
    out = passes.greater_compares(g, ctx)
    assert serialized(g) == before
    assert not any(n.op == "LessOrEqual" for n in out.nodes)
    assert_same_outputs(g, out)


@pytest.mark.parametrize("dtype", [np.int64, np.float32])
def test_same_truth_table_nan_included(dtype):
    a, b = gs.Variable("a", dtype, [6]), gs.Variable("b", dtype, [6])
    le, y = gs.Variable("le", bool, [6]), gs.Variable("y", dtype, [6])
    g = gs.Graph(nodes=[gs.Node("LessOrEqual", name="le", inputs=[a, b], outputs=[le]),
                        gs.Node("Where", name="w", inputs=[le, a, b], outputs=[y])],
                 inputs=[a, b], outputs=[le, y], opset=17)
    out = passes.greater_compares(g, PassContext())
    assert [n.op for n in out.nodes] == ["GreaterOrEqual", "Where"]
    if dtype == np.float32:
        feeds = {"a": np.array([1, 2, 3, np.nan, 0, -np.inf], dtype), "b": np.array([2, 2, 1, 0, np.nan, 5], dtype)}
    else:
        feeds = {"a": np.array([1, 2, 3, -1, 0, 7], dtype), "b": np.array([2, 2, 1, 0, -1, 5], dtype)}
    for x, y in zip(session(g).run(None, feeds), session(out).run(None, feeds)):
        np.testing.assert_array_equal(x, y)
