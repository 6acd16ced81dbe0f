"""Pass ``grouped_attention`` (ort): grouped-query attention reads the cache as it is.

Exports of grouped-query attention (H query heads sharing kvh = H / g key/value heads) repeat
every key/value head g times before the two attention products (transformers' ``repeat_kv``)::

    K = Reshape(Expand(Unsqueeze(cache, [2]), [B, kvh, g, S, d]), [B, H, S, d])

With a fixed ``ctx_len`` cache that is a copy of g times the whole cache per layer, per step
(SmolLM2-135M: 3 KV heads to 9, 30 layers, twice each). Here the queries are grouped instead:
query head h = j * g + r uses key head j (the layout ``repeat_kv`` makes).

The key product (it contracts over the head dim d)::

    scores = Reshape(MatMul(Reshape(Q, [B, kvh, -1, d]), K'), [B, H, -1, S])

with K' the export's own chain (the transpose of the last two axes, a scalar scale, Cast) on the
cache itself: the g query heads of KV head j and their s rows are the g*s rows of one product
(``[B, H, s, d]`` is ``[B, kvh, g*s, d]`` row-major), so each KV head's keys are read once. The
value product (it contracts over the cache axis S)::

    out = Reshape(MatMul(Reshape(P, [B, kvh, g, -1, S]), Unsqueeze(cache, [2])), [B, H, -1, d])

the cache as ``[B, kvh, 1, S, d]`` (a view, broadcast over the group, never copied) through the
export's chain (its transposes lifted to rank 5). The Reshapes are views of contiguous data, and
every node downstream of the products sees the same tensor as before. Each output element is the
export's own dot product, with the same operands: over d (at most a few hundred, one block of
ONNX Runtime's GEMM) a row's dot product does not depend on how many rows the product has, and
the value product keeps one row block per group member as the export had (merged into one
product, SmolLM2's values moved in the last bit; kept apart, they do not). Keys merged: at ctx
2048 SmolLM2's key products took 2.75 ms a step against 5.9 ms per group member (measured side by
side, 30 layers, 1 thread), bit for bit equal. A scalar scale on the other operand (SDPA's sqrt of
the softmax scale on the queries) stays right before the product, below the Reshape, where ONNX
Runtime folds it into the product as it did for the export. So the result is the same bits
(SmolLM2-135M, verify of the TLM at ctx 256, every width up to the prefill's 32: max |diff| 0);
with the scale applied apart, above the product's Reshape, SmolLM2's logits moved by 2.9e-4,
past the contract's 1e-4.

Found structurally, on every Expand whose input is ``Unsqueeze(x, [2])`` of a rank-4 x. The
rewrite is exact, and only made, when shape inference (with data propagation) establishes:
x is [B, kvh, S, d] with kvh and d static; the Expand output is [B, kvh, g, S, d] (axis 3 may be
unknown where the cache length is at least 2: the cache is ``ctx_len`` long and ``ctx_len`` >= 2
here, so the Expand cannot broadcast that axis), g >= 2 static; the Reshape output is
[B, g*kvh, ?, d] with the same B (so by element count it is [B, H, S, d]); every tensor from
the Reshape to the product has one consumer, and the product's other operand is [?, H, ?, ?].
Anything else is left as it is, with the reason (``find_groups``).

qaic keeps the repeated form: QEfficient's device graphs repeat the KV heads (its Llama attention,
``eager_attention_forward`` in QEfficient/transformers/models/llama/modeling_llama.py, calls
``repeat_kv`` on keys and values), so the grouped form has no device precedent to cite.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_graphsurgeon as gs

from ..graph_utils import copy_graph, Builder, const_value, producer
from ._context import PassContext, need, graph_pass
from ._shape_trace import same as _same
from ._shape_trace import static_axis, target_dims
from ._static import symbolic_dims

#: ops allowed between the repeated tensor and the product: per head, or a layout change keeping
#: the batch and head axes (checked per node)
_CHAIN_OPS = ("Transpose", "Mul", "Div", "Cast")
_MAX_CHAIN = 4


@dataclass(frozen=True)
class Group:
    """One repeated cache read: ``expand`` (of Unsqueeze(``cache``, [2])) and ``reshape`` make
    the repeated heads, ``chain`` leads to ``matmul`` (input 1)."""
    cache: gs.Tensor
    expand: gs.Node
    reshape: gs.Node
    chain: tuple[gs.Node, ...]
    matmul: gs.Node
    kv_heads: int
    heads: int
    head_dim: int


def expand_dims(expand: gs.Node, c: list, dims: dict) -> list | None:
    """The Expand's output dims over Unsqueeze(x, [2]) of x with dims ``c``: inference's where it
    knows them, else worked out from the traced target (an axis it cannot pin is None)."""
    e = list(dims.get(expand.outputs[0].name) or [None] * 5)
    t = target_dims(expand.inputs[1], dims)
    if len(e) != 5 or (t is not None and len(t) != 5):
        return None
    src = [c[0], c[1], 1, c[2], c[3]]
    for j in range(5):
        if e[j] is not None or t is None or t[j] is None:
            continue
        e[j] = src[j] if (t[j] == 1 or _same(t[j], src[j])) else (t[j] if src[j] == 1 else None)
    return e


def _unsqueeze_axes(node: gs.Node) -> list[int] | None:
    if len(node.inputs) > 1:
        v = const_value(node.inputs[1])
        return None if v is None else [int(x) for x in v.reshape(-1)]
    axes = node.attrs.get("axes")
    return list(axes) if axes is not None else None


def _only_consumer(t: gs.Tensor, outputs: set) -> gs.Node | None:
    return t.outputs[0] if len(t.outputs) == 1 and id(t) not in outputs else None


def _chain_ok(node: gs.Node, t: gs.Tensor) -> bool:
    """Does ``node`` (reading ``t``) act on each (batch, head) slice alone, keeping those axes?"""
    if node.op == "Transpose":
        perm = node.attrs.get("perm")
        return perm is not None and len(perm) == 4 and list(perm[:2]) == [0, 1]
    if node.op == "Cast":
        return True
    other = [x for x in node.inputs if x is not t]
    v = const_value(other[0]) if len(other) == 1 else None
    return v is not None and v.size == 1 and (node.op == "Mul" or node.inputs[0] is t)


def _follow(reshape: gs.Node, outputs: set) -> tuple[tuple[gs.Node, ...], gs.Node] | str:
    """(chain, matmul) from the repeated tensor to the product reading it as input 1, or why not."""
    t, chain = reshape.outputs[0], []
    while True:
        node = _only_consumer(t, outputs)
        if node is None:
            return f"{t.name} has {len(t.outputs)} consumers (or is an output)"
        if node.op == "MatMul":
            return (tuple(chain), node) if node.inputs[1] is t else f"{node.name} reads it as its first operand"
        if node.op not in _CHAIN_OPS or not _chain_ok(node, t) or len(chain) == _MAX_CHAIN:
            return f"{node.name} ({node.op}) between the repeated heads and the product"
        chain.append(node)
        t = node.outputs[0]


def _match(expand: gs.Node, dims: dict, ctx: PassContext, outputs: set) -> Group | str:
    """The group ``expand`` starts, or why it is left alone."""
    unsq = producer(expand.inputs[0])
    if unsq is None or unsq.op != "Unsqueeze" or _unsqueeze_axes(unsq) not in ([2], [-3]):
        return "not an Unsqueeze(x, [2]) repeat"
    cache = unsq.inputs[0]
    c = dims.get(cache.name)
    if c is None or len(c) != 4 or not isinstance(c[1], int) or not isinstance(c[3], int):
        return f"{cache.name}: not [B, kvh, S, d] with static kvh and d ({c})"
    e = expand_dims(expand, c, dims)
    if e is None or len(e) != 5 or not isinstance(e[2], int) or e[2] < 2:
        return f"{expand.outputs[0].name}: the repeat count is not static ({e})"
    kvh, g, d = c[1], e[2], c[3]
    long_cache = _same(e[3], c[2]) or (e[3] is None and ctx.ctx_len is not None and ctx.ctx_len >= 2)
    if not (_same(e[0], c[0]) and e[1] == kvh and e[4] == d and long_cache):
        return f"{expand.outputs[0].name}: not [B, kvh, g, S, d] over {cache.name} ({e} over {c})"
    reshape = _only_consumer(expand.outputs[0], outputs)
    r = dims.get(reshape.outputs[0].name) if reshape is not None and reshape.op == "Reshape" else None
    if r is None or len(r) != 4 or not _same(r[0], c[0]) or r[1] != g * kvh or r[3] != d:
        return f"the repeated heads are not reshaped to [B, {g * kvh}, S, {d}] ({r})"
    found = _follow(reshape, outputs)
    if isinstance(found, str):
        return found
    chain, matmul = found
    a = dims.get(matmul.inputs[0].name)
    if a is None or len(a) != 4 or static_axis(matmul.inputs[0], 1, dims) != g * kvh:
        return f"{matmul.name}: its first operand is not [B, {g * kvh}, s, x] ({a})"
    return Group(cache, expand, reshape, chain, matmul, kvh, g * kvh, d)


def find_groups(graph: gs.Graph, ctx: PassContext) -> tuple[list[Group], list[tuple[str, str]]]:
    """Every repeated cache read the pass rewrites, and (Expand node, reason) for every
    ``Unsqueeze(x, [2])`` Expand it leaves alone."""
    candidates = [n for n in graph.nodes if n.op == "Expand" and producer(n.inputs[0]) is not None
                  and producer(n.inputs[0]).op == "Unsqueeze"]
    if not candidates:
        return [], []
    dims, outputs = symbolic_dims(graph), {id(t) for t in graph.outputs}
    groups, skipped = [], []
    for n in candidates:
        m = _match(n, dims, ctx, outputs)
        (skipped.append((n.name, m)) if isinstance(m, str) else groups.append(m))
    return groups, [(n, why) for n, why in skipped if why != "not an Unsqueeze(x, [2]) repeat"]


def _cache_dims(grp: Group) -> tuple[int, int]:
    """The cache axes (2: S, 3: d) that the product's second operand has as its last two axes,
    through the chain's transposes."""
    perm = [0, 1, 2, 3]
    for node in grp.chain:
        if node.op == "Transpose":
            perm = [perm[int(i)] for i in node.attrs["perm"]]
    return perm[2], perm[3]


