"""The ops a graph uses, checked against device precedent or a compiler's op list.

    op_uses(model)                 every node, model-local function bodies and subgraphs included
    op_set(model)                  the op set, as the manifest records it
    load_precedent()               qaic_precedent.tsv: op -> where QEfficient's device graphs use it
    without_precedent(model)       the first use of each op that has no device precedent
    render_precedent_table()       the precedent data as the markdown table of docs/qaic-ops.md
    read_supported_ops(path)       an operator list as ``qaic-exec -operators-supported=onnx`` writes it
    not_supported(model, ops)      the first use of each op the list lacks

A call of a model-local function (``com.qualcomm.cloud::CtxScatter``) is
itself an op of the graph for the precedent check (the device compiler must
know the function); for a supported-ops list only its body counts, since
``qaic-exec`` lists ONNX operators, not the functions a model defines.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import onnx

from ..errors import SpecdecError

PRECEDENT_FILE = Path(__file__).with_name("qaic_precedent.tsv")
_DEFAULT_DOMAINS = ("", "ai.onnx")


@dataclass(frozen=True)
class OpUse:
    """One node: its op, domain ("" for ai.onnx), name, and where it sits
    (``graph``, or ``function <domain>::<name>``)."""
    op: str
    domain: str
    node: str
    where: str = "graph"
    local_function: bool = False

    @property
    def key(self) -> tuple[str, str]:
        return (self.domain, self.op)

    def describe(self) -> str:
        name = f"{self.domain}::{self.op}" if self.domain else self.op
        place = f" in {self.where}" if self.where != "graph" else ""
        return f"{name} (node {self.node!r}{place})"


def _domain(d: str) -> str:
    return "" if d in _DEFAULT_DOMAINS else d


def _nodes(nodes, where: str, local: set[tuple[str, str]]):
    for i, n in enumerate(nodes):
        key = (_domain(n.domain), n.op_type)
        yield OpUse(op=n.op_type, domain=key[0], node=n.name or f"{n.op_type}__{i}", where=where,
                    local_function=key in local)
        for a in n.attribute:  # If/Loop/Scan bodies
            for g in ([a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)):
                yield from _nodes(g.node, f"{where} > {n.name or n.op_type}.{a.name}", local)


def op_uses(model: onnx.ModelProto) -> list[OpUse]:
    """Every node of ``model``: the graph's, then each model-local function's body."""
    local = {(_domain(f.domain), f.name) for f in model.functions}
    uses = list(_nodes(model.graph.node, "graph", local))
    for f in model.functions:
        uses += _nodes(f.node, f"function {f.domain}::{f.name}", local)
    return uses


def _name(domain: str, op: str) -> str:
    return f"{domain}::{op}" if domain else op


def op_set(model: onnx.ModelProto) -> dict:
    """{"graph": sorted ops of the graph, "functions": {"domain::name": sorted ops of its body}}."""
    graph = sorted({_name(u.domain, u.op) for u in _nodes(model.graph.node, "graph", set())})
    functions = {}
    for f in model.functions:
        functions[_name(f.domain, f.name)] = sorted({_name(u.domain, u.op) for u in _nodes(f.node, "", set())})
    return {"graph": graph, "functions": functions}


def _first_per_op(uses) -> list[OpUse]:
    seen, out = set(), []
    for u in uses:
        if u.key not in seen:
            seen.add(u.key)
            out.append(u)
    return out


# --------------------------------------------------------------------------- precedent

@dataclass(frozen=True)
class Precedent:
    op: str
    domain: str
    source: str


def load_precedent(path: str | Path | None = None) -> dict[tuple[str, str], Precedent]:
    """(domain, op) -> Precedent, from the tab-separated data file."""
    found = {}
    for n, line in enumerate(Path(path or PRECEDENT_FILE).read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        parts = line.split("\t")
        if len(parts) != 3 or not parts[0] or not parts[2].strip():
            raise ValueError(f"{path or PRECEDENT_FILE}:{n}: expected 'op<TAB>domain<TAB>source'")
        p = Precedent(op=parts[0], domain=_domain(parts[1]), source=parts[2].strip())
        found[(p.domain, p.op)] = p
    return found


def without_precedent(model: onnx.ModelProto, precedent: dict | None = None) -> list[OpUse]:
    """The first use of each op of ``model`` (functions included) with no device precedent."""
    precedent = load_precedent() if precedent is None else precedent
    return _first_per_op(u for u in op_uses(model) if u.key not in precedent)


def render_precedent_table(precedent: dict | None = None) -> str:
    """docs/qaic-ops.md's table of the ops with device precedent, from the data file."""
    precedent = load_precedent() if precedent is None else precedent
    rows = ["| op | where QEfficient's device graphs use it (`QEfficient/...`) |", "| --- | --- |"]
    for (domain, op), p in sorted(precedent.items(), key=lambda kv: (kv[0][0] != "", kv[0][1])):
        source = p.source.replace("|", "\\|")
        rows.append(f"| `{_name(domain, op)}` | {source} |")
    return "\n".join(rows) + "\n"


# --------------------------------------------------------------------------- supported-ops lists

_TOKEN = re.compile(r"^(?:(?P<domain>[A-Za-z][\w.]*)::?)?(?P<op>[A-Z][A-Za-z0-9_]*)"
                    r"(?:(?:-|_v|:|@)\d+(?:[.,]\d+)*|\(\d+(?:[.,\s]*\d+)*\))?$")


def _op_token(token: str) -> str | None:
    m = _TOKEN.match(token.strip().strip("`*\"'"))
    return m.group("op") if m else None


def _line_ops(line: str) -> list[str]:
    line = line.split("#", 1)[0].strip()
    if not line or set(line) <= set("|-: "):
        return []
    if line.startswith("|"):  # a markdown table row: the first cell names the op
        op = _op_token(line.strip("|").split("|")[0])
        return [op] if op else []
    tokens = [t for t in re.split(r"[\s,;]+", line) if t]
    ops = [_op_token(t) for t in tokens]
    if all(ops):  # a line of op names
        return ops
    return [ops[0]] if ops[0] else []  # "Add 1,6,7,13,14 notes...": the first token


def read_supported_ops(path: str | Path) -> set[str]:
    """The op names of an operator list. ``qaic-exec -operators-supported=onnx``
    writes OnnxSupportedOperators.txt; its exact layout is not published, so the
    plausible ones are read: one op a line (optionally ``domain:Op``, ``Op-13``,
    or followed by opset versions and notes), comma-separated op names, or a
    markdown table whose first column names the op. ``#`` starts a comment."""
    from ..model_io import MAX_TEXT_BYTES, read_limited
    p = Path(path)
    try:
        text = read_limited(p, "an operator list", MAX_TEXT_BYTES).decode("utf-8", errors="replace")
    except SpecdecError as e:
        raise SpecdecError(f"--supported-ops {e}") from None
    ops = {op for line in text.splitlines() for op in _line_ops(line)}
    if not ops:
        raise SpecdecError(f"--supported-ops {p}: no operator names found (expected one ONNX op name a line)")
    return ops


def not_supported(model: onnx.ModelProto, supported: set[str]) -> list[OpUse]:
    """The first use of each op of ``model`` not in ``supported``; calls of
    model-local functions are checked through their bodies."""
    return _first_per_op(u for u in op_uses(model) if not u.local_function and u.op not in supported)
