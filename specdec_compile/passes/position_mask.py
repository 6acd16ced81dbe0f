"""Pass ``position_mask``: the attention mask, derived from position_ids alone.

A query at position p sees slot c iff c <= p; on a layer with a sliding
window of W tokens (detection reads W off the export's own mask) iff
p - W < c <= p. A padded query (p = -1) sees nothing. Every mask operand
detection found (the additive mask or the Where condition on the scores path)
is replaced by a mask built once (per window size) from ``position_ids`` and
the cache length, and the ``attention_mask`` input, now unused, is removed.
Masked scores get ``ctx.mask_value`` (finite, so a fully padded row is
uniform, never NaN). Built from GreaterOrEqual, Greater and Where only (ops
with Cloud AI 100 precedent), in the operand's own dtype.
"""
from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from ..contract import past_name, retained_name
from ..errors import UnsupportedPatternError
from ..graph_utils import copy_graph, Builder, node_by_name, replace_uses, tensor_by_name
from ._context import PassContext, need, graph_pass, distinct_node_names
from ._subgraphs import deep_dependence


def _key_length_source(graph: gs.Graph, det) -> gs.Tensor:
    """Layer 0's keys: the retained cache's input once ``retained_kv`` ran (the same shape
    as its output, and read before anything the mask feeds: an export that takes its batch
    size from ``Shape(attention_mask)`` would otherwise make a cycle), else the Concat's output."""
    t = graph.tensors().get(past_name("key", det.layers[0].index))
    if t is not None and t in graph.inputs:
        return t
    t = graph.tensors().get(retained_name("key", det.layers[0].index))
    if t is not None:
        return t
    return node_by_name(graph, det.layers[0].key_concat).outputs[0]


class _Masks:
    """The masks of one graph, built on demand: visibility per window, and the
    additive / negated forms per (window, dtype)."""

    def __init__(self, graph: gs.Graph, det, mask_value: float):
        self.b = Builder(graph, "mask")
        b = self.b
        keys = _key_length_source(graph, det)
        key_len = b.op("Gather", [b.op("Shape", [keys], hint="cache_shape"), b.const(2, "int64")],
                       attrs={"axis": 0}, hint="key_len")
        self.slots = b.op("Range", [b.const(0, "int64"), key_len, b.const(1, "int64")], hint="slots")   # [C]
        pos = tensor_by_name(graph, det.position_ids)
        self.query = b.op("Unsqueeze", [pos, b.const([1, 3], "int64")], hint="query_pos")             # [B,1,S,1]
        self.mask_value = mask_value
        self.cache: dict = {}

    def visible(self, window: int | None) -> gs.Tensor:
        key = ("visible", window)
        if key not in self.cache:
            b = self.b
            if window is None:
                self.cache[key] = b.op("GreaterOrEqual", [self.query, self.slots], hint="visible")   # c <= p
            else:
                lower = b.op("Sub", [self.query, b.const(window, "int64")], hint=f"window{window}_start")
                inside = b.op("Greater", [self.slots, lower], hint=f"window{window}")               # c > p - W
                # outside the window the query counts as padding (-1), which sees nothing
                query = b.op("Where", [inside, self.query, b.const(-1, "int64")], hint=f"window{window}_query")
                self.cache[key] = b.op("GreaterOrEqual", [query, self.slots], hint=f"visible_w{window}")
        return self.cache[key]

    def additive(self, window: int | None, dtype: str) -> gs.Tensor:
        key = ("additive", window, dtype)
        if key not in self.cache:
            b = self.b
            self.cache[key] = b.op("Where", [self.visible(window), b.const(0.0, dtype),
                                             b.const(self.mask_value, dtype)], hint=f"additive_{dtype}")
        return self.cache[key]

    def masked(self, window: int | None) -> gs.Tensor:
        key = ("masked", window)
        if key not in self.cache:
            self.cache[key] = self.b.op("Not", [self.visible(window)], hint="masked")
        return self.cache[key]


def _site_windows(det) -> dict[tuple[str, int], int | None]:
    """(node, input) -> window; a site shared by layers must have one window."""
    windows = {layer.index: layer.window for layer in det.layers}
    out: dict = {}
    for site in det.mask_sites:
        key = (site.node, site.input_index)
        w = windows.get(site.layer)
        if key in out and out[key] != w:
            raise UnsupportedPatternError(f"mask operand {site.node!r} (input {site.input_index}) is shared by "
                                          f"layers with different windows ({out[key]}, {w})")
        out[key] = w
    return out


@graph_pass
def position_mask(graph: gs.Graph, ctx: PassContext) -> gs.Graph:
    det = need("position_mask", ctx, "detection").detection
    distinct_node_names("position_mask", graph)
    if not det.mask_sites:
        return graph
    graph = copy_graph(graph)
    masks = _Masks(graph, det, ctx.mask_value)
    windows = _site_windows(det)
    for site in det.mask_sites:
        node = node_by_name(graph, site.node)
        window = windows[(site.node, site.input_index)]
        if site.kind == "additive":
            dtype = site.dtype or det.info.dtype
            if np.dtype(dtype).kind != "f":
                raise UnsupportedPatternError(f"additive mask operand of {site.node!r} has dtype {dtype}")
            node.inputs[site.input_index] = masks.additive(window, dtype)
        elif site.kind == "visible":
            node.inputs[site.input_index] = masks.visible(window)
        elif site.kind == "masked":
            node.inputs[site.input_index] = masks.masked(window)
        else:  # pragma: no cover - detection only makes the three kinds
            raise UnsupportedPatternError(f"unknown mask kind {site.kind!r}")
    graph.cleanup(remove_unused_graph_inputs=False)
    if det.attention_mask is not None:
        _drop_attention_mask(graph, det, masks.b)
    return graph


def _drop_attention_mask(graph: gs.Graph, det, b: Builder) -> None:
    """Remove the ``attention_mask`` input. Uses left that read only its shape
    (an exporter slicing its mask to the key length) read a stand-in of the
    cache's length, ``[batch, ctx_len]``; a use of its values is refused (inside an If, Loop or
    Scan body too: those read it without naming it as their node's input)."""
    am = graph.tensors().get(det.attention_mask)
    if am is not None and am.outputs:
        top = {id(n) for n in graph.nodes}
        users = ", ".join(sorted({n.name if id(n) in top else f"{n.op} {n.name!r} in an If/Loop/Scan body"
                                  for n in am.outputs}))
        ids = tensor_by_name(graph, det.input_ids)
        batch = b.op("Slice", [b.op("Shape", [ids]), b.const([0], "int64"), b.const([1], "int64")], hint="batch")
        ctx_len = b.op("Slice", [b.op("Shape", [_key_length_source(graph, det)]), b.const([2], "int64"),
                                 b.const([3], "int64")], hint="ctx_len")
        fill = gs.Constant("specdec/mask/ones", np.ones(1, dtype=np.dtype(am.dtype or np.int64)))
        stand_in = b.op("ConstantOfShape", [b.op("Concat", [batch, ctx_len], attrs={"axis": 0})],
                        attrs={"value": fill}, hint="attention_mask_shape")
        replace_uses(graph, am, stand_in)
        dep = deep_dependence(graph, [stand_in])
        if any(id(t) in dep for t in graph.outputs):
            raise UnsupportedPatternError(
                f"{det.attention_mask!r} is still used outside the attention mask (by {users}); "
                f"cannot derive the mask from position_ids alone")
    graph.inputs = [t for t in graph.inputs if t.name != det.attention_mask]
