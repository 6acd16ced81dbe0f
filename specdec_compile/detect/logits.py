"""Finder: the logits output.

The one rank-3 float graph output that is not a present K/V; when several
qualify, the names in ``hints["logits_names"]`` break the tie."""
from __future__ import annotations

import onnx_graphsurgeon as gs

from ..errors import DetectionError
from ._tensors import is_float, names, rank
from .cache_concats import present_tensors


def find_logits(graph: gs.Graph, concats: list[gs.Node], hints: dict) -> gs.Tensor:
    present = {id(t) for n in concats for t in present_tensors(n)}
    cands = [t for t in graph.outputs if id(t) not in present and is_float(t) and rank(t) == 3]
    if len(cands) > 1:
        named = [t for t in cands if t.name in hints["logits_names"]]
        cands = named or cands
    if len(cands) != 1:
        raise DetectionError(
            f"not a decoder LM: expected one rank-3 float logits output, found "
            f"{len(cands)} (outputs: {names(graph.outputs)})")
    return cands[0]


def vocab_dim(logits: gs.Tensor):
    """The logits' last dim as the graph states it (an int, a dim name, or None)."""
    return logits.shape[-1] if logits.shape is not None else None
