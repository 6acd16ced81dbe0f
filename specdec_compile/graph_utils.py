"""Small helpers over onnx-graphsurgeon graphs shared by detection and passes."""
from __future__ import annotations

from typing import Callable, Iterable

import numpy as np
import onnx
import onnx_graphsurgeon as gs
from onnx_graphsurgeon.logger import G_LOGGER

from .errors import SpecdecError

G_LOGGER.severity = G_LOGGER.ERROR

#: ops whose output carries only the *shape* of their input, never its values
SHAPE_ONLY_OPS = frozenset({"Shape", "Size"})


def producer(t: gs.Tensor) -> gs.Node | None:
    return t.inputs[0] if t.inputs else None


def is_const(t: gs.Tensor) -> bool:
    """A tensor whose value is known when the graph is built (initializer or Constant)."""
    if isinstance(t, gs.Constant):
        return True
    p = producer(t)
    return p is not None and p.op == "Constant"


def graph_input(graph: gs.Graph, name: str) -> gs.Variable | None:
    for t in graph.inputs:
        if t.name == name:
            return t
    return None


def topo_nodes(graph: gs.Graph) -> list[gs.Node]:
    """The graph's nodes in a topological order, without reordering the graph."""
    nodes = list(graph.nodes)
    index = {id(n): i for i, n in enumerate(nodes)}
    indegree = [0] * len(nodes)
    users: list[list[int]] = [[] for _ in nodes]
    for i, n in enumerate(nodes):
        deps = {index[id(t.inputs[0])] for t in n.inputs if t.inputs and id(t.inputs[0]) in index}
        indegree[i] = len(deps)
        for d in deps:
            users[d].append(i)
    ready = [i for i, d in enumerate(indegree) if d == 0]
    order = []
    while ready:
        i = ready.pop()
        order.append(nodes[i])
        for u in users[i]:
            indegree[u] -= 1
            if indegree[u] == 0:
                ready.append(u)
    if len(order) != len(nodes):
        raise ValueError("graph has a cycle")
    return order


def value_dependence(graph: gs.Graph, sources: Iterable[gs.Tensor],
                     nodes: list[gs.Node] | None = None, stop: Iterable[gs.Tensor] = ()) -> set[int]:
    """ids of tensors whose *values* depend on any of ``sources``.

    Dependence through Shape/Size is not value dependence: ``Shape(x)`` does
    not change when the values of x change. Tensors in ``stop`` neither
    depend nor pass dependence on (a value the rewrite replaces).
    """
    blocked = {id(t) for t in stop}
    dep = {id(t) for t in sources} - blocked
    for node in nodes if nodes is not None else topo_nodes(graph):
        if node.op in SHAPE_ONLY_OPS:
            continue
        if any(id(t) in dep for t in node.inputs):
            dep.update(id(t) for t in node.outputs if id(t) not in blocked)
    return dep


def const_value(t: gs.Tensor) -> np.ndarray | None:
    """The value of a small constant tensor, without touching external data."""
    if isinstance(t, gs.Constant):
        if is_external(t):
            return None
        return np.asarray(t.values)
    p = producer(t)
    if p is not None and p.op == "Constant":
        v = p.attrs.get("value")
        if isinstance(v, gs.Constant) and not is_external(v):
            return np.asarray(v.values)
        for key, cast in (("value_float", np.float32), ("value_int", np.int64)):
            if key in p.attrs:
                return np.asarray(p.attrs[key], dtype=cast)
        for key, cast in (("value_floats", np.float32), ("value_ints", np.int64)):
            if key in p.attrs:
                return np.asarray(p.attrs[key], dtype=cast)
    return None


def is_external(c: gs.Constant) -> bool:
    """True when the constant's data lives in an external file (never load it)."""
    lazy = getattr(c, "_values", None)
    tensor = getattr(lazy, "tensor", None)
    return tensor is not None and tensor.data_location == onnx.TensorProto.EXTERNAL


