"""Finder: where the export derives positions from, when not from ``position_ids``.

Two kinds of source, each found structurally (by op and by what it depends
on) and confirmed by evaluating it for a probe input (batch 1, 3 tokens after
7 cached ones, ``attention_mask`` all ones):

query   a ``Range`` whose values are the new tokens' positions, past..past+seq-1
        (the "cache_position" an export without a ``position_ids`` input
        computes from the past length). Its ``Unsqueeze(axes=[0])`` is the
        export's position_ids, ``[1, seq]``: the rewrite feeds those from the
        ``position_ids`` it adds. Any other use of the Range must lie inside the
        attention mask (which ``position_mask`` replaces); ``check_query_uses``
        refuses the graph otherwise.
key     a ``CumSum`` of ``attention_mask`` (through Sub, Mul, Cast, ...) whose
        values are the keys' positions 0..past+seq-1, ``[batch, ..., keys]``:
        the ALiBi index of Bloom, MPT-style and Falcon-ALiBi exports. In the
        rewrite the key position is the slot index. ``check_key_uses`` refuses a
        graph whose first layer's new keys or values depend on it (positions
        of the new tokens cut from the CumSum, e.g. for the rotary).

A graph that has a ``position_ids`` input gets no query source (its positions
already come from there).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_graphsurgeon as gs

from ..errors import UnsupportedPatternError
from ..graph_utils import SHAPE_ONLY_OPS, const_value, producer, value_dependence
from ._probe import Probe, ProbeError, probe_inputs

PAST, SEQ = 7, 3
#: ops a key-position index passes through on its way from the CumSum
_KEY_CHAIN = ("Sub", "Add", "Mul", "Cast", "Unsqueeze", "Reshape", "Squeeze", "Identity")


@dataclass(frozen=True, eq=False)
class PositionSources:
    """``ranges``: the query Range nodes; ``query``: their [1, seq] unsqueezed
    outputs (the export's position_ids); ``key``: key-position tensors."""
    ranges: tuple[gs.Node, ...] = ()
    query: tuple[gs.Tensor, ...] = ()
    key: tuple[gs.Tensor, ...] = ()
    #: probe value of each key tensor (its rank and dtype)
    key_values: tuple = ()


def _is_unsqueeze0(n: gs.Node) -> bool:
    if n.op != "Unsqueeze":
        return False
    axes = n.attrs.get("axes")
    if axes is None and len(n.inputs) > 1:
        v = const_value(n.inputs[1])
        axes = v.reshape(-1).tolist() if v is not None else None
    return axes is not None and list(axes) == [0]


def _values(probe: Probe, tensors: list[gs.Tensor]) -> list[np.ndarray | None]:
    """Probe values, one tensor at a time when the batch fails (None: cannot evaluate)."""
    return [None if isinstance(v, ProbeError) else v for v in probe.values_each(tensors)]


def _query_ranges(probe: Probe, nodes: list[gs.Node]) -> list[gs.Node]:
    ranges = [n for n in nodes if n.op == "Range"]
    want = np.arange(PAST, PAST + SEQ)
    vals = _values(probe, [n.outputs[0] for n in ranges]) if ranges else []
    return [n for n, v in zip(ranges, vals) if v is not None and v.shape == want.shape and np.array_equal(v, want)]


def _key_sources(probe: Probe, nodes: list[gs.Node], amask: gs.Tensor | None) -> list[tuple]:
    """For each CumSum over the attention mask, the last tensor of its chain
    that holds the key positions 0..past+seq-1 (broadcast over other dims)."""
    if amask is None:
        return []
    want = np.arange(PAST + SEQ)
    found = []
    for n in nodes:
        if n.op != "CumSum" or not _reads(n.inputs[0], amask):
            continue
        chain, t = [], n.outputs[0]
        while True:
            chain.append(t)
            nxt = [c for c in t.outputs if c.op in _KEY_CHAIN]
            if len(t.outputs) != 1 or len(nxt) != 1:
                break
            t = nxt[0].outputs[0]
        vals = _values(probe, chain)
        good = [t for t, v in zip(chain, vals) if v is not None and v.shape[-1:] == want.shape
                and np.all(v.reshape(-1, v.shape[-1]) == want)]
        if good:
            found.append((good[-1], vals[chain.index(good[-1])]))
    return found


def _reads(t: gs.Tensor, source: gs.Tensor, steps: int = 4) -> bool:
    """``t`` is ``source`` or reached from it through single-input casts."""
    for _ in range(steps):
        if t is source:
            return True
        n = producer(t)
        if n is None or n.op not in ("Cast", "Identity", "Unsqueeze"):
            return False
        t = n.inputs[0]
    return t is source


def find_position_sources(graph: gs.Graph, nodes: list[gs.Node], inputs, concats: list[gs.Node]) -> PositionSources:
    """``inputs``: the ``IntegerInputs``; ``concats``: the cache Concats."""
    ranges_or_cumsum = any(n.op == "CumSum" for n in nodes) or (
        inputs.position_ids is None and any(n.op == "Range" for n in nodes))
    if not ranges_or_cumsum:
        return PositionSources()
    roles = {"input_ids": inputs.input_ids, "position_ids": inputs.position_ids,
             "attention_mask": inputs.attention_mask}
    try:
        dims, feeds = probe_inputs(graph, PAST, SEQ, roles, [n.inputs[0] for n in concats])
        probe = Probe(graph, dims, feeds)
    except ProbeError as e:
        raise UnsupportedPatternError(f"cannot trace where positions come from: {e}") from None
    found = _key_sources(probe, nodes, inputs.attention_mask)
    key, key_values = tuple(t for t, _ in found), tuple(v for _, v in found)
    if inputs.position_ids is not None:
        return PositionSources(key=key, key_values=key_values)
    ranges = _query_ranges(probe, nodes)
    query = tuple(c.outputs[0] for r in ranges for c in r.outputs[0].outputs if _is_unsqueeze0(c))
    return PositionSources(ranges=tuple(ranges), query=query, key=key, key_values=key_values)


def check_query_uses(sources: PositionSources, mask_operands: list[gs.Tensor]) -> None:
    """Every value the query Ranges feed, other than through the export's
    position_ids (``sources.query``), must be part of an attention mask operand."""
    if not sources.ranges:
        return
    replaced = {id(t) for t in sources.query} | {id(t) for t in mask_operands}
    cone = _backward_cone(mask_operands)
    stack = [o for r in sources.ranges for n in r.outputs[0].outputs if n.op not in SHAPE_ONLY_OPS
             for o in n.outputs]
    seen = set()
    while stack:
        t = stack.pop()
        if id(t) in seen or id(t) in replaced:
            continue
        seen.add(id(t))
        if id(t) not in cone:
            users = ", ".join(sorted(f"{n.op} {n.name!r}" for n in t.outputs)) or "a graph output"
            raise UnsupportedPatternError(
                f"positions computed from the past length reach {t.name!r} (used by {users}) outside the "
                f"attention mask and the rotary position_ids; cannot feed them from position_ids")
        for n in t.outputs:
            if n.op not in SHAPE_ONLY_OPS:
                stack += list(n.outputs)


def check_key_uses(graph: gs.Graph, nodes: list[gs.Node], sources: PositionSources, layers) -> None:
    """ALiBi key positions only bias the scores: the rewrite replaces them by the slot index
    0..ctx_len-1, read off the cache. A layer whose new keys or values (computed before any
    attention) depend on them reads them as the new tokens' positions (position_ids =
    cumsum(attention_mask) - 1, sliced to the last tokens, for the rotary): refused."""
    if not sources.key:
        return
    before = value_dependence(graph, [a.softmax.outputs[0] for a in layers], nodes)
    for t in sources.key:
        dep = value_dependence(graph, [t], nodes)
        for i, a in enumerate(layers):
            for what, concat in (("keys", a.key), ("values", a.value)):
                new = concat.inputs[1]
                if id(new) in dep and id(new) not in before:
                    raise UnsupportedPatternError(
                        f"layer {i}: the new {what} (Concat {concat.name!r}) depend on {t.name!r}, a CumSum of "
                        f"attention_mask holding the key positions: positions of the new tokens computed from "
                        f"attention_mask (e.g. for the rotary) are not supported; export the model reading "
                        f"position_ids")


def _backward_cone(tensors: list[gs.Tensor]) -> set[int]:
    out, stack = set(), list(tensors)
    while stack:
        t = stack.pop()
        if id(t) in out:
            continue
        out.add(id(t))
        n = producer(t)
        if n is not None:
            stack += list(n.inputs)
    return out
