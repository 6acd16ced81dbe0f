"""Pass ``dense_experts`` (qaic): MoE routing without ``NonZero``.

Hugging Face's sparse MoE block runs each expert on the tokens that chose it,
found with ``torch.where`` (a data-dependent ``NonZero``, which the device
compiler does not take; QEfficient replaces the block by a dense form). Here,
for every expert whose routing ``_moe_routes.find_routes`` recognizes exactly:

* the expert runs on every token, in order (the token index becomes
  ``Range(0, T)``, T the mask's token count), and the index_add writes every
  row (unique indices, as before);
* the gathered weight ``weights[t, k]`` of each chosen pair becomes, per
  token, ``ReduceSum_k(weights[t, k] * M[t, k])``, gathered from the same
  flattened table with the graph's own index ``k + t * S`` for every slot.
  A token meets an expert in at most one slot, so the sum has at most one
  non-zero term: the chosen weight exactly, or 0.

A chosen token's contribution is the same product as before; a token that did
not choose the expert adds ``expert(x) * 0 = 0`` (its hidden state is finite:
the position mask is finite, so padding rows are too). The expert's row results
are those of a matrix product over more rows, so they agree to rounding.
A NonZero that is not exactly this routing is left as it is (and the precedent
check then reports it).
"""
from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from ..graph_utils import Builder
from ._context import PassContext, need
from ._moe_routes import Route, find_routes
from ._static import dtype_of, elem_types


def _densify(b: Builder, r: Route, float_type: int) -> None:
    shape = b.op("Shape", [r.mask], hint="moe_mask_shape")
    tokens = b.op("Gather", [shape, b.const(r.token_axis, np.int64)], attrs={"axis": 0}, hint="moe_tokens")
    slots = b.op("Gather", [shape, b.const(1 - r.token_axis, np.int64)], attrs={"axis": 0}, hint="moe_slots")
    zero, one = b.const(0, np.int64), b.const(1, np.int64)
    rows = b.op("Range", [zero, tokens, one], hint="moe_rows")
    for node in r.token_uses:
        node.inputs[[i for i, t in enumerate(node.inputs) if t is r.token][0]] = rows
    mask = r.mask if r.token_axis == 0 else b.op("Transpose", [r.mask], attrs={"perm": [1, 0]}, hint="moe_mask_tk")
    index = b.op("Add", [b.op("Mul", [b.op("Unsqueeze", [rows, b.const([1], np.int64)], hint="moe_t"), r.stride],
                              hint="moe_t_stride"),
                         b.op("Unsqueeze", [b.op("Range", [zero, slots, one], hint="moe_k"), b.const([0], np.int64)],
                              hint="moe_k_row")], hint="moe_index")                      # [T, K]: k + t * S
    picked = b.op("Gather", [r.table, index], attrs={"axis": 0}, hint="moe_weights")   # [T, K, 1]
    on = b.op("Unsqueeze", [b.op("Cast", [mask], attrs={"to": float_type}, hint="moe_on"), b.const([2], np.int64)],
              hint="moe_on_col")
    weight = b.op("ReduceSum", [b.op("Mul", [picked, on], hint="moe_chosen"), b.const([1], np.int64)],
                  attrs={"keepdims": 0}, hint="moe_weight")                               # [T, 1]
    r.scale.inputs[[i for i, t in enumerate(r.scale.inputs) if t is r.weight][0]] = weight


def dense_experts(graph: gs.Graph, ctx: PassContext) -> gs.Graph:
    need("dense_experts", ctx)
    if not any(n.op == "NonZero" for n in graph.nodes):
        return graph
    graph = graph.copy()
    routes = find_routes(graph)
    if not routes:
        return graph
    types = elem_types(graph)
    b = Builder(graph, "dense_experts")
    for r in routes:
        float_type = dtype_of(r.table, types)
        if float_type not in (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16,
                              onnx.TensorProto.DOUBLE):
            continue  # the weights' dtype is not known to be float: leave this expert as it is
        _densify(b, r, float_type)
    graph.cleanup(remove_unused_graph_inputs=False)
    return graph
