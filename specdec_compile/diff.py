"""``specdec-compile diff``: a graph-aware diff of two ONNX models.

    specdec-compile diff A.onnx B.onnx [--json] [--color auto|always|never]
    specdec-compile diff --passes ORIGINAL.onnx --role tlm [--target qaic|ort] [--k K] [--json]

Exit status like ``diff(1)``: 0 same, 1 different, 2 error.

A report has five sections, each empty when nothing changed:

* ``interface``: graph inputs and outputs added, removed, renamed, or changed
  in dtype or shape (dim names included);
* ``metadata``: IR version, opsets, producer, metadata properties, local functions;
* ``op_counts``: op types whose count changed, before and after;
* ``nodes``: nodes added, removed, rewired (an input now comes from elsewhere)
  and changed (attributes), grouped by transformer layer. Nodes are matched by
  name first, then by topology (a structural hash of what feeds them and what
  they feed), so a renamed copy of the same structure reports nothing;
* ``initializers``: added, removed, renamed (same content) or changed, by
  name, dtype, shape and sha256 of the content. External data is streamed
  from its file in chunks (offset/length), never loaded whole; two tensors
  that point at the same bytes of the same file (hard links included) are
  equal without being read.

Library API:

    diff_models(a, b, *, a_dir=None, b_dir=None, a_label="a", b_label="b") -> dict
    diff_files(path_a, path_b) -> dict
    explain(snapshots, *, base_dir=None) -> dict      # [("original", m0), ("pass", m1), ...]
    render_text(report) -> str                         # stable plain text (golden tests)
    render_json(report) -> str                         # stable key order
    print_report(report, file=None, color=None)        # rich colours on a terminal
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import sys
from collections import Counter, defaultdict, deque
from pathlib import Path
from typing import Any, Iterable

import onnx
from onnx import AttributeProto, TensorProto

from .errors import SpecdecError

CHUNK_SIZE = 1 << 20  # bytes read at a time from an external data file

GLOBAL = "global"

_LAYER_PATTERNS = [
    re.compile(r"(?:^|[/._:\s\-])layers?[._/](\d+)(?=$|[/._:\s\-])"),
    re.compile(r"(?:^|[/._])L(\d+)(?=$|[/._])"),
    re.compile(r"(?:^|[/.])(?:h|blocks?|decoder_layers?)\.(\d+)(?=$|[/.])"),
]


# --------------------------------------------------------------------------- helpers


def layer_of_name(name: str) -> int | None:
    """The transformer layer index a node or value name refers to, or None."""
    if not name:
        return None
    for pat in _LAYER_PATTERNS:
        m = pat.search(name)
        if m:
            return int(m.group(1))
    return None


def node_layer(node: onnx.NodeProto) -> int | None:
    """Layer of a node: from its name, its exporter scope metadata, then its outputs."""
    lay = layer_of_name(node.name)
    if lay is not None:
        return lay
    for p in node.metadata_props:
        if p.key in ("pkg.torch.onnx.name_scopes", "namespace"):
            lay = layer_of_name(p.value)
            if lay is not None:
                return lay
    for o in node.output:
        lay = layer_of_name(o)
        if lay is not None:
            return lay
    return None


def dtype_name(elem_type: int) -> str:
    if elem_type == TensorProto.FLOAT:
        return "float32"
    if elem_type == TensorProto.DOUBLE:
        return "float64"
    try:
        return TensorProto.DataType.Name(elem_type).lower()
    except ValueError:
        return f"dtype{elem_type}"


def _type_desc(tp: onnx.TypeProto) -> tuple[str, list | None]:
    """(dtype, shape) of a value; shape entries are ints, dim names, or '?'."""
    kind = tp.WhichOneof("value")
    if kind == "tensor_type":
        tt = tp.tensor_type
        shape = None
        if tt.HasField("shape"):
            shape = []
            for d in tt.shape.dim:
                if d.HasField("dim_value"):
                    shape.append(int(d.dim_value))
                elif d.HasField("dim_param"):
                    shape.append(d.dim_param)
                else:
                    shape.append("?")
        return dtype_name(tt.elem_type), shape
    if kind is None:
        return "?", None
    return kind.replace("_type", ""), None


def _fmt_shape(shape) -> str:
    if shape is None:
        return "[?]"
    return "[" + ", ".join(str(d) for d in shape) + "]"


def _ext_info(t: TensorProto) -> dict:
    return {e.key: e.value for e in t.external_data}


def _is_external(t: TensorProto) -> bool:
    return t.data_location == TensorProto.EXTERNAL


class TensorHasher:
    """sha256 of tensor contents; external data streamed in CHUNK_SIZE pieces.

    Results for external data are cached by (file identity, offset, length), so
    hard-linked weight files and repeated snapshots are read at most once.
    """

    def __init__(self) -> None:
        self._cache: dict[tuple, str] = {}

    def identity(self, t: TensorProto, base_dir) -> tuple | None:
        """(device, inode, size, mtime, offset, length) of external bytes, or None."""
        if not _is_external(t) or base_dir is None:
            return None
        info = _ext_info(t)
        path = Path(base_dir) / info.get("location", "")
        try:
            st = path.stat()
        except OSError:
            raise SpecdecError(f"missing external data file {path} (needed by tensor {t.name!r})") from None
        off = int(info.get("offset", 0) or 0)
        length = int(info["length"]) if info.get("length", "") != "" else st.st_size - off
        return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, off, length)

    def digest(self, t: TensorProto, base_dir) -> str:
        if _is_external(t):
            info = _ext_info(t)
            loc = info.get("location", "")
            if base_dir is None:  # snapshots without a directory: compare references
                return f"ref:{loc}@{info.get('offset', '0')}+{info.get('length', '')}"
            ident = self.identity(t, base_dir)
            if ident in self._cache:
                return self._cache[ident]
            path = Path(base_dir) / loc
            off, remaining = ident[4], ident[5]
            h = hashlib.sha256()
            with open(path, "rb") as f:
                f.seek(off)
                while remaining > 0:
                    chunk = f.read(min(CHUNK_SIZE, remaining))
                    if not chunk:
                        raise SpecdecError(f"external data file {path} is truncated (tensor {t.name!r})")
                    h.update(chunk)
                    remaining -= len(chunk)
            d = "sha256:" + h.hexdigest()
            self._cache[ident] = d
            return d
        h = hashlib.sha256()
        if t.HasField("raw_data"):
            h.update(t.raw_data)
        elif t.data_type == TensorProto.STRING:
            for s in t.string_data:
                h.update(len(s).to_bytes(8, "little"))
                h.update(s)
        else:
            from onnx import numpy_helper
            h.update(numpy_helper.to_array(t).tobytes())
        return "sha256:" + h.hexdigest()

    def equal(self, ta: TensorProto, a_dir, tb: TensorProto, b_dir) -> bool:
        if ta.data_type != tb.data_type or list(ta.dims) != list(tb.dims):
            return False
        ia, ib = self.identity(ta, a_dir), self.identity(tb, b_dir)
        if ia is not None and ia == ib:
            return True
        return self.digest(ta, a_dir) == self.digest(tb, b_dir)


def _short(d: str | None) -> str:
    if d is None:
        return "-"
    if d.startswith("sha256:"):
        return "sha256:" + d[7:19]
    return d


# --------------------------------------------------------------------------- graph index


class _Graph:
    def __init__(self, model: onnx.ModelProto, base_dir, hasher: TensorHasher):
        self.model = model
        g = model.graph
        self.base_dir = base_dir
        self.hasher = hasher
        self.nodes = list(g.node)
        self.inits = {t.name: t for t in g.initializer}
        self.inputs = {v.name: v for v in g.input if v.name not in self.inits}
        self.input_order = [v.name for v in g.input if v.name not in self.inits]
        self.outputs = {v.name: v for v in g.output}
        self.output_order = [v.name for v in g.output]
        self.producer: dict[str, tuple[int, int]] = {}
        self.consumers: dict[str, list[tuple[int, int]]] = defaultdict(list)
        for i, n in enumerate(self.nodes):
            for k, o in enumerate(n.output):
                if o:
                    self.producer[o] = (i, k)
            for s, x in enumerate(n.input):
                if x:
                    self.consumers[x].append((i, s))
        self.layers = [node_layer(n) for n in self.nodes]
        self.order = self._topo_order()
        self.pos = {i: p for p, i in enumerate(self.order)}
        self._attr_digest: dict[int, str] = {}

    def _topo_order(self) -> list[int]:
        indeg = [0] * len(self.nodes)
        succ: dict[int, list[int]] = defaultdict(list)
        for i, n in enumerate(self.nodes):
            for x in n.input:
                p = self.producer.get(x)
                if p is not None and p[0] != i:
                    indeg[i] += 1
                    succ[p[0]].append(i)
        ready = deque(i for i in range(len(self.nodes)) if indeg[i] == 0)
        order = []
        while ready:
            i = ready.popleft()
            order.append(i)
            for j in succ[i]:
                indeg[j] -= 1
                if indeg[j] == 0:
                    ready.append(j)
        seen = set(order)
        order += [i for i in range(len(self.nodes)) if i not in seen]  # cycles: keep going
        return order

    def attr_digest(self, i: int) -> str:
        d = self._attr_digest.get(i)
        if d is None:
            parts = [f"{a.name}={_attr_value_digest(a, self)}" for a in sorted(self.nodes[i].attribute, key=lambda a: a.name)]
            d = hashlib.blake2b("\x1f".join(parts).encode(), digest_size=16).hexdigest()
            self._attr_digest[i] = d
        return d

    def content_key(self, i: int) -> tuple:
        n = self.nodes[i]
        return (n.domain or "", n.op_type, self.attr_digest(i), len(n.input), len(n.output))


def _attr_value_digest(a: AttributeProto, g: _Graph) -> str:
    if a.ref_attr_name:
        return f"@{a.ref_attr_name}"
    if a.type == AttributeProto.TENSOR:
        return _tensor_token(a.t, g)
    if a.type == AttributeProto.TENSORS:
        return "[" + ",".join(_tensor_token(t, g) for t in a.tensors) + "]"
    if a.type == AttributeProto.GRAPH:
        return hashlib.sha256(a.g.SerializeToString(deterministic=True)).hexdigest()
    if a.type == AttributeProto.GRAPHS:
        return "[" + ",".join(hashlib.sha256(x.SerializeToString(deterministic=True)).hexdigest() for x in a.graphs) + "]"
    return repr(onnx.helper.get_attribute_value(a))


def _tensor_token(t: TensorProto, g: _Graph) -> str:
    return f"{dtype_name(t.data_type)}{list(t.dims)}{g.hasher.digest(t, g.base_dir)}"


def _attr_display(a: AttributeProto | None, g: _Graph) -> str | None:
    if a is None:
        return None
    if a.ref_attr_name:
        return f"@{a.ref_attr_name}"
    if a.type == AttributeProto.TENSOR:
        t = a.t
        return f"tensor {dtype_name(t.data_type)} {_fmt_shape(list(t.dims))} {_short(g.hasher.digest(t, g.base_dir))}"
    if a.type in (AttributeProto.GRAPH, AttributeProto.GRAPHS, AttributeProto.TENSORS):
        return f"{AttributeProto.AttributeType.Name(a.type).lower()} " + _short("sha256:" + hashlib.sha256(
            _attr_value_digest(a, g).encode()).hexdigest())
    v = onnx.helper.get_attribute_value(a)
    if isinstance(v, bytes):
        v = v.decode("utf-8", "replace")
    elif isinstance(v, list):
        v = [x.decode("utf-8", "replace") if isinstance(x, bytes) else x for x in v]
    return json.dumps(v)


def _h(*parts: str) -> str:
    return hashlib.blake2b("\x1e".join(parts).encode(), digest_size=16).hexdigest()


# --------------------------------------------------------------------------- interface


def _tokens(name: str) -> tuple[set[str], tuple[str, ...], str | None]:
    toks = re.findall(r"[A-Za-z]+|\d+", name)
    alpha = set()
    for t in toks:
        if t.isdigit():
            continue
        t = t.lower()
        if len(t) > 3 and t.endswith("s"):
            t = t[:-1]
        alpha.add(t)
    ints = tuple(t for t in toks if t.isdigit())
    role = None
    for t in reversed(toks):
        tl = t.lower()
        if tl in ("key", "k", "keys"):
            role = "key"
            break
        if tl in ("value", "v", "values"):
            role = "value"
            break
    return alpha, ints, role


def _rename_compatible(a: str, da, b: str, db) -> bool:
    (ta, sa), (tb, sb) = da, db
    if ta != tb:
        return False
    if sa is not None and sb is not None and len(sa) != len(sb):
        return False
    aa, ia, ra = _tokens(a)
    ab, ib, rb = _tokens(b)
    if ia != ib or ra != rb:
        return False
    return bool(aa & ab) or ra is not None


def _heuristic_renames(removed: list[str], added: list[str], desc_a, desc_b) -> dict[str, str]:
    out: dict[str, str] = {}
    used: set[str] = set()
    for a in removed:
        for b in added:
            if b not in used and _rename_compatible(a, desc_a[a], b, desc_b[b]):
                out[a] = b
                used.add(b)
                break
    return out


def _io_section(order_a, desc_a, order_b, desc_b, renames: dict[str, str]) -> dict:
    sec = {"added": [], "removed": [], "renamed": [], "changed": []}
    set_b = set(order_b)
    renamed_to = set(renames.values())
    for name in order_a:
        if name in set_b:
            (ta, sa), (tb, sb) = desc_a[name], desc_b[name]
            e: dict[str, Any] = {"name": name}
            if ta != tb:
                e["dtype"] = [ta, tb]
            if sa != sb:
                e["shape"] = [sa, sb]
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


# --------------------------------------------------------------------------- metadata


def _opsets(m: onnx.ModelProto) -> dict[str, int]:
    return {(o.domain or "ai.onnx"): int(o.version) for o in m.opset_import}


def _functions(m: onnx.ModelProto) -> dict[str, str]:
    out = {}
    for f in m.functions:
        key = f"{f.domain}::{f.name}" + (f"::{f.overload}" if getattr(f, "overload", "") else "")
        out[key] = "sha256:" + hashlib.sha256(f.SerializeToString(deterministic=True)).hexdigest()
    return out


def _metadata_section(ma: onnx.ModelProto, mb: onnx.ModelProto) -> list[dict]:
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
    fa, fb = _functions(ma), _functions(mb)
    for k in sorted(set(fa) | set(fb)):
        cmp(f"function {k}", fa.get(k), fb.get(k))
    return out


def _op_key(n: onnx.NodeProto) -> str:
    d = n.domain or ""
    return n.op_type if d in ("", "ai.onnx") else f"{d}::{n.op_type}"


def _op_counts_section(ga: _Graph, gb: _Graph) -> list[dict]:
    ca = Counter(_op_key(n) for n in ga.nodes)
    cb = Counter(_op_key(n) for n in gb.nodes)
    return [{"op": op, "before": ca.get(op, 0), "after": cb.get(op, 0)}
            for op in sorted(set(ca) | set(cb)) if ca.get(op, 0) != cb.get(op, 0)]


# --------------------------------------------------------------------------- initializers


def _init_section(ga: _Graph, gb: _Graph) -> tuple[dict, dict[str, str]]:
    H = ga.hasher
    sec = {"added": [], "removed": [], "renamed": [], "changed": []}
    for name in sorted(set(ga.inits) & set(gb.inits)):
        ta, tb = ga.inits[name], gb.inits[name]
        if H.equal(ta, ga.base_dir, tb, gb.base_dir):
            continue
        e: dict[str, Any] = {"name": name}
        if ta.data_type != tb.data_type:
            e["dtype"] = [dtype_name(ta.data_type), dtype_name(tb.data_type)]
        if list(ta.dims) != list(tb.dims):
            e["shape"] = [list(ta.dims), list(tb.dims)]
        e["sha256"] = [H.digest(ta, ga.base_dir), H.digest(tb, gb.base_dir)]
        sec["changed"].append(e)

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
        t = ga.inits[name]
        if name in renames:
            sec["renamed"].append({"from": name, "to": renames[name]})
        else:
            sec["removed"].append({"name": name, "dtype": dtype_name(t.data_type), "shape": list(t.dims),
                                   "sha256": H.digest(t, ga.base_dir)})
    taken = set(renames.values())
    for name in only_b:
        if name not in taken:
            t = gb.inits[name]
            sec["added"].append({"name": name, "dtype": dtype_name(t.data_type), "shape": list(t.dims),
                                 "sha256": H.digest(t, gb.base_dir)})
    return sec, renames


# --------------------------------------------------------------------------- node matching


def _forward_hashes(g: _Graph, in_map: dict[str, str], init_map: dict[str, str]) -> list[str]:
    F = [""] * len(g.nodes)
    for i in g.order:
        n = g.nodes[i]
        refs = []
        for x in n.input:
            if not x:
                refs.append("-")
            elif x in g.producer:
                p, k = g.producer[x]
                refs.append(f"n:{F[p] or 'cycle'}:{k}")
            elif x in g.inits:
                refs.append("i:" + init_map.get(x, x))
            elif x in g.inputs:
                refs.append("x:" + in_map.get(x, x))
            else:
                refs.append("f:" + x)
        F[i] = _h(n.domain or "", n.op_type, g.attr_digest(i), *refs, str(len(n.output)))
    return F


def _backward_hashes(g: _Graph, F: list[str], out_map: dict[str, str]) -> list[str]:
    Bk = [""] * len(g.nodes)
    for i in reversed(g.order):
        n = g.nodes[i]
        parts = [F[i]]
        for k, o in enumerate(n.output):
            uses = sorted(f"{g.nodes[c].op_type}:{s}:{Bk[c] or 'cycle'}" for c, s in g.consumers.get(o, ()))
            if o in g.outputs:
                uses.append("o:" + out_map.get(o, o))
            parts.append(f"{k}(" + ",".join(uses) + ")")
        Bk[i] = _h(*parts)
    return Bk


def _src_a(ga: _Graph, x: str, match, in_map, init_map) -> tuple:
    """Where input ``x`` of an A node comes from, in B's terms (for comparing wiring)."""
    if not x:
        return ("-",)
    if x in ga.producer:
        p, k = ga.producer[x]
        return ("n", match[p], k) if p in match else ("na", p, k)
    if x in ga.inits:
        return ("i", init_map.get(x, x))
    if x in ga.inputs:
        return ("x", in_map.get(x, x))
    return ("f", x)


