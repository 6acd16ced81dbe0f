"""The sections of a diff report: interface, metadata, op counts, initializers, nodes."""
from __future__ import annotations

import hashlib
from collections import Counter, defaultdict, deque
from itertools import zip_longest
from typing import Any

import onnx

from .index import GraphIndex, attr_display, attr_value_digest, dtype_name, op_key
from .matching import src_a, src_b

GLOBAL = "global"

SECTIONS = ("interface", "metadata", "op_counts", "nodes", "initializers")


def is_empty(sec) -> bool:
    """True when a section (or a nested part of one) lists nothing."""
    if isinstance(sec, list):
        return not sec
    if isinstance(sec, dict):
        return all(is_empty(v) for v in sec.values())
    return False


# --------------------------------------------------------------------------- interface


def io_section(order_a, desc_a, order_b, desc_b, renames: dict[str, str], sources=None) -> dict:
    """Graph inputs (or outputs) added, removed, renamed and changed; ``desc``: name -> (dtype, shape);
    ``sources``: outputs kept in both that another node (input, initializer) produces now: A name ->
    [before, after] (``output_sources``)."""
    sources = sources or {}
    sec = {"added": [], "removed": [], "renamed": [], "changed": []}
    set_b = set(order_b)
    renamed_to = set(renames.values())
    moved = _moved(order_a, order_b, renames)
    for name in order_a:
        if name in set_b:
            (ta, sa), (tb, sb) = desc_a[name], desc_b[name]
            e: dict[str, Any] = {"name": name}
            if ta != tb:
                e["dtype"] = [ta, tb]
            if sa != sb:
                e["shape"] = [sa, sb]
            if name in moved:
                e["position"] = moved[name]
            if name in sources:
                e["source"] = sources[name]
            if len(e) > 1:
                sec["changed"].append(e)
        elif name in renames:
            b = renames[name]
            (ta, sa), (tb, sb) = desc_a[name], desc_b[b]
            e = {"from": name, "to": b}
            if ta != tb:
                e["dtype"] = [ta, tb]
            if sa != sb:
                e["shape"] = [sa, sb]
            if name in moved:
                e["position"] = moved[name]
            if name in sources:
                e["source"] = sources[name]
            sec["renamed"].append(e)
        else:
            t, s = desc_a[name]
            sec["removed"].append({"name": name, "dtype": t, "shape": s})
    set_a = set(order_a)
    for name in order_b:
        if name not in set_a and name not in renamed_to:
            t, s = desc_b[name]
            sec["added"].append({"name": name, "dtype": t, "shape": s})
    return sec


def _source_label(g: GraphIndex, x: str) -> str:
    if x in g.producer:
        return f"{_node_label(g.nodes[g.producer[x][0]])} ({op_key(g.nodes[g.producer[x][0]])})"
    if x in g.inits:
        return f"initializer {x}"
    return f"input {x}" if x in g.inputs else x


def output_sources(ga: GraphIndex, gb: GraphIndex, out_map, match, in_map, init_map) -> dict[str, list[str]]:
    """Graph outputs kept in both (by name or renamed) whose tensor comes from somewhere else now:
    A name -> [where from in A, in B]. An output of a removed node that an added node produces now is
    left out (the nodes section shows both)."""
    out = {}
    names_b = set(gb.output_order)
    for a in ga.output_order:
        b = a if a in names_b else out_map.get(a)
        if b is None:
            continue
        ra, rb = src_a(ga, a, match, in_map, init_map), src_b(gb, b)
        if ra != rb and not (ra[0] == "na" and rb[0] == "n" and rb[1] not in set(match.values())):
            out[a] = [_source_label(ga, a), _source_label(gb, b)]
    return out


def _moved(order_a, order_b, renames: dict[str, str]) -> dict[str, list[int]]:
    """Inputs (outputs) kept in both, by name or renamed, whose order among the kept ones changed:
    A name -> [index in A, index in B]. Adding or removing others moves nothing."""
    set_b = set(order_b)
    kept = [(a, a if a in set_b else renames[a]) for a in order_a if a in set_b or a in renames]
    pos_a = {a: i for i, a in enumerate(order_a)}
    pos_b = {b: i for i, b in enumerate(order_b)}
    by_b = sorted(kept, key=lambda ab: pos_b[ab[1]])
    return {a: [pos_a[a], pos_b[b]] for (a, b), other in zip(kept, by_b) if (a, b) != other}


