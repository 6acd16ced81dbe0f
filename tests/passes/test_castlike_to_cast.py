"""Pass castlike_to_cast (qaic): CastLike becomes Cast, or nothing where it changes no dtype."""
from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs
import pytest
from pass_helpers import serialized, session
from qaic_helpers import assert_same_outputs, pipeline_until

from specdec_compile import passes
from specdec_compile.errors import UnsupportedPatternError
from specdec_compile.passes import PassContext


def _with_castlikes(g):
    """The attention probabilities p of every layer read through CastLike(p, p) (a
    no-op) and CastLike(Cast(p, float16), p) (a real cast), as exports and older
    mask forms write them."""
    for i, sm in enumerate([n for n in g.nodes if n.op == "Softmax"]):
        p = sm.outputs[0]
        users = list(p.outputs)
        half, same, back = gs.Variable(f"half{i}"), gs.Variable(f"same{i}"), gs.Variable(f"back{i}")
        g.nodes += [gs.Node("CastLike", name=f"noop{i}", inputs=[p, p], outputs=[same]),
                    gs.Node("Cast", name=f"to16_{i}", attrs={"to": 10}, inputs=[same], outputs=[half]),
                    gs.Node("CastLike", name=f"back{i}", inputs=[half, p], outputs=[back])]
        for u in users:
            u.inputs[[j for j, t in enumerate(u.inputs) if t is p][0]] = back
    return g


@pytest.mark.parametrize("name", ["llama_gqa", "gpt_neox", "gptj", "llama_dynamo"])
def test_no_castlike_leaves_and_outputs_are_equal(fixture_path, name):
    g, ctx = pipeline_until(fixture_path(name), "castlike_to_cast")
    g = _with_castlikes(g)
    assert sum(n.op == "CastLike" for n in g.nodes) == 4
    before = serialized(g)
    out = passes.castlike_to_cast(g, ctx)
    assert serialized(g) == before
    assert not any(n.op == "CastLike" for n in out.nodes)
    assert_same_outputs(g, out)


def _graph(like_dtype):
    x = gs.Variable("x", np.float32, [3])
    like = gs.Variable("like", like_dtype, [3])
    y = gs.Variable("y", like_dtype, [3])
    z = gs.Variable("z", like_dtype, [3])
    return gs.Graph(nodes=[gs.Node("CastLike", name="cl", inputs=[x, like], outputs=[y]),
                           gs.Node("Add", name="add", inputs=[y, like], outputs=[z])],
                    inputs=[x, like], outputs=[z], opset=17)


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.int64])
def test_castlike_becomes_a_cast_to_the_dtype_of_like(dtype):
    g = _graph(dtype)
    out = passes.castlike_to_cast(g, PassContext())
    ops = [n.op for n in out.nodes]
    assert "CastLike" not in ops
    assert ops == (["Add"] if dtype == np.float32 else ["Cast", "Add"]), "a float32 -> float32 CastLike goes"
    feeds = {"x": np.array([1.25, -2.5, 3.0], np.float32), "like": np.array([1, 2, 3]).astype(dtype)}
    np.testing.assert_array_equal(session(out).run(None, feeds)[0], session(g).run(None, feeds)[0])


def test_unknown_target_dtype_is_refused():
    """``like`` comes from an op no inference types: refuse, do not guess."""
    x = gs.Variable("x", np.float32, [3])
    like, y = gs.Variable("like"), gs.Variable("y")
    g = gs.Graph(nodes=[gs.Node("Mystery", name="m", domain="example.com", inputs=[x], outputs=[like]),
                        gs.Node("CastLike", name="cl", inputs=[x, like], outputs=[y])],
                 inputs=[x], outputs=[y], opset=17)
    with pytest.raises(UnsupportedPatternError, match="CastLike node 'cl'.*dtype of 'like' is unknown"):
        passes.castlike_to_cast(g, PassContext())
