"""Finder: the integer inputs ``input_ids``, ``position_ids`` and ``attention_mask``.

Names in ``hints["input_names"]`` are tried first; then structure decides:
input_ids is the integer input feeding an embedding ``Gather`` whose table has
as many rows as the logits have columns; position_ids is the integer input with
input_ids' shape; attention_mask is the one left over. Every graph input must
be one of these or a past K/V. position_ids may be absent (the positions
finder then looks for where the export derives them)."""
from __future__ import annotations

from dataclasses import dataclass

import onnx_graphsurgeon as gs

from ..errors import DetectionError, UnsupportedPatternError
from ..graph_utils import is_const, producer
from ._tensors import is_int, names, rank

ROLES = ("input_ids", "position_ids", "attention_mask")


@dataclass(frozen=True)
class IntegerInputs:
    input_ids: gs.Tensor
    position_ids: gs.Tensor | None
    attention_mask: gs.Tensor | None


def require_integer_input(graph: gs.Graph) -> None:
    """A decoder LM takes token ids: refuse a graph with no integer input at all."""
    if not [t for t in graph.inputs if is_int(t)]:
        raise DetectionError(
            f"not a decoder LM: no integer token-id input (inputs: {names(graph.inputs)})")


def embedding_rows(t: gs.Tensor) -> int | None:
    """Rows of the embedding table ``t`` indexes (through Cast, Identity,
    Unsqueeze, Reshape; at most 3 steps), or None."""
    frontier = list(t.outputs)
    for _ in range(3):
        nxt = []
        for c in frontier:
            if c.op == "Gather" and len(c.inputs) == 2 and c.inputs[1] is not None:
                table = c.inputs[0]
                if (c.inputs[1] is t or producer(c.inputs[1]) is not None) and is_const(table) \
                        and table.shape is not None and len(table.shape) == 2:
                    return int(table.shape[0])
            if c.op in ("Cast", "Identity", "Unsqueeze", "Reshape"):
                nxt += [x for o in c.outputs for x in o.outputs]
        frontier = nxt
    return None


def _by_name(int_inputs: list[gs.Tensor], hints: dict) -> dict[str, gs.Tensor]:
    roles: dict[str, gs.Tensor] = {}
    for role in ROLES:
        for t in int_inputs:
            if t.name in hints["input_names"][role] and t not in roles.values():
                roles[role] = t
                break
    return roles


def _token_input(int_inputs: list[gs.Tensor], vocab) -> gs.Tensor:
    emb = [(t, embedding_rows(t)) for t in int_inputs]
    emb = [(t, rows) for t, rows in emb if rows is not None]
    if vocab is not None and len(emb) > 1:
        emb = [(t, rows) for t, rows in emb if rows == vocab] or emb
    if len(emb) != 1:
        raise DetectionError(
            f"not a decoder LM: cannot find the token-id input feeding the embedding "
            f"(integer inputs: {names(int_inputs)})")
    return emb[0][0]


def find_integer_inputs(graph: gs.Graph, hints: dict, concats: list[gs.Node], vocab=None,
                        other: tuple[gs.Tensor, ...] = ()) -> IntegerInputs:
    """``vocab``: the logits' last dim, to tell the token embedding from others;
    ``other``: inputs other finders account for (a feature draft's features)."""
    int_inputs = [t for t in graph.inputs if is_int(t) and rank(t) == 2]
    roles = _by_name(int_inputs, hints)
    if "input_ids" not in roles:
        roles["input_ids"] = _token_input(int_inputs, vocab)
    ids = roles["input_ids"]
    rest = [t for t in int_inputs if t not in roles.values()]
    if "position_ids" not in roles:
        same = [t for t in rest if t.shape is not None and list(t.shape) == list(ids.shape)]
        if len(same) == 1:
            roles["position_ids"] = same[0]
            rest.remove(same[0])
    if "attention_mask" not in roles and len(rest) == 1:
        roles["attention_mask"] = rest.pop()
    known = {id(t) for t in roles.values()} | {id(n.inputs[0]) for n in concats} | {id(t) for t in other}
    extra = [t for t in graph.inputs if id(t) not in known]
    if extra:
        raise UnsupportedPatternError(f"unexpected graph inputs: {names(extra)}")
    return IntegerInputs(input_ids=ids, position_ids=roles.get("position_ids"),
                         attention_mask=roles.get("attention_mask"))
