"""Pass ``role_logits``: what the logits output holds, per role.

TLM: every position (``[batch_size, seq_len, vocab]``), for verification.
DLM: only the last valid token of each row, the one with the largest position
(``[batch_size, 1, vocab]``). When the logits are ``MatMul(hidden, W)`` with
constant W (the LM head), the row is picked *before* the head, so a prefill
chunk pays the vocabulary projection once, not once per token.
Logits are float32 in both roles. The last valid token is found by an ArgMax
over the positions cast to int32 (QEfficient's form; the device's ArgMax).
"""
from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from ..contract import LOGITS
from ..errors import SpecdecError
from ..graph_utils import copy_graph, Builder, is_const, producer, tensor_by_name
from ._context import PassContext, need, graph_pass


def _last_valid(b: Builder, x: gs.Tensor, pos: gs.Tensor) -> gs.Tensor:
    """x [B,S,N] -> x[b, argmax_s position_ids[b,s], :] as [B,1,N]. The ArgMax
    runs on int32 positions (exact: positions are < ctx_len), as QEfficient's
    device graphs do."""
    pos32 = b.op("Cast", [pos], attrs={"to": onnx.TensorProto.INT32}, hint="positions_i32", dtype=np.int32)
    idx = b.op("ArgMax", [pos32], attrs={"axis": 1, "keepdims": 1}, hint="last_valid")   # [B,1]
    idx3 = b.op("Unsqueeze", [idx, b.const([2], "int64")], hint="last_valid_3d")           # [B,1,1]
    shape = b.op("Shape", [x], hint="hidden_shape")
    target = b.op("Concat", [b.op("Slice", [shape, b.const([0], "int64"), b.const([1], "int64")]),
                             b.const([1], "int64"),
                             b.op("Slice", [shape, b.const([2], "int64"), b.const([3], "int64")])],
                  attrs={"axis": 0}, hint="gather_shape")
    index = b.op("Expand", [idx3, target], hint="gather_index")
    return b.op("GatherElements", [x, index], attrs={"axis": 1}, hint="pick_last")


#: ops that act on each token's vector alone (with constant side operands)
_PER_TOKEN = {"Cast", "Identity", "Tanh", "Add", "Mul", "Div", "Sub"}


def lm_head_matmul(logits: gs.Tensor):
    """The MatMul(hidden, const W) that makes the logits, through per-token ops
    (bias Add, softcap Tanh/Mul, Cast), each with a single consumer; or None."""
    t = logits
    for _ in range(8):
        n = producer(t)
        if n is None:
            return None
        if n.op == "MatMul":
            w = n.inputs[1]
            wp = producer(w)
            if len(n.outputs[0].outputs) <= 1 and (
                    is_const(w) or (wp is not None and wp.op == "Transpose" and is_const(wp.inputs[0]))):
                return n
            return None
        if n.op not in _PER_TOKEN:
            return None
        data = [x for x in n.inputs if not is_const(x)]
        if len(data) != 1 or len(data[0].outputs) != 1:
            return None
        t = data[0]
    return None


@graph_pass
def role_logits(graph: gs.Graph, ctx: PassContext) -> gs.Graph:
    need("role_logits", ctx, "detection", "role")
    det, role = ctx.detection, ctx.role
    if any(n.name.startswith("specdec/logits/") for n in graph.nodes):
        raise SpecdecError("pass role_logits has already run on this graph: run each pass once")
    graph = copy_graph(graph)
    b = Builder(graph, "logits")
    out = tensor_by_name(graph, det.logits)
    vocab = det.info.vocab_size
    if role == "dlm":
        pos = tensor_by_name(graph, det.position_ids)
        head = lm_head_matmul(out)
        if head is not None:
            head.inputs[0] = _last_valid(b, head.inputs[0], pos)
        else:
            out.name = f"{LOGITS}__all_positions"
            picked = _last_valid(b, out, pos)
            graph.outputs = [picked if t is out else t for t in graph.outputs]
            out = picked
    if out.dtype is not None and np.dtype(out.dtype) != np.float32:
        cast = b.op("Cast", [out], attrs={"to": 1}, hint="logits_f32", dtype=np.float32)
        graph.outputs = [cast if t is out else t for t in graph.outputs]
        out = cast
    out.name = LOGITS
    out.dtype = np.float32
    out.shape = ["batch_size", 1 if role == "dlm" else "seq_len", vocab]
    return graph
