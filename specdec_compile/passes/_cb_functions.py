"""The continuous-batching cache ops of the qaic lowering, as model-local ONNX functions.

``com.qualcomm.cloud::CtxScatterCB(data, batch_index, position_ids, updates)``
and ``com.qualcomm.cloud::CtxGatherCB(data, batch_index, ctx_indices)``: the
names, domain, signatures and ScatterND / GatherND bodies over
``[batch_index, head, position]`` indices of the custom ops QEfficient's
continuous-batching device graphs use (its customop/ctx_scatter_gather_cb.py),
built here from the ONNX spec of those two ops.

CtxScatterCB: data [F,H,C,D], batch_index [B,1], position_ids [B,S], updates
[B,H,S,D] -> data with data[batch_index[b], h, position_ids[b,s]] = updates[b,h,s].
CtxGatherCB: data [F,H,C,D], batch_index [B,1], ctx_indices [B|1, 1, N] ->
[B,H,N,D], out[b,h,n] = data[batch_index[b], h, ctx_indices[b,0,n]].
"""
from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from ..contract import QAIC_DOMAIN


class _Body:
    def __init__(self):
        self.nodes: list[gs.Node] = []

    def op(self, op_type, inputs, attrs=None, name=None):
        o = gs.Variable(name or f"t{len(self.nodes)}")
        self.nodes.append(gs.Node(op=op_type, inputs=inputs, outputs=[o], attrs=attrs or {}))
        return o

    def const(self, value, name):
        o = gs.Variable(name)
        self.nodes.append(gs.Node(op="Constant", inputs=[], outputs=[o],
                                  attrs={"value": gs.Constant(f"{name}_v", np.asarray(value, dtype=np.int64))}))
        return o

    def indices(self, data, batch_index, positions, pos_axes, n_axis: int):
        """[B,H,N,3] indices (batch_index[b], h, positions[...]) with N = dim ``n_axis`` of positions."""
        zero, one = self.const([0], "zero"), self.const([1], "one")
        b = self.op("Gather", [self.op("Shape", [batch_index], name="bi_shape"), zero], {"axis": 0}, "b")
        h = self.op("Gather", [self.op("Shape", [data], name="data_shape"), one], {"axis": 0}, "h")
        n = self.op("Gather", [self.op("Shape", [positions], name="pos_shape"), self.const([n_axis], "naxis")],
                    {"axis": 0}, "n")
        shape = self.op("Concat", [b, h, n, one], {"axis": 0}, "index_shape")
        bidx = self.op("Expand", [self.op("Unsqueeze", [batch_index, self.const([2, 3], "ax23")], name="b4"),
                                  shape], name="bidx")
        hidx = self.op("Expand", [self.op("Unsqueeze", [self.op("Range", [self.const(0, "z0"), self.op(
            "Squeeze", [h], name="h0"), self.const(1, "o1")], name="hrange"), self.const([0, 2, 3], "ax023")],
            name="h4"), shape], name="hidx")
        pidx = self.op("Expand", [self.op("Unsqueeze", [positions, self.const(pos_axes, "pax")], name="p4"),
                                  shape], name="pidx")
        return self.op("Concat", [bidx, hidx, pidx], {"axis": 3}, "indices")


def ctx_scatter_cb() -> gs.Function:
    data, bi, pos, upd = (gs.Variable(n) for n in ("data", "batch_index", "position_ids", "updates"))
    out = gs.Variable("output")
    body = _Body()
    idx = body.indices(data, bi, pos, [1, 3], 1)
    body.nodes.append(gs.Node(op="ScatterND", inputs=[data, idx, upd], outputs=[out]))
    return gs.Function("CtxScatterCB", domain=QAIC_DOMAIN, nodes=body.nodes, inputs=[data, bi, pos, upd],
                       outputs=[out], opset=17)


def ctx_gather_cb() -> gs.Function:
    data, bi, ctx_idx = (gs.Variable(n) for n in ("data", "batch_index", "ctx_indices"))
    out = gs.Variable("output")
    body = _Body()
    idx = body.indices(data, bi, ctx_idx, [3], 2)
    body.nodes.append(gs.Node(op="GatherND", inputs=[data, idx], outputs=[out]))
    return gs.Function("CtxGatherCB", domain=QAIC_DOMAIN, nodes=body.nodes, inputs=[data, bi, ctx_idx],
                       outputs=[out], opset=17)
