"""Finding Hugging Face's sparse expert routing in an exported graph (read only).

The MoE blocks of transformers (Qwen2/3-MoE, Mixtral, DeepSeek-V3, ...) pick
each expert's tokens with ``torch.where(expert_mask[e])``; traced per expert,
that is::

    M      = Gather(Transpose(OneHot(TopK(.., axis=-1).indices, E, [0, 1])), e)  # [T,K] or [K,T], 0/1
    t, k   = Squeeze(Split(Transpose(NonZero(Cast(M, bool)))))   # the (token, slot) pairs, N of them
    x      = Gather(hidden, t)                                   # the chosen tokens' rows
    w      = Reshape..(Gather(Flatten(weights), k + t * S))      # [N, 1], weights[t, k]
    y      = expert(x) * w                                       # row-wise MLP
    out    = acc + ScatterElements(zeros, Expand(Unsqueeze(t)), Expand(y))   # index_add at t

``find_routes`` returns, for every ``NonZero`` that is exactly this, what
``dense_experts`` needs; a NonZero that differs anywhere is not returned.
Each check is what the dense form's exactness rests on:

* M is 0/1 and a token meets expert e in at most one slot (OneHot of TopK
  indices along the slot axis: TopK's indices are distinct), so the dense
  weight ``sum_k M[t, k] * weights[t, k]`` has at most one non-zero term;
* the expert is row-wise (each output row depends on its own input row:
  MatMul by a constant, elementwise ops), so running it on every token leaves
  the chosen rows' values as they were;
* the expert's output reaches the scatter only through ``* w``, and t feeds
  nothing else, so a token that chose nothing adds ``y * 0 = 0``.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from ..graph_utils import const_value, is_const, producer
from ._static import inferred_dims

_UNARY = ("Sigmoid", "Tanh", "Relu", "Erf", "Cast", "Neg", "Identity", "Sqrt", "Exp", "Abs", "Softplus", "Gelu")
_BINARY = ("Mul", "Add", "Sub", "Div", "Pow", "Max", "Min")
_LAYOUT = ("Reshape", "Unsqueeze", "Squeeze", "Identity")
_MAX_EXPERT_NODES = 64


@dataclass(frozen=True)
class Route:
    """One expert's sparse routing, as ``dense_experts`` rewrites it.

    mask        M, the expert's 0/1 selection over (token, slot), rank 2
    token_axis  the axis of M that counts tokens (0 or 1)
    table       the routing weights flattened to [tokens * S, 1]
    stride      S, the slot count the graph's own weight index multiplies t by
    weight      the gathered weight, [N, 1]
    scale       the node ``expert(x) * weight``
    token_uses  the nodes that read the token index besides the weight index:
                the token gather and the index_add's index (they get 0..T-1)
    token       the token index the NonZero yields
    """
    mask: gs.Tensor
    token_axis: int
    table: gs.Tensor
    stride: gs.Tensor
    weight: gs.Tensor
    scale: gs.Node
    token_uses: tuple[gs.Node, ...]
    token: gs.Tensor


def _only(t: gs.Tensor) -> gs.Node | None:
    return t.outputs[0] if len(t.outputs) == 1 else None


def _ints(t: gs.Tensor) -> list[int] | None:
    v = const_value(t)
    return None if v is None or v.dtype.kind not in "iu" else [int(x) for x in v.reshape(-1)]


def _axes(node: gs.Node) -> list[int] | None:
    return _ints(node.inputs[1]) if len(node.inputs) > 1 else node.attrs.get("axes")


def _selection(nonzero: gs.Node) -> tuple[gs.Tensor, int] | None:
    """(M, the token axis of M) when NonZero reads Cast(M, bool) of a OneHot of TopK indices."""
    cast = producer(nonzero.inputs[0])
    if cast is None or cast.op != "Cast" or cast.attrs.get("to") != onnx.TensorProto.BOOL:
        return None
    mask = cast.inputs[0]
    pick = producer(mask)
    if pick is None or pick.op != "Gather" or pick.attrs.get("axis", 0) != 0:
        return None
    index = const_value(pick.inputs[1])
    trans = producer(pick.inputs[0])
    if index is None or index.ndim != 0 or trans is None or trans.op != "Transpose":
        return None
    perm = list(trans.attrs.get("perm", []))
    hot = producer(trans.inputs[0])
    if sorted(perm) != [0, 1, 2] or perm[0] != 2 or hot is None or hot.op != "OneHot":
        return None
    values = const_value(hot.inputs[2])
    if hot.attrs.get("axis", -1) not in (-1, 2) or values is None or values.reshape(-1).tolist() != [0, 1]:
        return None
    topk = producer(hot.inputs[0])
    if topk is None or topk.op != "TopK" or topk.attrs.get("axis", -1) != -1 or hot.inputs[0] is not topk.outputs[1]:
        return None
    return mask, perm[1:].index(0)  # OneHot's axes: 0 = token, 1 = slot, 2 = expert


def _pairs(nonzero: gs.Node) -> tuple[gs.Tensor, gs.Tensor] | None:
    """(index along M's axis 0, index along axis 1): Squeeze(Split(Transpose(NonZero)))."""
    trans = _only(nonzero.outputs[0])
    if trans is None or trans.op != "Transpose" or list(trans.attrs.get("perm", [])) != [1, 0]:
        return None
    split = _only(trans.outputs[0])
    if split is None or split.op != "Split" or split.attrs.get("axis") not in (1, -1) or len(split.outputs) != 2:
        return None
    if len(split.inputs) > 1 and _ints(split.inputs[1]) != [1, 1]:
        return None
    out = []
    for part in split.outputs:
        squeeze = _only(part)
        if squeeze is None or squeeze.op != "Squeeze" or _axes(squeeze) not in ([1], [-1]):
            return None
        out.append(squeeze.outputs[0])
    return out[0], out[1]


def _is_unit_column(dims: list | None) -> bool:
    return dims is not None and len(dims) == 2 and dims[1] == 1


def _weight(token: gs.Tensor, slot: gs.Tensor, dims: dict) -> tuple | None:
    """(table, stride, weight, scale, weight-index Mul) for weight = table[slot + token * stride]."""
    add = _only(slot)
    if add is None or add.op != "Add":
        return None
    other = add.inputs[1] if add.inputs[0] is slot else add.inputs[0]
    mul = producer(other)
    if mul is None or mul.op != "Mul" or not any(x is token for x in mul.inputs) or len(other.outputs) != 1:
        return None
    stride = mul.inputs[1] if mul.inputs[0] is token else mul.inputs[0]
    gathers = [n for n in add.outputs[0].outputs if n.op != "Shape"]
    if dims.get(stride.name) not in ([], [1]) or len(gathers) != 1:
        return None
    gather = gathers[0]
    if gather.op != "Gather" or gather.attrs.get("axis", 0) != 0 or gather.inputs[1] is not add.outputs[0]:
        return None
    table, t = gather.inputs[0], gather.outputs[0]
    while True:  # order-keeping layout ops only, down to the one consumer that scales the expert
        users = [n for n in t.outputs if n.op != "Shape"]
        if len(users) != 1:
            return None
        if users[0].op not in _LAYOUT or users[0].inputs[0] is not t:
            break
        t = users[0].outputs[0]
    scale = users[0]
    if scale.op != "Mul" or not _is_unit_column(dims.get(table.name)) or not _is_unit_column(dims.get(t.name)):
        return None
    return table, stride, t, scale, mul


def _token_gather_ok(node: gs.Node, dims: dict) -> bool:
    """Gather of rows: the gathered axis is the second to last, every axis before it is 1."""
    d = dims.get(node.inputs[0].name)
    if node.op != "Gather" or d is None or len(d) < 2:
        return False
    return node.attrs.get("axis", 0) in (len(d) - 2, -2) and all(x == 1 for x in d[:-2])


def _row_wise(node: gs.Node, inside: set[int], dims: dict) -> bool:
    """Each output row of ``node`` depends only on the same row of its on-path input."""
    if node.op in _UNARY:
        return True
    if node.op == "MatMul":
        b = node.inputs[1]
        return id(node.inputs[0]) in inside and id(b) not in inside and is_const(b) and len(b.shape or []) == 2
    if node.op in _BINARY:
        return all(id(x) in inside or (is_const(x) and len(dims.get(x.name, [0, 0])) <= 1) for x in node.inputs)
    if node.op == "Reshape":  # [1, .., 1, R, H] -> [R', H] keeps rows
        d_in, d_out = dims.get(node.inputs[0].name), dims.get(node.outputs[0].name)
        if not d_in or not d_out or len(d_out) != 2 or not isinstance(d_out[1], int):
            return False
        return d_in[-1] == d_out[1] and all(x == 1 for x in d_in[:-2])
    return False


def _expert_rows(start: gs.Tensor, scale: gs.Node, weight: gs.Tensor, dims: dict, outputs: set[int]) -> bool:
    """Every node from the token gather's output to the expert operand of ``scale`` is
    row-wise, and nothing outside that path reads a tensor on it."""
    expert_out = scale.inputs[1] if scale.inputs[0] is weight else scale.inputs[0]
    if len(dims.get(expert_out.name) or []) != 2 or len(expert_out.outputs) != 1:
        return False
    inside, frontier, nodes = {id(start)}, [start], {}
    while frontier:
        t = frontier.pop()
        if id(t) in outputs or (t is not expert_out and not t.outputs):
            return False  # a graph output or a dead end: not only the expert's path
        for user in t.outputs:
            if (user is scale and t is expert_out) or id(user) in nodes:
                continue
            if len(nodes) >= _MAX_EXPERT_NODES or user is scale:
                return False
            nodes[id(user)] = user
            for out in user.outputs:
                inside.add(id(out))
                frontier.append(out)
    return id(expert_out) in inside and all(_row_wise(n, inside, dims) for n in nodes.values())


def _scatter_index(node: gs.Node, scale: gs.Node, outputs: set[int]) -> bool:
    """``node`` is Unsqueeze(t, [1]) -> Expand -> the index of a ScatterElements(zeros, .., y)
    on axis 0 whose updates are the scaled expert output (through Cast/Expand), added to a sum."""
    if node.op != "Unsqueeze" or _axes(node) not in ([1], [-1]):
        return False
    expand = _only(node.outputs[0])
    scatter = _only(expand.outputs[0]) if expand is not None and expand.op == "Expand" else None
    if scatter is None or scatter.op != "ScatterElements" or scatter.inputs[1] is not expand.outputs[0]:
        return False
    if scatter.attrs.get("axis", 0) != 0 or scatter.attrs.get("reduction", "none") not in ("none", "add"):
        return False
    zeros = producer(scatter.inputs[0])
    fill = zeros.attrs.get("value") if zeros is not None and zeros.op == "ConstantOfShape" else None
    if zeros is None or zeros.op != "ConstantOfShape" or (fill is not None and np.any(np.asarray(fill.values))):
        return False
    if not scatter.outputs[0].outputs or any(n.op != "Add" for n in scatter.outputs[0].outputs):
        return False
    t = scatter.inputs[2]
    while producer(t) is not scale:
        p = producer(t)
        if p is None or p.op not in ("Cast", "Expand"):
            return False
        t = p.inputs[0]
    changed = [node.outputs[0], expand.outputs[0], scale.outputs[0], scatter.inputs[2]]
    if any(id(x) in outputs for x in changed):
        return False  # a tensor whose rows become every token's is a graph output
    return _updates_only_scattered(scale.outputs[0], scatter, expand, outputs)


def _updates_only_scattered(t: gs.Tensor, scatter: gs.Node, index_expand: gs.Node, outputs: set[int]) -> bool:
    """From the scaled expert output to the scatter's updates, each tensor is read only by
    the next node on that path or by a Shape that sizes the index Expand."""
    while t is not scatter.inputs[2]:
        data = [n for n in t.outputs if not (n.op == "Shape" and _only(n.outputs[0]) is index_expand)]
        if id(t) in outputs or len(data) != 1 or data[0].op not in ("Cast", "Expand") or data[0].inputs[0] is not t:
            return False
        t = data[0].outputs[0]
    return all(n is scatter or (n.op == "Shape" and _only(n.outputs[0]) is index_expand) for n in t.outputs)


def _route(nonzero: gs.Node, dims: dict, outputs: set[int]) -> Route | None:
    found = _selection(nonzero)
    pairs = _pairs(nonzero) if found is not None else None
    if pairs is None:
        return None
    mask, token_axis = found
    token, slot = pairs[token_axis], pairs[1 - token_axis]
    weight = _weight(token, slot, dims)
    if weight is None:
        return None
    table, stride, w, scale, index_mul = weight
    uses = [n for n in token.outputs if n is not index_mul]
    gathers = [n for n in uses if n.op == "Gather"]
    scatters = [n for n in uses if n.op == "Unsqueeze"]
    if len(uses) != 2 or len(gathers) != 1 or len(scatters) != 1:
        return None
    gather = gathers[0]
    if gather.inputs[1] is not token or not _token_gather_ok(gather, dims):
        return None
    if not _expert_rows(gather.outputs[0], scale, w, dims, outputs) or not _scatter_index(scatters[0], scale, outputs):
        return None
    return Route(mask, token_axis, table, stride, w, scale, (gather, scatters[0]), token)


def find_routes(graph: gs.Graph) -> list[Route]:
    """Every expert routing of ``graph`` that is exactly HF's sparse MoE form (see above)."""
    nonzeros = [n for n in graph.nodes if n.op == "NonZero"]
    if not nonzeros:
        return []
    dims, outputs = inferred_dims(graph), {id(t) for t in graph.outputs}
    return [r for r in (_route(n, dims, outputs) for n in nonzeros) if r is not None]
