"""Pass cleanup: dead nodes removed, topological order."""
from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from specdec_compile import passes
from specdec_compile.passes import PassContext


def test_cleanup_removes_dead_nodes_and_sorts():
    x = gs.Variable("x", np.float32, [2])
    a = gs.Variable("a", np.float32, [2])
    dead = gs.Variable("dead", np.float32, [2])
    y = gs.Variable("y", np.float32, [2])
    nodes = [gs.Node("Relu", name="second", inputs=[a], outputs=[y]),
             gs.Node("Neg", name="unused", inputs=[x], outputs=[dead]),
             gs.Node("Abs", name="first", inputs=[x], outputs=[a])]
    g = gs.Graph(nodes=nodes, inputs=[x], outputs=[y], opset=17)
    out = passes.cleanup(g, PassContext())
    assert [n.name for n in out.nodes] == ["first", "second"]
    assert len(g.nodes) == 3
