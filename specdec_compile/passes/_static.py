"""What the legalization passes can know about a tensor before the graph runs.

Small, conservative static facts (anything not established is "unknown", and
a pass that needs a fact it cannot establish leaves the node alone or refuses):

    elem_types(graph)   onnx element type of every tensor shape inference types
    inferred_dims(graph) the dims shape inference (with data propagation) establishes
    symbolic_dims(graph) the same, each dim an int, its symbol (dim_param) or None
    vector(t)           the elements of a 1-D int64 shape-like tensor, each an int or None
    scalar(t)           (is t a rank-0 tensor, its value or None)
    rank_of(t)          the rank of t, or None
    unit_axes(t, rank)  the axes of t (rank ``rank``) known to have size 1
    nonnegative(t)      True when every element of the int tensor t is >= 0 in every run
"""
from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from ..graph_utils import copy_graph, const_value, producer, toposort

_DEPTH = 24
_PASS_THROUGH = ("Cast", "Identity")


def _inferred(graph: gs.Graph, data_prop: bool = False) -> onnx.ModelProto:
    ordered = copy_graph(graph)
    toposort(ordered)  # inference reads the nodes in order; passes append theirs at the end
    model = gs.export_onnx(ordered, do_type_check=False)
    try:
        return onnx.shape_inference.infer_shapes(model, strict_mode=False, data_prop=data_prop)
    except Exception:  # inference is a help here, not a requirement
        return model


def inferred_dims(graph: gs.Graph) -> dict[str, list[int | None]]:
    """name -> dims (an int where static, else None), from shape inference with
    data propagation; tensors of unknown rank are absent."""
    model = _inferred(graph, data_prop=True)
    dims = {}
    for vi in [*model.graph.input, *model.graph.value_info, *model.graph.output]:
        t = vi.type.tensor_type
        if t.HasField("shape"):
            dims[vi.name] = [d.dim_value if d.HasField("dim_value") else None for d in t.shape.dim]
    for init in model.graph.initializer:
        dims[init.name] = list(init.dims)
    return dims


def _dims_of(model: onnx.ModelProto) -> dict[str, list]:
    out = {}
    for vi in [*model.graph.input, *model.graph.value_info, *model.graph.output]:
        t = vi.type.tensor_type
        if t.HasField("shape"):
            out[vi.name] = [d.dim_value if d.HasField("dim_value") else _symbol(d.dim_param) for d in t.shape.dim]
    return out


def _types_of(model: onnx.ModelProto) -> dict[str, int]:
    types: dict[str, int] = {}
    for vi in [*model.graph.input, *model.graph.value_info, *model.graph.output]:
        if vi.type.tensor_type.elem_type:
            types[vi.name] = vi.type.tensor_type.elem_type
    for init in model.graph.initializer:
        types[init.name] = init.data_type
    for node in model.graph.node:
        if node.op_type == "Constant":
            for a in node.attribute:
                if a.name == "value":
                    types[node.output[0]] = a.t.data_type
    return types


def symbolic_dims(graph: gs.Graph) -> dict[str, list]:
    """name -> dims as shape inference with data propagation gives them: an int, the
    dim_param's name (one symbol, one value), or None (unknown; inference's ``unk__N``)."""
    return _dims_of(_inferred(graph, data_prop=True))


def dims_and_types(graph: gs.Graph) -> tuple[dict[str, list], dict[str, int]]:
    """``symbolic_dims`` and ``elem_types`` from one run of shape inference (with data propagation)."""
    model = _inferred(graph, data_prop=True)
    return _dims_of(model), _types_of(model)


def _symbol(name: str):
    return None if not name or name.startswith("unk__") else name


def elem_types(graph: gs.Graph) -> dict[str, int]:
    """name -> onnx element type, from the graph's own types and shape inference."""
    return _types_of(_inferred(graph))


def dtype_of(t: gs.Tensor, types: dict[str, int]) -> int | None:
    """The onnx element type of ``t``: its own dtype, else the inferred one."""
    if t.dtype is not None:
        try:
            return onnx.helper.np_dtype_to_tensor_dtype(np.dtype(t.dtype))
        except (TypeError, KeyError, ValueError):
            pass
    return types.get(t.name)


