"""Check: values computed from the cache's key length reach the model only where the rewrite keeps them.

After the rewrite the cache is ``ctx_len`` slots long whatever the history: a
``Shape`` of a past input reads ``ctx_len - seq_len``, a ``Shape`` of the cache
``ctx_len`` (``retained_kv``). A value an export computes from that length is
right in the rewrite only where it means the same for a ``ctx_len`` long
cache: a shape (a Reshape/Expand/Tile operand: the tensors really are that
long), a mask operand (``position_mask`` replaces it), a query position
(``synth_positions`` feeds it from ``position_ids``), a table sliced to the
first K rows. Qwen-1's "logn attention" is not: it scales the queries by
``logn[K-S:K]``, the rows of the *last* slots, which the rewrite moves to
``ctx_len - S``.

How it is checked (numerically, not by pattern): the ``Shape``/``Size``
nodes whose value changes with the past length are the length sources. Each
tensor computed from them (through any op, except the replaced tensors above)
that does not itself depend on the activations but is read by a node that
does, other than as a shape operand, is evaluated twice (``_probe``: no
weights read) for 3 tokens at positions 7..9: as the export computes it (7
cached) and as the rewrite does (a cache of 24 slots, and one as long as the
largest constant table in its cone, the positions still 7..9). Along an axis
that is the key length in both, the rewrite's first slots are compared. The
two must be equal, except for a bias added to a layer's attention scores
(MPT-style ALiBi, ``slope * (c - (K-1))``): there a shift constant along the
keys is what the softmax ignores. Anything else is refused in one line naming
the layer, the tensor, the node that reads it and both values.

Besides, an activation with an axis as long as the cache may not be reduced over
it outside the attention's own MatMul(probs, V) (``check_key_axis_reductions``,
on the shapes shape inference finds).
"""
from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from ..contract import MASK_VALUE
from ..errors import UnsupportedPatternError
from ..graph_utils import SHAPE_ONLY_OPS, producer, value_dependence
from ._probe import Probe, ProbeError, probe_inputs
from .attention import is_max_shift

PAST, SEQ = 7, 3
#: the cache length of the rewrite's first probe; a second one is as long as the largest table read
CTX = 24
MAX_CTX = 1 << 17
#: (op, input index) that read a tensor for its shape only: the rewrite's tensors have that shape
SHAPE_OPERANDS = {("Reshape", 1), ("Expand", 1), ("Tile", 1), ("ConstantOfShape", 0)}
#: ops on the scores path after which a per-row shift of the scores is still a per-row shift
_SHIFT_KEEPING = {"Add", "Sub", "Cast", "Identity"}


def _probes(graph: gs.Graph, roles: dict, pasts: list[gs.Tensor], past: int, positions: int) -> Probe:
    """A probe of ``SEQ`` tokens after ``past`` cached ones whose positions start at ``positions``."""
    dims, feeds = probe_inputs(graph, past, SEQ, roles, pasts)
    pos = roles.get("position_ids")
    if pos is not None:
        feeds[pos.name] = (feeds[pos.name] - past + positions).astype(feeds[pos.name].dtype)
    return Probe(graph, dims, feeds, elementwise=True)   # what it evaluates reads no activation


def rewrite_mask(kind: str, window: int | None, rank: int, dtype, ctx: int) -> np.ndarray:
    """The mask ``position_mask`` puts in place of an operand of ``kind``, for the probe's
    queries at positions PAST.. over ``ctx`` slots."""
    vis = visible(ctx, window)
    m = np.where(vis, 0.0, MASK_VALUE) if kind == "additive" else (vis if kind == "visible" else ~vis)
    return m.astype(dtype).reshape((1,) * max(0, rank - 2) + m.shape)


def visible(keys: int, window: int | None) -> np.ndarray:
    """[SEQ, keys]: the slots the probe's queries (positions PAST..) see."""
    p, c = np.arange(PAST, PAST + SEQ)[:, None], np.arange(keys)[None]
    return (c <= p) & (c > p - window) if window else c <= p


