"""Finder: a feature draft's float input (the target's hidden states).

A draft head that reads the target's features (EAGLE-style) takes, besides
the token ids, the positions, the mask and its KV cache, one float input of
rank 3, ``[batch, seq, F]``: the target's hidden states, one row per token.
Found structurally: the one float rank-3 graph input that is not a past K/V
(a cache Concat's first operand). Its width F must be static. No such input:
None (an ordinary decoder). Several: None too, and the integer-inputs finder
refuses them as unexpected inputs, as it did before feature drafts."""
from __future__ import annotations

import onnx_graphsurgeon as gs

from ..errors import UnsupportedPatternError
from ._tensors import is_float, rank


def find_feature_input(graph: gs.Graph, concats: list[gs.Node]) -> gs.Tensor | None:
    past = {id(n.inputs[0]) for n in concats}
    cands = [t for t in graph.inputs if id(t) not in past and is_float(t) and rank(t) == 3]
    if len(cands) != 1:
        return None
    t = cands[0]
    if not isinstance(t.shape[-1], int) or t.shape[-1] < 1:
        raise UnsupportedPatternError(f"feature input {t.name!r} has no static width (shape {list(t.shape)})")
    return t
