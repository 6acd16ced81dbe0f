"""Pass ``logits_to_keep`` (``--interface qeff``, TLM): QEfficient's ``num_logits_to_keep``.

A new input ``num_logits_to_keep`` ``[num_logits_to_keep, 1]`` (int64) is read
for its shape only: n = its dim 0. The logits become ``[batch_size, n, vocab]``:
for each row, the n positions ending at its last valid token (the largest
position, column L), i.e. columns ``L+1-n .. L``; when ``L+1 < n`` the first n
columns (``0 .. n-1``), as QEfficient's TLM picks them (its
``filter_hidden_states``). Where the logits are ``MatMul(hidden, W)`` (the LM
head), the columns are picked before the head, so a prefill chunk with n = 1
pays the vocabulary projection once.
"""
from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from ..contract import BATCH, LOGITS, NUM_LOGITS_TO_KEEP
from ..errors import SpecdecError
from ..graph_utils import copy_graph, Builder, tensor_by_name
from ._context import PassContext, need, graph_pass
from .role_logits import lm_head_matmul


def _keep(b: Builder, x: gs.Tensor, pos: gs.Tensor, nlk: gs.Tensor) -> gs.Tensor:
    """x [B,S,N] -> [B,n,N], rows as the module doc says."""
    pos32 = b.op("Cast", [pos], attrs={"to": 6}, hint="pos_i32", dtype=np.int32)
    last = b.op("ArgMax", [pos32], attrs={"axis": 1, "keepdims": 1}, hint="last_valid")        # [B,1]
    n = b.op("Gather", [b.op("Shape", [nlk], hint="nlk_shape"), b.const(0, "int64")],
             attrs={"axis": 0}, hint="n")                                                       # scalar
    start = b.op("Sub", [b.op("Add", [last, b.const(1, "int64")], hint="end"), n], hint="start")
    start = b.op("Max", [start, b.const(0, "int64")], hint="start0")                          # [B,1]
    cols = b.op("Add", [start, b.op("Range", [b.const(0, "int64"), n, b.const(1, "int64")], hint="offs")],
                hint="cols")                                                                    # [B,n]
    cols = b.op("Max", [cols, b.const(0, "int64")], hint="cols0")   # >= 0 already; says so to the qaic checks
    shape = b.op("Concat", [b.op("Shape", [cols], hint="cols_shape"),
                            b.op("Slice", [b.op("Shape", [x], hint="x_shape"), b.const([2], "int64"),
                                           b.const([3], "int64")], hint="width")],
                 attrs={"axis": 0}, hint="index_shape")
    index = b.op("Expand", [b.op("Unsqueeze", [cols, b.const([2], "int64")], hint="cols3"), shape], hint="index")
    return b.op("GatherElements", [x, index], attrs={"axis": 1}, hint="keep")


@graph_pass
def logits_to_keep(graph: gs.Graph, ctx: PassContext) -> gs.Graph:
    det = need("logits_to_keep", ctx, "detection").detection
    if any(t.name == NUM_LOGITS_TO_KEEP for t in graph.inputs):
        raise SpecdecError(f"pass logits_to_keep has already run on this graph (it has the input "
                           f"{NUM_LOGITS_TO_KEEP}): run each pass once")
    graph = copy_graph(graph)
    b = Builder(graph, "logits_to_keep")
    nlk = gs.Variable(NUM_LOGITS_TO_KEEP, dtype=np.int64, shape=[NUM_LOGITS_TO_KEEP, 1])
    graph.inputs.append(nlk)
    pos = next(t for t in graph.inputs if t.name == "position_ids")
    out = tensor_by_name(graph, LOGITS)
    head = lm_head_matmul(out)
    if head is not None:
        head.inputs[0] = _keep(b, head.inputs[0], pos, nlk)
    else:
        out.name = f"{LOGITS}__all_positions"
        picked = _keep(b, out, pos, nlk)
        graph.outputs = [picked if t is out else t for t in graph.outputs]
        picked.name = LOGITS
        out = picked
    out.dtype = np.float32
    out.shape = [BATCH, NUM_LOGITS_TO_KEEP, det.info.vocab_size]
    return graph
