"""Pass ``fold_static_shapes`` (qaic): integer shape arithmetic with a static
answer becomes a constant.

Exports compute index patterns from shapes at run time even where the shapes
are static: GLM's and Helium's rotary ``repeat_interleave`` builds its gather
indices with ``ConstantOfShape``, ``ReduceMax``, ``Range``, ``Less`` and
``NonZero`` (QEfficient removed ``NonZero`` as unsupported by the device,
commit f9f4ac92e). Where every value such a computation reads is known at
compile time (small constants, and the static dims of ``Shape`` as ONNX shape
inference establishes them), it is evaluated here and replaced by its result.

Only integer and boolean results are folded (exact by construction: the
reference evaluation is integer arithmetic), only small ones (at most
``MAX_ELEMENTS``), and nothing that reads a value of the model's inputs or of
an external weight. Whatever depends on ``batch_size``, ``seq_len`` or
``ctx_len`` stays as it is.
"""
from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from ..graph_utils import copy_graph, const_value, is_external, producer, replace_uses, topo_nodes
from ._context import PassContext, need, graph_pass
from ._static import dtype_of, elem_types, inferred_dims

MAX_ELEMENTS = 4096
_EXACT = {onnx.TensorProto.INT64, onnx.TensorProto.INT32, onnx.TensorProto.INT8, onnx.TensorProto.UINT8,
          onnx.TensorProto.BOOL}
#: ops that are not a function of their inputs' values alone
_NOT_FOLDABLE = {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial",
                 "Bernoulli", "If", "Loop", "Scan"}


def _shape_value(node: gs.Node, dims: dict) -> np.ndarray | None:
    """Shape/Size of a tensor whose (selected) dims are all static."""
    d = dims.get(node.inputs[0].name)
    if d is None:
        return None
    if node.op == "Size":
        return np.asarray(np.prod(d), dtype=np.int64) if None not in d else None
    d = d[node.attrs.get("start", 0):node.attrs.get("end", None)]
    return np.asarray(d, dtype=np.int64) if None not in d else None


def _partial_shape_value(node: gs.Node, dims: dict) -> np.ndarray | None:
    """Gather(Shape(x), const) or Slice(Shape(x), consts) picking only static dims."""
    src = producer(node.inputs[0])
    if src is None or src.op != "Shape" or dims.get(src.inputs[0].name) is None:
        return None
    d = dims[src.inputs[0].name][src.attrs.get("start", 0):src.attrs.get("end", None)]
    params = [const_value(t) for t in node.inputs[1:] if t is not None and t.name]
    if any(p is None for p in params):
        return None
    if node.op == "Gather" and node.attrs.get("axis", 0) == 0:
        picked = np.asarray(np.asarray(d, dtype=object)[params[0]])
    elif node.op == "Slice" and (len(params) < 3 or params[2].reshape(-1).tolist() == [0]):
        start, end = int(params[0].reshape(-1)[0]), int(params[1].reshape(-1)[0])
        step = int(params[3].reshape(-1)[0]) if len(params) > 3 else 1
        picked = np.asarray(d[start:end:step], dtype=object)
    else:
        return None
    if any(x is None for x in picked.reshape(-1)):
        return None
    return picked.astype(np.int64)


def _evaluate(node: gs.Node, known: dict) -> list[np.ndarray] | None:
    from onnx.reference import ReferenceEvaluator

    inputs = [gs.Variable(f"in{j}", dtype=known[id(t)].dtype, shape=known[id(t)].shape)
              if t is not None and t.name else gs.Variable("") for j, t in enumerate(node.inputs)]
    outputs = [gs.Variable(f"out{j}") for j in range(len(node.outputs))]
    g = gs.Graph(nodes=[gs.Node(node.op, attrs=dict(node.attrs), inputs=inputs, outputs=outputs,
                                domain=node.domain)],
                 inputs=[t for t in inputs if t.name], outputs=outputs, opset=17)
    feeds = {f"in{j}": known[id(t)] for j, t in enumerate(node.inputs) if t is not None and t.name}
    try:
        return [np.asarray(x) for x in ReferenceEvaluator(gs.export_onnx(g, do_type_check=False)).run(None, feeds)]
    except Exception:
        return None


def _known_constant(t: gs.Tensor) -> np.ndarray | None:
    if isinstance(t, gs.Constant) and is_external(t):
        return None
    v = const_value(t)
    return v if v is not None and v.size <= MAX_ELEMENTS else None


def _refine_slice(node: gs.Node, dims: dict, known: dict) -> None:
    """The dims of a Slice output whose starts/ends/axes/steps are known now
    (inference cannot see through computed slice bounds)."""
    src = dims.get(node.inputs[0].name)
    params = [known.get(id(t)) for t in node.inputs[1:] if t is not None and t.name]
    if src is None or len(params) < 2 or any(p is None for p in params):
        return
    starts, ends = params[0].reshape(-1), params[1].reshape(-1)
    axes = params[2].reshape(-1) if len(params) > 2 else np.arange(len(starts))
    steps = params[3].reshape(-1) if len(params) > 3 else np.ones(len(starts), np.int64)
    out = list(src)
    for start, end, axis, step in zip(starts, ends, axes, steps):
        axis = int(axis) % len(src)
        out[axis] = len(range(*slice(int(start), int(end), int(step)).indices(src[axis]))) \
            if src[axis] is not None else None
    dims[node.outputs[0].name] = out


def static_values(graph: gs.Graph) -> dict[int, np.ndarray]:
    """id(tensor) -> value, for every small integer/bool tensor computable now."""
    dims, types = inferred_dims(graph), elem_types(graph)
    known: dict[int, np.ndarray] = {}
    for t in graph.tensors().values():
        v = _known_constant(t)
        if v is not None:
            known[id(t)] = v
    for node in topo_nodes(graph):
        if node.op == "Slice":
            _refine_slice(node, dims, known)
        if node.op in _NOT_FOLDABLE or node.domain not in (None, "", "ai.onnx"):
            continue
        if any(dtype_of(o, types) not in _EXACT for o in node.outputs) or any(id(o) in known for o in node.outputs):
            continue
        if node.op in ("Shape", "Size"):
            values = [_shape_value(node, dims)]
        elif all(t is None or not t.name or id(t) in known for t in node.inputs):
            values = _evaluate(node, known)
        else:
            values = [_partial_shape_value(node, dims)] if node.op in ("Gather", "Slice") else None
        if values and all(v is not None and v.size <= MAX_ELEMENTS for v in values):
            known.update({id(o): v for o, v in zip(node.outputs, values)})
    return known


@graph_pass
def fold_static_shapes(graph: gs.Graph, ctx: PassContext) -> gs.Graph:
    need("fold_static_shapes", ctx)
    graph = copy_graph(graph)
    known = static_values(graph)
    outputs = {id(t) for t in graph.outputs}
    folded = 0
    for t in list(graph.tensors().values()):
        p = producer(t)
        if id(t) not in known or p is None or p.op == "Constant" or id(t) in outputs or not t.outputs:
            continue
        replace_uses(graph, t, gs.Constant(f"{t.name}__static", np.asarray(known[id(t)])))
        folded += 1
    if folded:
        graph.cleanup(remove_unused_graph_inputs=False)
    return graph
