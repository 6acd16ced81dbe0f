"""Finder: rotary angles computed on the device from ``position_ids``.

Rotary exports (Llama, Qwen2, Mistral, Phi-3, GPT-NeoX, ... and their scaled
variants) compute ``Cos``/``Sin`` of ``Cast(position_ids) x inv_freq`` inside
the graph. Every ``Cos``/``Sin`` whose input *values* depend on the position
input is such a site, found by dependence, not by a name or a layout. Each
site ends at its *table tensor*: the trig output followed forward, while it has
one consumer, through ``Cast`` and through ``Mul``/``Div`` by a constant (the
scaled ropes' attention factor): what a per-position table would hold.

GPT-J and CodeGen gather sin/cos from a constant table already: they have no
site. Whether a site's values are a function of each token's own position (so
a table can replace it) is not decided here: ``passes.rotary_tables`` checks it
numerically and refuses otherwise.
"""
from __future__ import annotations

import onnx_graphsurgeon as gs

from ..graph_utils import const_value, value_dependence
from ._records import RotarySite

TRIG_OPS = ("Cos", "Sin")
#: side operands of these ops may be a constant scale (yarn's attention factor)
_SCALE_OPS = ("Mul", "Div")
#: onnx float element types (float, float16, double, bfloat16)
_FLOAT_TYPES = (1, 10, 11, 16)


def _scale_step(node: gs.Node, t: gs.Tensor) -> bool:
    """Is ``node`` ``t * c`` or ``t / c`` with a constant of at most one element?"""
    if node.op not in _SCALE_OPS or len(node.inputs) != 2:
        return False
    if node.op == "Div" and node.inputs[0] is not t:
        return False
    other = node.inputs[1] if node.inputs[0] is t else node.inputs[0]
    value = const_value(other)
    return value is not None and value.size == 1


def table_tensor(graph: gs.Graph, trig: gs.Node) -> gs.Tensor:
    """The last tensor of the per-position chain that starts at ``trig``'s output."""
    t = trig.outputs[0]
    outputs = {id(o) for o in graph.outputs}
    for _ in range(8):
        if len(t.outputs) != 1 or id(t) in outputs:
            break
        nxt = t.outputs[0]
        is_float_cast = nxt.op == "Cast" and nxt.attrs.get("to") in _FLOAT_TYPES
        if not (is_float_cast or _scale_step(nxt, t)) or len(nxt.outputs) != 1:
            break
        t = nxt.outputs[0]
    return t


def find_rotary(graph: gs.Graph, nodes: list[gs.Node], positions) -> list[RotarySite]:
    """Every Cos/Sin whose input depends on ``positions`` (the position_ids
    input, or a list of the tensors an export without one derives its
    positions into), in topological order."""
    if positions is None:
        return []
    sources = [positions] if isinstance(positions, gs.Tensor) else list(positions)
    if not sources:
        return []
    dep = value_dependence(graph, sources, nodes)
    sites = []
    for n in nodes:
        if n.op in TRIG_OPS and n.inputs and id(n.inputs[0]) in dep:
            sites.append(RotarySite(node=n.name, op=n.op, angle=n.inputs[0].name,
                                    table=table_tensor(graph, n).name))
    return sites
