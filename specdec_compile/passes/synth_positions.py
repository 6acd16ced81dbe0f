"""Pass ``synth_positions``: positions come from ``position_ids``, everywhere.

When the export has no ``position_ids`` input (Gemma, Gemma-2/3, gpt-oss,
Nemotron, Bloom, MPT, Falcon-ALiBi: they derive positions from the past length
or from ``attention_mask``), the pass adds it (int64 ``[batch_size, seq_len]``)
and feeds from it every query-position value detection found (the export's own
``[1, seq]`` position_ids, made from a Range over the past length): rows then
have their own positions, and padding is ``-1``.

ALiBi key positions (a CumSum of ``attention_mask``) become the slot index
0..ctx_len-1 of the cache, ``[batch, 1.., ctx_len]``: in the rewrite the key at
slot c is at position c. Slots a query must not see are masked, so padding
stays a no-op. The other passes (the mask, the cache write) then read
``position_ids`` like any export's.
"""
from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from ..contract import BATCH, SEQ
from ..graph_utils import copy_graph, Builder, node_by_name, replace_uses, tensor_by_name
from ._context import PassContext, need, graph_pass, distinct_node_names


def _key_slots(b: Builder, graph: gs.Graph, det, ids: gs.Tensor, rank: int, dtype: str) -> gs.Tensor:
    """slot index 0..K-1 as [batch, 1, ..., K] in ``dtype``, K the key length of layer 0."""
    keys = node_by_name(graph, det.layers[0].key_concat).outputs[0]   # the cache: ctx_len long once retained
    k = b.op("Slice", [b.op("Shape", [keys], hint="cache_shape"), b.const([2], "int64"), b.const([3], "int64")],
             hint="key_len")
    slots = b.op("Range", [b.const(0, "int64"), b.op("Squeeze", [k, b.const([0], "int64")]), b.const(1, "int64")],
                 hint="slots")
    batch = b.op("Slice", [b.op("Shape", [ids], hint="ids_shape"), b.const([0], "int64"), b.const([1], "int64")],
                 hint="batch")
    shape = b.op("Concat", [batch, b.const([1] * (rank - 2), "int64"), k], attrs={"axis": 0}, hint="slots_shape")
    ones = b.op("Concat", [b.const([1] * (rank - 1), "int64"), k], attrs={"axis": 0}, hint="slots_row")
    out = b.op("Expand", [b.op("Reshape", [slots, ones]), shape], hint="key_positions")
    if dtype != "int64":
        out = b.op("Cast", [out], attrs={"to": _onnx_type(dtype)}, hint="key_positions_cast")
    return out


def _onnx_type(dtype: str) -> int:
    from onnx import helper
    return helper.np_dtype_to_tensor_dtype(np.dtype(dtype))


@graph_pass
def synth_positions(graph: gs.Graph, ctx: PassContext) -> gs.Graph:
    det = need("synth_positions", ctx, "detection").detection
    distinct_node_names("synth_positions", graph)
    if not det.synthesize_position_ids and not det.position_sources:
        return graph
    graph = copy_graph(graph)
    b = Builder(graph, "positions")
    if det.synthesize_position_ids:
        pos = gs.Variable(det.position_ids, dtype=np.int64, shape=[BATCH, SEQ])
        graph.inputs.insert(1, pos)
    else:
        pos = tensor_by_name(graph, det.position_ids)
    ids = tensor_by_name(graph, det.input_ids)
    for src in det.position_sources:
        old = tensor_by_name(graph, src.tensor)
        if src.kind == "query":
            replace_uses(graph, old, pos)
        else:
            replace_uses(graph, old, _key_slots(b, graph, det, ids, src.rank or 2, src.dtype or "int64"))
    graph.cleanup(remove_unused_graph_inputs=False)
    return graph
