"""Pass ``share_shapes`` (ort): shape arithmetic computed once per graph, not once per layer.

Exports compute the shapes they reshape to from the tensors at hand: every layer reads
``Shape(hidden)[0]`` (the batch), ``Shape(hidden)[1]`` (the sequence), ``Shape(cache)[2]``
(the cache length), and builds the same ``Unsqueeze``/``Concat`` targets from them. On ONNX
Runtime each of these is a kernel launch per layer per step (SmolLM2-135M: about 2,000 of
its 3,000 kernels per decode step). What depends only on static dims is folded before this
pass (``fold_static_shapes``); what is left depends on ``batch_size``, ``seq_len`` and
``ctx_len``, the same for every layer:

1. **One read per dim.** A ``Gather(Shape(x), k)`` (or a ``Shape(x, start, end)`` of one
   dim, or ``Slice`` of a Shape picking one) whose dim shape inference names ``batch_size``,
   ``seq_len`` or ``ctx_len`` reads that dim once, at the top of the graph, off the graph
   input that declares it (the contract's inputs: ``input_ids`` ``[batch_size, seq_len]``,
   ``past_key.0`` ``[batch_size, kv, ctx_len, d]``). The contract makes those dims one value
   each (``qaic-exec`` binds them by name); inference only names a dim where it has proved it.
2. **Common subexpressions merged.** Then, in topological order, two nodes of the same op,
   domain and attributes reading the same inputs (constants compared by value) compute the
   same thing: the later one is dropped and its uses read the first. Every standard op but
   the random ones and those with subgraphs is deterministic, so this is exact.

Nothing is merged into a graph output, and a graph with none of the three dims named is left
as it is. A read already in step 1's form (``Gather(Shape(input), axis)`` off the declaring
input) is reused and the ``Shape`` of that input kept, so the pass is idempotent: run on its
own output it changes nothing.
"""
from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from ..graph_utils import copy_graph, Builder, const_value, producer, replace_uses, topo_nodes
from ._context import PassContext, need, graph_pass
from ._shape_trace import static_axis
from ._static import symbolic_dims

SHARED_DIMS = ("batch_size", "seq_len", "ctx_len")
_NOT_MERGED = {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial",
               "Bernoulli", "Dropout", "If", "Loop", "Scan"}
_SMALL = 4096


def _one_dim(node: gs.Node, dims: dict) -> tuple[object, int] | None:
    """(the dim's symbol or int, rank of the result: 0 or 1) when ``node`` reads one dim off a shape."""
    if node.op == "Shape":
        x = dims.get(node.inputs[0].name)
        if x is None:
            return None
        picked = x[node.attrs.get("start", 0):node.attrs.get("end", None)]
        return (picked[0], 1) if len(picked) == 1 else None
    src = producer(node.inputs[0]) if node.inputs else None
    if src is None or src.op != "Shape" or dims.get(src.inputs[0].name) is None:
        return None
    x = dims[src.inputs[0].name][src.attrs.get("start", 0):src.attrs.get("end", None)]
    params = [const_value(t) for t in node.inputs[1:]]
    if any(p is None for p in params) or not params:
        return None
    if node.op == "Gather" and node.attrs.get("axis", 0) == 0 and params[0].size == 1:
        k = int(params[0].reshape(-1)[0])
        return (x[k], params[0].ndim) if -len(x) <= k < len(x) else None
    if node.op == "Slice" and len(params) >= 2 and all(p.size == 1 for p in params) \
            and (len(params) < 3 or int(params[2].reshape(-1)[0]) in (0, -1)) \
            and (len(params) < 4 or int(params[3].reshape(-1)[0]) == 1):
        picked = x[slice(int(params[0].reshape(-1)[0]), int(params[1].reshape(-1)[0]))]
        return (picked[0], 1) if len(picked) == 1 else None
    return None


def _sources(graph: gs.Graph, dims: dict) -> dict[str, tuple[gs.Tensor, int]]:
    """symbol -> (the first graph input declaring it, its axis)."""
    found = {}
    for t in graph.inputs:
        for axis, d in enumerate(t.shape or []):
            if d in SHARED_DIMS and d not in found and dims.get(t.name, [None] * (axis + 1))[axis] == d:
                found[d] = (t, axis)
    return found


def _existing_reads(graph: gs.Graph, sources: dict) -> dict[tuple[str, int], gs.Tensor]:
    """(symbol, rank) -> the output of a ``Gather(Shape(src), axis)`` the graph already has that
    reads that dim off its source input exactly as step 1 builds it (a run of this pass before, or
    the export's own): reused, not rebuilt, so the pass run on its own output changes nothing."""
    found: dict[tuple[str, int], gs.Tensor] = {}
    by_source = {(id(t), axis): sym for sym, (t, axis) in sources.items()}
    for node in graph.nodes:
        if node.op != "Gather" or node.attrs.get("axis", 0) != 0 or len(node.inputs) != 2:
            continue
        shape = producer(node.inputs[0])
        if shape is None or shape.op != "Shape" or shape.attrs.get("start", 0) != 0 \
                or shape.attrs.get("end") is not None:
            continue
        index = const_value(node.inputs[1])
        if index is None or index.size != 1 or index.ndim > 1 or not np.issubdtype(index.dtype, np.integer):
            continue
        sym = by_source.get((id(shape.inputs[0]), int(index.reshape(-1)[0])))
        if sym is not None:
            found.setdefault((sym, index.ndim), node.outputs[0])
    return found


