"""Pass ``lower``: target-neutral graph -> a graph for one target.

``qaic`` (Cloud AI 100): opset 17; each CacheWrite becomes a call of the
model-local function ``com.qualcomm.cloud::CtxScatter(data, position_ids,
updates)`` whose body is a ScatterND over [batch, head, position] indices, the
form QEfficient's device-proven graphs use. Ops newer than opset 17 are
rewritten to their opset-17 forms (Reduce* axes input -> attribute, Split
num_outputs -> split sizes, Gelu -> Erf formula); anything else newer fails.

``openvino`` (OpenVINO's ONNX frontend): opset 17 as for ``qaic``; each CacheWrite
becomes ``ScatterElements(cache, index, updates, axis=2)``, the index the slots
expanded to the update's shape (OpenVINO's ScatterElementsUpdate, which its
MakeStateful transformation keeps on a state variable inside the engine).

``ort`` (ONNX Runtime): opset 24; each CacheWrite becomes
``TensorScatter(cache, updates, write_index, axis=2, mode="circular")``, which
ONNX Runtime updates in place when the output is bound to the input's buffer.

Padding, on both targets: a padded token (position -1) is written to the slot
``(first position + j) mod ctx_len``, distinct from every valid slot of its
row, with the value that slot already holds. So padding never changes the
cache, and never collides with a valid write at the end of the context. The guard (the old
slot values, gathered, kept where the token is padding) is per write; on ``ort`` its gather
index is expanded to the update's shape ``[B, kv_heads, S, d]`` once for every write of that
shape (built from the positions' shape and the cache's static dims), not from each update.
"""
from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from ..contract import CACHE_WRITE, QAIC_DOMAIN, SPECDEC_DOMAIN, TARGET_OPSET
from ..errors import SpecdecError, UnsupportedPatternError
from ..graph_utils import copy_graph, Builder, const_value
from ._context import PassContext, need, graph_pass
from ._static import inferred_dims

_REDUCE_18 = {"ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
              "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare"}
#: ops whose versions after 17 (up to 24) only add types or attributes with
#: defaults that keep the old meaning: valid as they are at opset 17
_SAME_MEANING_AFTER_17 = {"Cast", "CastLike", "Constant", "ConstantOfShape", "Equal", "Identity",
                          "Reshape", "Shape", "Size", "Squeeze", "Unsqueeze", "Transpose", "Flatten",
                          "IsNaN", "IsInf", "If", "Loop", "Scan", "Pad", "ScatterND", "ScatterElements",
                          "Where", "Less", "LessOrEqual", "Greater", "GreaterOrEqual", "Max", "Min"}


def _ctx_scatter_function() -> gs.Function:
    """CtxScatter(data [B,H,C,D], position_ids [B,S], updates [B,H,S,D]) -> data'."""
    data, pos, upd = (gs.Variable(n) for n in ("data", "position_ids", "updates"))
    out = gs.Variable("output")
    nodes = []

    def op(op_type, inputs, attrs=None, name=None):
        o = gs.Variable(name or f"t{len(nodes)}")
        nodes.append(gs.Node(op=op_type, inputs=inputs, outputs=[o], attrs=attrs or {}))
        return o

    def const(value, name):
        o = gs.Variable(name)
        nodes.append(gs.Node(op="Constant", inputs=[], outputs=[o],
                             attrs={"value": gs.Constant(f"{name}_v", np.asarray(value, dtype=np.int64))}))
        return o

    zero, one = const(0, "zero"), const(1, "one")
    shp = op("Shape", [data], name="shape")
    b = op("Gather", [shp, zero], {"axis": 0}, "batch")
    h = op("Gather", [shp, one], {"axis": 0}, "heads")
    s = op("Gather", [op("Shape", [pos], name="pos_shape"), one], {"axis": 0}, "seq")
    bhs = op("Concat", [op("Unsqueeze", [b, const([0], "ax0a")], name="b1"),
                        op("Unsqueeze", [h, const([0], "ax0b")], name="h1"),
                        op("Unsqueeze", [s, const([0], "ax0c")], name="s1")], {"axis": 0}, "bhs")
    bidx = op("Expand", [op("Unsqueeze", [op("Range", [zero, b, one], name="brange"), const([1, 2], "ax12")],
                            name="b3"), bhs], name="bidx")
    hidx = op("Expand", [op("Unsqueeze", [op("Range", [zero, h, one], name="hrange"), const([0, 2], "ax02")],
                            name="h3"), bhs], name="hidx")
    pidx = op("Expand", [op("Unsqueeze", [pos, const([1], "ax1")], name="p3"), bhs], name="pidx")
    idx = op("Concat", [op("Unsqueeze", [bidx, const([3], "ax3a")], name="bi4"),
                        op("Unsqueeze", [hidx, const([3], "ax3b")], name="hi4"),
                        op("Unsqueeze", [pidx, const([3], "ax3c")], name="pi4")], {"axis": 3}, "indices")
    nodes.append(gs.Node(op="ScatterND", inputs=[data, idx, upd], outputs=[out]))
    return gs.Function("CtxScatter", domain=QAIC_DOMAIN, nodes=nodes, inputs=[data, pos, upd],
                       outputs=[out], opset=17)


