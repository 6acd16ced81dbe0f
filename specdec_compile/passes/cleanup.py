"""Pass ``cleanup``: dead nodes and unused initializers removed, nodes in
topological order. (Shape inference and ``onnx.checker`` run on the exported
model: see ``specdec_compile.graph_checks``.)"""
from __future__ import annotations

import onnx_graphsurgeon as gs

from ..graph_utils import copy_graph, toposort
from ._context import PassContext, need, graph_pass


@graph_pass
def cleanup(graph: gs.Graph, ctx: PassContext) -> gs.Graph:
    need("cleanup", ctx)
    graph = copy_graph(graph)
    graph.cleanup(remove_unused_graph_inputs=False, remove_unused_node_outputs=False)
    toposort(graph)
    return graph
