"""Pass ``dense_experts`` (qaic): MoE routing without ``NonZero``.

Hugging Face's sparse MoE block runs each expert on the tokens that chose it,
found with ``torch.where`` (a data-dependent ``NonZero``, which the device
compiler does not take; QEfficient replaces the block by a dense form). Here,
for every expert whose routing ``_moe_routes.find_routes`` recognizes exactly:

* the expert runs on every token, in order (the token index becomes
  ``Range(0, T)``, T the mask's token count), and the index_add writes every
  row (unique indices, as before);
* a token that did not choose the expert gets ``Where(chose, y * w, 0)``:
  exactly 0 even if the expert's output for it is not finite (an fp16
  overflow on a row the sparse form never computed);
* the gathered weight ``weights[t, k]`` of each chosen pair becomes, per
  token, ``ReduceSum_k(weights[t, k] * M[t, k])``, gathered from the same
  flattened table with the graph's own index ``k + t * S`` for every slot.
  A token meets an expert in at most one slot, so the sum has at most one
  non-zero term: the chosen weight exactly, or 0.

A chosen token's contribution is the same product as before; a token that did
not choose the expert adds 0. The expert's row results
are those of a matrix product over more rows, so they agree to rounding.
A NonZero that is not exactly this routing is left as it is (and the precedent
check then reports it).
"""
from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from ..graph_utils import copy_graph, Builder
from ._context import PassContext, need, graph_pass
from ._moe_routes import Route, find_routes
from ._static import dtype_of, elem_types


def _weight(b: Builder, r: Route, rows: gs.Tensor, slots: gs.Tensor, float_type: int) -> tuple:
    """([T, 1] weight of each token for this expert, [T, 1] bool: did the token choose it)."""
    mask = r.mask if r.token_axis == 0 else b.op("Transpose", [r.mask], attrs={"perm": [1, 0]}, hint="moe_mask_tk")
    t_stride = b.op("Mul", [b.op("Unsqueeze", [rows, b.const([1], np.int64)], hint="moe_t"), r.stride],
                    hint="moe_t_stride")
    k_row = b.op("Unsqueeze", [b.op("Range", [b.const(0, np.int64), slots, b.const(1, np.int64)], hint="moe_k"),
                               b.const([0], np.int64)], hint="moe_k_row")
    index = b.op("Add", [t_stride, k_row], hint="moe_index")                            # [T, K]: k + t * S
    picked = b.op("Gather", [r.table, index], attrs={"axis": 0}, hint="moe_weights")   # [T, K, 1]
    on = b.op("Unsqueeze", [b.op("Cast", [mask], attrs={"to": float_type}, hint="moe_on"), b.const([2], np.int64)],
              hint="moe_on_col")                                                       # [T, K, 1], 0/1
    axis = b.const([1], np.int64)
    weight = b.op("ReduceSum", [b.op("Mul", [picked, on], hint="moe_chosen"), axis], attrs={"keepdims": 0},
                  hint="moe_weight")
    zero = b.const(np.zeros((), onnx.helper.tensor_dtype_to_np_dtype(float_type)), hint="moe_zero")
    chose = b.op("Greater", [b.op("ReduceSum", [on, axis], attrs={"keepdims": 0}, hint="moe_hits"), zero],
                 hint="moe_chose")
    return weight, chose


def _densify(b: Builder, r: Route, float_type: int, out_type: int) -> None:
    shape = b.op("Shape", [r.mask], hint="moe_mask_shape")
    tokens = b.op("Gather", [shape, b.const(r.token_axis, np.int64)], attrs={"axis": 0}, hint="moe_tokens")
    slots = b.op("Gather", [shape, b.const(1 - r.token_axis, np.int64)], attrs={"axis": 0}, hint="moe_slots")
    rows = b.op("Range", [b.const(0, np.int64), tokens, b.const(1, np.int64)], hint="moe_rows")
    for node in r.token_uses:
        node.inputs[[i for i, t in enumerate(node.inputs) if t is r.token][0]] = rows
    weight, chose = _weight(b, r, rows, slots, float_type)
    r.scale.inputs[[i for i, t in enumerate(r.scale.inputs) if t is r.weight][0]] = weight
    # a token that did not choose the expert adds 0 even where the expert's output for it is not finite
    # (an fp16 overflow the sparse form never computes): Where, not only the 0 weight
    scaled = r.scale.outputs[0]
    zero = b.const(np.zeros((), onnx.helper.tensor_dtype_to_np_dtype(out_type)), hint="moe_none")
    kept = b.op("Where", [chose, scaled, zero], hint="moe_kept")
    where = kept.inputs[0]  # the Where node itself
    for user in [n for n in scaled.outputs if n is not where]:
        for i, t in enumerate(user.inputs):
            if t is scaled:
                user.inputs[i] = kept


@graph_pass
def dense_experts(graph: gs.Graph, ctx: PassContext) -> gs.Graph:
    need("dense_experts", ctx)
    if not any(n.op == "NonZero" for n in graph.nodes):
        return graph
    graph = copy_graph(graph)
    routes = find_routes(graph)
    if not routes:
        return graph
    types = elem_types(graph)
    b = Builder(graph, "dense_experts")
    floats = (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.DOUBLE)
    for r in routes:
        float_type, out_type = dtype_of(r.table, types), dtype_of(r.scale.outputs[0], types)
        if float_type not in floats or out_type not in floats:
            continue  # a dtype is not known to be float: leave this expert as it is
        _densify(b, r, float_type, out_type)
    graph.cleanup(remove_unused_graph_inputs=False)
    return graph