def _src_b(gb: _Graph, x: str) -> tuple:
    if not x:
        return ("-",)
    if x in gb.producer:
        p, k = gb.producer[x]
        return ("n", p, k)
    if x in gb.inits:
        return ("i", x)
    if x in gb.inputs:
        return ("x", x)
    return ("f", x)


def _match_nodes(ga: _Graph, gb: _Graph, in_map, init_map, out_map) -> dict[int, int]:
    match: dict[int, int] = {}
    rev: dict[int, int] = {}

    def pair(i, j):
        match[i] = j
        rev[j] = i

    # 1. by name (unique names, same op)
    for i, j in _match_nodes_by_name_only(ga, gb).items():
        pair(i, j)

    # When most nodes kept their names, names are meaningful: a node whose name is new was
    # added, unless it computes exactly what an old node computed (steps 2 below).
    named_pairs = len(match)
    names_meaningful = named_pairs >= 0.5 * max(1, min(len(ga.nodes), len(gb.nodes)))

    # 2. by topology: identical forward+backward structure, then forward only (the same
    #    computation from the same inputs, renamed)
    FA = _forward_hashes(ga, in_map, init_map)
    FB = _forward_hashes(gb, {}, {})
    BA = _backward_hashes(ga, FA, out_map)
    BB = _backward_hashes(gb, FB, {})
    for ka, kb in ((BA, BB), (FA, FB)):
        pool: dict[str, deque] = defaultdict(deque)
        for j in gb.order:
            if j not in rev:
                pool[kb[j]].append(j)
        for i in ga.order:
            if i in match:
                continue
            q = pool.get(ka[i])
            while q:
                j = q.popleft()
                if j not in rev:
                    pair(i, j)
                    break

    # 3. propagate along edges from matched pairs to unmatched neighbours: first nodes with the
    #    same content (op, attributes, arity), then nodes that differ only in attributes but
    #    read exactly the same inputs
    def same_inputs(i, j):
        na, nb = ga.nodes[i], gb.nodes[j]
        if len(na.input) != len(nb.input):
            return False
        for xa, xb in zip(na.input, nb.input):
            if _src_a(ga, xa, match, in_map, init_map) != _src_b(gb, xb):
                return False
        return True

    def strict(g, i):
        return g.content_key(i)

    def loose(g, i):
        n = g.nodes[i]
        return (n.domain or "", n.op_type, len(n.input), len(n.output))

    def allowed(i, j):
        return not (names_meaningful and ga.nodes[i].name and gb.nodes[j].name)

    def propagate(keyf, check0):
        def check(i, j):
            return allowed(i, j) and check0(i, j)

        added = False
        work = deque(sorted(match.items(), key=lambda p: ga.pos[p[0]]))
        while work:
            i, j = work.popleft()
            na, nb = ga.nodes[i], gb.nodes[j]
            for s in range(min(len(na.input), len(nb.input))):
                pa, pb = ga.producer.get(na.input[s]), gb.producer.get(nb.input[s])
                if pa and pb and pa[1] == pb[1] and pa[0] not in match and pb[0] not in rev \
                        and keyf(ga, pa[0]) == keyf(gb, pb[0]) and check(pa[0], pb[0]):
                    pair(pa[0], pb[0])
                    work.append((pa[0], pb[0]))
                    added = True
            for k in range(min(len(na.output), len(nb.output))):
                ca = defaultdict(list)
                for c, s in ga.consumers.get(na.output[k], ()):
                    if c not in match:
                        ca[(s, keyf(ga, c))].append(c)
                if not ca:
                    continue
                cb = defaultdict(list)
                for c, s in gb.consumers.get(nb.output[k], ()):
                    if c not in rev:
                        cb[(s, keyf(gb, c))].append(c)
                for key, la in ca.items():
                    lb = cb.get(key)
                    if len(la) == 1 and lb and len(lb) == 1 and la[0] not in match and lb[0] not in rev \
                            and check(la[0], lb[0]):
                        pair(la[0], lb[0])
                        work.append((la[0], lb[0]))
                        added = True
        return added

    while True:
        propagate(strict, lambda i, j: True)
        if not propagate(loose, same_inputs):
            break
    return match


