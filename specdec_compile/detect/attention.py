"""Finder: the attention layers and their mask sites.

Every Softmax whose input chain (through ``hints["score_ops"]``) reaches a
MatMul whose second operand comes (through ``hints["layout_ops"]``) from a
cache Concat is an attention layer: that Concat holds the keys. The MatMul
that consumes the Softmax output (through ``hints["probs_ops"]``) reads the
values. The mask: on the chain MatMul -> Softmax, each side operand whose
values depend on the mask sources (found by dependence, not position: CodeGen
adds it before a Div, Llama right before Softmax). The mask sources are
``attention_mask``, or, in a graph without one, the positions (position_ids
or the query positions the export derives). An ALiBi bias also depends on
``attention_mask`` (through its key positions): dependence does not pass
through those key-position tensors, so the bias is not taken for a mask.
A layer without any mask operand is refused: the compiler never rewrites a
graph whose masking it cannot account for; so is a Softmax over another axis
than the keys (the scores' last)."""
from __future__ import annotations

from dataclasses import dataclass

import onnx_graphsurgeon as gs

from ..errors import UnsupportedPatternError
from ..graph_utils import SHAPE_ONLY_OPS, producer, value_dependence


@dataclass(frozen=True, eq=False)
class Attention:
    """One layer: its key and value cache Concats, its Softmax, and its mask
    sites as ``(node, input index, kind)``."""
    key: gs.Node
    value: gs.Node
    softmax: gs.Node
    sites: tuple[tuple[gs.Node, int, str], ...]
    qk: gs.Node | None = None   # MatMul(Q, K)
    pv: gs.Node | None = None   # MatMul(probs, V)


def walk_back(t: gs.Tensor, ops: set[str], dep: set[int], stop, max_steps: int = 16):
    """Follow ``t`` backwards through ``ops``, at each node taking the one input
    in ``dep``, until ``stop(node)`` is true. Returns that node or None."""
    for _ in range(max_steps):
        n = producer(t)
        if n is None:
            return None
        if stop(n):
            return n
        if n.op not in ops:
            return None
        cands = [x for x in n.inputs if id(x) in dep]
        if len(cands) != 1:
            return None
        t = cands[0]
    return None


def mask_kind(node: gs.Node, j: int, chain: int) -> str:
    """How input ``j`` of ``node`` (whose input ``chain`` carries the scores) masks them."""
    if node.op == "Add":
        return "additive"
    if node.op == "Where" and j == 0:
        return "visible" if chain == 1 else "masked"
    raise UnsupportedPatternError(
        f"attention mask enters the scores through {node.op} node {node.name!r} "
        f"(input {j}); only additive masks and Where conditions are supported")


def _refine(n: gs.Node, j: int, am_dep: set[int], key_dep: set[int]) -> tuple[gs.Node, int, str]:
    """An additive operand that mixes an ALiBi bias (made from key positions)
    with the mask, ``Add(bias, mask)`` or ``Where(cond, min, bias)``: the mask
    site is the inner mask input (or the Where condition)."""
    kind = "additive"
    for _ in range(8):
        p = producer(n.inputs[j])
        for _ in range(6):   # through ops that move a [.., S, K] mask without mixing its entries
            if p is None or p.op not in ("Slice", "Reshape", "Cast", "Identity", "Expand"):
                break
            p = producer(p.inputs[0])
        if p is not None and p.op == "Where" and id(p.inputs[0]) in am_dep:
            bias = [i for i in (1, 2) if id(p.inputs[i]) in key_dep]
            if len(bias) == 1:
                return p, 0, "visible" if bias[0] == 1 else "masked"
        if p is None or p.op != "Add" or len(p.inputs) != 2:
            break
        dep = [i for i, x in enumerate(p.inputs) if id(x) in am_dep]
        if len(dep) != 1 or id(p.inputs[1 - dep[0]]) not in key_dep:
            break
        n, j = p, dep[0]
    return n, j, kind