def _expand_cache_writes(graph: gs.Graph, target: str) -> None:
    writes = [n for n in graph.nodes if n.op == CACHE_WRITE and n.domain == SPECDEC_DOMAIN]
    if not writes:
        return
    b = Builder(graph, "kv")
    pos = writes[0].inputs[1]
    cache0 = writes[0].inputs[0]
    ctx = b.op("Gather", [b.op("Shape", [cache0], hint="cache_shape"), b.const(2, "int64")],
               attrs={"axis": 0}, hint="ctx_len")
    seq = b.op("Gather", [b.op("Shape", [pos], hint="pos_shape"), b.const(1, "int64")],
               attrs={"axis": 0}, hint="seq_len")
    valid = b.op("GreaterOrEqual", [pos, b.const(0, "int64")], hint="valid")                       # [B,S]
    first = b.op("Max", [b.op("Slice", [pos, b.const([0], "int64"), b.const([1], "int64"),
                                        b.const([1], "int64")], hint="first_pos"),
                         b.const(0, "int64")], hint="write_start")                                # [B,1]
    offs = b.op("Range", [b.const(0, "int64"), seq, b.const(1, "int64")], hint="offsets")         # [S]
    wrap = b.op("Mod", [b.op("Add", [first, offs], hint="run"), ctx], hint="pad_slots")           # [B,S]
    slots = b.op("Where", [valid, pos, wrap], hint="slots")                                      # [B,S]
    idx4 = b.op("Unsqueeze", [wrap if target == "ort" else slots, b.const([1, 3], "int64")], hint="slots4")
    valid4 = b.op("Unsqueeze", [valid, b.const([1, 3], "int64")], hint="valid4")                 # [B,1,S,1]
    start = b.op("Squeeze", [first, b.const([1], "int64")], hint="write_index") if target == "ort" else None
    shared: dict = {}
    for node in writes:
        cache, _, update = node.inputs
        out = node.outputs[0]
        layer = node.name.split("/")[1] if node.name.count("/") >= 2 else "kv"
        lb = Builder(graph, f"{layer}/{node.name.rsplit('_', 1)[-1]}")
        index = _shared_index(b, idx4, pos, cache, shared) if target != "qaic" else None
        index = index or lb.op("Expand", [idx4, lb.op("Shape", [update], hint="update_shape")], hint="old_index")
        old = lb.op("GatherElements", [cache, index], attrs={"axis": 2}, hint="old_slots")
        keep = lb.op("Where", [valid4, update, old], hint="pad_keeps_old")
        node.inputs.clear()
        node.outputs.clear()
        if target == "qaic":
            graph.nodes.append(gs.Node(op="CtxScatter", domain=QAIC_DOMAIN, name=f"{lb.scope}/CtxScatter",
                                       inputs=[cache, slots, keep], outputs=[out]))
        elif target == "openvino":   # the slots' index, the shape of the update (ScatterElementsUpdate)
            graph.nodes.append(gs.Node(op="ScatterElements", name=f"{lb.scope}/ScatterElements", attrs={"axis": 2},
                                       inputs=[cache, index, keep], outputs=[out]))
        else:
            graph.nodes.append(gs.Node(op="TensorScatter", name=f"{lb.scope}/TensorScatter",
                                       attrs={"axis": 2, "mode": "circular"},
                                       inputs=[cache, keep, start], outputs=[out]))
    graph.cleanup(remove_unused_graph_inputs=False)