def _topology_io_renames(ga: _Graph, gb: _Graph, match, un_a: list[str], un_b: list[str], inputs: bool) -> dict[str, str]:
    out: dict[str, str] = {}
    set_b = set(un_b)
    used: set[str] = set()
    for a in un_a:
        cands = Counter()
        if inputs:
            for c, s in ga.consumers.get(a, ()):
                j = match.get(c)
                if j is not None and s < len(gb.nodes[j].input):
                    b = gb.nodes[j].input[s]
                    if b in set_b and b not in used:
                        cands[b] += 1
        else:
            p = ga.producer.get(a)
            if p and p[0] in match:
                nb = gb.nodes[match[p[0]]]
                if p[1] < len(nb.output):
                    b = nb.output[p[1]]
                    if b in set_b and b not in used:
                        cands[b] += 1
        if cands:
            b = sorted(cands.items(), key=lambda kv: (-kv[1], kv[0]))[0][0]
            out[a] = b
            used.add(b)
    return out


def _group_key(layer):
    return (-1, 0) if layer is None else (0, layer)


def _node_label(n: onnx.NodeProto) -> str:
    return n.name if n.name else "(-> " + ", ".join(n.output) + ")"


def _nodes_section(ga: _Graph, gb: _Graph, match, in_map, init_map) -> list[dict]:
    rev = {j: i for i, j in match.items()}

    def src_a(x):
        return _src_a(ga, x, match, in_map, init_map)

    def src_b(x):
        return _src_b(gb, x)

    groups: dict[Any, dict] = {}

    def group(layer):
        if layer not in groups:
            groups[layer] = {"group": GLOBAL if layer is None else f"layer {layer}", "layer": layer,
                             "added": [], "removed": [], "rewired": [], "changed": []}
        return groups[layer]

    def origin(g: _Graph, x: str) -> str:
        if x in g.producer:
            return _node_label(g.nodes[g.producer[x][0]])
        if x in g.inits:
            return "initializer"
        if x in g.inputs:
            return "input"
        return "?"

    for i in ga.order:
        if i not in match:
            n = ga.nodes[i]
            group(ga.layers[i])["removed"].append(
                {"name": n.name, "op": _op_key(n), "inputs": list(n.input), "outputs": list(n.output)})
    for j in gb.order:
        if j not in rev:
            n = gb.nodes[j]
            group(gb.layers[j])["added"].append(
                {"name": n.name, "op": _op_key(n), "inputs": list(n.input), "outputs": list(n.output)})
        else:
            i = rev[j]
            na, nb = ga.nodes[i], gb.nodes[j]
            layer = gb.layers[j] if gb.layers[j] is not None else ga.layers[i]
            base = {"name": nb.name, "op": _op_key(nb)}
            if na.name != nb.name:
                base["name_before"] = na.name
            diffs = []
            for s in range(max(len(na.input), len(nb.input))):
                xa = na.input[s] if s < len(na.input) else None
                xb = nb.input[s] if s < len(nb.input) else None
                ra = src_a(xa) if xa is not None else None
                rb = src_b(xb) if xb is not None else None
                if ra != rb:
                    e = {"slot": s, "before": xa, "after": xb}
                    if xa is not None and xb is not None and xa == xb:
                        e["from_before"] = origin(ga, xa) if xa else None
                        e["from_after"] = origin(gb, xb) if xb else None
                    diffs.append(e)
            if diffs:
                group(layer)["rewired"].append({**base, "inputs": diffs})
            if ga.attr_digest(i) != gb.attr_digest(j) or len(na.output) != len(nb.output):
                aa = {a.name: a for a in na.attribute}
                ab = {a.name: a for a in nb.attribute}
                ch = []
                for an in sorted(set(aa) | set(ab)):
                    da, db = _attr_display(aa.get(an), ga), _attr_display(ab.get(an), gb)
                    if an not in aa or an not in ab or _attr_value_digest(aa[an], ga) != _attr_value_digest(ab[an], gb):
                        ch.append({"name": an, "before": da, "after": db})
                if len(na.output) != len(nb.output):
                    ch.append({"name": "(outputs)", "before": str(len(na.output)), "after": str(len(nb.output))})
                if ch:
                    group(layer)["changed"].append({**base, "attributes": ch})
    return [groups[k] for k in sorted(groups, key=_group_key)]


