"""Pass share_shapes (ort): reads of batch_size/seq_len/ctx_len off per-layer shapes read the graph
input once, and identical nodes are merged; exact."""
from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs
import pytest
from pass_helpers import serialized, session
from qaic_helpers import assert_same_outputs, pipeline_until

from specdec_compile import passes
from specdec_compile.passes import PassContext
from specdec_compile.passes.share_shapes import merge_common


@pytest.mark.parametrize("name,per_layer", [
    ("llama_gqa", 0),      # the cache write's guard no longer reads its update's shape (lower, ort)
    ("llama_dynamo", 0),
    ("gpt2", 7),           # inference does not name gpt2's batch dim: those reads stay
])
def test_fixtures_compute_their_shapes_once(fixture_path, name, per_layer):
    g, ctx = pipeline_until(fixture_path(name), "share_shapes", target="ort")
    before = serialized(g)
    out = passes.share_shapes(g, ctx)
    assert serialized(g) == before
    shapes = lambda graph: sum(n.op == "Shape" for n in graph.nodes)  # noqa: E731
    layers = ctx.detection.info.num_layers
    assert len(out.nodes) < len(g.nodes) and shapes(out) < shapes(g)
    # two reads of the graph inputs (input_ids, past_key.0) for the whole graph, and what stays per layer
    assert shapes(out) == 2 + per_layer * layers, [(n.name, n.inputs[0].name) for n in out.nodes if n.op == "Shape"]
    assert merge_common(out.copy()) == 0            # nothing identical is left
    assert_same_outputs(g, out)                     # exact


def _two_layers():
    """Two 'layers', each reshaping its own tensor to [batch, seq, 2, 2] with its own shape reads."""
    x = gs.Variable("x", np.float32, ["batch_size", "seq_len", 4])
    nodes, t = [], x
    for i in range(2):
        y, shp, b, s, tgt, r = (gs.Variable(f"{n}{i}") for n in ("y", "shp", "b", "s", "tgt", "r"))
        bu, su = gs.Variable(f"bu{i}"), gs.Variable(f"su{i}")
        nodes += [gs.Node("Relu", name=f"relu{i}", inputs=[t], outputs=[y]),
                  gs.Node("Shape", name=f"shape{i}", inputs=[y], outputs=[shp]),
                  gs.Node("Gather", name=f"gb{i}", inputs=[shp, gs.Constant(f"i0_{i}", np.array(0))], outputs=[b]),
                  gs.Node("Gather", name=f"gs{i}", inputs=[shp, gs.Constant(f"i1_{i}", np.array(1))], outputs=[s]),
                  gs.Node("Unsqueeze", name=f"ub{i}", inputs=[b, gs.Constant(f"a{i}", np.array([0]))], outputs=[bu]),
                  gs.Node("Unsqueeze", name=f"us{i}", inputs=[s, gs.Constant(f"a2{i}", np.array([0]))], outputs=[su]),
                  gs.Node("Concat", name=f"cat{i}", attrs={"axis": 0},
                          inputs=[bu, su, gs.Constant(f"two{i}", np.array([2, 2]))], outputs=[tgt]),
                  gs.Node("Reshape", name=f"reshape{i}", inputs=[y, tgt], outputs=[r])]
        t = gs.Variable(f"flat{i}")
        nodes.append(gs.Node("Reshape", name=f"flat{i}", inputs=[r, gs.Constant(f"f{i}", np.array([0, 0, 4]))],
                             outputs=[t]))
    t.dtype, t.shape = np.float32, ["batch_size", "seq_len", 4]
    return gs.Graph(nodes=nodes, inputs=[x], outputs=[t], opset=17)


def test_each_dim_is_read_once_and_the_targets_are_built_once():
    g = _two_layers()
    out = passes.share_shapes(g, PassContext())
    ops = [n.op for n in out.nodes]
    assert ops.count("Shape") == 1 and ops.count("Concat") == 1 and ops.count("Unsqueeze") == 2, ops
    shape = next(n for n in out.nodes if n.op == "Shape")
    assert shape.inputs[0].name == "x"                       # read off the graph input
    feeds = {"x": np.random.default_rng(0).standard_normal((3, 5, 4)).astype(np.float32)}
    np.testing.assert_array_equal(session(out).run(None, feeds)[0], session(g).run(None, feeds)[0])


def test_random_ops_and_graph_outputs_are_never_merged():
    x = gs.Variable("x", np.float32, [2])
    a, b, c, d = (gs.Variable(n, np.float32, [2]) for n in "abcd")
    g = gs.Graph(nodes=[gs.Node("RandomUniformLike", name="r1", inputs=[x], outputs=[a]),
                        gs.Node("RandomUniformLike", name="r2", inputs=[x], outputs=[b]),
                        gs.Node("Neg", name="n1", inputs=[x], outputs=[c]),
                        gs.Node("Neg", name="n2", inputs=[x], outputs=[d])],
                 inputs=[x], outputs=[a, b, c, d], opset=17)
    assert merge_common(g.copy()) == 0
    assert serialized(passes.share_shapes(g, PassContext())) == serialized(g)


@pytest.mark.parametrize("name", ["llama_gqa", "llama_dynamo", "gpt2"])
def test_run_again_on_its_own_output_it_changes_nothing(fixture_path, name):
    """Idempotent: the reads it built (Gather(Shape(input), axis)) are reused, not rebuilt under
    new names (was: llama_gqa's and llama_dynamo's reads of ctx_len and the shape Concat rebuilt)."""
    g, ctx = pipeline_until(fixture_path(name), "share_shapes", target="ort")
    once = passes.share_shapes(g, ctx)
    twice = passes.share_shapes(once, ctx)
    assert serialized(twice) == serialized(once)
    assert_same_outputs(g, twice)                   # exact, against the graph before the pass