def _axes(node: gs.Node) -> list[int] | None:
    if len(node.inputs) > 1:
        v = vector(node.inputs[1])
        return None if v is None or None in v else v
    axes = node.attrs.get("axes")
    return list(axes) if axes is not None else None


def scalar(t: gs.Tensor, depth: int = 0) -> tuple[bool, int | None]:
    """(t is rank 0, its value if known)."""
    v = const_value(t)
    if v is not None:
        return (v.ndim == 0, int(v) if v.ndim == 0 and v.dtype.kind in "iu" else None)
    p = producer(t)
    if p is None or depth > _DEPTH:
        return (False, None)
    if p.op in _PASS_THROUGH:
        return scalar(p.inputs[0], depth + 1)
    if p.op == "Gather" and p.attrs.get("axis", 0) == 0:
        index = const_value(p.inputs[1])
        if index is not None and index.ndim == 0:
            data = vector(p.inputs[0], depth + 1)
            i = int(index)
            known = data is not None and -len(data) <= i < len(data)
            return (True, data[i] if known else None)
    if p.op == "Squeeze":
        data = vector(p.inputs[0], depth + 1)
        if data is not None and len(data) == 1:
            return (True, data[0])
    return (False, None)


def _shape_vector(p: gs.Node, depth: int) -> list[int | None] | None:
    x = p.inputs[0]
    if x.shape is not None:
        dims = [d if isinstance(d, int) else None for d in x.shape]
    else:
        known = vector(x, depth + 1)  # the shape of a 1-D vector is its length
        if known is None:
            return None
        dims = [len(known)]
    start, end = p.attrs.get("start", 0), p.attrs.get("end", None)
    return dims[start:end]


def vector(t: gs.Tensor, depth: int = 0) -> list[int | None] | None:
    """The elements of the 1-D integer tensor ``t`` (each an int or None when
    unknown), or None when not even its length is known."""
    v = const_value(t)
    if v is not None:
        return [int(x) for x in v.reshape(-1)] if v.ndim == 1 and v.dtype.kind in "iu" else None
    p = producer(t)
    if p is None or depth > _DEPTH:
        static = t.shape is not None and len(t.shape) == 1 and isinstance(t.shape[0], int)
        return [None] * t.shape[0] if static else None
    if p.op in _PASS_THROUGH:
        return vector(p.inputs[0], depth + 1)
    if p.op == "Concat" and p.attrs.get("axis") in (0, -1):
        parts = [vector(x, depth + 1) for x in p.inputs]
        return None if any(x is None for x in parts) else [e for part in parts for e in part]
    if p.op in ("Unsqueeze", "Reshape"):
        is_scalar, value = scalar(p.inputs[0], depth + 1)
        if is_scalar and (p.op == "Reshape" or _axes(p) == [0]):
            return [value]
        return vector(p.inputs[0], depth + 1) if p.op == "Reshape" else None
    if p.op == "Shape":
        return _shape_vector(p, depth)
    if p.op == "ConstantOfShape":
        n = vector(p.inputs[0], depth + 1)
        fill = p.attrs.get("value")
        fill = np.asarray(fill.values).reshape(-1) if isinstance(fill, gs.Constant) else np.zeros(1)
        if n is not None and len(n) == 1 and n[0] is not None and fill.size == 1 and fill[0] == int(fill[0]):
            return [int(fill[0])] * n[0]
    return None


def rank_of(t: gs.Tensor, depth: int = 0) -> int | None:
    if t.shape is not None:
        return len(t.shape)
    v = const_value(t)
    if v is not None:
        return v.ndim
    p = producer(t)
    if p is None or depth > _DEPTH:
        return None
    if p.op in _PASS_THROUGH:
        return rank_of(p.inputs[0], depth + 1)
    if p.op == "Unsqueeze":
        axes, inner = _axes(p), rank_of(p.inputs[0], depth + 1)
        return None if axes is None or inner is None else inner + len(axes)
    if p.op == "Expand":
        target, inner = vector(p.inputs[1], depth + 1), rank_of(p.inputs[0], depth + 1)
        return None if target is None or inner is None else max(len(target), inner)
    return None


