"""Pass ``batch_index`` (``--interface qeff``): a cache of ``full_batch_size`` rows, routed by row.

QEfficient's continuous batching (contract section 7): every ``past_*`` input
and ``*_RetainedState`` output holds ``full_batch_size`` rows, and the new
input ``batch_index`` ``[batch_size, 1]`` (int64) names the cache row of each
row of the call, so a prompt is prefilled at batch 1 into its row while decode
calls run every row. Row r of the call reads and writes only cache row
``batch_index[r]``; other rows keep their contents.

Each ``CacheWrite`` of ``retained_kv`` becomes, per target:

* qaic: ``com.qualcomm.cloud::CtxScatterCB(cache, batch_index, slots, kept)``, and
  attention reads ``CtxGatherCB(cache', batch_index, [0..ctx_len-1])``: the
  custom ops QEfficient's device graphs use (``_cb_functions``);
* ort: ``ScatterND`` / ``GatherND`` over the same ``[batch_index, head, slot]``
  indices, and attention reads ``Gather(cache', batch_index, axis 0)``.

Padding (position -1) at either end of a row: the row's valid positions are
consecutive, so each column j gets the slot ``(p0 + j) mod ctx_len`` with p0 =
the largest position minus its column; for a valid token that is its position,
for a padded one a slot no valid token of the row writes, and a padded token
writes back the value its slot holds. QEfficient's own runtime pads on the left
(a decode at the TLM's width with one valid token) and our loop on the right.
Two rows of one call must not name the same cache row (the runtime refuses it).
Shape computations that read a ``past_*`` input see the call's rows.

QEfficient's plain interface (``--interface qeff`` without ``--full-batch-size``,
``ctx.continuous_batching`` False) has no ``batch_index`` and a cache of
``batch_size`` rows, but its runtime pads on the left too: the write is the same,
with the rows 0..B-1 of the call (computed in the graph, not an input), and
attention reads the written cache as it is.
"""
from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from ..contract import BATCH, BATCH_INDEX, CACHE_WRITE, FULL_BATCH, QAIC_DOMAIN, SPECDEC_DOMAIN
from ..errors import SpecdecError, UnsupportedPatternError
from ..graph_utils import copy_graph, Builder
from ._cb_functions import ctx_gather_cb, ctx_scatter_cb
from ._context import PassContext, need, graph_pass


def _slots(b: Builder, pos: gs.Tensor, cache: gs.Tensor):
    """(slots [B,S], valid [B,S]) for the row-wise write (see the module doc)."""
    ctx = b.op("Gather", [b.op("Shape", [cache], hint="cache_shape"), b.const(2, "int64")],
               attrs={"axis": 0}, hint="ctx_len")
    seq = b.op("Gather", [b.op("Shape", [pos], hint="pos_shape"), b.const(1, "int64")],
               attrs={"axis": 0}, hint="seq_len")
    pos32 = b.op("Cast", [pos], attrs={"to": 6}, hint="pos_i32", dtype=np.int32)   # the device's ArgMax
    last = b.op("ArgMax", [pos32], attrs={"axis": 1, "keepdims": 1}, hint="last_col")        # [B,1]
    top = b.op("GatherElements", [pos, last], attrs={"axis": 1}, hint="last_pos")              # [B,1]
    p0 = b.op("Sub", [top, last], hint="col0_pos")
    cols = b.op("Range", [b.const(0, "int64"), seq, b.const(1, "int64")], hint="cols")         # [S]
    slots = b.op("Mod", [b.op("Add", [p0, cols], hint="run"), ctx], hint="slots")             # [B,S]
    valid = b.op("GreaterOrEqual", [pos, b.const(0, "int64")], hint="valid")
    return slots, valid


def _ort_indices(b: Builder, cache, bi, slots, like):
    """[B,H,S,3] (batch_index[b], h, slots[b,s]) for ScatterND/GatherND; ``like`` is [B,H,S,D]."""
    shape = b.op("Concat", [b.op("Slice", [b.op("Shape", [like], hint="upd_shape"), b.const([0], "int64"),
                                           b.const([3], "int64")], hint="bhs"), b.const([1], "int64")],
                 attrs={"axis": 0}, hint="index_shape")
    heads = b.op("Gather", [b.op("Shape", [cache], hint="cache_shape"), b.const(1, "int64")], attrs={"axis": 0})
    hr = b.op("Range", [b.const(0, "int64"), heads, b.const(1, "int64")], hint="heads")
    parts = [b.op("Expand", [b.op("Unsqueeze", [t, b.const(axes, "int64")]), shape], hint=hint)
             for t, axes, hint in ((bi, [2, 3], "bidx"), (hr, [0, 2, 3], "hidx"), (slots, [1, 3], "sidx"))]
    return b.op("Concat", parts, attrs={"axis": 3}, hint="indices")


def _rewire(node_out: gs.Tensor, new: gs.Tensor, skip: gs.Node | None = None) -> None:
    """Every node reading ``node_out`` (but ``skip``) reads ``new``; graph outputs stay."""
    for node in list(node_out.outputs):
        if node is skip or node in new.inputs:
            continue
        for j, t in enumerate(node.inputs):
            if t is node_out:
                node.inputs[j] = new


