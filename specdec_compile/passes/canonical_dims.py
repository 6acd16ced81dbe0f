"""Pass ``canonical_dims``: the contract's interface, in the contract's order.

Only ``batch_size``, ``seq_len`` and ``ctx_len`` stay symbolic: ``qaic-exec``
binds the keys of the specialization file to exactly these names. Shapes of
intermediate tensors are dropped (the exporter's dim names, such as
``past_sequence_length + sequence_length``, no longer hold after the rewrite).
"""
from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from ..contract import BATCH, CTX, HIDDEN_STATES, INPUT_IDS, LOGITS, POSITION_IDS, SEQ, interface
from ..errors import UnsupportedPatternError
from ..graph_utils import copy_graph, Builder
from ._context import PassContext, need, graph_pass


@graph_pass
def canonical_dims(graph: gs.Graph, ctx: PassContext) -> gs.Graph:
    det = need("canonical_dims", ctx, "detection").detection
    graph = copy_graph(graph)
    info = det.info
    by_name = {t.name: t for t in graph.inputs}
    for orig, new in ((det.input_ids, INPUT_IDS), (det.position_ids, POSITION_IDS)):
        t = by_name.get(orig) or by_name.get(new)
        t.name = new
    # integer inputs are int64 in the contract
    b = Builder(graph, "dims")
    for name in (INPUT_IDS, POSITION_IDS):
        t = next(x for x in graph.inputs if x.name == name)
        if t.dtype is not None and np.dtype(t.dtype) != np.int64:
            inner = gs.Variable(f"{name}__{np.dtype(t.dtype).name}", dtype=t.dtype)
            for node in list(t.outputs):
                for j, x in enumerate(node.inputs):
                    if x is t:
                        node.inputs[j] = inner
            b.op("Cast", [t], attrs={"to": onnx.helper.np_dtype_to_tensor_dtype(np.dtype(t.dtype))},
                 outputs=[inner], hint=f"{name}_cast")
            t.dtype = np.int64
        t.shape = [BATCH, SEQ]
    if det.feature_input is not None:  # a feature draft's features: [batch_size, seq_len, F], like input_ids
        feat = by_name.get(det.feature_input) or by_name.get(HIDDEN_STATES)
        clash = graph.tensors().get(HIDDEN_STATES)
        if clash is not None and clash is not feat:
            clash.name = f"{HIDDEN_STATES}__export"
        feat.name = HIDDEN_STATES
        feat.shape = [BATCH, SEQ, det.feature_width]
    ins, outs = interface(info.num_layers, features=det.feature_input is not None,
                          hidden_states=any(t.name == HIDDEN_STATES for t in graph.outputs))
    inputs = {t.name: t for t in graph.inputs}
    outputs = {t.name: t for t in graph.outputs}
    missing = [n for n in ins if n not in inputs] + [n for n in outs if n not in outputs]
    if missing:
        raise UnsupportedPatternError(f"rewrite lost interface tensors: {', '.join(missing)}")
    extra = sorted(set(inputs) - set(ins)) + sorted(set(outputs) - set(outs))
    if extra:
        raise UnsupportedPatternError(f"rewrite left extra interface tensors: {', '.join(extra)}")
    graph.inputs = [inputs[n] for n in ins]
    graph.outputs = [outputs[n] for n in outs]
    for name in [n for n in ins + outs if n.startswith("past_")]:
        t = inputs.get(name) or outputs[name]
        dim = info.value_head_dim if (info.value_head_dim and name.startswith("past_value.")) else info.head_dim
        t.shape = [BATCH, info.num_kv_heads, CTX, dim]
    logits = outputs[LOGITS]
    if logits.shape is None or len(logits.shape) != 3:
        logits.shape = [BATCH, SEQ, info.vocab_size]
    logits.shape = [BATCH, logits.shape[1] if logits.shape[1] == 1 else SEQ, info.vocab_size]
    io = {id(t) for t in graph.inputs} | {id(t) for t in graph.outputs}
    for t in graph.tensors().values():
        if isinstance(t, gs.Variable) and id(t) not in io:
            t.shape = None
    return graph
