"""Rendering of diff and explain reports: stable text, JSON, and rich colours."""
from __future__ import annotations

import json
import os
import sys

from ..errors import SpecdecError
from .hashing import short_digest
from .index import fmt_shape
from .sections import is_empty


def _escape(c: str) -> str:
    o = ord(c)
    return {"\n": "\\n", "\r": "\\r", "\t": "\\t"}.get(c) or (
        f"\\x{o:02x}" if o < 0x100 else f"\\u{o:04x}" if o < 0x10000 else f"\\U{o:08x}")


def _visible(text: str) -> str:
    """``text`` with each character that does not print (control and format characters such as
    a newline, a terminal escape or a bidirectional override; separators but the space) written
    as an escape (``\\n``, ``\\x1b``, ``\\u202e``): a name cannot forge, hide or reorder report lines."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else _escape(c) for c in text)


def _check_report(report) -> None:
    if not (isinstance(report, dict) and report.get("kind") in ("diff", "explain")):
        raise SpecdecError(f"expected a report from diff_files, diff_models or diff_snapshots, "
                           f"got {type(report).__name__}")


def render_json(report: dict) -> str:
    """The report as JSON with sorted keys (stable)."""
    _check_report(report)
    return json.dumps(report, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def _io_lines(title: str, sec: dict) -> list[tuple[str, str]]:
    lines = []
    if is_empty(sec):
        return lines
    lines.append((f"  {title}", "bold"))
    for e in sec["removed"]:
        lines.append((f"    - {e['name']}  {e['dtype']} {fmt_shape(e['shape'])}", "red"))
    for e in sec["added"]:
        lines.append((f"    + {e['name']}  {e['dtype']} {fmt_shape(e['shape'])}", "green"))
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
        parts.append(f"shape {fmt_shape(e['shape'][0])} -> {fmt_shape(e['shape'][1])}")
    if "position" in e:
        parts.append(f"position {e['position'][0]} -> {e['position'][1]}")
    if "source" in e:
        parts.append(f"from {e['source'][0]} -> {e['source'][1]}")
    return ("  " + "; ".join(parts)) if parts else ""


def _fmt_meta(v) -> str:
    if v is None:
        return "(none)"
    if isinstance(v, str) and v.startswith("sha256:"):
        return short_digest(v)
    return str(v)


def _node_text(e: dict) -> str:
    if e.get("name"):
        return e["name"]
    return "(-> " + ", ".join(e.get("outputs", [])) + ")"


def _diff_lines(r: dict, indent: str = "") -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []

    def add(text, style=""):
        out.append((indent + text, style))

    if not is_empty(r["interface"]):
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
                    outer = " (outer scope)" if s.get("outer_scope") else ""
                    add(f"        input {s['slot']}{outer}: {before} -> {after}", "yellow")
                for a in e.get("attributes", []):
                    add(f"        {a['name']}: {a['before'] if a['before'] is not None else '(none)'} -> "
                        f"{a['after'] if a['after'] is not None else '(none)'}", "yellow")
    ini = r["initializers"]
    if not is_empty(ini):
        add("initializers", "bold cyan")
        for sign, kind, style in (("-", "removed", "red"), ("+", "added", "green")):
            for e in ini[kind]:
                listed = "  (also a graph input)" if e.get("graph_input") else ""
                add(f"  {sign} {e['name']}  {e['dtype']} {fmt_shape(e['shape'])} {short_digest(e['sha256'])}{listed}",
                    style)
        for e in ini["renamed"]:
            add(f"  ~ {e['from']} -> {e['to']}  (same content{'; ' + _listed(e) if 'graph_input' in e else ''})",
                "yellow")
        for e in ini["changed"]:
            parts = []
            if "dtype" in e:
                parts.append(f"dtype {e['dtype'][0]} -> {e['dtype'][1]}")
            if "shape" in e:
                parts.append(f"shape {fmt_shape(e['shape'][0])} -> {fmt_shape(e['shape'][1])}")
            if e["sha256"][0] != e["sha256"][1]:
                parts.append(f"{short_digest(e['sha256'][0])} -> {short_digest(e['sha256'][1])}")
            if "graph_input" in e:
                parts.append(_listed(e))
            add(f"  ~ {e['name']}  " + "; ".join(parts), "yellow")
    return out


def _listed(e: dict) -> str:
    """An initializer's listing in graph.input, before and after."""
    a, b = ("yes" if x else "no" for x in e["graph_input"])
    return f"also a graph input: {a} -> {b}"


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
    """The report as (text, rich style) lines; render_text joins the text. Control characters in
    names are escaped (``_visible``), so each line is one line."""
    _check_report(report)
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
    return [(_visible(t), style) for t, style in lines]


def render_text(report: dict) -> str:
    """Plain text, no colours, no wrapping: stable for golden tests."""
    return "".join(t + "\n" for t, _ in report_lines(report))


def print_report(report: dict, file=None, color: bool | None = None) -> None:
    """Print the report; ``color=None``: colours only on a terminal without NO_COLOR."""
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

