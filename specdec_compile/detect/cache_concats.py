"""Finder: the growing KV cache.

Past K/V are rank-4 graph inputs that are the first operand of a two-input
``Concat`` along axis 2 (the sequence axis): that Concat's output is the
layer's K or V (the "present"), which attention reads."""
from __future__ import annotations

import onnx_graphsurgeon as gs

from ..errors import DetectionError, UnsupportedPatternError
from ._tensors import is_float, names, rank, through

#: ops through which a present K/V reaches a graph output unchanged in meaning
PRESENT_OPS = ("Identity", "Cast")


def _axis(node: gs.Node, rank: int = 4) -> int:
    a = int(node.attrs.get("axis", 0))
    return a + rank if a < 0 else a


def is_cache_concat(node: gs.Node, graph_inputs: set[int]) -> bool:
    return (node.op == "Concat" and len(node.inputs) == 2 and id(node.inputs[0]) in graph_inputs
            and rank(node.inputs[0]) == 4 and _axis(node) == 2)


def find_cache_concats(graph: gs.Graph, nodes: list[gs.Node]) -> list[gs.Node]:
    """The cache Concat nodes, in ``nodes`` order; raises when there are none."""
    graph_inputs = {id(t) for t in graph.inputs}
    concats = [n for n in nodes if is_cache_concat(n, graph_inputs)]
    if concats:
        return concats
    past_like = [t for t in graph.inputs if is_float(t) and rank(t) == 4]
    if past_like:
        raise UnsupportedPatternError(
            f"KV cache inputs ({names(past_like)}) are not grown by a Concat along the sequence axis; "
            f"only concatenating caches are supported")
    raise DetectionError(
        f"decoder exported without a KV cache: no past key/value inputs (inputs: {names(graph.inputs)}); "
        f"export with --task text-generation-with-past")


def present_tensors(concat: gs.Node) -> list[gs.Tensor]:
    """The concat's output and its copies through ``PRESENT_OPS``."""
    return through(concat.outputs[0], PRESENT_OPS)


def present_outputs(graph: gs.Graph, concat: gs.Node) -> tuple[str, ...]:
    """Names of the graph outputs that are the concat's present K/V, sorted."""
    out_ids = {id(t) for t in graph.outputs}
    return tuple(sorted(t.name for t in present_tensors(concat) if id(t) in out_ids))