# --------------------------------------------------------------------------- metadata


def _opsets(m: onnx.ModelProto) -> dict[str, int]:
    return {(o.domain or "ai.onnx"): int(o.version) for o in m.opset_import}


def _functions(m: onnx.ModelProto) -> dict[str, str]:
    """Each local function's digest, its nodes taken as a set: a body whose nodes were only
    reordered (edges are by name) computes the same and is not reported as changed."""
    out = {}
    for f in m.functions:
        key = f"{f.domain}::{f.name}" + (f"::{f.overload}" if getattr(f, "overload", "") else "")
        shell = onnx.FunctionProto()
        shell.CopyFrom(f)
        del shell.node[:]
        h = hashlib.sha256(shell.SerializeToString(deterministic=True))
        for b in sorted(n.SerializeToString(deterministic=True) for n in f.node):
            h.update(len(b).to_bytes(8, "little") + b)
        out[key] = "sha256:" + h.hexdigest()
    return out


def metadata_section(ma: onnx.ModelProto, mb: onnx.ModelProto) -> list[dict]:
    """IR version, opsets, producer, metadata properties and local functions that differ."""
    out: list[dict] = []

    def cmp(field, va, vb):
        if va != vb:
            out.append({"field": field, "before": va, "after": vb})

    cmp("ir_version", int(ma.ir_version), int(mb.ir_version))
    oa, ob = _opsets(ma), _opsets(mb)
    for d in sorted(set(oa) | set(ob)):
        cmp(f"opset {d}", oa.get(d), ob.get(d))
    for f in ("producer_name", "producer_version", "domain"):
        cmp(f, getattr(ma, f) or None, getattr(mb, f) or None)
    cmp("model_version", int(ma.model_version) or None, int(mb.model_version) or None)
    pa = {p.key: p.value for p in ma.metadata_props}
    pb = {p.key: p.value for p in mb.metadata_props}
    for k in sorted(set(pa) | set(pb)):
        cmp(f"metadata {k}", pa.get(k), pb.get(k))
    ga_props = {p.key: p.value for p in ma.graph.metadata_props}   # IR 10: the graph's own
    gb_props = {p.key: p.value for p in mb.graph.metadata_props}
    for k in sorted(set(ga_props) | set(gb_props)):
        cmp(f"graph metadata {k}", ga_props.get(k), gb_props.get(k))
    fa, fb = _functions(ma), _functions(mb)
    for k in sorted(set(fa) | set(fb)):
        cmp(f"function {k}", fa.get(k), fb.get(k))
    return out


def op_counts_section(ga: GraphIndex, gb: GraphIndex) -> list[dict]:
    """Op types whose count changed."""
    ca = Counter(op_key(n) for n in ga.nodes)
    cb = Counter(op_key(n) for n in gb.nodes)
    return [{"op": op, "before": ca.get(op, 0), "after": cb.get(op, 0)}
            for op in sorted(set(ca) | set(cb)) if ca.get(op, 0) != cb.get(op, 0)]


# --------------------------------------------------------------------------- initializers


def _listing(e: dict, a: bool, b: bool) -> dict:
    """``e`` with ``graph_input`` [A, B] when the initializer's listing in graph.input changed."""
    if a != b:
        e["graph_input"] = [a, b]
    return e


def _entry(name: str, t, g: GraphIndex) -> dict:
    """An added or removed initializer; ``graph_input``: also listed in graph.input (only when it is)."""
    e = {"name": name, "dtype": dtype_name(t.data_type), "shape": list(t.dims), "sha256": g.hasher.digest(t, g.base_dir)}
    if name in g.listed:
        e["graph_input"] = True
    return e


