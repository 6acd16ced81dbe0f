"""Which A node / input / output is which in B: names, rename heuristics, structural hashes."""
from __future__ import annotations

import hashlib
import re
from collections import Counter, defaultdict, deque

from .index import GraphIndex
from .subgraphs import node_domain


def _h(*parts: str) -> str:
    """A short structural hash of ``parts``."""
    return hashlib.blake2b("\x1e".join(parts).encode(), digest_size=16).hexdigest()


# --------------------------------------------------------------------------- interface renames


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


def heuristic_renames(removed: list[str], added: list[str], desc_a, desc_b) -> dict[str, str]:
    """Renames guessed from names alike (same dtype, rank, numbers and key/value role)."""
    out: dict[str, str] = {}
    used: set[str] = set()
    for a in removed:
        for b in added:
            if b not in used and _rename_compatible(a, desc_a[a], b, desc_b[b]):
                out[a] = b
                used.add(b)
                break
    return out


def match_nodes_by_name(ga: GraphIndex, gb: GraphIndex) -> dict[int, int]:
    """Nodes whose unique name and op are the same in A and B."""
    cnt_a = Counter(n.name for n in ga.nodes if n.name)
    cnt_b = Counter(n.name for n in gb.nodes if n.name)
    idx_b = {n.name: j for j, n in enumerate(gb.nodes) if n.name and cnt_b[n.name] == 1}
    out = {}
    for i, n in enumerate(ga.nodes):
        if n.name and cnt_a[n.name] == 1 and n.name in idx_b:
            m = gb.nodes[idx_b[n.name]]
            if n.op_type == m.op_type and node_domain(n) == node_domain(m):
                out[i] = idx_b[n.name]
    return out


def topology_io_renames(ga: GraphIndex, gb: GraphIndex, match, un_a: list[str], un_b: list[str],
                        inputs: bool) -> dict[str, str]:
    """Renames of graph inputs (outputs) that the matched consumers (producers) show."""
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


# --------------------------------------------------------------------------- structural hashes


def _forward_hashes(g: GraphIndex, in_map: dict[str, str], init_map: dict[str, str]) -> list[str]:
    F = [""] * len(g.nodes)

    def ref(x: str) -> str:
        if not x:
            return "-"
        if x in g.producer:
            p, k = g.producer[x]
            return f"n:{F[p] or 'cycle'}:{k}"
        if x in g.inits:
            return "i:" + init_map.get(x, x)
        if x in g.inputs:
            return "x:" + in_map.get(x, x)
        return "f:" + x

    for i in g.order:
        n = g.nodes[i]
        refs = [ref(x) for x in n.input]
        if g.outer[i]:   # what its subgraphs read from this graph, where it comes from
            refs.append("outer:" + g.outer_digest(i, ref))
        F[i] = _h(node_domain(n), n.op_type, g.attr_digest(i), *refs, str(len(n.output)))
    return F


def _backward_hashes(g: GraphIndex, F: list[str], out_map: dict[str, str]) -> list[str]:
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


def src_a(ga: GraphIndex, x: str, match, in_map, init_map) -> tuple:
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


def src_b(gb: GraphIndex, x: str) -> tuple:
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


# --------------------------------------------------------------------------- node matching


def _strict_key(g: GraphIndex, i: int) -> tuple:
    return g.content_key(i)


def _loose_key(g: GraphIndex, i: int) -> tuple:
    n = g.nodes[i]
    return (node_domain(n), n.op_type, len(n.input), len(n.output))