def _replace(tensors: dict, name: str, value: np.ndarray) -> None:
    """Every reader of tensor ``name`` reads the constant ``value`` instead."""
    old = tensors[name]
    const = gs.Constant(name + "__rewrite", value)
    for n in list(old.outputs):
        for j, x in enumerate(n.inputs):
            if x is old:
                n.inputs[j] = const


def _rewrite_view(graph: gs.Graph, sources, query: list[np.ndarray], layers, windows, export: Probe,
                  ctx: int) -> gs.Graph:
    """A copy of ``graph`` computing what the rewrite feeds in place of the export's query
    positions (``synth_positions``: the export's) and mask operands (``position_mask``)."""
    g = graph.copy()
    tensors = g.tensors()
    for q, v in zip(sources.query, query):
        _replace(tensors, q.name, np.asarray(v))
    done = set()
    for a, w in zip(layers, windows):
        for n, j, kind in a.sites:
            x = n.inputs[j]
            if x.name in done:
                continue
            done.add(x.name)
            elem, shape = export.dtype(x.name), export.shapes.get(x.name)
            dtype = (onnx.helper.tensor_dtype_to_np_dtype(elem) if elem else
                     np.float32 if kind == "additive" else np.bool_)
            _replace(tensors, x.name, rewrite_mask(kind, w, len(shape) if shape is not None else 4, dtype, ctx))
    return g


def _shape_value(n: gs.Node, shapes: dict) -> list | None:
    shape = shapes.get(n.inputs[0].name)
    if shape is None or None in shape:
        return None
    if n.op == "Size":
        return [int(np.prod(shape))]
    start, end = int(n.attrs.get("start", 0)), n.attrs.get("end")
    return shape[start:None if end is None else int(end)]


def length_sources(nodes: list[gs.Node], export: Probe, rewrite: Probe) -> tuple[list, list]:
    """(Shape/Size nodes whose static value differs between the two probes, those whose input's
    shape inference left unknown)."""
    found, unknown = [], []
    for n in nodes:
        if n.op not in SHAPE_ONLY_OPS:
            continue
        a, b = _shape_value(n, export.shapes), _shape_value(n, rewrite.shapes)
        if a is None or b is None:
            unknown.append(n)
        elif a != b:
            found.append(n)
    return found, unknown


def _changing(unknown: list[gs.Node], export: Probe, rewrite: Probe) -> list[gs.Node]:
    """Of ``unknown`` Shape/Size nodes, those whose evaluated value differs between the probes
    (or that cannot be evaluated: the check then evaluates what they feed)."""
    outs = [n.outputs[0] for n in unknown]
    return [n for n, a, b in zip(unknown, export.values_each(outs), rewrite.values_each(outs))
            if not isinstance(a, np.ndarray) or not isinstance(b, np.ndarray) or not np.array_equal(a, b)]


def _cone(tensors: list[gs.Tensor]) -> set[int]:
    out, stack = set(), list(tensors)
    while stack:
        t = stack.pop()
        if id(t) not in out:
            out.add(id(t))
            n = producer(t)
            stack += list(n.inputs) if n is not None else []
    return out


def _frontier(nodes: list[gs.Node], dep: set[int], active: set[int]) -> dict[int, tuple]:
    """id -> (tensor, [(node, input index)]): tensors computed from the key length, not from the
    activations, read as a value by a node whose output depends on the activations."""
    out: dict[int, tuple] = {}
    for n in nodes:
        if n.op in SHAPE_ONLY_OPS or not any(id(o) in active for o in n.outputs):
            continue
        for j, x in enumerate(n.inputs):
            if id(x) in dep and id(x) not in active and (n.op, j) not in SHAPE_OPERANDS:
                out.setdefault(id(x), (x, []))[1].append((n, j))
    return out


def _last_dim_one(t: gs.Tensor, shapes: dict) -> bool:
    shape = shapes.get(t.name)
    return shape is not None and (len(shape) == 0 or shape[-1] == 1)


