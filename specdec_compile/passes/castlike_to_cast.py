"""Pass ``castlike_to_cast`` (qaic): no ``CastLike`` in the graph.

A Qualcomm development branch of QEfficient lists CastLike among the ops the
device compiler does not take and rewrites it to Cast (quic/efficient-
transformers PR #1181, ``RewriteUnsupportedOpsTransform``). Here every
``CastLike(x, like)`` becomes ``Cast(x, to=dtype(like))``, or disappears when
x already has that dtype (the position mask's float32 fill cast to float32
scores). The dtype comes from the graph's types or ONNX shape inference; a
CastLike whose target dtype neither knows is refused, not guessed.
"""
from __future__ import annotations

import onnx_graphsurgeon as gs

from ..errors import UnsupportedPatternError
from ._context import PassContext, need, graph_pass
from ._static import dtype_of, elem_types
from ..graph_utils import copy_graph


@graph_pass
def castlike_to_cast(graph: gs.Graph, ctx: PassContext) -> gs.Graph:
    need("castlike_to_cast", ctx)
    if not any(n.op == "CastLike" for n in graph.nodes):
        return graph
    graph = copy_graph(graph)
    types = elem_types(graph)
    outputs = {id(t) for t in graph.outputs}
    for node in [n for n in graph.nodes if n.op == "CastLike"]:
        x, like = node.inputs[0], node.inputs[1]
        to = dtype_of(like, types)
        if to is None:
            raise UnsupportedPatternError(
                f"CastLike node {node.name!r}: the dtype of {like.name!r} is unknown; cannot lower it to Cast")
        out = node.outputs[0]
        if dtype_of(x, types) == to and id(out) not in outputs:
            for consumer in list(out.outputs):
                for j, t in enumerate(consumer.inputs):
                    if t is out:
                        consumer.inputs[j] = x
            node.outputs.clear()
            node.inputs.clear()
            continue
        node.op = "Cast"
        node.attrs = {"to": int(to)}
        while len(node.inputs) > 1:
            node.inputs.pop()
    graph.cleanup(remove_unused_graph_inputs=False)
    return graph
