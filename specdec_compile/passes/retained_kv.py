"""Pass ``retained_kv``: growing KV cache -> fixed ``ctx_len`` cache written at position_ids.

Each layer's ``present = Concat(past, new, axis=2)`` becomes
``past_X.i_RetainedState = ai.specdec::CacheWrite(past_X.i, position_ids, new)``:
the same tensor now holds all ``ctx_len`` slots, the token at position p in
slot p. Attention reads the whole cache; the mask pass makes unwritten and
future slots invisible. CacheWrite is target-neutral; ``lower`` expands it.

CacheWrite(cache [B,H,C,D], position_ids [B,S], update [B,H,S,D]) -> cache':
cache'[b,:,position_ids[b,j],:] = update[b,:,j,:] for every j with
position_ids[b,j] >= 0; a padded token (position -1) changes nothing.

Shape computations on the past inputs that survive see a past length of
``ctx_len - seq_len``, so that "past + seq" is the cache length.
"""
from __future__ import annotations

import onnx_graphsurgeon as gs

from ..contract import BATCH, CACHE_WRITE, CTX, SPECDEC_DOMAIN, past_name, retained_name
from ..errors import SpecdecError, UnsupportedPatternError
from ..graph_utils import copy_graph, Builder, graph_input, node_by_name, replace_uses, tensor_by_name
from ._context import PassContext, need, graph_pass, distinct_node_names
from ._subgraphs import subgraph_readers


def _virtual_past_shapes(graph: gs.Graph, pasts: list[gs.Tensor], pos: gs.Tensor) -> None:
    """Shape(past) nodes that survive mean "the past length": make it ctx_len - seq_len.

    Exporters compute the key length as ``past_len + seq_len`` from shapes (the
    dynamo export's GQA Expand does). With a fixed cache the keys are ctx_len
    long, so the past a shape computation sees must be ``ctx_len - seq_len``.
    """
    b = Builder(graph, "kv/virtual_past")
    seq = None
    for past in pasts:
        for node in [n for n in past.outputs if n.op == "Shape"]:
            if seq is None:
                seq = b.op("Slice", [b.op("Shape", [pos], hint="pos_shape"), b.const([1], "int64"),
                                     b.const([2], "int64")], hint="seq")
            full = b.op("Shape", [past], hint="cache_shape")
            ctx = b.op("Slice", [full, b.const([2], "int64"), b.const([3], "int64")], hint="ctx")
            virtual = b.op("Concat", [b.op("Slice", [full, b.const([0], "int64"), b.const([2], "int64")]),
                                      b.op("Sub", [ctx, seq], hint="past_len"),
                                      b.op("Slice", [full, b.const([3], "int64"), b.const([4], "int64")])],
                           attrs={"axis": 0}, hint="shape")
            start = int(node.attrs.get("start", 0))
            end = node.attrs.get("end")
            sliced = b.op("Slice", [virtual, b.const([start], "int64"),
                                    b.const([4 if end is None else int(end)], "int64")], hint="slice")
            replace_uses(graph, node.outputs[0], sliced)
            node.inputs.clear()
            node.outputs.clear()
            graph.nodes.remove(node)


def _check_past_readers(graph: gs.Graph, past: gs.Tensor, concat: gs.Node) -> None:
    """The past is read by its cache Concat and by Shape nodes (the past length) only: any other
    reader would read the whole ``ctx_len`` cache, written slots and stale ones, where the export
    reads the past tokens (a silently different value), and a subgraph's reads are not rewritten."""
    inner = {id(n) for n in subgraph_readers(graph, past)}
    others = [n for n in past.outputs if n is not concat and (n.op != "Shape" or id(n) in inner)]
    if others:
        n = others[0]
        where = " in an If/Loop/Scan body" if id(n) in inner else ""
        raise UnsupportedPatternError(
            f"past input {past.name!r} is read by {n.op} node {n.name!r}{where}, not only by its cache Concat "
            f"{concat.name!r} (and Shape): with a retained cache that node would read all ctx_len slots")


@graph_pass
def retained_kv(graph: gs.Graph, ctx: PassContext) -> gs.Graph:
    det = need("retained_kv", ctx, "detection").detection
    distinct_node_names("retained_kv", graph)
    if any(n.op == CACHE_WRITE and n.domain == SPECDEC_DOMAIN for n in graph.nodes):
        raise SpecdecError("pass retained_kv has already run on this graph (it has cache writes): run each pass once")
    graph = copy_graph(graph)
    pos = tensor_by_name(graph, det.position_ids)
    drop = set()
    new_outputs = []
    pasts = []
    for layer in det.layers:
        for kind, concat_name, in_name, present in (
                ("key", layer.key_concat, layer.key_input, layer.key_outputs),
                ("value", layer.value_concat, layer.value_input, layer.value_outputs)):
            concat = node_by_name(graph, concat_name)
            past = graph_input(graph, in_name)
            _check_past_readers(graph, past, concat)
            new = concat.inputs[1]
            old_out = concat.outputs[0]
            pasts.append(past)
            past.name = past_name(kind, layer.index)
            past.shape = [BATCH, past.shape[1], CTX, past.shape[3]]
            written = gs.Variable(retained_name(kind, layer.index), dtype=past.dtype, shape=list(past.shape))
            node = gs.Node(op=CACHE_WRITE, domain=SPECDEC_DOMAIN,
                           name=f"specdec/L{layer.index}/cache_write_{kind}",
                           inputs=[past, pos, new], outputs=[written])
            graph.nodes.append(node)
            replace_uses(graph, old_out, written)
            concat.inputs.clear()
            concat.outputs.clear()
            graph.nodes.remove(concat)
            drop.update(present)
            new_outputs.append(written)
    _virtual_past_shapes(graph, pasts, pos)
    kept = [t for t in graph.outputs if t.name not in drop and t not in new_outputs]
    graph.outputs = kept + new_outputs
    return graph