# --------------------------------------------------------------------------- the diff


SECTIONS = ("interface", "metadata", "op_counts", "nodes", "initializers")


def _empty(sec) -> bool:
    if isinstance(sec, list):
        return not sec
    if isinstance(sec, dict):
        return all(_empty(v) for v in sec.values())
    return False


def diff_models(a: onnx.ModelProto, b: onnx.ModelProto, *, a_dir=None, b_dir=None,
                a_label: str = "a", b_label: str = "b", hasher: TensorHasher | None = None) -> dict:
    """Diff two models (loaded without external data). ``*_dir``: where their external data lives."""
    hasher = hasher or TensorHasher()
    ga, gb = _Graph(a, a_dir, hasher), _Graph(b, b_dir, hasher)

    init_sec, init_map = _init_section(ga, gb)

    din = {n: _type_desc(v.type) for n, v in ga.inputs.items()}
    dinb = {n: _type_desc(v.type) for n, v in gb.inputs.items()}
    dout = {n: _type_desc(v.type) for n, v in ga.outputs.items()}
    doutb = {n: _type_desc(v.type) for n, v in gb.outputs.items()}

    def unmatched(order_a, order_b, known):
        sa, sb = set(order_a), set(order_b)
        ua = [n for n in order_a if n not in sb and n not in known]
        ub = [n for n in order_b if n not in sa and n not in set(known.values())]
        return ua, ub

    # interface renames: what the consumers of an input say (name-matched nodes), then names
    name_match = _match_nodes_by_name_only(ga, gb)
    in_map: dict[str, str] = {}
    out_map: dict[str, str] = {}
    ua, ub = unmatched(ga.input_order, gb.input_order, in_map)
    in_map.update(_topology_io_renames(ga, gb, name_match, ua, ub, inputs=True))
    ua, ub = unmatched(ga.output_order, gb.output_order, out_map)
    out_map.update(_topology_io_renames(ga, gb, name_match, ua, ub, inputs=False))
    ua, ub = unmatched(ga.input_order, gb.input_order, in_map)
    in_map.update(_heuristic_renames(ua, ub, din, dinb))
    ua, ub = unmatched(ga.output_order, gb.output_order, out_map)
    out_map.update(_heuristic_renames(ua, ub, dout, doutb))

    match = _match_nodes(ga, gb, in_map, init_map, out_map)

    # with the full matching, renames that only topology shows (renamed copies)
    ua, ub = unmatched(ga.input_order, gb.input_order, in_map)
    in_map.update(_topology_io_renames(ga, gb, match, ua, ub, inputs=True))
    ua, ub = unmatched(ga.output_order, gb.output_order, out_map)
    out_map.update(_topology_io_renames(ga, gb, match, ua, ub, inputs=False))

    report: dict[str, Any] = {
        "kind": "diff",
        "a": a_label,
        "b": b_label,
        "interface": {
            "inputs": _io_section(ga.input_order, din, gb.input_order, dinb, in_map),
            "outputs": _io_section(ga.output_order, dout, gb.output_order, doutb, out_map),
        },
        "metadata": _metadata_section(a, b),
        "op_counts": _op_counts_section(ga, gb),
        "nodes": _nodes_section(ga, gb, match, in_map, init_map),
        "initializers": init_sec,
        "notes": [],
    }
    report["identical"] = all(_empty(report[s]) for s in SECTIONS)
    return report


