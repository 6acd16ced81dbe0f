"""Pass ``fuse_rotary`` (ort, opt-in): each q/k rotation becomes one ONNX ``RotaryEmbedding`` node.

When on (``PassContext.fuse_rotary``), the pass first turns the export's rotary ``Cos``/``Sin``
of the positions into ``rotary_tables``' constant tables of ``ctx_len`` rows, evaluated for the
ort target (the export's own dtypes, by ONNX Runtime's own kernels: bit for bit what the export
computes per call; ``with_tables``). The graph's context is then fixed at ``ctx_len`` (a
position past the table is an error, where the unfused ort graph takes any cache length), so
the pipeline records it (``specdec.ctx_len``), as for qaic. Each layer then rotates q and k as
``x*cos + rotate_half(x)*sin`` from those tables: on ONNX Runtime seven kernels per tensor (two
Slices, Neg, Concat, two Muls, Add; Cohere's interleaved layout adds two Unsqueezes and a
Reshape), four after ``gather_rotate_half``, which runs next and rewrites what this pass leaves.
Where ``detect.rotate_half`` finds exactly that form (its docstring lists each fact it checks),
the Add's output is computed instead by the standard ``RotaryEmbedding`` (ai.onnx opset
23; the ``ort`` target is opset 24), which ONNX Runtime 1.32 runs as one CPU kernel::

    RotaryEmbedding(x, cos_cache, sin_cache, Max(position_ids, 0), interleaved=0 or 1)

with x ``[B, N, S, d]`` (the kernel's 4-D layout; N is read off x, so ``num_heads`` is not
set), ``cos_cache``/``sin_cache`` ``[ctx_len, d/2]``: the tables' first halves (interleaved:
their even columns; the other half, or odd column, is checked equal, so nothing is lost), and
the rotary over the whole of x (partial rotary: x is already the export's slice of the rotary
dims). Per element the kernel computes ``x[i]*cos[i] - x[i+h]*sin[i]`` and
``x[i+h]*cos[i] + x[i]*sin[i]`` (interleaved: the same on each pair ``(2i, 2i+1)``), the
export's own products; only the order of rounding may differ (tests: 1e-4 against the export,
the contract's tolerance). The same row index as the tables' Gather: padding (-1) reads row 0,
and a position >= ctx_len is an error, as the Gather's is (ONNX Runtime checks the range).

**Opt-in** (``PassContext.fuse_rotary``; ``pipeline.rewrite(..., fuse_rotary=True)``), off by
default: ONNX Runtime 1.32's kernel (the standard op and ``com.microsoft``'s alike) computes
``x*cos - y*sin`` with fused multiply-adds, so about a quarter of the rotated elements differ
from the export's in the last bit. That stays within 1e-4 on every fixture and coverage row,
but SmolLM2-135M amplifies it: ``specdec-compile verify`` at ctx 256 gives 3e-5..7e-5 on the
short scenarios and 4.8e-4 on ``fill`` (positions up to 255), past the contract's 1e-4, where
the unfused rewrite is bit for bit the export. Off, the pass returns the graph as it is (the
export's Cos/Sin per call, any context length).

Sites in any other form are left as they are, each with the reason (logged at INFO; the pass
returns the graph with those sites untouched). qaic keeps the unfused form: QEfficient's device
graphs compute rotary with Mul/Concat/Slice, so ``RotaryEmbedding`` has no device precedent.
"""
from __future__ import annotations

import dataclasses
import logging

import onnx_graphsurgeon as gs

from ..contract import POSITION_IDS
from ..detect.rotate_half import RotateHalfSite, find_rotate_half
from ..graph_utils import copy_graph, Builder, graph_input, toposort
from ._context import PassContext, need, graph_pass
from ._static import symbolic_dims
from .rotary_tables import rotary_tables

_log = logging.getLogger(__name__)
#: the first ai.onnx opset with RotaryEmbedding
_OPSET = 23


def with_tables(graph: gs.Graph, ctx: PassContext) -> gs.Graph:
    """``graph`` with its rotary Cos/Sin turned into ``rotary_tables``' tables, evaluated for the
    ort target (the export's dtypes, ONNX Runtime's kernels: its own bits); as it is when the
    export has no on-device angles (or none left)."""
    det = ctx.detection
    if not det.rotary or not any(n.op in ("Cos", "Sin") for n in graph.nodes):
        return graph
    return rotary_tables(graph, dataclasses.replace(ctx, target="ort"))


def find_sites(graph: gs.Graph) -> tuple[list[RotateHalfSite], list[tuple[str, str]]]:
    """(the rotations the pass fuses, [(Add node, reason)] for those it leaves), on a graph whose
    rotary reads constant tables (``with_tables``)."""
    positions = graph_input(graph, POSITION_IDS)
    if positions is None or not any(n.op == "Neg" for n in graph.nodes):
        return [], []
    return find_rotate_half(graph, positions, symbolic_dims(graph))


def _fuse(b: Builder, site: RotateHalfSite, caches: dict) -> None:
    key = (site.cos.tobytes(), site.sin.tobytes(), site.cos.shape)
    if key not in caches:
        caches[key] = (b.const(site.cos, hint="cos_cache"), b.const(site.sin, hint="sin_cache"))
    cos, sin = caches[key]
    out = site.add.outputs[0]
    site.add.outputs.clear()
    b.op("RotaryEmbedding", [site.x, cos, sin, site.row], attrs={"interleaved": int(site.interleaved)},
         hint="rotary", outputs=[out])


@graph_pass
def fuse_rotary(graph: gs.Graph, ctx: PassContext) -> gs.Graph:
    need("fuse_rotary", ctx)
    if not ctx.fuse_rotary:
        return graph
    need("fuse_rotary", ctx, "detection")
    if (graph.opset or 0) < _OPSET:
        _log.info("fuse_rotary: opset %s < %d, no RotaryEmbedding; left as is", graph.opset, _OPSET)
        return graph
    graph = copy_graph(with_tables(graph, ctx))
    sites, skipped = find_sites(graph)
    for name, why in skipped:
        _log.info("fuse_rotary: left %s as is: %s", name, why)
    if not sites:
        return graph
    b, caches = Builder(graph, "fuse_rotary"), {}
    for site in sites:
        _fuse(b, site, caches)
    graph.cleanup(remove_unused_graph_inputs=False)
    toposort(graph)
    return graph
