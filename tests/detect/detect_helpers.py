"""Shared by the detection tests: a fixture's graph with its nodes named, and
the inputs the finders take (topological nodes, hints, cache Concats)."""
from __future__ import annotations

import onnx
import onnx_graphsurgeon as gs

from specdec_compile.detect.cache_concats import find_cache_concats
from specdec_compile.detect.hints import load_hints
from specdec_compile.graph_utils import name_unnamed_nodes, topo_nodes


def graph(path) -> gs.Graph:
    g = gs.import_onnx(onnx.load(str(path), load_external_data=False))
    name_unnamed_nodes(g)
    return g


def parts(g: gs.Graph):
    """(nodes in topological order, default hints, cache Concats)."""
    nodes = topo_nodes(g)
    return nodes, load_hints(None), find_cache_concats(g, nodes)


def input_named(g: gs.Graph, name: str) -> gs.Tensor:
    return next(t for t in g.inputs if t.name == name)