def share_dim_reads(graph: gs.Graph, dims: dict) -> int:
    """Step 1 (in place): every read of a shared dim reads the one at the top. Returns the count.
    Reads already in that form are kept (``_existing_reads``), as is the Shape of a source input."""
    sources = _sources(graph, dims)
    if not sources:
        return 0
    b = Builder(graph, "shapes")
    made = _existing_reads(graph, sources)
    kept = {id(t) for t in made.values()}
    source_inputs = {id(t) for t, _ in sources.values()}
    outputs = {id(t) for t in graph.outputs}
    count = 0

    def dim(sym, rank: int) -> gs.Tensor:
        if (sym, rank) not in made:
            src, axis = sources[sym]
            index = np.array([axis] if rank else axis, np.int64)
            made[(sym, rank)] = b.op("Gather", [b.op("Shape", [src], hint=f"{sym}_shape"), b.const(index)],
                                     attrs={"axis": 0}, hint=sym, dtype=np.int64, shape=[1] if rank else [])
        return made[(sym, rank)]

    # one-dim reads first, so a whole Shape is replaced only where it is still read as a whole
    ordered = sorted((n for n in graph.nodes if n.op in ("Shape", "Gather", "Slice")), key=lambda n: n.op == "Shape")
    for node in ordered:
        if id(node.outputs[0]) in outputs or not node.outputs[0].outputs or id(node.outputs[0]) in kept:
            continue
        got = _one_dim(node, dims)
        # the Shape of a source input is the read at the top: the dims are gathered from it
        top = node.op == "Shape" and id(node.inputs[0]) in source_inputs
        whole = _whole_shape(node, dims, sources) if got is None and not top else None
        if got is not None and got[0] in sources:
            replace_uses(graph, node.outputs[0], dim(*got))
        elif whole is not None:
            parts = [dim(d, 1) if isinstance(d, str) else b.const(np.array([d], np.int64)) for d in whole]
            replace_uses(graph, node.outputs[0], b.op("Concat", parts, attrs={"axis": 0}, hint="shape",
                                                      dtype=np.int64, shape=[len(whole)]))
        else:
            continue
        count += 1
    return count


def _whole_shape(node: gs.Node, dims: dict, sources: dict) -> list | None:
    """The dims ``Shape(x)`` reads (two or more), when each is static or a shared dim."""
    x = dims.get(node.inputs[0].name) if node.op == "Shape" else None
    if x is None:
        return None
    x = [d if d is not None else static_axis(node.inputs[0], i, dims) for i, d in enumerate(x)]
    picked = x[node.attrs.get("start", 0):node.attrs.get("end", None)]
    ok = len(picked) > 1 and all(isinstance(d, int) or d in sources for d in picked)
    return picked if ok and any(isinstance(d, str) for d in picked) else None


def _key(node: gs.Node) -> tuple | None:
    if node.op in _NOT_MERGED or node.domain not in (None, "", "ai.onnx"):
        return None
    ins = []
    for t in node.inputs:
        v = const_value(t) if isinstance(t, gs.Constant) or (producer(t) is not None and producer(t).op == "Constant") \
            else None
        if v is not None and v.size <= _SMALL:
            ins.append(("c", str(v.dtype), v.shape, v.tobytes()))
        else:
            ins.append(id(t) if t is not None and t.name else None)
    attrs = tuple(sorted((k, _attr(v)) for k, v in node.attrs.items()))
    return (node.op, node.domain or "", attrs, tuple(ins), len(node.outputs))


def _attr(v):
    if isinstance(v, gs.Constant):
        return ("t", str(v.values.dtype), v.values.shape, np.asarray(v.values).tobytes())
    if isinstance(v, (list, tuple)):
        return tuple(_attr(x) for x in v)
    return v if isinstance(v, (int, float, str, bytes, type(None))) else repr(v)


def merge_common(graph: gs.Graph) -> int:
    """Step 2 (in place): identical nodes merged into the first of them. Returns the count."""
    seen: dict[tuple, gs.Node] = {}
    outputs = {id(t) for t in graph.outputs}
    merged = 0
    for node in topo_nodes(graph):
        key = _key(node)
        if key is None or any(id(o) in outputs for o in node.outputs):
            continue
        first = seen.setdefault(key, node)
        if first is node:
            continue
        for old, new in zip(node.outputs, first.outputs):
            replace_uses(graph, old, new)
        merged += 1
    return merged


@graph_pass
def share_shapes(graph: gs.Graph, ctx: PassContext) -> gs.Graph:
    need("share_shapes", ctx)
    graph = copy_graph(graph)
    shared = share_dim_reads(graph, symbolic_dims(graph))
    merged = merge_common(graph)
    if shared or merged:
        graph.cleanup(remove_unused_graph_inputs=False)
    return graph