def scores_path(softmax: gs.Node, score_ops: set[str], cache_dep: set[int], am_dep: set[int],
                key_dep: set[int] = frozenset()):
    """Walk from the Softmax back to the QK MatMul: ``(MatMul or None, mask sites)``."""
    t = softmax.inputs[0]
    sites = []
    for _ in range(16):
        n = producer(t)
        if n is None:
            break
        if n.op == "MatMul":
            return n, sites
        if n.op not in score_ops:
            break
        chain = [j for j, x in enumerate(n.inputs) if id(x) in cache_dep]
        if len(chain) == 2 and is_max_shift(n):
            chain = [0]    # x - max(x): a stable softmax (gpt-oss with attention sinks)
        if len(chain) != 1:
            break
        for j, x in enumerate(n.inputs):
            cond = n.op == "Where" and j == 0 and chain[0] > 0   # a Where condition on the scores is a mask
            if j != chain[0] and (id(x) in am_dep or cond) and not (j == 1 and is_max_shift(n)):
                kind = mask_kind(n, j, chain[0])
                sites.append(_refine(n, j, am_dep, key_dep) if kind == "additive" else (n, j, kind))
        t = n.inputs[chain[0]]
    return None, sites


def is_max_shift(n: gs.Node) -> bool:
    """``Sub(x, ReduceMax(x))``."""
    red = producer(n.inputs[1]) if n.op == "Sub" and len(n.inputs) == 2 else None
    return red is not None and red.op == "ReduceMax" and red.inputs[0] is n.inputs[0]


def probs_matmul(softmax: gs.Node, probs_ops: set[str]) -> gs.Node | None:
    """The MatMul(probs, V) reading the Softmax output through ``probs_ops``."""
    pv = None
    frontier = [softmax.outputs[0]]
    for _ in range(4):
        nxt = []
        for x in frontier:
            for c in x.outputs:
                if c.op == "MatMul" and c.inputs[0] is x:
                    pv = c
                elif c.op in probs_ops:
                    nxt += list(c.outputs)
        if pv is not None or not nxt:
            break
        frontier = nxt
    return pv


def _check_softmax_axis(sm: gs.Node, opset: int) -> None:
    """The attention Softmax must normalize over the keys (the scores' last axis): over heads or
    queries it is another model, which the rewrite (padded queries, grouped heads, a ctx_len
    long key axis) would not reproduce. Opset < 13 defaults to axis 1 (and flattens from it)."""
    axis = int(sm.attrs.get("axis", -1 if opset >= 13 else 1))
    shape = sm.inputs[0].shape
    rank = len(shape) if shape is not None else 4   # scores of a rank-4 cache, when not recorded
    if not -rank <= axis < rank:     # no valid ONNX: the model's checks name it (not a pattern of ours)
        return
    if axis not in (-1, rank - 1):
        raise UnsupportedPatternError(
            f"attention at Softmax {sm.name!r} normalizes over axis {axis} of its rank-{rank} scores, not "
            f"over the keys (the last axis); cannot rewrite it")


def check_cache_reads(concat: gs.Node, end: gs.Node, layout_ops: set[str], top: set[int]) -> None:
    """The cache Concat's output is read, through ``layout_ops``, only by its attention's MatMul
    ``end`` (as its second operand), by Shape/Size and as a graph output. Any other reader (a mean
    over the keys, a body of an If) would read all ``ctx_len`` slots of the retained cache, stale
    ones too, where the export reads the tokens so far: refused in one line."""
    seen, stack = set(), [concat.outputs[0]]
    while stack:
        t = stack.pop()
        if id(t) in seen:
            continue
        seen.add(id(t))
        for c in t.outputs:
            if id(c) in top and (c.op in SHAPE_ONLY_OPS or (c is end and c.inputs[1] is t)):
                continue
            if id(c) in top and c.op in layout_ops:
                stack += list(c.outputs)
                continue
            where = "" if id(c) in top else " in an If/Loop/Scan body"
            raise UnsupportedPatternError(
                f"cache Concat {concat.name!r} is read by {c.op} node {c.name!r}{where}, not only by its "
                f"attention's MatMul {end.name!r} (and Shape): with a retained cache that node would read all "
                f"ctx_len slots; cannot rewrite it")


