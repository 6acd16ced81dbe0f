"""Pass ``expose_hidden_states``: the residual stream after chosen decoder
layers becomes one more output, for every position of the call.

TLM (``--hidden-states LAYERS``): output ``hidden_states``, ``[batch_size,
seq_len, n * hidden]``, the outputs of the listed layers concatenated in the
listed order (-1: the last layer, before the final norm). A feature draft
(DLM with ``--feature-layers``): output ``draft_hidden_states``, its own last
layer's output, ``[batch_size, seq_len, hidden]``: its prediction of the
target's feature at each position. The tensors are those the detection found
(``Detection.layer_outputs``); a model where they were not found is refused
with the reason. No-op when ``ctx.exposed_layers`` is None.
"""
from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from ..contract import BATCH, DRAFT_HIDDEN_STATES, HIDDEN_STATES, SEQ
from ..errors import SpecdecError, UnsupportedPatternError
from ..graph_utils import copy_graph, Builder, tensor_by_name
from ..layer_lists import resolve_layers
from ._context import PassContext, need, graph_pass


@graph_pass
def expose_hidden_states(graph: gs.Graph, ctx: PassContext) -> gs.Graph:
    need("expose_hidden_states", ctx, "detection", "role")
    if ctx.exposed_layers is None:
        return graph
    det = ctx.detection
    if any(n.name.startswith("specdec/hidden_states/") for n in graph.nodes):
        raise SpecdecError("pass expose_hidden_states has already run on this graph: run each pass once")
    option = "--hidden-states" if ctx.role == "tlm" else "--feature-layers (the draft's own features)"
    if not det.layer_outputs:
        raise UnsupportedPatternError(f"{option}: the decoder layers' outputs are not found: "
                                      f"{det.layer_outputs_problem or 'no layers'}")
    layers = resolve_layers(tuple(ctx.exposed_layers), len(det.layer_outputs), option)
    graph = copy_graph(graph)
    picked = [tensor_by_name(graph, det.layer_outputs[i]) for i in layers]
    b = Builder(graph, "hidden_states")
    dtype = np.dtype(det.info.dtype)
    if len(picked) == 1:
        out = b.op("Identity", picked, hint="layer_output", dtype=dtype)
    else:
        out = b.op("Concat", picked, attrs={"axis": -1}, hint="layer_outputs", dtype=dtype)
    name = HIDDEN_STATES if ctx.role == "tlm" else DRAFT_HIDDEN_STATES
    clash = graph.tensors().get(name)
    if clash is not None:  # an export's own tensor of that name keeps its place under another
        clash.name = f"{name}__export"
    out.name = name
    out.shape = [BATCH, SEQ, len(picked) * det.hidden_size]
    graph.outputs.append(out)
    return graph