def _target(b: Builder, grp: Group, head: list[int], axis: int, hint: str) -> gs.Tensor:
    """``head`` + [the cache's dim ``axis``]: a Reshape target; d is static, S read off the cache."""
    if axis == 3:
        return b.const(np.array([*head, grp.head_dim], np.int64), hint=hint)
    length = b.op("Shape", [grp.cache], attrs={"start": 2, "end": 3}, hint=f"{hint}_cache_len", dtype=np.int64,
                  shape=[1])
    return b.op("Concat", [b.const(np.array(head, np.int64), hint=hint), length], attrs={"axis": 0},
                hint=f"{hint}_target", dtype=np.int64, shape=[len(head) + 1])


def _scaled_operand(mm: gs.Node, outputs: set) -> tuple[gs.Tensor, list[gs.Node]]:
    """(the product's first operand before any scalar Mul/Div that only it reads, those nodes from
    the product up). The grouping Reshape goes above them, so a scale stays right before the
    product, where ONNX Runtime folds it into the product (``FusedMatMul``'s alpha) as it did for
    the export: a scale applied apart rounds differently."""
    t, scales = mm.inputs[0], []
    while len(t.outputs) == 1 and id(t) not in outputs and producer(t) is not None \
            and producer(t).op in ("Mul", "Div"):
        p = producer(t)
        data = [x for x in p.inputs if const_value(x) is None]
        k = [const_value(x) for x in p.inputs if const_value(x) is not None]
        if len(data) != 1 or len(k) != 1 or k[0].size != 1 or (p.op == "Div" and p.inputs[0] is not data[0]):
            break
        scales.append(p)
        t = data[0]
    return t, scales