def _layer(sm: gs.Node, hints: dict, concat_ids: set[int], cache_dep: set[int], am_dep: set[int],
           sources: list[gs.Tensor], key_dep: set[int], opset: int = 13) -> Attention | None:
    """The attention layer at Softmax ``sm``, or None when it is not one."""
    layout_ops = set(hints["layout_ops"])
    qk, sites = scores_path(sm, set(hints["score_ops"]), cache_dep, am_dep, key_dep)
    if qk is None:
        return None
    key = walk_back(qk.inputs[1], layout_ops, cache_dep, lambda n: id(n) in concat_ids)
    if key is None:
        return None
    _check_softmax_axis(sm, opset)
    pv = probs_matmul(sm, set(hints["probs_ops"]))
    value = None
    if pv is not None:
        value = walk_back(pv.inputs[1], layout_ops, cache_dep, lambda n: id(n) in concat_ids)
    if value is None:
        raise UnsupportedPatternError(
            f"attention at Softmax {sm.name!r}: keys come from cache Concat {key.name!r} but the "
            f"values' cache Concat was not found behind the MatMul that reads the probabilities")
    if not sites:
        what = ", ".join(repr(t.name) for t in sources) or "the positions (no attention_mask input)"
        raise UnsupportedPatternError(
            f"attention at Softmax {sm.name!r}: no operand depending on {what} on the "
            f"scores path from MatMul {qk.name!r}; cannot find the attention mask")
    return Attention(key=key, value=value, softmax=sm, sites=tuple(sites), qk=qk, pv=pv)


def _check_every_concat_read_once(found: list[Attention], concats: list[gs.Node]) -> None:
    if not found:
        raise UnsupportedPatternError(
            f"found {len(concats)} cache Concat nodes but no attention (Softmax over "
            f"MatMul(Q, K) with K from a cache) uses them; fused attention ops are not supported")
    used = [id(a.key) for a in found] + [id(a.value) for a in found]
    if len(set(used)) != len(used):
        raise UnsupportedPatternError("two attention layers share one cache Concat")
    unused = [n for n in concats if id(n) not in set(used)]
    if unused:
        raise UnsupportedPatternError(
            f"cache Concat nodes not read by any attention: {', '.join(n.name for n in unused)}")


def _opset(graph: gs.Graph) -> int:
    """The default-domain opset (13 when not recorded: Softmax's axis then defaults to -1)."""
    v = getattr(graph, "opset", None)
    return int(v) if isinstance(v, int) and not isinstance(v, bool) else 13


def find_attention(graph: gs.Graph, nodes: list[gs.Node], hints: dict, concats: list[gs.Node],
                   attention_mask: gs.Tensor | None, mask_sources: list[gs.Tensor] | None = None,
                   key_positions: list[gs.Tensor] = ()) -> list[Attention]:
    """Every attention layer, in the order of their key Concats in ``nodes``.
    ``mask_sources``: what a mask depends on (default: ``attention_mask``);
    ``key_positions``: ALiBi key-position tensors, through which no mask dependence passes."""
    if mask_sources is None:
        mask_sources = [attention_mask] if attention_mask is not None else []
    cache_dep = value_dependence(graph, [n.outputs[0] for n in concats], nodes)
    am_dep = value_dependence(graph, mask_sources, nodes, stop=key_positions)
    key_dep = value_dependence(graph, key_positions, nodes) if key_positions else set()
    concat_ids = {id(n) for n in concats}
    found = []
    for sm in (n for n in nodes if n.op == "Softmax"):
        layer = _layer(sm, hints, concat_ids, cache_dep, am_dep, mask_sources, key_dep, _opset(graph))
        if layer is not None:
            found.append(layer)
    _check_every_concat_read_once(found, concats)
    top, layout_ops = {id(n) for n in nodes}, set(hints["layout_ops"])
    for a in found:
        check_cache_reads(a.key, a.qk, layout_ops, top)
        check_cache_reads(a.value, a.pv, layout_ops, top)
    order = {id(n): i for i, n in enumerate(nodes)}
    return sorted(found, key=lambda a: order[id(a.key)])