def init_section(ga: GraphIndex, gb: GraphIndex) -> tuple[dict, dict[str, str]]:
    """Initializers added, removed, renamed (same content) and changed (content, or its listing in
    graph.input: ``graph_input`` [A, B]); and the renames A -> B."""
    H = ga.hasher
    sec = {"added": [], "removed": [], "renamed": [], "changed": []}
    for name in sorted(set(ga.inits) & set(gb.inits)):
        ta, tb = ga.inits[name], gb.inits[name]
        la, lb = name in ga.listed, name in gb.listed
        if la == lb and H.equal(ta, ga.base_dir, tb, gb.base_dir):
            continue
        e: dict[str, Any] = {"name": name}
        if ta.data_type != tb.data_type:
            e["dtype"] = [dtype_name(ta.data_type), dtype_name(tb.data_type)]
        if list(ta.dims) != list(tb.dims):
            e["shape"] = [list(ta.dims), list(tb.dims)]
        e["sha256"] = [H.digest(ta, ga.base_dir), H.digest(tb, gb.base_dir)]
        sec["changed"].append(_listing(e, la, lb))

    def key(t, g):
        return (t.data_type, tuple(t.dims), H.digest(t, g.base_dir))

    only_a = sorted(set(ga.inits) - set(gb.inits))
    only_b = sorted(set(gb.inits) - set(ga.inits))
    pool: dict[tuple, deque] = defaultdict(deque)
    for name in only_b:
        pool[key(gb.inits[name], gb)].append(name)
    renames: dict[str, str] = {}
    for name in only_a:
        q = pool.get(key(ga.inits[name], ga))
        if q:
            renames[name] = q.popleft()
    for name in only_a:
        if name in renames:
            to = renames[name]
            sec["renamed"].append(_listing({"from": name, "to": to}, name in ga.listed, to in gb.listed))
        else:
            sec["removed"].append(_entry(name, ga.inits[name], ga))
    taken = set(renames.values())
    for name in only_b:
        if name not in taken:
            sec["added"].append(_entry(name, gb.inits[name], gb))
    return sec, renames


# --------------------------------------------------------------------------- nodes


def _group_key(layer):
    return (-1, 0) if layer is None else (0, layer)


def _node_label(n: onnx.NodeProto) -> str:
    return n.name if n.name else "(-> " + ", ".join(n.output) + ")"


def _origin(g: GraphIndex, x: str) -> str:
    if x in g.producer:
        return _node_label(g.nodes[g.producer[x][0]])
    if x in g.inits:
        return "initializer"
    if x in g.inputs:
        return "input"
    return "?"


def _producer_state(g: GraphIndex, x: str, matched, unmatched_word: str) -> str:
    """The op of the node of ``g`` producing ``x``, after ``unmatched_word`` ("removed" or
    "added") when that node is not in ``matched``."""
    i = g.producer[x][0]
    return ("" if i in matched else unmatched_word + " ") + op_key(g.nodes[i])


def _rewired_inputs(ga: GraphIndex, gb: GraphIndex, i: int, j: int, match, in_map, init_map) -> list[dict]:
    """Input slots of matched nodes A[i] ~ B[j] that are fed from somewhere else now."""
    na, nb = ga.nodes[i], gb.nodes[j]
    diffs = []
    for s in range(max(len(na.input), len(nb.input))):
        xa = na.input[s] if s < len(na.input) else None
        xb = nb.input[s] if s < len(nb.input) else None
        ra = src_a(ga, xa, match, in_map, init_map) if xa is not None else None
        rb = src_b(gb, xb) if xb is not None else None
        if ra != rb:
            diffs.append(_slot_entry(ga, gb, s, xa, xb, match))
    return diffs


def _slot_entry(ga: GraphIndex, gb: GraphIndex, s: int, xa, xb, match) -> dict:
    """A rewired input slot: the tensor before and after, and where from when the name is the same."""
    e = {"slot": s, "before": xa, "after": xb}
    if xa is not None and xb is not None and xa == xb:
        e["from_before"] = _origin(ga, xa) if xa else None
        e["from_after"] = _origin(gb, xb) if xb else None
        if e["from_before"] == e["from_after"] and xa in ga.producer and xb in gb.producer:
            # the same name, another node (a removed one replaced by an added one): say which
            e["from_before"] += f" ({_producer_state(ga, xa, match, 'removed')})"
            e["from_after"] += f" ({_producer_state(gb, xb, set(match.values()), 'added')})"
    return e


