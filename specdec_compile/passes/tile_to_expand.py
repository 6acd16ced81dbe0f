"""Pass ``tile_to_expand`` (qaic): no ``Tile`` in the graph.

GPT-J and CodeGen exports repeat the positions with ``Tile`` whose repeats are
read from a shape (``position_ids.unsqueeze(-1).repeat(1, 1, D)``); QEfficient
removed exactly this dynamic Tile from its GPT-J (PR #1189) in favour of an
``expand``. Two exact rewrites, the first where it applies:

* ``Tile(x, r)`` is ``Expand(x, r)`` when, on every axis, the repeat is 1 or x
  has size 1 there (both then give ``r_i``, or both keep ``x_i``). That is
  established statically (``_static.unit_axes``: axes added by Unsqueeze, kept
  through Expand by ones; repeats traced through Concat, Unsqueeze, Shape and
  constants).
* Otherwise (gpt-oss repeats the tokens once per expert), for x of rank R:
  ``Reshape(Expand(Unsqueeze(x, [0, 2, .., 2R-2]), [r0, d0, r1, d1, ..]),
  r * Shape(x))``: each axis becomes (repeat, size), broadcast over the repeat,
  then merged, which is Tile's row-major layout. A Tile whose rank is not known
  is left as it is (and flagged by the precedent check).
"""
from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from ..graph_utils import copy_graph, Builder
from ._context import PassContext, need, graph_pass
from ._static import rank_of, unit_axes, vector


def expandable(node: gs.Node) -> bool:
    """Is this Tile node provably an Expand by its own repeats?"""
    repeats = vector(node.inputs[1])
    if repeats is None:
        return False
    units = unit_axes(node.inputs[0], len(repeats))
    return all(r == 1 or i in units for i, r in enumerate(repeats))


def _tile_rank(node: gs.Node) -> int | None:
    repeats = vector(node.inputs[1])
    return len(repeats) if repeats is not None else rank_of(node.inputs[0])


def _decompose(b: Builder, node: gs.Node, rank: int) -> None:
    """Replace ``node`` (a Tile of rank ``rank``) by Unsqueeze/Expand/Reshape."""
    x, repeats = node.inputs[0], node.inputs[1]
    out = node.outputs[0]
    dims = b.op("Shape", [x], hint="tile_dims")
    pieces = []
    for i in range(rank):
        for src in (repeats, dims):
            pieces.append(b.op("Slice", [src, b.const([i], np.int64), b.const([i + 1], np.int64)],
                               hint="tile_piece"))
    spread = b.op("Unsqueeze", [x, b.const(list(range(0, 2 * rank, 2)), np.int64)], hint="tile_spread")
    grown = b.op("Expand", [spread, b.op("Concat", pieces, attrs={"axis": 0}, hint="tile_target")],
                 hint="tile_grown")
    node.inputs.clear()
    node.outputs.clear()
    b.op("Reshape", [grown, b.op("Mul", [repeats, dims], hint="tile_shape")], hint="tile", outputs=[out])


@graph_pass
def tile_to_expand(graph: gs.Graph, ctx: PassContext) -> gs.Graph:
    need("tile_to_expand", ctx)
    if not any(n.op == "Tile" for n in graph.nodes):
        return graph
    graph = copy_graph(graph)
    b = Builder(graph, "tile")
    for node in [n for n in graph.nodes if n.op == "Tile"]:
        if expandable(node):
            node.op = "Expand"
            continue
        rank = _tile_rank(node)
        if rank is not None:
            _decompose(b, node, rank)
    graph.cleanup(remove_unused_graph_inputs=False)
    return graph
