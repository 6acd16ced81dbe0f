"""Pass ``position_mask``: the attention mask, derived from position_ids alone.

A query at position p sees slot c iff c <= p; a padded query (p = -1) sees
nothing. Every mask operand detection found (the additive mask or the Where
condition on the scores path) is replaced by one mask built once from
``position_ids`` and the key length (the last dim of the scores), and the
``attention_mask`` input, now unused, is removed. Masked scores get
``ctx.mask_value`` (finite, so a fully padded row is uniform, never NaN).
"""
from __future__ import annotations

import onnx_graphsurgeon as gs

from ..errors import UnsupportedPatternError
from ..graph_utils import Builder, node_by_name, tensor_by_name
from ._context import PassContext, need


def position_mask(graph: gs.Graph, ctx: PassContext) -> gs.Graph:
    det = need("position_mask", ctx, "detection").detection
    mask_value = ctx.mask_value
    if not det.mask_sites:
        return graph
    graph = graph.copy()
    b = Builder(graph, "mask")
    pos = tensor_by_name(graph, det.position_ids)
    first = node_by_name(graph, det.mask_sites[0].node)
    # the scores operand of the first site: its last dim is the key length
    scores = next(x for j, x in enumerate(first.inputs) if j != det.mask_sites[0].input_index
                  and (first.op != "Where" or j > 0))
    key_len = b.op("Gather", [b.op("Shape", [scores], hint="scores_shape"), b.const(-1, "int64")],
                   attrs={"axis": 0}, hint="key_len")
    slots = b.op("Range", [b.const(0, "int64"), key_len, b.const(1, "int64")], hint="slots")   # [C]
    query = b.op("Unsqueeze", [pos, b.const([1, 3], "int64")], hint="query_pos")              # [B,1,S,1]
    visible = b.op("LessOrEqual", [slots, query], hint="visible")                             # [B,1,S,C]
    additive = None
    masked = None
    for site in det.mask_sites:
        node = node_by_name(graph, site.node)
        if site.kind == "additive":
            if additive is None:
                fill = b.op("Where", [visible, b.const(0.0, "float32"), b.const(mask_value, "float32")],
                            hint="additive_f32")
                like = node.inputs[1 - site.input_index] if len(node.inputs) == 2 else scores
                additive = b.op("CastLike", [fill, like], hint="additive")
            node.inputs[site.input_index] = additive
        elif site.kind == "visible":
            node.inputs[site.input_index] = visible
        elif site.kind == "masked":
            if masked is None:
                masked = b.op("Not", [visible], hint="masked")
            node.inputs[site.input_index] = masked
        else:  # pragma: no cover - detection only makes the three kinds
            raise UnsupportedPatternError(f"unknown mask kind {site.kind!r}")
    graph.cleanup(remove_unused_graph_inputs=False)
    if det.attention_mask is not None:
        am = graph.tensors().get(det.attention_mask)
        if am is not None and am.outputs:
            users = ", ".join(sorted(n.name for n in am.outputs))
            raise UnsupportedPatternError(
                f"{det.attention_mask!r} is still used outside the attention mask (by {users}); "
                f"cannot derive the mask from position_ids alone")
        graph.inputs = [t for t in graph.inputs if t.name != det.attention_mask]
    return graph
