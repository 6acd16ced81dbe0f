"""Pass fold_static_shapes (qaic): integer shape arithmetic with a static answer becomes a constant."""
from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs
import pytest
from pass_helpers import serialized, session
from qaic_helpers import assert_same_outputs, pipeline_until

from specdec_compile import passes
from specdec_compile.passes import PassContext


def _repeat_interleave_index(d_static=True):
    """indices of repeat_interleave(2) over the last axis of x [b, d], built the
    way torch exports it: ConstantOfShape/ReduceMax/Range/Less/NonZero from Shape(x)."""
    x = gs.Variable("x", np.float32, ["b", 4 if d_static else "d"])
    t = {n: gs.Variable(n) for n in ("shape", "d", "d1", "reps", "mx", "rng", "reps2", "less", "nz", "idx")}
    i64 = lambda name, v: gs.Constant(name, np.array(v, dtype=np.int64))  # noqa: E731
    nodes = [
        gs.Node("Shape", inputs=[x], outputs=[t["shape"]]),
        gs.Node("Gather", attrs={"axis": 0}, inputs=[t["shape"], i64("one", 1)], outputs=[t["d"]]),
        gs.Node("Unsqueeze", inputs=[t["d"], i64("ax0", [0])], outputs=[t["d1"]]),
        gs.Node("ConstantOfShape", attrs={"value": gs.Constant("two", np.array([2], np.int64))},
                inputs=[t["d1"]], outputs=[t["reps"]]),
        gs.Node("ReduceMax", attrs={"keepdims": 0}, inputs=[t["reps"]], outputs=[t["mx"]]),
        gs.Node("Range", inputs=[i64("zero", 0), t["mx"], i64("step", 1)], outputs=[t["rng"]]),
        gs.Node("Unsqueeze", inputs=[t["reps"], i64("ax1", [1])], outputs=[t["reps2"]]),
        gs.Node("Less", inputs=[t["rng"], t["reps2"]], outputs=[t["less"]]),
        gs.Node("NonZero", inputs=[t["less"]], outputs=[t["nz"]]),
        gs.Node("Gather", attrs={"axis": 0}, inputs=[t["nz"], i64("row0", 0)], outputs=[t["idx"]]),
    ]
    y = gs.Variable("y", np.float32)
    nodes.append(gs.Node("Gather", attrs={"axis": 1}, inputs=[x, t["idx"]], outputs=[y]))
    return gs.Graph(nodes=nodes, inputs=[x], outputs=[y], opset=17)


def test_a_static_repeat_interleave_index_loses_its_nonzero():
    g = _repeat_interleave_index()
    before = serialized(g)
    out = passes.fold_static_shapes(g, PassContext())
    assert serialized(g) == before
    assert [n.op for n in out.nodes] == ["Gather"], "only the data gather is left"
    index = out.nodes[0].inputs[1]
    assert isinstance(index, gs.Constant) and index.values.tolist() == [0, 0, 1, 1, 2, 2, 3, 3]
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    np.testing.assert_array_equal(session(out).run(None, {"x": x})[0], session(g).run(None, {"x": x})[0])


def test_a_dim_only_known_at_run_time_is_not_folded():
    g = _repeat_interleave_index(d_static=False)
    out = passes.fold_static_shapes(g, PassContext())
    assert "NonZero" in [n.op for n in out.nodes]


def test_float_arithmetic_is_never_folded():
    x = gs.Variable("x", np.float32, [2, 3])
    s, f, y = gs.Variable("s"), gs.Variable("f"), gs.Variable("y", np.float32)
    g = gs.Graph(nodes=[gs.Node("Shape", inputs=[x], outputs=[s]),
                        gs.Node("Cast", attrs={"to": 1}, inputs=[s], outputs=[f]),
                        gs.Node("Sqrt", inputs=[f], outputs=[y])], inputs=[x], outputs=[y], opset=17)
    out = passes.fold_static_shapes(g, PassContext())
    assert [n.op for n in out.nodes] == ["Cast", "Sqrt"], "the int Shape folds, the float ops stay"


@pytest.mark.parametrize("name", ["llama_gqa", "gptj", "llama_dynamo"])
def test_fixtures_keep_their_outputs(fixture_path, name):
    g, ctx = pipeline_until(fixture_path(name), "fold_static_shapes")
    out = passes.fold_static_shapes(g, ctx)
    assert len(out.nodes) <= len(g.nodes)
    assert_same_outputs(g, out)