def _match_nodes_by_name_only(ga: _Graph, gb: _Graph) -> dict[int, int]:
    cnt_a = Counter(n.name for n in ga.nodes if n.name)
    cnt_b = Counter(n.name for n in gb.nodes if n.name)
    idx_b = {n.name: j for j, n in enumerate(gb.nodes) if n.name and cnt_b[n.name] == 1}
    out = {}
    for i, n in enumerate(ga.nodes):
        if n.name and cnt_a[n.name] == 1 and n.name in idx_b:
            m = gb.nodes[idx_b[n.name]]
            if n.op_type == m.op_type and (n.domain or "") == (m.domain or ""):
                out[i] = idx_b[n.name]
    return out


def _resolve(path: str | os.PathLike) -> Path:
    p = Path(path)
    if p.is_dir() and (p / "model.onnx").is_file():
        return p / "model.onnx"
    return p


def _artifact_notes(pa: Path, pb: Path, identical: bool) -> list[str]:
    notes = []
    ma, mb = pa.parent / "manifest.json", pb.parent / "manifest.json"
    if ma.is_file() and mb.is_file():
        try:
            ja, jb = json.loads(ma.read_text()), json.loads(mb.read_text())
        except (OSError, ValueError):
            return notes
        if isinstance(ja, dict) and isinstance(jb, dict) and ja.get("k") != jb.get("k"):
            what = "graphs are identical" if identical else "graphs differ as shown"
            notes.append(f"k differs ({ja.get('k')} vs {jb.get('k')}); {what}: k lives in "
                         f"specializations.json (seq_len = k, k+1), not in the graph")
    return notes


