"""Pass ``tile_to_expand`` (qaic): ``Tile`` becomes ``Expand`` where that is exact.

GPT-J and CodeGen exports repeat the positions with ``Tile`` whose repeats are
read from a shape (``position_ids.unsqueeze(-1).repeat(1, 1, D)``); QEfficient
removed exactly this dynamic Tile from its GPT-J (PR #1189) in favour of an
``expand``. ``Tile(x, r)`` equals ``Expand(x, r)`` when, on every axis, the
repeat is 1 or x has size 1 there (then both give ``r_i``, or both keep
``x_i``). That is established statically (``_static.unit_axes``: axes added by
Unsqueeze, kept through Expand by ones; repeats traced through Concat,
Unsqueeze, Shape and constants); a Tile where it cannot be is left as it is.
"""
from __future__ import annotations

import onnx_graphsurgeon as gs

from ._context import PassContext, need
from ._static import unit_axes, vector


def expandable(node: gs.Node) -> bool:
    """Is this Tile node provably an Expand by its own repeats?"""
    repeats = vector(node.inputs[1])
    if repeats is None:
        return False
    units = unit_axes(node.inputs[0], len(repeats))
    return all(r == 1 or i in units for i, r in enumerate(repeats))


def tile_to_expand(graph: gs.Graph, ctx: PassContext) -> gs.Graph:
    need("tile_to_expand", ctx)
    if not any(n.op == "Tile" for n in graph.nodes):
        return graph
    graph = graph.copy()
    for node in graph.nodes:
        if node.op == "Tile" and expandable(node):
            node.op = "Expand"
    return graph