def _outer_rewired(ga: GraphIndex, gb: GraphIndex, i: int, j: int, match, in_map, init_map) -> list[dict]:
    """Tensors that the subgraphs of matched nodes A[i] ~ B[j] read from the graph (outer scope) and
    that come from somewhere else now; only when the subgraphs are the same otherwise (a changed
    subgraph is a changed attribute). Slots count the tensors each reads, in order of first use."""
    if not (ga.outer[i] or gb.outer[j]) or ga.attr_digest(i) != gb.attr_digest(j):
        return []

    def ra(x):
        return repr(src_a(ga, x, match, in_map, init_map))

    def rb(x):
        return repr(src_b(gb, x))

    if ga.outer_digest(i, ra) == gb.outer_digest(j, rb):
        return []
    oa, ob = ga.outer[i], gb.outer[j]
    common = [x for x in oa if x in set(ob)]
    pairs = [(x, x) for x in common if ra(x) != rb(x)] or [(x, x) for x in common]
    pairs += list(zip_longest([x for x in oa if x not in set(ob)], [x for x in ob if x not in set(oa)]))
    out = []
    for xa, xb in pairs:
        s = ob.index(xb) if xb is not None else oa.index(xa)
        out.append({**_slot_entry(ga, gb, s, xa, xb, match), "outer_scope": True})
    return out


def _changed_attributes(ga: GraphIndex, gb: GraphIndex, i: int, j: int) -> list[dict]:
    """Attributes (and the output count) that differ between matched nodes A[i] ~ B[j]."""
    na, nb = ga.nodes[i], gb.nodes[j]
    if ga.attr_digest(i) == gb.attr_digest(j) and len(na.output) == len(nb.output):
        return []
    aa = {a.name: a for a in na.attribute}
    ab = {a.name: a for a in nb.attribute}
    ch = []
    for an in sorted(set(aa) | set(ab)):
        da, db = attr_display(aa.get(an), ga), attr_display(ab.get(an), gb)
        if an not in aa or an not in ab or attr_value_digest(aa[an], ga) != attr_value_digest(ab[an], gb):
            ch.append({"name": an, "before": da, "after": db})
    if na.overload != nb.overload:
        ch.append({"name": "(overload)", "before": na.overload or None, "after": nb.overload or None})
    if len(na.output) != len(nb.output):
        ch.append({"name": "(outputs)", "before": str(len(na.output)), "after": str(len(nb.output))})
    return ch


def nodes_section(ga: GraphIndex, gb: GraphIndex, match, in_map, init_map) -> list[dict]:
    """Nodes added, removed, rewired and changed, grouped by layer (global first)."""
    rev = {j: i for i, j in match.items()}
    groups: dict[Any, dict] = {}

    def group(layer):
        if layer not in groups:
            groups[layer] = {"group": GLOBAL if layer is None else f"layer {layer}", "layer": layer,
                             "added": [], "removed": [], "rewired": [], "changed": []}
        return groups[layer]

    for i in ga.order:
        if i not in match:
            n = ga.nodes[i]
            group(ga.layers[i])["removed"].append(
                {"name": n.name, "op": op_key(n), "inputs": list(n.input), "outputs": list(n.output)})
    for j in gb.order:
        if j not in rev:
            n = gb.nodes[j]
            group(gb.layers[j])["added"].append(
                {"name": n.name, "op": op_key(n), "inputs": list(n.input), "outputs": list(n.output)})
            continue
        i = rev[j]
        na, nb = ga.nodes[i], gb.nodes[j]
        layer = gb.layers[j] if gb.layers[j] is not None else ga.layers[i]
        base = {"name": nb.name, "op": op_key(nb)}
        if na.name != nb.name:
            base["name_before"] = na.name
        diffs = _rewired_inputs(ga, gb, i, j, match, in_map, init_map) + \
            _outer_rewired(ga, gb, i, j, match, in_map, init_map)
        if diffs:
            group(layer)["rewired"].append({**base, "inputs": diffs})
        ch = _changed_attributes(ga, gb, i, j)
        if ch:
            group(layer)["changed"].append({**base, "attributes": ch})
    return [groups[k] for k in sorted(groups, key=_group_key)]