def diff_files(path_a, path_b, *, hasher: TensorHasher | None = None) -> dict:
    """Diff two .onnx files (or artifact directories holding model.onnx)."""
    from .io import load_model
    pa, pb = _resolve(path_a), _resolve(path_b)
    ma, mb = load_model(pa), load_model(pb)
    rep = diff_models(ma, mb, a_dir=pa.parent, b_dir=pb.parent, a_label=str(path_a), b_label=str(path_b),
                      hasher=hasher)
    rep["notes"] = _artifact_notes(pa, pb, rep["identical"])
    return rep


def explain(snapshots: Iterable[tuple[str, onnx.ModelProto]], *, base_dir=None, total: bool = True) -> dict:
    """What each pass changed: diff consecutive ``(name, model)`` snapshots.

    ``base_dir``: the directory external data locations are relative to (the
    source model's); without it external tensors are compared by reference.
    """
    snaps = list(snapshots)
    if not snaps:
        raise SpecdecError("explain: no snapshots to compare")
    hasher = TensorHasher()
    passes = []
    for (na, ma), (nb, mb) in zip(snaps, snaps[1:]):
        r = diff_models(ma, mb, a_dir=base_dir, b_dir=base_dir, a_label=na, b_label=nb, hasher=hasher)
        r["pass"] = nb
        passes.append(r)
    rep: dict[str, Any] = {"kind": "explain", "passes": passes,
                           "identical": all(p["identical"] for p in passes), "notes": []}
    if total and len(snaps) > 2:
        rep["total"] = diff_models(snaps[0][1], snaps[-1][1], a_dir=base_dir, b_dir=base_dir,
                                   a_label=snaps[0][0], b_label=snaps[-1][0], hasher=hasher)
    return rep


# --------------------------------------------------------------------------- rendering