def _keeps_shift(n: gs.Node, j: int, mask_nodes: set[int], shapes: dict) -> bool:
    """A per-row shift of input ``j`` (the scores) of ``n`` is a per-row shift of its output."""
    if n.op in _SHIFT_KEEPING or (n.op == "Where" and id(n) in mask_nodes and j > 0):
        return True
    if n.op in ("Mul", "Div") and len(n.inputs) == 2:
        return _last_dim_one(n.inputs[1 - j], shapes) and (n.op == "Mul" or j == 0)
    if n.op == "Reshape":
        a, b = shapes.get(n.inputs[0].name), shapes.get(n.outputs[0].name)
        return bool(a) and bool(b) and a[-1] == b[-1] and a[-1] is not None
    return False


def shift_sites(layers, active: set[int], shapes: dict) -> dict[tuple[int, int], int]:
    """(node id, input index) -> layer: the additive operands of each layer's scores (from the QK
    MatMul to its Softmax) where a shift constant along the keys leaves the Softmax unchanged."""
    mask_nodes = {id(n) for a in layers for n, _, _ in a.sites}
    out = {}
    for i, a in enumerate(layers):
        t, keeps = a.softmax.inputs[0], True
        for _ in range(32):
            n = producer(t)
            if n is None or n.op == "MatMul":
                break
            chain = [j for j, x in enumerate(n.inputs) if id(x) in active]
            if len(chain) == 2 and n.op == "Sub" and getattr(producer(n.inputs[1]), "op", None) == "ReduceMax":
                chain = [0]
            if len(chain) != 1:
                break
            if keeps and n.op in ("Add", "Sub"):
                out.update({(id(n), j): i for j in range(len(n.inputs))
                            if j != chain[0] and (n.op == "Add" or j == 1)})
            keeps = keeps and _keeps_shift(n, chain[0], mask_nodes, shapes)
            t = n.inputs[chain[0]]
    return out


def _cut(export: np.ndarray, rewrite: np.ndarray, ctx: int) -> tuple[np.ndarray, list[int]] | None:
    """The rewrite's value restricted to the export's slots, and the axes cut; None: shapes differ."""
    if export.ndim != rewrite.ndim:
        return None
    cut = []
    for ax, (e, r) in enumerate(zip(export.shape, rewrite.shape)):
        if e == r:
            continue
        if (e, r) not in ((PAST + SEQ, ctx), (PAST, ctx - SEQ)):
            return None
        rewrite = np.take(rewrite, np.arange(e), axis=ax)
        cut.append(ax)
    return rewrite, cut


def agrees(export: np.ndarray, rewrite: np.ndarray, ctx: int, seen: np.ndarray | None) -> bool:
    """The rewrite computes the export's value. ``seen`` (a bias on the scores): only up to a
    shift constant along the keys (the last axis), and only on the slots a query sees
    (``[SEQ, PAST+SEQ]``)."""
    found = _cut(np.asarray(export), np.asarray(rewrite), ctx)
    if found is None:
        return False
    r, cut = found
    e = np.asarray(export).astype(np.float64)
    r = r.astype(np.float64)
    diff = np.where((e == r) | (np.isnan(e) & np.isnan(r)), 0.0, r - e)
    if seen is not None and e.ndim and cut in ([], [e.ndim - 1]):
        if cut and e.ndim >= 2 and e.shape[-2] in (1, SEQ):
            keep = np.broadcast_to(seen if e.shape[-2] == SEQ else seen[-1:], e.shape)
            diff, e = np.where(keep, diff, np.nan), np.where(keep, e, 0.0)
        with np.errstate(invalid="ignore"):
            diff = diff - np.nanmin(diff, axis=-1, keepdims=True)
        diff = np.nan_to_num(diff, nan=0.0, posinf=np.inf, neginf=-np.inf)
    if not np.all(np.isfinite(diff)):
        return False
    scale = np.abs(e[np.isfinite(e)])
    tol = 1e-6 * max(1.0, float(scale.max(initial=0.0)))
    return bool(np.all(np.abs(diff) <= tol))


