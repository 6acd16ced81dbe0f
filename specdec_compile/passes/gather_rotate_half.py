"""Pass ``gather_rotate_half`` (ort): ``rotate_half(x) * sin`` as one Gather of x times a signed sin.

Rotary exports rotate q and k as ``x*cos + rotate_half(x)*sin`` with
``rotate_half(x) = Concat(-x[..., h:], x[..., :h])`` (h = d/2): two Slices, a Neg and a Concat
per rotated tensor, four of the seven kernels ONNX Runtime runs for it (SmolLM2-135M: 240 of a
decode step's kernels). Where ``detect.rotate_half.rotate_half_of`` finds that form multiplied
by a tensor s whose last axis is d, the product becomes::

    Mul(Gather(x, [h, ..., d-1, 0, ..., h-1], axis=-1), Mul(s, [-1]*h + [1]*h))

and, for Cohere's interleaved layout (``stack((-x[..., 1::2], x[..., ::2]), -1).flatten(-2)``),
the pairs swapped by the Gather (``[1, 0, 3, 2, ...]``) and the sign ``[-1, 1, -1, 1, ...]``.
Exact, bit for bit: element i of the product is ``(-x[j]) * s[i]`` before and
``x[j] * (-s[i])`` after, and IEEE multiplication rounds the magnitude alone (negation is exact),
so both are the same number; the other elements are ``x[j] * s[i]`` unchanged. The signed s is
computed once per distinct s (every layer's q and k share the rotary sin, so one ``Mul`` per
call), and the shapes are x's, so the product broadcasts as before. ``fuse_rotary`` (opt-in) runs
first and takes the rotations it fuses; this pass rewrites what is left.

Left as it is, with the reason (logged at INFO): a rotate_half read by anything else too (or a
graph output), an s whose last axis is not the static d (a broadcast one would need the sign on
x's side), or any other form. qaic keeps the export's form (Slice/Neg/Concat: QEfficient's device
graphs compute rotary that way, ``apply_rotary_pos_emb``; a Gather on the head dim has no
device precedent there).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import onnx_graphsurgeon as gs

from ..detect.rotate_half import rotate_half_of
from ..graph_utils import copy_graph, Builder, toposort
from ._context import PassContext, need, graph_pass
from ._static import dims_and_types, dtype_of

_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Site:
    """``mul`` computes ``rotated * other``, ``rotated`` being rotate_half of ``x`` (d wide)."""
    mul: gs.Node
    rotated: gs.Tensor
    x: gs.Tensor
    other: gs.Tensor
    dim: int
    interleaved: bool
    dtype: np.dtype


def _float_dtype(t: gs.Tensor, types: dict) -> np.dtype | None:
    import onnx
    code = dtype_of(t, types)
    if code is None:
        return None
    dt = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(code))
    return dt if dt.kind == "f" else None


def _site(mul: gs.Node, dims: dict, types: dict, outputs: set) -> Site | str | None:
    """The site ``mul`` is, the reason it is not one, or None when no operand looks rotated."""
    if len(mul.inputs) != 2:
        return None
    for i, t in enumerate(mul.inputs):
        got = rotate_half_of(t, dims)
        if isinstance(got, str):
            if "not a Concat or Reshape" in got or "not a flatten" in got or "Neg" not in _ops_above(t):
                continue
            return f"{mul.name}: {got}"
        x, interleaved = got
        other = mul.inputs[1 - i]
        d = dims.get(x.name)[-1]
        if len(t.outputs) != 1 or id(t) in outputs:
            return f"{mul.name}: its rotate_half is read elsewhere too"
        od = dims.get(other.name)
        if not od or od[-1] != d:
            return f"{mul.name}: the other operand's last axis is not {d} ({od})"
        dt = _float_dtype(other, types)
        if dt is None or _float_dtype(x, types) != dt:
            return f"{mul.name}: the operands are not of one known float dtype"
        return Site(mul, t, x, other, int(d), interleaved, dt)
    return None


def _ops_above(t: gs.Tensor, depth: int = 4) -> set[str]:
    """The ops up to ``depth`` producers above ``t`` (to tell a rotate_half from other Concats)."""
    seen, frontier = set(), [t]
    for _ in range(depth):
        nxt = []
        for x in frontier:
            if x.inputs:
                p = x.inputs[0]
                seen.add(p.op)
                nxt += [i for i in p.inputs if isinstance(i, gs.Variable)]
        frontier = nxt
    return seen


def find_sites(graph: gs.Graph) -> tuple[list[Site], list[tuple[str, str]]]:
    """(the products the pass rewrites, [(Mul node, reason)] for rotate_half products it leaves)."""
    if not any(n.op == "Neg" for n in graph.nodes):
        return [], []
    (dims, types), outputs = dims_and_types(graph), {id(t) for t in graph.outputs}
    sites, skipped = [], []
    for n in graph.nodes:
        if n.op != "Mul":
            continue
        got = _site(n, dims, types, outputs)
        if isinstance(got, Site):
            sites.append(got)
        elif got is not None:
            skipped.append((n.name, got))
    return sites, skipped


def permutation(dim: int, interleaved: bool) -> tuple[np.ndarray, np.ndarray]:
    """(the Gather's indices, the sign of s): rotate_half(x)[i] = sign[i] * x[perm[i]]."""
    h = dim // 2
    if interleaved:
        perm = np.arange(dim).reshape(h, 2)[:, ::-1].reshape(-1)
        sign = np.tile([-1.0, 1.0], h)
    else:
        perm = np.concatenate([np.arange(h, dim), np.arange(h)])
        sign = np.concatenate([-np.ones(h), np.ones(h)])
    return perm.astype(np.int64), sign


@graph_pass
def gather_rotate_half(graph: gs.Graph, ctx: PassContext) -> gs.Graph:
    need("gather_rotate_half", ctx)
    if not any(n.op == "Neg" for n in graph.nodes):
        return graph
    graph = copy_graph(graph)
    sites, skipped = find_sites(graph)
    for name, why in skipped:
        _log.info("gather_rotate_half: left %s as is: %s", name, why)
    if not sites:
        return graph
    b = Builder(graph, "rotate_half")
    signed: dict = {}
    for s in sites:
        perm, sign = permutation(s.dim, s.interleaved)
        key = (id(s.other), s.dim, s.interleaved)
        if key not in signed:
            signed[key] = b.op("Mul", [s.other, b.const(sign.astype(s.dtype), hint="sign")], hint="signed",
                               dtype=s.dtype)
        gathered = b.op("Gather", [s.x, b.const(perm, hint="perm")], attrs={"axis": -1}, hint="gather",
                        dtype=s.dtype)
        s.mul.inputs[s.mul.inputs.index(s.rotated)] = gathered
        s.mul.inputs[s.mul.inputs.index(s.other)] = signed[key]
    graph.cleanup(remove_unused_graph_inputs=False)
    toposort(graph)
    return graph
