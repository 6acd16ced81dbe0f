"""Pass clamp_gather_positions (qaic): gathers indexed by positions read row Max(index, 0)."""
from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs
import pytest
from pass_helpers import serialized, session
from qaic_helpers import assert_same_outputs, pipeline_until

from specdec_compile import passes
from specdec_compile.errors import UnsupportedPatternError
from specdec_compile.passes import PassContext


@pytest.mark.parametrize("name,clamped", [("gpt2", 1), ("opt", 1), ("gptj", 1), ("codegen", 1),
                                          ("llama_gqa", 0), ("llama_dynamo", 0)])
def test_position_gathers_are_clamped(fixture_path, name, clamped):
    """GPT-2/OPT: the learned position table (OPT through +2); GPT-J/CodeGen: the
    sin/cos table (shared by the layers). The cache and last-token gathers are provably >= 0."""
    g, ctx = pipeline_until(fixture_path(name), "clamp_gather_positions", role="dlm")
    before = serialized(g)
    out = passes.clamp_gather_positions(g, ctx)
    assert serialized(g) == before
    rows = [n for n in out.nodes if n.name.startswith("specdec/clamp/row")]
    assert len(rows) == clamped and all(n.op == "Max" for n in rows)
    for n in rows:
        assert n.outputs[0].outputs[0].op in ("Gather", "GatherElements")
    assert_same_outputs(g, out, padded_logits=False)


def _gather(index_op=None, const=None):
    pos = gs.Variable("position_ids", np.int64, ["b", "s"])
    table = gs.Constant("table", np.arange(40, dtype=np.float32).reshape(10, 4))
    y = gs.Variable("y", np.float32)
    nodes, index = [], pos
    if index_op is not None:
        index = gs.Variable("index")
        nodes.append(gs.Node(index_op, name="index", inputs=[pos, gs.Constant("k", np.array(const))],
                             outputs=[index]))
    nodes.append(gs.Node("Gather", name="gather", attrs={"axis": 0}, inputs=[table, index], outputs=[y]))
    return gs.Graph(nodes=nodes, inputs=[pos], outputs=[y], opset=17)


def test_padding_reads_row_zero_and_valid_rows_are_kept():
    g = _gather()
    out = passes.clamp_gather_positions(g, PassContext())
    pos = np.array([[3, 4, -1]])
    got = session(out).run(None, {"position_ids": pos})[0]
    table = np.arange(40, dtype=np.float32).reshape(10, 4)
    np.testing.assert_array_equal(got[0], table[[3, 4, 0]])
    assert session(g).run(None, {"position_ids": pos})[0][0, 2].tolist() == table[9].tolist(), \
        "without the clamp ONNX wraps -1 to the last row"


@pytest.mark.parametrize("op,k", [("Sub", 3), ("Mul", -1), ("Add", -2)])
def test_other_position_arithmetic_is_refused(op, k):
    """pos - 3 is negative for valid positions 0..2: clamping it would change them."""
    with pytest.raises(UnsupportedPatternError, match="Gather node 'gather' is indexed by a value computed"):
        passes.clamp_gather_positions(_gather(op, k), PassContext())


def test_a_positive_offset_is_clamped_and_exact():
    g = _gather("Add", 2)
    out = passes.clamp_gather_positions(g, PassContext())
    pos = np.array([[0, 5, -1]])
    np.testing.assert_array_equal(session(out).run(None, {"position_ids": pos})[0],
                                  session(g).run(None, {"position_ids": pos})[0])


def test_a_graph_without_positions_is_left_alone():
    x = gs.Variable("x", np.int64, [2])
    y = gs.Variable("y", np.float32)
    g = gs.Graph(nodes=[gs.Node("Gather", inputs=[gs.Constant("t", np.ones((3, 2), np.float32)), x], outputs=[y])],
                 inputs=[x], outputs=[y], opset=17)
    assert passes.clamp_gather_positions(g, PassContext()) is g