class _Matcher:
    """A one-to-one node matching from A to B (``match``) and its inverse (``rev``), grown in steps."""

    def __init__(self, ga: GraphIndex, gb: GraphIndex, in_map, init_map):
        self.ga, self.gb = ga, gb
        self.in_map, self.init_map = in_map, init_map
        self.match: dict[int, int] = {}
        self.rev: dict[int, int] = {}
        self.names_meaningful = False

    def pair(self, i: int, j: int) -> None:
        self.match[i] = j
        self.rev[j] = i

    def by_hash(self, ka: list[str], kb: list[str]) -> None:
        """Pair unmatched nodes with equal hashes, in topological order."""
        pool: dict[str, deque] = defaultdict(deque)
        for j in self.gb.order:
            if j not in self.rev:
                pool[kb[j]].append(j)
        for i in self.ga.order:
            if i in self.match:
                continue
            q = pool.get(ka[i])
            while q:
                j = q.popleft()
                if j not in self.rev:
                    self.pair(i, j)
                    break

    def same_inputs(self, i: int, j: int) -> bool:
        na, nb = self.ga.nodes[i], self.gb.nodes[j]
        if len(na.input) != len(nb.input):
            return False
        for xa, xb in zip(na.input, nb.input):
            if src_a(self.ga, xa, self.match, self.in_map, self.init_map) != src_b(self.gb, xb):
                return False
        return True

    def allowed(self, i: int, j: int) -> bool:
        return not (self.names_meaningful and self.ga.nodes[i].name and self.gb.nodes[j].name)

    def propagate(self, keyf, check0) -> bool:
        """Pair unmatched producers and consumers of matched pairs; True when any was paired."""
        def check(i, j):
            return self.allowed(i, j) and (check0 is None or check0(i, j))

        added = False
        work = deque(sorted(self.match.items(), key=lambda p: self.ga.pos[p[0]]))
        while work:
            i, j = work.popleft()
            added |= self._via_inputs(i, j, keyf, check, work)
            added |= self._via_outputs(i, j, keyf, check, work)
        return added

    def _via_inputs(self, i, j, keyf, check, work: deque) -> bool:
        ga, gb, added = self.ga, self.gb, False
        na, nb = ga.nodes[i], gb.nodes[j]
        for s in range(min(len(na.input), len(nb.input))):
            pa, pb = ga.producer.get(na.input[s]), gb.producer.get(nb.input[s])
            if pa and pb and pa[1] == pb[1] and pa[0] not in self.match and pb[0] not in self.rev \
                    and keyf(ga, pa[0]) == keyf(gb, pb[0]) and check(pa[0], pb[0]):
                self.pair(pa[0], pb[0])
                work.append((pa[0], pb[0]))
                added = True
        return added

    def _via_outputs(self, i, j, keyf, check, work: deque) -> bool:
        ga, gb, added = self.ga, self.gb, False
        na, nb = ga.nodes[i], gb.nodes[j]
        for k in range(min(len(na.output), len(nb.output))):
            ca = defaultdict(list)
            for c, s in ga.consumers.get(na.output[k], ()):
                if c not in self.match:
                    ca[(s, keyf(ga, c))].append(c)
            if not ca:
                continue
            cb = defaultdict(list)
            for c, s in gb.consumers.get(nb.output[k], ()):
                if c not in self.rev:
                    cb[(s, keyf(gb, c))].append(c)
            for key, la in ca.items():
                lb = cb.get(key)
                if len(la) == 1 and lb and len(lb) == 1 and la[0] not in self.match and lb[0] not in self.rev \
                        and check(la[0], lb[0]):
                    self.pair(la[0], lb[0])
                    work.append((la[0], lb[0]))
                    added = True
        return added


def match_nodes(ga: GraphIndex, gb: GraphIndex, in_map, init_map, out_map) -> dict[int, int]:
    """Node matching A -> B: by name, then by structure, then along edges from matched pairs."""
    m = _Matcher(ga, gb, in_map, init_map)

    # 1. by name (unique names, same op)
    for i, j in match_nodes_by_name(ga, gb).items():
        m.pair(i, j)

    # When most nodes kept their names, names are meaningful: a node whose name is new was
    # added, unless it computes exactly what an old node computed (steps 2 below).
    m.names_meaningful = len(m.match) >= 0.5 * max(1, min(len(ga.nodes), len(gb.nodes)))

    # 2. by topology: identical forward+backward structure, then forward only (the same
    #    computation from the same inputs, renamed)
    FA = _forward_hashes(ga, in_map, init_map)
    FB = _forward_hashes(gb, {}, {})
    BA = _backward_hashes(ga, FA, out_map)
    BB = _backward_hashes(gb, FB, {})
    for ka, kb in ((BA, BB), (FA, FB)):
        m.by_hash(ka, kb)

    # 3. propagate along edges from matched pairs to unmatched neighbours: first nodes with the
    #    same content (op, attributes, arity), then nodes that differ only in attributes but
    #    read exactly the same inputs
    while True:
        m.propagate(_strict_key, None)
        if not m.propagate(_loose_key, m.same_inputs):
            break
    return m.match