def unit_axes(t: gs.Tensor, rank: int, depth: int = 0) -> set[int]:
    """Axes of ``t`` (whose rank is ``rank``) statically known to have size 1."""
    units = set()
    if t.shape is not None and len(t.shape) == rank:
        units |= {i for i, d in enumerate(t.shape) if d == 1}
    p = producer(t)
    if p is None or depth > _DEPTH:
        v = const_value(t)
        return units | ({i for i, d in enumerate(v.shape) if d == 1} if v is not None and v.ndim == rank else set())
    if p.op in _PASS_THROUGH:
        return units | unit_axes(p.inputs[0], rank, depth + 1)
    if p.op == "Unsqueeze":
        axes = _axes(p)
        if axes is not None:
            new = {a % rank for a in axes}
            kept = [i for i in range(rank) if i not in new]
            inner = unit_axes(p.inputs[0], len(kept), depth + 1)
            units |= new | {kept[i] for i in inner}
    elif p.op == "Expand":
        units |= _expand_unit_axes(p, rank, depth)
    return units


def _expand_unit_axes(p: gs.Node, rank: int, depth: int) -> set[int]:
    """Output axis i of Expand(x, target) is 1 iff the target is 1 there (or
    shorter) and x is 1 there (or shorter): both aligned to the right."""
    target, x_rank = vector(p.inputs[1], depth + 1), rank_of(p.inputs[0], depth + 1)
    if target is None or x_rank is None or max(len(target), x_rank) != rank:
        return set()
    x_units = unit_axes(p.inputs[0], x_rank, depth + 1)
    units = set()
    for i in range(rank):
        ti, xi = i - (rank - len(target)), i - (rank - x_rank)
        target_one = ti < 0 or target[ti] == 1
        x_one = xi < 0 or xi in x_units
        if target_one and x_one:
            units.add(i)
    return units


_NONNEG_OPS = ("ArgMax", "ArgMin", "Shape", "Size", "NonZero", "Relu")
_DATA_FIRST = ("Unsqueeze", "Squeeze", "Reshape", "Expand", "Tile", "Transpose", "Flatten", "Identity",
               "Slice", "Gather", "GatherElements", "Cast")


def _is_at_least(node: gs.Node, t: gs.Tensor) -> bool:
    """Is ``node`` ``t >= k`` with constant k >= 0, or ``t > k`` with k >= -1?"""
    if node is None or node.op not in ("GreaterOrEqual", "Greater") or node.inputs[0] is not t:
        return False
    k = const_value(node.inputs[1])
    low = 0 if node.op == "GreaterOrEqual" else -1
    return k is not None and k.size > 0 and bool(np.all(k >= low))


def nonnegative(t: gs.Tensor, depth: int = 0) -> bool:
    """Every element of the integer tensor ``t`` is >= 0, whatever the inputs."""
    v = const_value(t)
    if v is not None:
        return v.dtype.kind in "iub" and bool(np.all(v >= 0))
    p = producer(t)
    if p is None or depth > _DEPTH:
        return False
    if p.op in _NONNEG_OPS:
        return True
    if p.op == "Max":
        return any(nonnegative(x, depth + 1) for x in p.inputs)
    if p.op in ("Add", "Mul", "Min", "Concat"):
        return all(nonnegative(x, depth + 1) for x in p.inputs)
    if p.op == "Mod":  # fmod=0: the result has the divisor's sign
        return not p.attrs.get("fmod", 0) and nonnegative(p.inputs[1], depth + 1)
    if p.op == "Where":
        cond, a, b = p.inputs
        return nonnegative(b, depth + 1) and (nonnegative(a, depth + 1) or _is_at_least(producer(cond), a))
    if p.op in _DATA_FIRST:
        return nonnegative(p.inputs[0], depth + 1)
    return False
