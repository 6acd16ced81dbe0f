"""Pass ``flatten_to_reshape`` (qaic): no ``Flatten`` in the graph.

No QEfficient device graph has ``Flatten`` (the MoE exports index their
routing weights through one); ``Reshape`` is everywhere. ``Flatten(x, axis=a)``
is ``Reshape(x, [prod(d[:a]), prod(d[a:])])``; the rewrite writes one side as
-1 and the other as a constant, so it needs x's rank and the static dims of one
side (from the graph or shape inference): ``[-1, prod(d[a:])]`` where the
trailing dims are static, else ``[prod(d[:a]), -1]`` where the leading ones
are. A side whose product is 0 is not used (``-1`` would be ambiguous); a
Flatten whose dims allow neither is left as it is (and the precedent check
reports it).
"""
from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from ._context import PassContext, need, graph_pass
from ._static import inferred_dims
from ..graph_utils import copy_graph


def _target(dims: list | None, axis: int) -> list[int] | None:
    if dims is None:
        return None
    a = axis + len(dims) if axis < 0 else axis
    if not 0 <= a <= len(dims):
        return None
    lead, trail = dims[:a], dims[a:]
    if all(isinstance(d, int) for d in trail) and int(np.prod(trail, dtype=np.int64)) > 0:
        return [-1, int(np.prod(trail, dtype=np.int64))] if lead else [1, -1]
    if all(isinstance(d, int) for d in lead) and int(np.prod(lead, dtype=np.int64)) > 0:
        return [int(np.prod(lead, dtype=np.int64)), -1]
    return None


@graph_pass
def flatten_to_reshape(graph: gs.Graph, ctx: PassContext) -> gs.Graph:
    need("flatten_to_reshape", ctx)
    if not any(n.op == "Flatten" for n in graph.nodes):
        return graph
    graph = copy_graph(graph)
    dims = inferred_dims(graph)
    for node in [n for n in graph.nodes if n.op == "Flatten"]:
        x = node.inputs[0]
        known = [d if isinstance(d, int) else None for d in x.shape] if x.shape is not None else None
        target = _target(known if known is not None else dims.get(x.name), int(node.attrs.get("axis", 1)))
        if target is None:
            continue
        node.op = "Reshape"
        node.attrs = {}
        node.inputs.append(gs.Constant(f"{node.name}/flatten_shape", np.array(target, dtype=np.int64)))
    graph.cleanup(remove_unused_graph_inputs=False)
    return graph
