"""Shape facts traced through a graph's shape arithmetic, over the dims shape inference gives
(``_static.symbolic_dims``: an int, a dim symbol, or None):

    target_dims(t, dims)        the elements of a 1-D shape tensor (an Expand's or Reshape's target)
    static_axis(t, axis, dims)  the static size of one axis of a rank-4 tensor, traced back through
                                elementwise ops, Transpose and Reshape (its -1 worked out)
    same(a, b)                  two dims known equal (the same int, or the same symbol)

Anything not established is None: callers leave a graph alone where they need a fact that is not.
"""
from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from ..graph_utils import const_value, producer


def same(a, b) -> bool:
    return a is not None and a == b


def _all(t: gs.Tensor, value: int) -> bool:
    """Is every element of ``t`` ``value``: a constant, ConstantOfShape(.., value), or that times a constant?"""
    v = const_value(t)
    if v is not None:
        return v.size > 0 and bool(np.all(v == value))
    p = producer(t)
    if p is not None and p.op == "ConstantOfShape":
        fill = p.attrs.get("value")
        fill = np.asarray(fill.values).reshape(-1) if isinstance(fill, gs.Constant) else np.zeros(1)
        return fill.size == 1 and fill[0] == value
    if p is not None and p.op == "Mul":
        for a, k in ((p.inputs[0], p.inputs[1]), (p.inputs[1], p.inputs[0])):
            kv = const_value(k)
            if kv is not None and kv.size == 1 and int(kv.reshape(-1)[0]) == value and _all(a, 1):
                return True
    return False


def target_dims(t: gs.Tensor, dims: dict, depth: int = 0) -> list | None:
    """The elements of a 1-D shape tensor (an Expand's or Reshape's target): each an int, a dim
    symbol (read off a tensor's inferred dims through Shape), or None. Sees through Shape,
    Concat, Slice, Gather, Unsqueeze/Squeeze, Cast, ``Reshape(x, [-1])`` and ``Where(x == -1, 1, x)``."""
    v = const_value(t)
    if v is not None:
        return [int(x) for x in v.reshape(-1)] if v.dtype.kind in "iu" else None
    p = producer(t)
    if p is None or depth > 16:
        return None
    ins = p.inputs
    if p.op == "Shape":
        x = dims.get(ins[0].name)
        return None if x is None else x[p.attrs.get("start", 0):p.attrs.get("end", None)]
    if p.op in ("Cast", "Identity", "Squeeze", "Unsqueeze") or (p.op == "Reshape" and _all(ins[1], -1)):
        return target_dims(ins[0], dims, depth + 1)
    if p.op == "Concat" and p.attrs.get("axis") in (0, -1):
        parts = [target_dims(x, dims, depth + 1) or _unknown(x, dims) for x in ins]
        return None if any(x is None for x in parts) else [e for part in parts for e in part]
    if p.op == "Gather" and p.attrs.get("axis", 0) == 0:
        data, k = target_dims(ins[0], dims, depth + 1), const_value(ins[1])
        if data is None or k is None or k.size != 1 or not -len(data) <= int(k.reshape(-1)[0]) < len(data):
            return None
        return [data[int(k.reshape(-1)[0])]]
    if p.op == "Slice":
        return _slice(p, dims, depth)
    if p.op == "Where":
        return _where_minus_one(p, dims, depth)
    return None


def _unknown(t: gs.Tensor, dims: dict) -> list | None:
    """[None] * n for a 1-D tensor of static length n whose values are not known."""
    d = dims.get(t.name)
    return [None] * d[0] if d is not None and len(d) == 1 and isinstance(d[0], int) else None


def _slice(p: gs.Node, dims: dict, depth: int) -> list | None:
    data = target_dims(p.inputs[0], dims, depth + 1)
    params = [const_value(x) for x in p.inputs[1:]]
    if data is None or len(params) < 2 or any(v is None or v.size != 1 for v in params):
        return None
    a, b = (int(v.reshape(-1)[0]) for v in params[:2])
    axis = int(params[2].reshape(-1)[0]) if len(params) > 2 else 0
    step = int(params[3].reshape(-1)[0]) if len(params) > 3 else 1
    return data[slice(a, b, step)] if axis in (0, -1) else None


def _where_minus_one(p: gs.Node, dims: dict, depth: int) -> list | None:
    """``Where(x == -1, 1, x)`` (the export's guard on an Expand target): x with -1 made 1."""
    cond, ones, x = producer(p.inputs[0]), p.inputs[1], p.inputs[2]
    if cond is None or cond.op != "Equal" or cond.inputs[0] is not x or not _all(cond.inputs[1], -1) \
            or not _all(ones, 1):
        return None
    inner = target_dims(x, dims, depth + 1)
    return None if inner is None else [1 if e == -1 else e for e in inner]


_ELEMENTWISE = ("Add", "Sub", "Mul", "Div", "Neg", "Cast", "Where", "Softmax", "IsNaN", "Pow", "Sqrt", "Exp",
                "Tanh", "Sigmoid", "Relu", "Identity", "Erf", "Reciprocal")


def _reshape_element(node: gs.Node, axis: int, dims: dict, depth: int) -> int | None:
    """The static size a Reshape gives ``axis``: its target's element, or the -1 element worked
    out by cancelling the input's dims against the target's (symbols and ints)."""
    target, x = target_dims(node.inputs[1], dims), dims.get(node.inputs[0].name)
    if target is None or axis >= len(target):
        return None
    e = target[axis]
    if isinstance(e, int) and e > 0:
        return e
    keep_zero = node.attrs.get("allowzero", 0)
    if e == 0 and not keep_zero:
        return static_axis(node.inputs[0], axis, dims, depth + 1)
    if e != -1 or x is None or any(d is None for d in x):
        return None
    rest = [t if t != 0 or keep_zero else x[i] for i, t in enumerate(target) if i != axis]
    if any(r is None for r in rest):
        return None
    num_syms = sorted(str(d) for d in x if isinstance(d, str))
    den_syms = sorted(str(d) for d in rest if isinstance(d, str))
    num = int(np.prod([d for d in x if isinstance(d, int)]))
    den = int(np.prod([d for d in rest if isinstance(d, int)]))
    return num // den if num_syms == den_syms and den > 0 and num % den == 0 else None


def static_axis(t: gs.Tensor, axis: int, dims: dict, depth: int = 0) -> int | None:
    """The static size of ``axis`` of ``t`` (whose rank inference knows), from inference or traced
    back through elementwise ops (an input of the same rank with a size > 1 there: broadcasting
    keeps it), Transpose and Reshape."""
    d = dims.get(t.name)
    if d is None:
        return None
    if isinstance(d[axis], int):
        return d[axis]
    p = producer(t)
    if p is None or depth > 24:
        return None
    if p.op in _ELEMENTWISE:
        for x in p.inputs:
            xd = dims.get(x.name)
            if xd is not None and len(xd) == len(d) and (v := static_axis(x, axis, dims, depth + 1)) is not None \
                    and v > 1:
                return v
        return None
    if p.op == "Transpose" and p.attrs.get("perm") is not None and len(p.attrs["perm"]) == len(d):
        return static_axis(p.inputs[0], int(p.attrs["perm"][axis]), dims, depth + 1)
    if p.op == "Reshape":
        return _reshape_element(p, axis, dims, depth)
    return None