def _largest_table(tensors: list[gs.Tensor]) -> int:
    """The largest dim of a constant in the cone of ``tensors`` (no data read)."""
    best, seen, stack = 0, set(), list(tensors)
    while stack:
        t = stack.pop()
        if id(t) in seen:
            continue
        seen.add(id(t))
        n = producer(t)
        shape = t.shape if isinstance(t, gs.Constant) else None
        if n is not None and n.op == "Constant" and isinstance(n.attrs.get("value"), gs.Constant):
            shape = n.attrs["value"].shape
        if shape:
            best = max(best, *(int(d) for d in shape))
        if n is not None and n.op not in SHAPE_ONLY_OPS:   # a Shape reads no table's values
            stack += list(n.inputs)
    return best


def _show(v) -> str:
    v = np.asarray(v)
    flat = np.round(v.astype(np.float64).reshape(-1), 4).tolist() if v.dtype.kind in "biuf" else []
    return f"{list(v.shape)} {flat[:4]}{' ...' if len(flat) > 4 else ''}"


def _layer_of(graph: gs.Graph, nodes: list[gs.Node], node: gs.Node, layers) -> str:
    dep = value_dependence(graph, list(node.outputs), nodes)
    hit = [i for i, a in enumerate(layers) if id(a.softmax.outputs[0]) in dep]
    return f"layer {hit[0]}" if hit else "after the last attention layer"


def _refuse(graph, nodes, layers, t: gs.Tensor, uses, what: str) -> None:
    n = uses[0][0]
    raise UnsupportedPatternError(
        f"{_layer_of(graph, nodes, n, layers)}: {t.name!r} (read by {n.op} {n.name!r}) is computed from the "
        f"cache's key length, which the rewrite's cache fixes at ctx_len: {what}; cannot rewrite it")


def _context(graph, nodes, inputs, concats, sources, layers, windows):
    """(export probe, rewrite probe maker, first rewrite probe, active tensors, the frontier)."""
    roles = {"input_ids": inputs.input_ids, "position_ids": inputs.position_ids,
             "attention_mask": inputs.attention_mask}
    pasts = [n.inputs[0] for n in concats]
    export = _probes(graph, roles, pasts, PAST, PAST)
    query = export.values(list(sources.query)) if sources.query else []

    def rewrite(ctx: int) -> Probe:
        view = _rewrite_view(graph, sources, query, layers, windows, export, ctx)
        return _probes(view, roles, pasts, ctx - SEQ, PAST)

    first = rewrite(CTX)
    replaced = list(sources.query) + list(sources.key) + [n.inputs[j] for a in layers for n, j, _ in a.sites]
    floats = [t for t in graph.inputs if t is not inputs.attention_mask and t is not inputs.position_ids]
    active = value_dependence(graph, floats, nodes)

    def frontier(lengths: list[gs.Node]) -> list[tuple]:
        dep = value_dependence(graph, [n.outputs[0] for n in lengths], nodes, stop=replaced)
        return list(_frontier(nodes, dep, active).values())

    found, unknown = length_sources(nodes, export, first)
    reach = frontier(found + unknown)
    if unknown and reach:   # evaluate only the unknown ones that may matter
        cone = _cone([t for t, _ in reach])
        reach = frontier(found + _changing([n for n in unknown if id(n.outputs[0]) in cone], export, first))
    return export, rewrite, first, active, reach


def _seen(uses, shifts: dict, windows) -> np.ndarray | None:
    """The slots a query sees where every use of a tensor is a bias on scores (None: not all are)."""
    layers = [shifts.get((id(n), j), -1) for n, j in uses]
    if any(i < 0 for i in layers):
        return None
    ws = [windows[i] for i in layers]
    return visible(PAST + SEQ, None if None in ws else max(ws))