def _write(b: Builder, target: str, w: gs.Node, bi, rows, slots, valid, ctx_all) -> None:
    """The write of ``w`` at ``slots`` of the cache rows ``bi`` (padding keeps the old value); attention
    then reads those rows (``ctx_all`` None, the plain interface: the written cache itself)."""
    cache, _, update = w.inputs
    out = w.outputs[0]
    w.inputs.clear()
    w.outputs.clear()
    valid4 = b.op("Unsqueeze", [valid, b.const([1, 3], "int64")], hint="valid4")              # [B,1,S,1]
    if target == "qaic":
        slots3 = b.op("Unsqueeze", [slots, b.const([1], "int64")], hint="slots3")             # [B,1,S]
        old = b.op("CtxGatherCB", [cache, bi, slots3], domain=QAIC_DOMAIN, hint="old_slots")
        kept = b.op("Where", [valid4, update, old], hint="pad_keeps_old")
        b.op("CtxScatterCB", [cache, bi, slots, kept], domain=QAIC_DOMAIN, outputs=[out], hint="write")
        if ctx_all is None:
            return
        read = b.op("CtxGatherCB", [out, bi, ctx_all], domain=QAIC_DOMAIN, hint="read_rows")
    else:
        idx = _ort_indices(b, cache, bi, slots, update)
        old = b.op("GatherND", [cache, idx], hint="old_slots")
        kept = b.op("Where", [valid4, update, old], hint="pad_keeps_old")
        b.op("ScatterND", [cache, idx, kept], outputs=[out], hint="write")
        if rows is None:
            return
        read = b.op("Gather", [out, rows], attrs={"axis": 0}, hint="read_rows")
    _rewire(out, read)


@graph_pass
def batch_index(graph: gs.Graph, ctx: PassContext) -> gs.Graph:
    need("batch_index", ctx, "target")
    graph = copy_graph(graph)
    writes = [n for n in graph.nodes if n.op == CACHE_WRITE and n.domain == SPECDEC_DOMAIN]
    if not writes:
        if any(n.name.startswith("specdec/batch_index/") for n in graph.nodes):
            raise SpecdecError("pass batch_index has already run on this graph (its cache writes are routed by "
                               "row): run each pass once")
        raise UnsupportedPatternError("batch_index: no cache writes (run retained_kv first)")
    b = Builder(graph, "batch_index")
    pos = writes[0].inputs[1]
    cb = ctx.continuous_batching
    if cb:
        bi = gs.Variable(BATCH_INDEX, dtype=np.int64, shape=[BATCH, 1])
        graph.inputs.append(bi)
        rows = b.op("Reshape", [bi, b.const([-1], "int64")], hint="rows")                      # [B]
    else:   # the plain interface: the call's rows are the cache's, in order
        n = b.op("Gather", [b.op("Shape", [pos], hint="pos_shape"), b.const(0, "int64")], attrs={"axis": 0},
                 hint="batch")
        order = b.op("Range", [b.const(0, "int64"), n, b.const(1, "int64")], hint="rows_in_order")  # [B]
        bi = b.op("Unsqueeze", [order, b.const([1], "int64")], hint="rows_in_order2")              # [B,1]
    slots, valid = _slots(b, pos, writes[0].inputs[0])
    ctx_all = None
    if ctx.target == "qaic" and cb:
        ctx_len = b.op("Gather", [b.op("Shape", [writes[0].inputs[0]], hint="cache_shape"), b.const([2], "int64")],
                       attrs={"axis": 0}, hint="ctx_len")
        ctx_all = b.op("Reshape", [b.op("Range", [b.const(0, "int64"), b.op("Squeeze", [ctx_len]),
                                                  b.const(1, "int64")], hint="all_slots"),
                                   b.const([1, 1, -1], "int64")], hint="all_slots3")               # [1,1,C]
    for w in writes:
        cache = w.inputs[0]
        if not cb:
            _write(Builder(graph, f"batch_index/{w.name}"), ctx.target, w, bi, None, slots, valid, None)
            graph.nodes.remove(w)
            continue
        cache.shape = [FULL_BATCH, *cache.shape[1:]] if cache.shape else cache.shape
        w.outputs[0].shape = list(cache.shape) if cache.shape else None
        others = [n for n in cache.outputs if n is not w]
        if others:  # shape computations on the past see the call's rows
            mine = b.op("Gather", [cache, rows], attrs={"axis": 0}, hint="past_rows")
            _rewire(cache, mine, skip=w)
        lb = Builder(graph, f"batch_index/{w.name.split('/')[1] if w.name.count('/') >= 2 else 'kv'}"
                            f"/{w.name.rsplit('_', 1)[-1]}")
        _write(lb, ctx.target, w, bi, rows, slots, valid, ctx_all)
        graph.nodes.remove(w)
    if ctx.target == "qaic":
        graph.functions = [f for f in graph.functions if f.name not in ("CtxScatterCB", "CtxGatherCB")] + [
            ctx_scatter_cb(), ctx_gather_cb()]
    graph.cleanup(remove_unused_graph_inputs=False)
    return graph