def _shared_index(b: Builder, idx4: gs.Tensor, pos: gs.Tensor, cache: gs.Tensor, shared: dict):
    """ort: the old-slot index expanded to ``[B, kv_heads, S, d]`` once per (kv_heads, d), not
    per write: a CacheWrite's update is that shape by definition (B and S of the positions, the
    cache's static heads and head dim). None where the cache's heads or head dim are not static."""
    dims = list(cache.shape or [])
    if len(dims) != 4 or not all(isinstance(d, int) for d in (dims[1], dims[3])):
        return None
    key = (dims[1], dims[3])
    if key not in shared:
        bs = b.op("Shape", [pos], hint="batch_seq")                                                # [B, S]
        shape = b.op("Concat", [b.op("Slice", [bs, b.const([0], "int64"), b.const([1], "int64")]),
                                b.const([dims[1]], "int64"),
                                b.op("Slice", [bs, b.const([1], "int64"), b.const([2], "int64")]),
                                b.const([dims[3]], "int64")], attrs={"axis": 0}, hint="update_shape")
        shared[key] = b.op("Expand", [idx4, shape], hint="old_index")
    return shared[key]


def _truncate(node: gs.Node, n: int) -> None:
    while len(node.inputs) > n:
        node.inputs.pop()


def _axes_to_attribute(node: gs.Node) -> None:
    if len(node.inputs) < 2 or node.inputs[1] is None or node.inputs[1].name == "":
        _truncate(node, 1)
        return
    axes = const_value(node.inputs[1])
    if axes is None:
        raise UnsupportedPatternError(f"{node.op} node {node.name!r} has non-constant axes; cannot lower to opset 17")
    node.attrs["axes"] = [int(a) for a in np.asarray(axes).reshape(-1)]
    _truncate(node, 1)
    if node.attrs.pop("noop_with_empty_axes", 0):
        raise UnsupportedPatternError(f"{node.op} node {node.name!r} uses noop_with_empty_axes")