def _varies(t: gs.Tensor, export: Probe, rewrite: Probe) -> bool | None:
    """``t`` has an axis as long as the cache (its length differs between the probes); None: unknown."""
    a, b = export.shapes.get(t.name), rewrite.shapes.get(t.name)
    if a is None or b is None or len(a) != len(b):
        return None
    if any(x != y and x is not None and y is not None for x, y in zip(a, b)):
        return True
    return None if None in a or None in b else False


def _max_shift(n: gs.Node) -> bool:
    """``n`` is the ReduceMax of ``Sub(x, ReduceMax(x))`` (a stable softmax)."""
    return n.op == "ReduceMax" and any(is_max_shift(c) and c.inputs[1] is n.outputs[0]
                                       for c in n.outputs[0].outputs)


def check_key_axis_reductions(graph, nodes: list[gs.Node], layers, active: set[int], export: Probe,
                              rewrite: Probe) -> None:
    """A node that reads an activation with an axis as long as the cache and makes no such axis
    (a sum or mean over the keys, a Gather of one slot) reads the retained cache's stale slots
    in the rewrite, or counts them: refused, except the attention's own (its MatMul(probs, V),
    the ReduceMax of a stable softmax) and Shape/Size."""
    own = {id(a.pv) for a in layers if a.pv is not None}
    for n in nodes:
        if n.op in SHAPE_ONLY_OPS or id(n) in own or _max_shift(n):
            continue
        long = [x for x in n.inputs if id(x) in active and _varies(x, export, rewrite)]
        if long and all(_varies(o, export, rewrite) is False for o in n.outputs):
            x = long[0]
            raise UnsupportedPatternError(
                f"{_layer_of(graph, nodes, n, layers)}: {n.op} node {n.name!r} reduces {x.name!r} (shape "
                f"{export.shapes[x.name]} for {SEQ} tokens after {PAST} cached) over an axis as long as the cache "
                f"(its past or key length), which the rewrite fixes at ctx_len (stale slots included); cannot "
                f"rewrite it")


def check_key_length_uses(graph: gs.Graph, nodes: list[gs.Node], inputs, concats: list[gs.Node], sources,
                          layers, windows: list[int | None]) -> None:
    """``inputs``: the IntegerInputs; ``sources``: the PositionSources; ``layers``: the Attention
    layers and ``windows`` theirs. Refuses a value computed from the key length that the rewrite
    would change."""
    try:
        export, rewrite, first, active, frontier = _context(graph, nodes, inputs, concats, sources, layers,
                                                            windows)
    except ProbeError as e:
        raise UnsupportedPatternError(f"cannot trace what the cache's key length feeds: {e}") from None
    check_key_axis_reductions(graph, nodes, layers, active, export, first)
    if not frontier:
        return
    shifts = shift_sites(layers, active, export.shapes)
    tensors = [t for t, _ in frontier]
    want = export.values_each(tensors)
    tables = [min(_largest_table([t]), MAX_CTX) for t in tensors]
    for ctx in sorted({CTX} | {n for n in tables if n >= CTX + SEQ}):
        try:
            probe = first if ctx == CTX else rewrite(ctx)
        except ProbeError as e:
            raise UnsupportedPatternError(f"cannot trace what the cache's key length feeds: {e}") from None
        mine = [i for i, n in enumerate(tables) if ctx in (CTX, n)]   # each against its own table's length
        for i, r in zip(mine, probe.values_each([tensors[i] for i in mine])):
            (t, uses), e = frontier[i], want[i]
            if not isinstance(e, np.ndarray) or not isinstance(r, np.ndarray):
                why = e if not isinstance(e, np.ndarray) else r
                _refuse(graph, nodes, layers, t, uses,
                        f"it cannot be evaluated to check that this keeps it ({why})")
            if not agrees(e, r, ctx, _seen(uses, shifts, windows)):
                _refuse(graph, nodes, layers, t, uses,
                        f"it is {_show(e)} for {SEQ} tokens after {PAST} cached, but {_show(r)} for them with a "
                        f"{ctx}-slot cache")
