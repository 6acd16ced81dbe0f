"""Pass ``greater_compares`` (qaic): comparisons in Greater/GreaterOrEqual form.

No device graph of QEfficient uses ``LessOrEqual``: its masks compare with
``Greater`` (``kv_indices > query_indices``) and its cache code with
``GreaterOrEqual``. ``LessOrEqual(a, b)`` is ``GreaterOrEqual(b, a)`` exactly
(for every dtype, NaN included: both are false), so each one is rewritten by
swapping its operands; a ``Where`` over it reads the same condition, so it is
left as it is. Whatever mask form arrives (today's, or a rebuilt one), no
LessOrEqual leaves.
"""
from __future__ import annotations

import onnx_graphsurgeon as gs

from ._context import PassContext, need, graph_pass
from ..graph_utils import copy_graph


@graph_pass
def greater_compares(graph: gs.Graph, ctx: PassContext) -> gs.Graph:
    need("greater_compares", ctx)
    if not any(n.op == "LessOrEqual" for n in graph.nodes):
        return graph
    graph = copy_graph(graph)
    for node in graph.nodes:
        if node.op == "LessOrEqual":
            a, b = node.inputs[0], node.inputs[1]
            node.op = "GreaterOrEqual"
            node.inputs[0], node.inputs[1] = b, a
    return graph
