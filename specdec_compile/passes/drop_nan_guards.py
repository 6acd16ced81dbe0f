"""Pass ``drop_nan_guards`` (qaic): no ``IsNaN`` left over from fused attention.

Exports of fused attention (optimum's Llama, Qwen2, Mistral, Phi-3, GPT-NeoX,
GPT-2) guard the probabilities with ``Where(IsNaN(p), 0, p)``, ``p =
Softmax(scores)``: a row that is masked everywhere with -inf gives NaN there.
No device graph of QEfficient has IsNaN. The guard is dead exactly when no row
of ``scores`` can be all -inf, i.e. when every mask that enters this layer's
scores is finite: an additive mask of ``ctx.mask_value`` (finite) or a
``Where`` whose fill is a finite constant (``fp16_safe`` clamps them). Only
then is ``Where`` replaced by ``p``; a guard on any other Softmax, or in any
other form, is left as it is.
"""
from __future__ import annotations

import math

import numpy as np
import onnx_graphsurgeon as gs

from ..graph_utils import copy_graph, const_value, node_by_name, producer, replace_uses
from ._context import PassContext, need, graph_pass, distinct_node_names


def _site_is_finite(graph: gs.Graph, site, mask_value: float) -> bool:
    if site.kind == "additive":
        return math.isfinite(mask_value)
    try:
        node = node_by_name(graph, site.node)
    except KeyError:
        return False
    fill = node.inputs[2] if site.kind == "visible" else node.inputs[1]
    value = const_value(fill)
    return value is not None and value.dtype.kind == "f" and bool(np.all(np.isfinite(value)))


def finite_softmaxes(graph: gs.Graph, ctx: PassContext) -> set[str]:
    """Names of the attention Softmax nodes whose every mask is finite."""
    det = ctx.detection
    found = set()
    for layer in det.layers:
        sites = [s for s in det.mask_sites if s.layer == layer.index]
        if sites and all(_site_is_finite(graph, s, ctx.mask_value) for s in sites):
            found.add(layer.softmax)
    return found


def _guard(node: gs.Node, finite: set[str]):
    """The ``Where`` of ``Where(IsNaN(p), 0, p)`` around a finite Softmax ``p``, or None."""
    p = node.inputs[0]
    sm = producer(p)
    flag = node.outputs[0]
    if sm is None or sm.op != "Softmax" or sm.name not in finite or len(flag.outputs) != 1:
        return None
    where = flag.outputs[0]
    if where.op != "Where" or where.inputs[0] is not flag or where.inputs[2] is not p:
        return None
    zero = const_value(where.inputs[1])
    if zero is None or zero.size == 0 or np.any(zero != 0):
        return None
    return where


@graph_pass
def drop_nan_guards(graph: gs.Graph, ctx: PassContext) -> gs.Graph:
    need("drop_nan_guards", ctx, "detection")
    distinct_node_names("drop_nan_guards", graph)
    if not any(n.op == "IsNaN" for n in graph.nodes):
        return graph
    graph = copy_graph(graph)
    finite = finite_softmaxes(graph, ctx)
    for node in [n for n in graph.nodes if n.op == "IsNaN"]:
        where = _guard(node, finite)
        if where is not None:
            replace_uses(graph, where.outputs[0], node.inputs[0])
    graph.cleanup(remove_unused_graph_inputs=False)
    return graph
