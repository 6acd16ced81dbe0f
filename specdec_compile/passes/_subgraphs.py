"""Subgraphs (the bodies of If, Loop and Scan) read tensors of the graph around them without
listing them as their node's inputs. A pass that asks "what depends on this tensor" or "who
reads this tensor" must count those reads, or it rewrites a tensor a subgraph still reads
(an export's If reading ``attention_mask`` got the mask's stand-in of ones: wrong logits).

    outer_reads(node)             the tensors around ``node`` its subgraphs read (nested too)
    deep_dependence(graph, srcs)  ``graph_utils.value_dependence`` counting those reads as inputs
    subgraph_readers(graph, t)    the nodes inside a subgraph that read ``t``
"""
from __future__ import annotations

from typing import Iterable

import onnx_graphsurgeon as gs

from ..graph_utils import SHAPE_ONLY_OPS


def _bodies(node: gs.Node) -> list[gs.Graph]:
    out = []
    for value in node.attrs.values():
        out += [g for g in (value if isinstance(value, (list, tuple)) else [value]) if isinstance(g, gs.Graph)]
    return out


def outer_reads(node: gs.Node) -> list[gs.Tensor]:
    """Variables the subgraphs of ``node`` read that none of them makes (nor takes as an input)."""
    reads: dict[int, gs.Tensor] = {}
    for body in _bodies(node):
        made = {id(t) for n in body.nodes for t in n.outputs} | {id(t) for t in body.inputs}
        for inner in body.nodes:
            for t in [*inner.inputs, *outer_reads(inner)]:
                if isinstance(t, gs.Variable) and t.name and id(t) not in made:
                    reads[id(t)] = t
    return list(reads.values())


def _inputs(graph: gs.Graph) -> dict[int, list[gs.Tensor]]:
    """id(node) -> what the node reads: its inputs and, for a node with subgraphs, their outer reads."""
    return {id(n): [*n.inputs, *outer_reads(n)] if _bodies(n) else list(n.inputs) for n in graph.nodes}


def _order(graph: gs.Graph, reads: dict[int, list[gs.Tensor]]) -> list[gs.Node]:
    """The nodes in an order where each comes after what it reads (subgraph reads included)."""
    made = {id(t): n for n in graph.nodes for t in n.outputs}
    seen: set[int] = set()   # entered (a cycle, which the model checks refuse anyway, ends here)
    order: list[gs.Node] = []
    for start in graph.nodes:
        stack = [(start, False)]
        while stack:
            node, expanded = stack.pop()
            if expanded:
                order.append(node)
                continue
            if id(node) in seen:
                continue
            seen.add(id(node))
            stack.append((node, True))
            stack += [(made[id(t)], False) for t in reads[id(node)] if id(t) in made and id(made[id(t)]) not in seen]
    return order


def deep_dependence(graph: gs.Graph, sources: Iterable[gs.Tensor]) -> set[int]:
    """ids of the tensors whose values depend on any of ``sources`` (through Shape/Size: no),
    a node with subgraphs depending on what they read."""
    reads = _inputs(graph)
    dep = {id(t) for t in sources}
    for node in _order(graph, reads):
        if node.op not in SHAPE_ONLY_OPS and any(id(t) in dep for t in reads[id(node)]):
            dep.update(id(t) for t in node.outputs)
    return dep


def subgraph_readers(graph: gs.Graph, t: gs.Tensor) -> list[gs.Node]:
    """The consumers of ``t`` that are not nodes of ``graph`` itself (they are in a subgraph)."""
    top = {id(n) for n in graph.nodes}
    return [n for n in t.outputs if id(n) not in top]