def _split_to_sizes(b: Builder, node: gs.Node, dims: dict) -> None:
    """Split-18 ``num_outputs=n`` -> Split-13 with n equal sizes, over a dim
    static in the graph or by shape inference of the graph before lowering (``dims``)."""
    n = int(node.attrs.pop("num_outputs"))
    axis = int(node.attrs.get("axis", 0))
    shape = node.inputs[0].shape
    if shape is None or len(shape) <= abs(axis) or not isinstance(shape[axis], int):
        shape = dims.get(node.inputs[0].name)
    dim = shape[axis] if shape is not None and len(shape) > abs(axis) else None
    if not isinstance(dim, int) or dim % n:
        raise UnsupportedPatternError(
            f"Split node {node.name!r}: num_outputs={n} over a non-static or uneven dim")
    _truncate(node, 1)
    node.inputs.append(b.const([dim // n] * n, "int64", hint="split"))


def _to_opset17(graph: gs.Graph, source_opset: int) -> None:
    if source_opset <= 17:
        return
    b = Builder(graph, "opset17")
    splits = any(n.op == "Split" and "num_outputs" in n.attrs for n in graph.nodes)
    dims = inferred_dims(graph) if splits else {}  # before any node changes its opset form
    for node in list(graph.nodes):
        if node.domain not in (None, "", "ai.onnx"):
            continue
        if node.op in _REDUCE_18:
            _axes_to_attribute(node)
        elif node.op == "Split":
            if "num_outputs" in node.attrs:  # Split-18 with a split input means what Split-13 means
                _split_to_sizes(b, node, dims)
        elif node.op == "Gelu":
            x = node.inputs[0]
            out = node.outputs[0]
            approx = node.attrs.get("approximate", "none")
            node.outputs.clear()
            node.inputs.clear()

            def c(v):  # a scalar in x's dtype (float16 models too)
                return b.op("CastLike", [b.const(v, "float32"), x], hint="gelu_c")
            if approx == "tanh":
                cube = b.op("Mul", [c(0.044715), b.op("Pow", [x, c(3.0)])])
                core = b.op("Tanh", [b.op("Mul", [b.op("Add", [x, cube]), c(float(np.sqrt(2 / np.pi)))])])
            else:
                core = b.op("Erf", [b.op("Div", [x, c(float(np.sqrt(2.0)))])])
            half = b.op("Mul", [x, b.op("Add", [core, c(1.0)])])
            b.op("Mul", [half, c(0.5)], outputs=[out])
        elif node.op == "Cast" and "saturate" in node.attrs:
            node.attrs.pop("saturate")
        else:
            schema_version = _since_version(node.op, source_opset)
            if schema_version is not None and schema_version > 17 and node.op not in _SAME_MEANING_AFTER_17:
                raise UnsupportedPatternError(
                    f"op {node.op} (node {node.name!r}, opset {schema_version}) has no opset-17 form; "
                    f"use --target ort")
    graph.cleanup(remove_unused_graph_inputs=False)


def _from_below_18(graph: gs.Graph, source_opset: int) -> None:
    """Opset 13..17 graph -> valid at 18+: Reduce* axes attribute -> input."""
    if source_opset >= 18:
        return
    if source_opset < 13:
        raise UnsupportedPatternError(f"source opset {source_opset} is older than 13; re-export with opset >= 13")
    b = Builder(graph, "opset_up")
    for node in graph.nodes:
        if node.domain in (None, "", "ai.onnx") and node.op in _REDUCE_18 and "axes" in node.attrs:
            _truncate(node, 1)
            node.inputs.append(b.const(list(node.attrs.pop("axes")), "int64", hint="axes"))


def _since_version(op: str, opset: int) -> int | None:
    try:
        return onnx.defs.get_schema(op, opset).since_version
    except Exception:
        return None


@graph_pass
def lower(graph: gs.Graph, ctx: PassContext) -> gs.Graph:
    target = need("lower", ctx, "target").target
    source_opset = ctx.source_opset if ctx.source_opset is not None else graph.opset
    if source_opset < graph.opset and graph.opset not in TARGET_OPSET.values():  # (lowered already: as it is)
        raise SpecdecError(f"pass lower: ctx.source_opset {source_opset} is older than the graph's own opset "
                           f"{graph.opset}: the context is of another model")
    graph = copy_graph(graph)
    opset = TARGET_OPSET[target]
    _expand_cache_writes(graph, target)
    domains = [onnx.helper.make_opsetid("", opset)]
    if opset <= 17:
        _to_opset17(graph, source_opset)
    else:
        _from_below_18(graph, source_opset)
    if target == "qaic":
        if any(n.op == "CtxScatter" and n.domain == QAIC_DOMAIN for n in graph.nodes):
            graph.functions = [f for f in graph.functions if f.name != "CtxScatter"] + [_ctx_scatter_function()]
        if any(n.domain == QAIC_DOMAIN for n in graph.nodes):  # CtxScatter; batch_index's CB ops
            domains.append(onnx.helper.make_opsetid(QAIC_DOMAIN, 1))
    for f in graph.functions:
        f.opset = opset
    graph.opset = opset
    graph.import_domains = domains
    return graph
