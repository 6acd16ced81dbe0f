"""Pass ``fp16_safe``: no constant outside float16's range.

``qaic-exec -convert-to-fp16`` turns float32 constants into float16; a mask
fill of float32 min (or -inf) becomes -inf there, and a fully masked row then
gives NaN. Every embedded float constant (initializers held in the model,
Constant nodes, ConstantOfShape values) is clamped to [-65504, 65504].
External weights are never read: they are the model's weights, not fills.
"""
from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from ..contract import FP16_MAX
from ..graph_utils import copy_graph, is_external
from ._context import PassContext, need, graph_pass


def _clamp(c: gs.Constant) -> None:
    if is_external(c):
        return
    v = np.asarray(c.values)
    if v.dtype.kind != "f" or v.size == 0:
        return
    if np.any(np.abs(v[~np.isnan(v)]) > FP16_MAX):
        c.values = np.where(np.isnan(v), v, np.clip(v, -FP16_MAX, FP16_MAX)).astype(v.dtype)


@graph_pass
def fp16_safe(graph: gs.Graph, ctx: PassContext) -> gs.Graph:
    need("fp16_safe", ctx)
    graph = copy_graph(graph)
    for t in graph.tensors().values():
        if isinstance(t, gs.Constant):
            _clamp(t)
    for node in graph.nodes:
        v = node.attrs.get("value")  # Constant and ConstantOfShape
        if isinstance(v, gs.Constant):
            _clamp(v)
        if node.op == "Constant":
            for key in ("value_float", "value_floats"):
                if key in node.attrs:
                    node.attrs[key] = np.clip(np.asarray(node.attrs[key], dtype=np.float32),
                                              -FP16_MAX, FP16_MAX).tolist()
    return graph
