"""Subgraphs (If branches, Loop and Scan bodies) as the diff sees them: the outer tensors they read,
and a digest of their structure that does not depend on node names, tensor names or node order.

A subgraph reads tensors of the graphs around it by name (its *outer-scope* inputs). A diff
compares those reads as wiring, like a node's inputs: ``graph_digest`` turns each outer name into
a token that the caller chooses (``"outer"`` for the structure alone, or where the tensor comes from).
"""
from __future__ import annotations

import hashlib
from collections import defaultdict, deque
from typing import Callable

import onnx
from onnx import AttributeProto

Resolve = Callable[[str], str]
Leaf = Callable[[AttributeProto], str]


def _h(*parts: str) -> str:
    return hashlib.blake2b("\x1e".join(parts).encode(), digest_size=16).hexdigest()


def subgraphs(n: onnx.NodeProto) -> list[onnx.GraphProto]:
    """The graphs held by a node's attributes (GRAPH and GRAPHS), by attribute name."""
    out = []
    for a in sorted(n.attribute, key=lambda a: a.name):
        if a.type == AttributeProto.GRAPH:
            out.append(a.g)
        elif a.type == AttributeProto.GRAPHS:
            out.extend(a.graphs)
    return out


def _defined(g: onnx.GraphProto) -> set[str]:
    names = {v.name for v in g.input} | {t.name for t in g.initializer}
    names |= {t.values.name for t in g.sparse_initializer}
    for n in g.node:
        names.update(o for o in n.output if o)
    return names


def node_outer_names(n: onnx.NodeProto) -> list[str]:
    """The tensors of the enclosing scopes that a node's subgraphs read, in order of first use."""
    out: dict[str, None] = {}
    for g in subgraphs(n):
        for x in free_names(g):
            out.setdefault(x, None)
    return list(out)


def free_names(g: onnx.GraphProto) -> list[str]:
    """The names a graph reads (its nodes, nested subgraphs and outputs) that it does not define."""
    defined = _defined(g)
    out: dict[str, None] = {}
    for n in g.node:
        for x in list(n.input) + node_outer_names(n):
            if x and x not in defined:
                out.setdefault(x, None)
    for v in g.output:
        if v.name not in defined:
            out.setdefault(v.name, None)
    return list(out)


def topo_order(nodes: list[onnx.NodeProto], deps: list[list[str]]) -> list[int]:
    """A topological order of ``nodes`` (``deps``: the names each reads, its inputs and what its
    subgraphs read); nodes in a cycle follow in list order."""
    producer = {o: i for i, n in enumerate(nodes) for o in n.output if o}
    indeg = [0] * len(nodes)
    succ: dict[int, list[int]] = defaultdict(list)
    for i, xs in enumerate(deps):
        for x in xs:
            p = producer.get(x)
            if p is not None and p != i:
                indeg[i] += 1
                succ[p].append(i)
    ready = deque(i for i in range(len(nodes)) if indeg[i] == 0)
    order = []
    while ready:
        i = ready.popleft()
        order.append(i)
        for j in succ[i]:
            indeg[j] -= 1
            if indeg[j] == 0:
                ready.append(j)
    seen = set(order)
    return order + [i for i in range(len(nodes)) if i not in seen]


def graph_digest(g: onnx.GraphProto, resolve: Resolve, leaf: Leaf, value: Callable, tensor: Callable) -> str:
    """A digest of a subgraph's structure: its inputs by position and type, its initializers by
    content, its nodes by op, domain, overload, attributes (``leaf`` for those that hold no graph)
    and where their inputs come from, and its outputs by position, type and source. Names of nodes
    and of its own tensors, and the order of its nodes, do not count; a tensor of an enclosing
    scope counts as ``resolve(name)``. ``value``: a ValueInfo's type as text; ``tensor``: a
    TensorProto's dtype, shape and content as text."""
    local: dict[str, str] = {}
    for k, v in enumerate(g.input):
        local[v.name] = f"in{k}"
    for t in g.initializer:
        local[t.name] = "init:" + tensor(t)

    def tok(x: str) -> str:
        if not x:
            return "-"
        return local[x] if x in local else "outer:" + resolve(x)

    nodes = list(g.node)
    order = topo_order(nodes, [list(n.input) + node_outer_names(n) for n in nodes])
    hashes = []
    for i in order:
        n = nodes[i]
        attrs = [f"{a.name}={attr_digest(a, tok, leaf, value, tensor)}" for a in sorted(n.attribute, key=lambda a: a.name)]
        h = _h(node_domain(n), n.op_type, n.overload, "|".join(attrs), *(tok(x) for x in n.input),
               str(len(n.output)))
        for k, o in enumerate(n.output):
            if o:
                local.setdefault(o, f"n:{h}:{k}")
        hashes.append(h)
    inputs = [value(v) for v in g.input]
    outputs = [f"{tok(v.name)}:{value(v)}" for v in g.output]
    return _h("inputs", *inputs, "nodes", *sorted(hashes), "outputs", *outputs)


def attr_digest(a: AttributeProto, resolve: Resolve, leaf: Leaf, value: Callable, tensor: Callable) -> str:
    """An attribute's value as a digest: subgraphs by ``graph_digest``, anything else by ``leaf``."""
    if a.type == AttributeProto.GRAPH and not a.ref_attr_name:
        return "graph:" + graph_digest(a.g, resolve, leaf, value, tensor)
    if a.type == AttributeProto.GRAPHS and not a.ref_attr_name:
        return "[" + ",".join(graph_digest(x, resolve, leaf, value, tensor) for x in a.graphs) + "]"
    return leaf(a)


def node_domain(n: onnx.NodeProto) -> str:
    """A node's domain, ``""`` for the default one (also spelled ``ai.onnx``)."""
    d = n.domain or ""
    return "" if d == "ai.onnx" else d