class Builder:
    """Adds named nodes to a graph. Names are ``specdec/<scope>/<op>_<n>``, so
    they are stable from run to run and say which pass (and layer) made them."""

    def __init__(self, graph: gs.Graph, scope: str):
        self.graph = graph
        self.scope = scope
        self.count = 0
        # names the graph has (an export may hold one like ours): a new node or tensor never takes one
        self.used = {n.name for n in graph.nodes} | set(graph.tensors())

    def _name(self, hint: str) -> str:
        while True:
            self.count += 1
            name = f"specdec/{self.scope}/{hint}_{self.count}"
            if not {name, f"{name}_out", f"{name}_out0"} & self.used:
                self.used.add(name)
                return name

    def const(self, value, dtype=None, hint: str = "const") -> gs.Constant:
        arr = np.asarray(value, dtype=dtype)
        return gs.Constant(self._name(hint), arr)

    def op(self, op: str, inputs: list, *, attrs: dict | None = None, hint: str | None = None,
           dtype=None, shape=None, outputs: list | None = None, n_out: int = 1,
           domain: str | None = None) -> gs.Variable | list[gs.Variable]:
        name = self._name(hint or op)
        inputs = [i if isinstance(i, gs.Tensor) else self.const(i, hint=f"{hint or op}_c") for i in inputs]
        if outputs is None:
            outputs = [gs.Variable(f"{name}_out{j}" if n_out > 1 else f"{name}_out", dtype=dtype, shape=shape)
                       for j in range(n_out)]
        node = gs.Node(op=op, name=name, attrs=attrs or {}, inputs=inputs, outputs=outputs, domain=domain)
        self.graph.nodes.append(node)
        return outputs if n_out > 1 else outputs[0]


def replace_uses(graph: gs.Graph, old: gs.Tensor, new: gs.Tensor,
                 keep: Callable[[gs.Node], bool] | None = None) -> None:
    """Make every consumer of ``old`` read ``new`` (except nodes where ``keep``)."""
    for node in list(old.outputs):
        if keep is not None and keep(node):
            continue
        for j, t in enumerate(node.inputs):
            if t is old:
                node.inputs[j] = new
    graph.outputs = [new if t is old else t for t in graph.outputs]


def name_unnamed_nodes(graph: gs.Graph) -> None:
    """Give unnamed nodes stable names (their position), so passes can refer to them; never a name
    another node has (an export may name one ``Concat__222``, as we would name node 222)."""
    taken = {n.name for n in graph.nodes if n.name}
    seen: set[str] = set()
    for i, node in enumerate(graph.nodes):
        if not node.name or node.name in seen:
            base = name = f"{node.name or node.op}__{i}"
            j = 0
            while name in taken:
                j += 1
                name = f"{base}_{j}"
            node.name = name
            taken.add(name)
        seen.add(node.name)


class NotInGraph(SpecdecError, KeyError):
    """A node or tensor looked up by name (one the detection names) is not in the graph. A
    ``KeyError`` too, so callers that catch one keep working; the passes name themselves
    around it (``passes.graph_pass``)."""

    __str__ = Exception.__str__   # one line, not KeyError's quoted repr


def node_by_name(graph: gs.Graph, name: str) -> gs.Node:
    for n in graph.nodes:
        if n.name == name:
            return n
    raise NotInGraph(f"the graph has no node {name!r}")


def tensor_by_name(graph: gs.Graph, name: str) -> gs.Tensor:
    t = graph.tensors().get(name)
    if t is None:
        raise NotInGraph(f"the graph has no tensor {name!r}")
    return t


def copy_graph(graph: gs.Graph) -> gs.Graph:
    """``graph.copy()`` with its model-local functions copied too: onnx-graphsurgeon's copy
    shares the ``Function`` objects, so a ``cleanup()``/``toposort()`` of the copy (which
    recurse into functions) or a change of a function's opset would change the original."""
    new = graph.copy()
    new.functions = [f.copy() for f in graph.functions]
    return new


def toposort(graph: gs.Graph) -> gs.Graph:
    """``graph.toposort()`` in place, also for a graph with subgraphs (If, Loop, Scan):
    onnx-graphsurgeon's full sort recurses without end there (each subgraph lists the
    outer graph's subgraphs again), so such a graph sorts its nodes only."""
    has_subgraph = any(a for n in graph.nodes for a in n.attrs.values() if isinstance(a, gs.Graph))
    return graph.toposort(mode="nodes") if has_subgraph else graph.toposort()


def _attribute_tensors(graphs) -> Iterable[onnx.TensorProto]:
    for g in graphs:
        for n in g.node:
            for a in n.attribute:
                if a.type == onnx.AttributeProto.TENSOR:
                    yield a.t
                yield from _attribute_tensors([a.g] if a.type == onnx.AttributeProto.GRAPH else a.graphs)


class UnnamedAttributesKept:
    """``with UnnamedAttributesKept(model): ...`` gives a caller's ``ModelProto`` back as it was:
    onnx-graphsurgeon's export reuses the tensors of node attributes it imported and sets their
    ``name`` ("" then, present: the values are the same, the bytes not). Cleared again on exit."""

    def __init__(self, model: onnx.ModelProto):
        graphs = [model.graph, *model.functions]
        self.unnamed = [t for t in _attribute_tensors(graphs) if not t.HasField("name")]

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        for t in self.unnamed:
            if t.HasField("name") and not t.name:
                t.ClearField("name")