def render_json(report: dict) -> str:
    return json.dumps(report, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def _io_lines(title: str, sec: dict) -> list[tuple[str, str]]:
    lines = []
    if _empty(sec):
        return lines
    lines.append((f"  {title}", "bold"))
    for e in sec["removed"]:
        lines.append((f"    - {e['name']}  {e['dtype']} {_fmt_shape(e['shape'])}", "red"))
    for e in sec["added"]:
        lines.append((f"    + {e['name']}  {e['dtype']} {_fmt_shape(e['shape'])}", "green"))
    for e in sec["renamed"]:
        extra = _change_suffix(e)
        lines.append((f"    ~ {e['from']} -> {e['to']}{extra}", "yellow"))
    for e in sec["changed"]:
        lines.append((f"    ~ {e['name']}{_change_suffix(e)}", "yellow"))
    return lines


def _change_suffix(e: dict) -> str:
    parts = []
    if "dtype" in e:
        parts.append(f"dtype {e['dtype'][0]} -> {e['dtype'][1]}")
    if "shape" in e:
        parts.append(f"shape {_fmt_shape(e['shape'][0])} -> {_fmt_shape(e['shape'][1])}")
    return ("  " + "; ".join(parts)) if parts else ""


def _fmt_meta(v) -> str:
    if v is None:
        return "(none)"
    if isinstance(v, str) and v.startswith("sha256:"):
        return _short(v)
    return str(v)


def _node_text(e: dict) -> str:
    if e.get("name"):
        return e["name"]
    return "(-> " + ", ".join(e.get("outputs", [])) + ")"


def _diff_lines(r: dict, indent: str = "") -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []

    def add(text, style=""):
        out.append((indent + text, style))

    if not _empty(r["interface"]):
        add("interface", "bold cyan")
        for t, s in _io_lines("inputs", r["interface"]["inputs"]) + _io_lines("outputs", r["interface"]["outputs"]):
            add(t, s)
    if r["metadata"]:
        add("opset and metadata", "bold cyan")
        for e in r["metadata"]:
            sym, style = ("~", "yellow")
            if e["before"] is None:
                sym, style = "+", "green"
            elif e["after"] is None:
                sym, style = "-", "red"
            add(f"  {sym} {e['field']}: {_fmt_meta(e['before'])} -> {_fmt_meta(e['after'])}", style)
    if r["op_counts"]:
        add("op counts", "bold cyan")
        w = max(len(e["op"]) for e in r["op_counts"])
        w = max(w, 2)
        add(f"  {'op':<{w}}  {'before':>6}  {'after':>6}  {'delta':>6}", "dim")
        for e in r["op_counts"]:
            d = e["after"] - e["before"]
            add(f"  {e['op']:<{w}}  {e['before']:>6}  {e['after']:>6}  {d:>+6}", "green" if d > 0 else "red")
    if r["nodes"]:
        add("nodes", "bold cyan")
        for g in r["nodes"]:
            add(f"  {g['group']}  (+{len(g['added'])} -{len(g['removed'])} ~{len(_modified(g))})", "bold")
            for e in g["removed"]:
                add(f"    - {e['op']}  {_node_text(e)}", "red")
            for e in g["added"]:
                add(f"    + {e['op']}  {_node_text(e)}", "green")
            for e in _modified(g):
                ren = f" (was {e['name_before']})" if e.get("name_before") else ""
                add(f"    ~ {e['op']}  {e['name'] or '(unnamed)'}{ren}", "yellow")
                for s in e.get("inputs", []):
                    before = "(none)" if s["before"] is None else (s["before"] or "''")
                    after = "(none)" if s["after"] is None else (s["after"] or "''")
                    if "from_before" in s:
                        before += f" [from {s['from_before']}]"
                        after += f" [from {s['from_after']}]"
                    add(f"        input {s['slot']}: {before} -> {after}", "yellow")
                for a in e.get("attributes", []):
                    add(f"        {a['name']}: {a['before'] if a['before'] is not None else '(none)'} -> "
                        f"{a['after'] if a['after'] is not None else '(none)'}", "yellow")
    ini = r["initializers"]
    if not _empty(ini):
        add("initializers", "bold cyan")
        for e in ini["removed"]:
            add(f"  - {e['name']}  {e['dtype']} {_fmt_shape(e['shape'])} {_short(e['sha256'])}", "red")
        for e in ini["added"]:
            add(f"  + {e['name']}  {e['dtype']} {_fmt_shape(e['shape'])} {_short(e['sha256'])}", "green")
        for e in ini["renamed"]:
            add(f"  ~ {e['from']} -> {e['to']}  (same content)", "yellow")
        for e in ini["changed"]:
            parts = []
            if "dtype" in e:
                parts.append(f"dtype {e['dtype'][0]} -> {e['dtype'][1]}")
            if "shape" in e:
                parts.append(f"shape {_fmt_shape(e['shape'][0])} -> {_fmt_shape(e['shape'][1])}")
            parts.append(f"{_short(e['sha256'][0])} -> {_short(e['sha256'][1])}")
            add(f"  ~ {e['name']}  " + "; ".join(parts), "yellow")
    return out


def _modified(g: dict) -> list[dict]:
    """Rewired and changed entries of a group merged per node (rewired order first)."""
    out: dict[tuple, dict] = {}
    for kind in ("rewired", "changed"):
        for e in g[kind]:
            key = (e["op"], e["name"], e.get("name_before"))
            m = out.setdefault(key, {"op": e["op"], "name": e["name"], "name_before": e.get("name_before")})
            for f in ("inputs", "attributes"):
                if f in e:
                    m[f] = e[f]
    return list(out.values())


def _summary(r: dict) -> str:
    if r["identical"]:
        return "no differences"
    itf = sum(len(v) for io in r["interface"].values() for v in io.values())
    nodes = {k: sum(len(g[k]) for g in r["nodes"]) for k in ("added", "removed")}
    nodes["modified"] = sum(len(_modified(g)) for g in r["nodes"])
    ini = sum(len(v) for v in r["initializers"].values())
    return (f"{itf} interface, {len(r['metadata'])} metadata, {len(r['op_counts'])} op-count, "
            f"nodes +{nodes['added']} -{nodes['removed']} ~{nodes['modified']}, "
            f"{ini} initializer change(s)")


def report_lines(report: dict) -> list[tuple[str, str]]:
    """The report as (text, rich style) lines; render_text joins the text."""
    lines: list[tuple[str, str]] = []
    if report.get("kind") == "explain":
        n = len(report["passes"])
        lines.append((f"explain: {n} pass(es)", "bold"))
        for idx, p in enumerate(report["passes"], 1):
            lines.append((f"== pass {idx}/{n}: {p['pass']} ({p['a']} -> {p['b']}) ==", "bold magenta"))
            body = _diff_lines(p, indent="  ")
            lines.extend(body)
            lines.append(("  " + _summary(p), "dim"))
        if "total" in report:
            t = report["total"]
            lines.append((f"== total: {t['a']} -> {t['b']} ==", "bold magenta"))
            lines.extend(_diff_lines(t, indent="  "))
            lines.append(("  " + _summary(t), "dim"))
    else:
        lines.append((f"--- {report['a']}", "red"))
        lines.append((f"+++ {report['b']}", "green"))
        lines.extend(_diff_lines(report))
        lines.append((_summary(report), "dim"))
    for note in report.get("notes", []):
        lines.append((f"note: {note}", "italic"))
    return lines


def render_text(report: dict) -> str:
    """Plain text, no colours, no wrapping: stable for golden tests."""
    return "".join(t + "\n" for t, _ in report_lines(report))


def print_report(report: dict, file=None, color: bool | None = None) -> None:
    file = file or sys.stdout
    if color is None:
        color = _isatty(file) and not os.environ.get("NO_COLOR")
    if not color:
        file.write(render_text(report))
        file.flush()
        return
    from rich.console import Console
    from rich.text import Text
    console = Console(file=file, force_terminal=True, soft_wrap=True, highlight=False, markup=False, emoji=False)
    for t, style in report_lines(report):
        console.print(Text(t, style=style or ""))


def _isatty(f) -> bool:
    try:
        return f.isatty()
    except (AttributeError, ValueError):
        return False


# --------------------------------------------------------------------------- CLI


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 2 through the dispatcher
        raise SpecdecError(f"{message} (see --help)")


def _build_parser(prog: str) -> argparse.ArgumentParser:
    p = _Parser(prog=prog, description="Graph-aware diff of two ONNX models, or of the passes of a compile. "
                "Exit status: 0 same, 1 different, 2 error.")
    p.add_argument("paths", nargs="+", metavar="MODEL",
                   help="A.onnx B.onnx (or two artifact directories); with --passes: the original export")
    p.add_argument("--json", action="store_true", help="machine-readable JSON (stable key order)")
    p.add_argument("--color", choices=("auto", "always", "never"), default="auto",
                   help="colours (default: only when stdout is a terminal)")
    p.add_argument("--passes", action="store_true",
                   help="compile ORIGINAL and show what each pass changed (same sections per pass)")
    p.add_argument("--role", choices=("tlm", "dlm"), help="with --passes: the role to compile for")
    p.add_argument("--target", choices=("qaic", "ort"), default="qaic", help="with --passes: lowering target")
    p.add_argument("--k", type=int, default=None, help="with --passes: speculation length (graph does not depend on it)")
    return p


def explain_file(path, *, role: str, target: str = "qaic", k: int | None = None) -> dict:
    """Run the compile pipeline with recording on and explain its passes."""
    from .io import load_model
    p = _resolve(path)
    load_model(p)  # one-line errors for missing / truncated files before the pipeline runs
    try:
        from .pipeline import rewrite
    except ImportError as e:
        raise SpecdecError(f"--passes needs the compile pipeline, which is not available ({e})") from None
    kwargs: dict[str, Any] = {"role": role, "target": target, "record": True}
    if k is not None:
        kwargs["k"] = k
    res = rewrite(str(p), **kwargs)
    snaps = getattr(res, "snapshots", None)
    if not snaps:
        raise SpecdecError("the compile pipeline recorded no snapshots")
    base = getattr(res, "source_dir", None) or p.parent
    rep = explain(snaps, base_dir=base)
    rep["source"] = str(path)
    rep["role"], rep["target"] = role, target
    return rep


def _main(argv: list[str], prog: str) -> int:
    args = _build_parser(prog).parse_args(argv)
    if args.passes:
        if len(args.paths) != 1:
            raise SpecdecError("--passes takes exactly one model: the original export")
        if not args.role:
            raise SpecdecError("--passes needs --role tlm or --role dlm")
        report = explain_file(args.paths[0], role=args.role, target=args.target, k=args.k)
    else:
        if len(args.paths) != 2:
            raise SpecdecError(f"expected two models to compare, got {len(args.paths)}")
        if args.role or args.k is not None:
            raise SpecdecError("--role/--k only apply with --passes")
        report = diff_files(args.paths[0], args.paths[1])
    if args.json:
        sys.stdout.write(render_json(report))
        sys.stdout.flush()
    else:
        color = {"always": True, "never": False}.get(args.color)
        print_report(report, sys.stdout, color=color)
    return 0 if report["identical"] else 1


def main(argv: list[str] | None = None, prog: str = "specdec-compile diff") -> int:
    from .cli import run_cli
    argv = list(sys.argv[1:] if argv is None else argv)
    return run_cli(lambda a: _main(a, prog), argv, prog)


if __name__ == "__main__":
    sys.exit(main())