def _rewrite(b: Builder, grp: Group, outputs: set) -> None:
    """Contracting over the head dim (the key product): the other operand as [B, kvh, g*s, d]
    against the export's chain on the cache itself; otherwise (the value product): the cache as
    Unsqueeze(cache, [2]) ([B, kvh, 1, S, d], a view) through the export's chain (its transposes
    lifted to rank 5), against the other operand as [B, kvh, g, s, x]. Either way each output
    element is the export's own dot product (module doc)."""
    g = grp.heads // grp.kv_heads
    inner, last = _cache_dims(grp)
    merged = inner == 3
    first = grp.chain[0] if grp.chain else grp.matmul
    slot = [i for i, t in enumerate(first.inputs) if t is grp.reshape.outputs[0]][0]
    if merged:
        first.inputs[slot] = grp.cache
        for node in grp.chain:
            node.outputs[0].shape = None  # kvh heads now
    else:
        first.inputs[slot] = b.op("Unsqueeze", [grp.cache, b.const(np.array([2], np.int64), hint="axis2")],
                                  hint="cache_view", dtype=grp.cache.dtype)
        for node in grp.chain:
            if node.op == "Transpose":
                perm = [int(x) for x in node.attrs["perm"]]
                node.attrs["perm"] = [0, 1, 2, perm[2] + 1, perm[3] + 1]
            node.outputs[0].shape = None  # rank 5 now, kvh heads
    mm = grp.matmul
    top, scales = _scaled_operand(mm, outputs)
    head = [0, grp.kv_heads, -1] if merged else [0, grp.kv_heads, g, -1]
    grouped_a = b.op("Reshape", [top, _target(b, grp, head, inner, "kv_groups")],
                     hint="grouped_operand", dtype=top.dtype)
    reader = scales[-1] if scales else mm
    reader.inputs[[i for i, t in enumerate(reader.inputs) if t is top][0]] = grouped_a
    for node in scales:
        node.outputs[0].shape = None  # regrouped now
    out = mm.outputs[0]
    grouped = gs.Variable(b._name("grouped_product") + "_out", dtype=out.dtype)
    mm.outputs[0] = grouped
    b.op("Reshape", [grouped, _target(b, grp, [0, grp.heads, -1], last, "heads")],
         hint="heads_product", outputs=[out])


@graph_pass
def grouped_attention(graph: gs.Graph, ctx: PassContext) -> gs.Graph:
    need("grouped_attention", ctx)
    if not any(n.op == "Expand" for n in graph.nodes):
        return graph
    graph = copy_graph(graph)
    groups, _ = find_groups(graph, ctx)
    if not groups:
        return graph
    b = Builder(graph, "gqa")
    outputs = {id(t) for t in graph.outputs}
    for grp in groups:
        _rewrite(b, grp, outputs)
    graph.cleanup(remove_unused_graph_inputs=False)
    return graph
