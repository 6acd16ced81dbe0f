"""Finder: rotary applied to q or k as ``x*cos + rotate_half(x)*sin`` from constant tables.

Not one of ``detect()``'s finders: the form it looks for is the one ``passes.rotary_tables``
leaves (cos/sin gathered from constant ``ctx_len``-row tables at ``Max(position_ids, 0)``), so
``passes.fuse_rotary`` calls it on the graph it rewrites. One site is, exactly::

    Add(Mul(x, Unsqueeze(Gather(COS, row), [1])),
        Mul(Concat(Neg(Slice(x, [h], [>=d], [-1])), Slice(x, [0], [h], [-1]), axis=-1),
            Unsqueeze(Gather(SIN, row), [1])))

or, interleaved (Cohere's ``rotate_half``: ``stack((-x[..., 1::2], x[..., ::2]), -1).flatten(-2)``)::

    Mul(Reshape(Concat(Unsqueeze(Neg(Slice(x, [1], [>=d], [-1], [2])), [-1]),
                       Unsqueeze(Slice(x, [0], [>=d], [-1], [2]), [-1]), axis=-1), shape), ...)

with the Reshape's output x's shape (inference names its B, S and d: a row-major reshape of
``[B, N, S, d/2, 2]`` to that is the flatten of the last two axes),
(either operand order of each Mul and of the Add), where x is ``[B, N, S, d]`` with static
even d, h = d/2, COS and SIN are constant float32 tables ``[M, d]`` whose two halves are
equal (transformers' ``cat((freqs, freqs))``; interleaved: each even column equal to the next,
``repeat_interleave(freqs, 2)``), gathered on axis 0
with the same ``row = Max(position_ids, 0)``, position_ids is the graph input ``[B, S]``, and
the Add's output is ``[B, N, S, d]``, x's own shape (no other broadcast). Partial rotary
(transformers slices x to the rotary dims first) is this same form on the slice.

Anything else is skipped with the reason: tables whose halves (pairs) differ, a table read
through more ops (Helium's and GLM's ``cos[..., :d/2].repeat_interleave(2)``), a dtype other
than float32, a shape inference cannot establish. GPT-J and CodeGen gather from their own
table, not ``rotary_tables``': no site.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_graphsurgeon as gs

from ..graph_utils import const_value, producer


@dataclass(frozen=True)
class RotateHalfSite:
    """One rotation: ``add`` computes it from ``x`` (``[B, N, S, dim]``); ``cos``/``sin``
    are the tables' first halves ``[M, dim/2]`` (interleaved: their even columns), read at
    ``row``."""
    add: gs.Node
    x: gs.Tensor
    row: gs.Tensor
    cos: np.ndarray
    sin: np.ndarray
    dim: int
    interleaved: bool = False


def _ints(t: gs.Tensor) -> list[int] | None:
    v = const_value(t)
    if v is None or v.dtype.kind not in "iu" or v.ndim > 1:
        return None
    return [int(x) for x in np.atleast_1d(v)]


def _table_read(t: gs.Tensor):
    """``Unsqueeze(Gather(TABLE, row, axis=0), [1])``: (table, row) or a reason."""
    u = producer(t)
    if u is None or u.op != "Unsqueeze":
        return "cos/sin operand is not an Unsqueeze"
    axes = _ints(u.inputs[1]) if len(u.inputs) > 1 else u.attrs.get("axes")
    if list(axes or []) != [1]:
        return f"{u.name}: unsqueezes axes {axes}, not [1]"
    gather = producer(u.inputs[0])
    if gather is None or gather.op != "Gather" or gather.attrs.get("axis", 0) != 0:
        return f"{u.name}: not a Gather on axis 0 of a table"
    table = const_value(gather.inputs[0])
    if table is None or table.ndim != 2:
        return f"{gather.name}: does not read a constant 2-D table"
    return table, gather.inputs[1]


def _rotate_half(t: gs.Tensor, dim: int):
    """``Concat(Neg(Slice(x, h:)), Slice(x, :h), axis=-1)``: x, or a reason."""
    cat = producer(t)
    if cat is None or cat.op != "Concat" or len(cat.inputs) != 2 or cat.attrs.get("axis") not in (-1, 3):
        return "not Concat(-x2, x1) on the last axis"
    neg = producer(cat.inputs[0])
    if neg is None or neg.op != "Neg":
        return f"{cat.name}: first half is not negated (interleaved or other layout)"
    second, first = producer(neg.inputs[0]), producer(cat.inputs[1])
    h = dim // 2
    want = {id(second): ([h], dim), id(first): ([0], h)}
    x = None
    for s in (second, first):
        if s is None or s.op != "Slice" or len(s.inputs) < 4:
            return f"{cat.name}: halves are not Slices with explicit axes"
        steps = _ints(s.inputs[4]) if len(s.inputs) > 4 else [1]
        start, end, axes = _ints(s.inputs[1]), _ints(s.inputs[2]), _ints(s.inputs[3])
        begin, least = want[id(s)]
        if axes not in ([-1], [3]) or steps != [1] or start != begin or end is None or end[0] < least \
                or (end[0] > least and least != dim):
            return f"{s.name}: not the half [{begin}:{least}] of the last axis"
        if x is not None and s.inputs[0] is not x:
            return f"{cat.name}: halves of different tensors"
        x = s.inputs[0]
    return x


def _step_slice(s: gs.Node | None, begin: int, dim: int) -> gs.Tensor | str:
    """``Slice(x, [begin], [>=dim], [-1], [2])``: x, or a reason."""
    if s is None or s.op != "Slice" or len(s.inputs) != 5:
        return "not a Slice with steps"
    start, end, axes, steps = (_ints(t) for t in s.inputs[1:5])
    if axes not in ([-1], [3]) or steps != [2] or start != [begin] or end is None or end[0] < dim:
        return f"{s.name}: not x[..., {begin}::2]"
    return s.inputs[0]


def _rotate_pairs(t: gs.Tensor, shape: list, dims: dict):
    """``Reshape(Concat(Unsqueeze(-x[..., 1::2], -1), Unsqueeze(x[..., ::2], -1)), x's shape)``:
    x, or a reason."""
    r = producer(t)
    cat = producer(r.inputs[0])
    if cat is None or cat.op != "Concat" or len(cat.inputs) != 2 or cat.attrs.get("axis") not in (-1, 4):
        return f"{r.name}: not a flatten of Concat(-x_odd, x_even) on a new last axis"
    ups = [producer(i) for i in cat.inputs]
    if any(u is None or u.op != "Unsqueeze" or (_ints(u.inputs[1]) if len(u.inputs) > 1 else None) not in ([-1], [4])
           for u in ups):
        return f"{cat.name}: its operands are not Unsqueeze(., [-1])"
    neg = producer(ups[0].inputs[0])
    if neg is None or neg.op != "Neg":
        return f"{cat.name}: the odd elements are not negated first"
    odd, even = _step_slice(producer(neg.inputs[0]), 1, shape[3]), _step_slice(producer(ups[1].inputs[0]), 0, shape[3])
    bad = next((v for v in (odd, even) if isinstance(v, str)), None)
    if bad is not None or odd is not even:
        return bad or f"{cat.name}: pairs of different tensors"
    out = dims.get(r.outputs[0].name)
    if not _flattens_last_two(r, cat) and (out is None or out[0] != shape[0] or out[2:] != shape[2:]
                                           or None in (out[0], out[2])):
        return f"{r.name}: the flatten's output {out} is not x's shape {shape}"
    return odd


def _flattens_last_two(r: gs.Node, cat: gs.Node) -> bool:
    """Is ``r`` ``Reshape(c, Concat(Shape(c)[:3], [-1]))`` (torch's ``flatten(-2)`` of rank 5)?"""
    p = producer(r.inputs[1])
    if p is None or p.op != "Concat" or len(p.inputs) != 2 or _ints(p.inputs[1]) != [-1]:
        return False
    sl = producer(p.inputs[0])
    if sl is None or sl.op != "Slice" or len(sl.inputs) < 3:
        return False
    shp = producer(sl.inputs[0])
    rest = [_ints(t) for t in sl.inputs[3:]]
    return (shp is not None and shp.op == "Shape" and shp.inputs[0] is cat.outputs[0] and not shp.attrs
            and _ints(sl.inputs[1]) == [0] and _ints(sl.inputs[2]) in ([-2], [3])
            and rest in ([], [[0]], [[0], [1]]))


def _reads_table(t: gs.Tensor) -> bool:
    u = producer(t)
    return u is not None and u.op == "Unsqueeze" and producer(u.inputs[0]) is not None \
        and producer(u.inputs[0]).op == "Gather"


def _split(add: gs.Node):
    """The Add's two Muls as (x, cos operand, rotate-half operand, sin operand), or a reason."""
    muls = [producer(t) for t in add.inputs]
    if len(muls) != 2 or any(m is None or m.op != "Mul" or len(m.inputs) != 2 for m in muls):
        return "not an Add of two Muls"
    parts = []
    for m in muls:
        table = [t for t in m.inputs if _reads_table(t)]
        if len(table) != 1:
            return f"{m.name}: not a product with one table row"
        other = m.inputs[1] if m.inputs[0] is table[0] else m.inputs[0]
        parts.append((other, table[0]))
    rot = [producer(o) is not None and producer(o).op in ("Concat", "Reshape") for o, _ in parts]
    if rot.count(True) != 1:
        return f"{add.name}: not one rotate_half product and one plain product"
    (x, c), (r, s) = parts if rot[1] else parts[::-1]
    return x, c, r, s


def _site(add: gs.Node, dims: dict, positions: gs.Tensor):
    split = _split(add)
    if isinstance(split, str):
        return f"{add.name}: {split}" if not split.startswith(add.name) else split
    x, c, r, s = split
    shape = dims.get(x.name)
    if not shape or len(shape) != 4 or not isinstance(shape[3], int):
        return f"{add.name}: x {x.name!r} is not [B, N, S, d] with static d ({shape})"
    interleaved = producer(r).op == "Reshape"
    got = _rotate_pairs(r, shape, dims) if interleaved else _rotate_half(r, shape[3])
    if isinstance(got, str) or got is not x:
        return f"{add.name}: {got}" if isinstance(got, str) else f"{add.name}: rotate_half of another tensor"
    cos, sin = _table_read(c), _table_read(s)
    bad = next((t for t in (cos, sin) if isinstance(t, str)), None)
    if bad is not None:
        return f"{add.name}: {bad}"
    return _check_tables(add, x, cos, sin, shape[3], dims, positions, interleaved)


def _check_tables(add, x, cos, sin, dim, dims, positions, interleaved):
    (ct, row), (st, srow) = cos, sin
    if row is not srow:
        return f"{add.name}: cos and sin are read at different rows"
    mx = producer(row)
    if mx is None or mx.op != "Max" or len(mx.inputs) != 2 or mx.inputs[0] is not positions \
            or _ints(mx.inputs[1]) != [0]:
        return f"{add.name}: the table row is not Max(position_ids, 0)"
    if dim % 2 or ct.shape != st.shape or ct.shape[1] != dim:
        return f"{add.name}: tables {list(ct.shape)} do not match head dim {dim}"
    if ct.dtype != np.float32 or st.dtype != np.float32 or x.dtype not in (np.float32, None):
        return f"{add.name}: dtype {ct.dtype}, only float32 is fused"
    h = dim // 2
    a, b = (np.s_[:, 0::2], np.s_[:, 1::2]) if interleaved else (np.s_[:, :h], np.s_[:, h:])
    if not (np.array_equal(ct[a], ct[b]) and np.array_equal(st[a], st[b])):
        return f"{add.name}: the tables' two {'column pairs' if interleaved else 'halves'} differ"
    xs, ps, out = dims.get(x.name), dims.get(positions.name), dims.get(add.outputs[0].name)
    if ps is None or xs[0] != ps[0] or xs[2] != ps[1] or None in (xs[0], xs[2]) or out != xs:
        return f"{add.name}: x {xs}, positions {ps} and output {out} do not share B and S"
    return RotateHalfSite(add, x, row, np.ascontiguousarray(ct[a]), np.ascontiguousarray(st[a]), dim, interleaved)


def find_rotate_half(graph: gs.Graph, positions: gs.Tensor, dims: dict) -> tuple[list, list]:
    """(sites, [(Add node name, reason skipped)]) over every Add reading a Mul by a table row.
    ``dims``: tensor name -> dims from shape inference (an int, a symbol name or None)."""
    sites, skipped = [], []
    for n in graph.nodes:
        if n.op != "Add" or not any(_is_table_mul(t) for t in n.inputs):
            continue
        got = _site(n, dims, positions)
        (sites.append(got) if isinstance(got, RotateHalfSite) else skipped.append((n.name, got)))
    return sites, skipped


def _is_table_mul(t: gs.Tensor) -> bool:
    m = producer(t)
    return m is not None and m.op == "Mul" and any(_reads_table(i) for i in m.inputs)


def rotate_half_of(t: gs.Tensor, dims: dict) -> tuple[gs.Tensor, bool] | str:
    """``t`` is ``rotate_half(x)`` of a tensor x ``[B, N, S, d]`` with static even d, in either
    layout the sites above use (``Concat(-x2, x1)`` on the last axis, or Cohere's interleaved
    pairs): (x, interleaved), or the reason it is not. Unlike ``find_rotate_half`` it does not
    look at what the result is multiplied by."""
    p = producer(t)
    if p is None or p.op not in ("Concat", "Reshape"):
        return "not a Concat or Reshape"
    if p.op == "Concat":
        shape = dims.get(t.name)
        if not shape or not isinstance(shape[-1], int) or shape[-1] % 2:
            return f"{p.name}: last axis not static and even ({shape})"
        x = _rotate_half(t, shape[-1])
        if isinstance(x, str):
            return x
        xs = dims.get(x.name)
        if not xs or xs[-1] != shape[-1]:
            return f"{p.name}: x {x.name!r} is not {shape[-1]} wide on its last axis ({xs})"
        return x, False
    cat = producer(p.inputs[0])
    up = producer(cat.inputs[1]) if cat is not None and cat.op == "Concat" and len(cat.inputs) == 2 else None
    if up is None:
        return f"{p.name}: not a flatten of a Concat"
    even = producer(up.inputs[0])
    if even is None or even.op != "Slice":
        return f"{p.name}: not the interleaved pairs of a tensor"
    shape = dims.get(even.inputs[0].name)
    if not shape or len(shape) != 4 or not isinstance(shape[3], int) or shape[3] % 2:
        return f"{p.name}: x is not [B, N, S, d] with static even d ({shape})"
    x = _rotate_pairs(t, shape, dims)
    return x if isinstance(x, str) else (x, True)
