"""Pass ``clamp_gather_positions`` (qaic): no gather reads a row at a negative position.

Padding carries position -1. ONNX Gather wraps a negative index to the last
row, a device need not (QEfficient sanitizes ``position_ids == -1`` before its
GPT-J position gather, PR #1189). For every Gather/GatherElements/GatherND
whose indices are computed from ``position_ids`` by integer computations (a
value that goes through a float activation, such as the experts a MoE router
picks, is the model's data, not a position):

* indices provably >= 0 (an ArgMax, a slot computed as ``Where(p >= 0, p,
  ...)``, a row already clamped) are left as they are;
* indices that are the positions themselves, moved by layout ops (Unsqueeze,
  Expand, Tile, Reshape, ...), integer casts or an added constant >= 0 (OPT's
  offset) are clamped with ``Max(indices, 0)``. A valid position is >= 0 and
  keeps its row; only padding changes row, and a padded token's values never
  reach a valid output (its logits are unspecified, its cache write keeps the
  slot's old value);
* anything else computed from the positions is refused: clamping it could
  change a valid token's row.
"""
from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from ..contract import POSITION_IDS
from ..errors import UnsupportedPatternError
from ..graph_utils import copy_graph, SHAPE_ONLY_OPS, Builder, const_value, graph_input, producer, topo_nodes
from ._context import PassContext, need, graph_pass
from ._static import dtype_of, elem_types, nonnegative

GATHERS = ("Gather", "GatherElements", "GatherND")
_INDEX_TYPES = {onnx.TensorProto.INT64, onnx.TensorProto.INT32, onnx.TensorProto.BOOL}
_LAYOUT = ("Unsqueeze", "Squeeze", "Reshape", "Expand", "Tile", "Transpose", "Flatten", "Identity")
_INT_TYPES = {onnx.TensorProto.INT64: np.int64, onnx.TensorProto.INT32: np.int32}


def position_like(t: gs.Tensor, pos: gs.Tensor, depth: int = 0):
    """The numpy int dtype of ``t`` when its elements are positions (moved by
    layout ops, integer casts, plus a constant >= 0), else None."""
    if t is pos:
        return np.dtype(pos.dtype) if pos.dtype is not None else np.dtype(np.int64)
    p = producer(t)
    if p is None or depth > 24:
        return None
    if p.op in _LAYOUT:
        return position_like(p.inputs[0], pos, depth + 1)
    if p.op == "Cast" and p.attrs.get("to") in _INT_TYPES:
        inner = position_like(p.inputs[0], pos, depth + 1)
        return np.dtype(_INT_TYPES[p.attrs["to"]]) if inner is not None else None
    if p.op == "Add":
        for a, c in ((p.inputs[0], p.inputs[1]), (p.inputs[1], p.inputs[0])):
            k = const_value(c)
            if k is not None and k.size > 0 and bool(np.all(k >= 0)):
                return position_like(a, pos, depth + 1)
    return None


def integer_dependence(graph: gs.Graph, pos: gs.Tensor) -> set[int]:
    """ids of the integer/bool tensors computed from ``pos`` by integer
    computations alone. A value that passes through a float activation (the
    experts a router picks with TopK) is the model's data, not a position."""
    types = elem_types(graph)
    dep = {id(pos)}
    for node in topo_nodes(graph):
        if node.op in SHAPE_ONLY_OPS or not any(id(t) in dep for t in node.inputs):
            continue
        dep.update(id(o) for o in node.outputs if dtype_of(o, types) in _INDEX_TYPES)
    return dep


def _positions(graph: gs.Graph, ctx: PassContext) -> gs.Tensor | None:
    pos = graph_input(graph, POSITION_IDS)
    if pos is None and ctx.detection is not None:
        pos = graph_input(graph, ctx.detection.position_ids)
    return pos


@graph_pass
def clamp_gather_positions(graph: gs.Graph, ctx: PassContext) -> gs.Graph:
    need("clamp_gather_positions", ctx)
    pos = _positions(graph, ctx)
    if pos is None:
        return graph
    graph = copy_graph(graph)
    pos = _positions(graph, ctx)
    dep = integer_dependence(graph, pos)
    b = Builder(graph, "clamp")
    for node in [n for n in graph.nodes if n.op in GATHERS]:
        index = node.inputs[1]
        if id(index) not in dep or nonnegative(index):
            continue
        dtype = position_like(index, pos)
        if dtype is None:
            raise UnsupportedPatternError(
                f"{node.op} node {node.name!r} is indexed by a value computed from {pos.name} that may be "
                f"negative for a valid token; cannot clamp it to >= 0 safely")
        node.inputs[1] = b.op("Max", [index, b.const(0, dtype, hint="zero")], hint="row", dtype=dtype)
    return graph
