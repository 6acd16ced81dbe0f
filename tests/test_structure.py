"""The code's shape, checked statically over the package and the workshop/, demo/ and
bench/ packages: no import cycle, importable in any order, no function longer than about
80 lines, no module longer than about 600, and no ``sys.path`` edits in workshop/, demo/,
bench/ or scripts/ (they are packages, run with ``python -m``).

These are the limits the structure issue set so that each new graph pattern is
one new small module; a test failing here means a function or module grew past
them and should be split, not that the limit should move.
"""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "specdec_compile"
#: every package whose shape is checked: the compiler, the model workshop, the demo and the benchmarks
PACKAGES = (PKG, ROOT / "workshop", ROOT / "demo", ROOT / "bench")
PACKAGE_NAMES = {p.name for p in PACKAGES}
MAX_FUNCTION_LINES = 80
MAX_MODULE_LINES = 600


def _modules() -> dict[str, Path]:
    mods = {}
    for pkg in PACKAGES:
        for p in sorted(pkg.rglob("*.py")):
            parts = list(p.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            mods[".".join(parts)] = p
    return mods


def _resolve(mod: str, path: Path, node: ast.ImportFrom | ast.Import, known: set[str]) -> set[str]:
    """Package modules an import statement (at any depth in the file) loads."""
    out = set()
    if isinstance(node, ast.Import):
        for alias in node.names:
            if alias.name.split(".")[0] in PACKAGE_NAMES:
                out.add(alias.name)
        return {m for m in out if m in known}
    if node.level:
        base = mod.split(".") if path.name == "__init__.py" else mod.split(".")[:-1]
        base = base[: len(base) - (node.level - 1)]
        target = ".".join(base + ([node.module] if node.module else []))
    else:
        target = node.module or ""
    if target.split(".")[0] not in PACKAGE_NAMES:
        return set()
    for alias in node.names:  # "from . import diff" names a module, not an attribute
        if f"{target}.{alias.name}" in known:
            out.add(f"{target}.{alias.name}")
    if target in known:
        out.add(target)
    # importing a.b.c imports a and a.b first
    parts = target.split(".")
    out |= {".".join(parts[:i]) for i in range(1, len(parts)) if ".".join(parts[:i]) in known}
    return out


def import_graph() -> dict[str, set[str]]:
    mods = _modules()
    known = set(mods)
    graph = {}
    for mod, path in mods.items():
        deps = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                deps |= _resolve(mod, path, node, known)
        deps.discard(mod)
        # a package's __init__ is loaded before any of its modules: that is not an edge back
        graph[mod] = {d for d in deps if not mod.startswith(d + ".")}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        stack.append(m)
        for d in sorted(graph.get(m, ())):
            if state.get(d) == 1:
                return stack[stack.index(d):] + [d]
            if d not in state:
                found = visit(d)
                if found:
                    return found
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state:
            found = visit(m)
            if found:
                return found
    return None


def test_no_import_cycle_anywhere_in_the_packages():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_cycle_finder_finds_a_planted_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_every_module_imports_first_in_a_fresh_interpreter_state():
    # each module imported first (package modules dropped from sys.modules between them), then
    # all of them in reverse order: an order-dependent import fails here
    code = (
        "import importlib, sys\n"
        f"mods = {sorted(_modules())!r}\n"
        "def fresh():\n"
        f"    for m in [m for m in sys.modules if m.split('.')[0] in {sorted(PACKAGE_NAMES)!r}]:\n"
        "        del sys.modules[m]\n"
        "for m in mods:\n"
        "    fresh(); importlib.import_module(m)\n"
        "fresh()\n"
        "for m in reversed(mods):\n"
        "    importlib.import_module(m)\n"
        "print('ok', len(mods))\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=ROOT)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.startswith("ok")


def test_no_function_longer_than_about_80_lines():
    long = []
    for mod, path in _modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    long.append(f"{mod}.{node.name}: {n} lines")
    assert not long, "functions too long: " + "; ".join(long)


def test_no_module_longer_than_about_600_lines():
    long = [f"{mod}: {n}" for mod, path in _modules().items()
            if (n := len(path.read_text().splitlines())) > MAX_MODULE_LINES]
    assert not long, "modules too long: " + "; ".join(long)


#: the one script that reaches the test suite's helpers (tests/coverage/matrix.py and
#: tests/models.py, imported by their bare names as pytest imports them)
SYS_PATH_ALLOWED = {"scripts/coverage_matrix.py"}


def test_the_demo_and_the_benchmarks_are_packages_without_sys_path_edits():
    """workshop/, demo/, bench/ and scripts/ import each other as packages (``python -m
    demo.run_demo``); none of them edits ``sys.path`` to find a sibling by its bare name."""
    for pkg in PACKAGES[1:]:
        assert (pkg / "__init__.py").is_file(), f"{pkg.name}/ is not a package"
    edits = []
    for d in ("workshop", "demo", "bench", "scripts"):
        for p in sorted((ROOT / d).rglob("*.py")):
            if p.relative_to(ROOT).as_posix() in SYS_PATH_ALLOWED:
                continue
            for node in ast.walk(ast.parse(p.read_text())):
                if (isinstance(node, ast.Attribute) and node.attr == "path" and isinstance(node.value, ast.Name)
                        and node.value.id == "sys"):
                    edits.append(f"{p.relative_to(ROOT)}:{node.lineno}")
    assert not edits, "sys.path used in: " + ", ".join(edits)


#: the layers: a module under the first never imports (at any depth in the file) a module under
#: any of the second. detect/ finds, passes/ rewrite what it found; the artifact format is read
#: and written without the compiler's driver, the runtime or the CLI; the runtime runs artifacts
#: without the compiler. The workshop makes models and never imports the demo or the benchmarks;
#: the demo never imports the benchmarks.
LAYERS = (
    ("specdec_compile.detect", ("specdec_compile.passes",)),
    ("specdec_compile.artifact", ("specdec_compile.runtime", "specdec_compile.pipeline", "specdec_compile.cli")),
    ("specdec_compile.runtime", ("specdec_compile.pipeline", "specdec_compile.passes", "specdec_compile.detect")),
    ("workshop", ("demo", "bench")),
    ("demo", ("bench",)),
)


def layer_violations(graph: dict[str, set[str]]) -> list[str]:
    def under(m: str, pkg: str) -> bool:
        return m == pkg or m.startswith(pkg + ".")
    return [f"{m} imports {d}" for low, banned in LAYERS for m, deps in sorted(graph.items()) if under(m, low)
            for d in sorted(deps) if any(under(d, b) for b in banned)]


def test_the_layers_hold():
    graph = import_graph()
    assert all(any(m == low or m.startswith(low + ".") for m in graph) for low, _ in LAYERS)
    bad = layer_violations(graph)
    assert not bad, "layer broken: " + "; ".join(bad)


def test_layer_check_finds_a_planted_violation():
    graph = {"specdec_compile.artifact.reader": {"specdec_compile.runtime.tokenizer"},
             "specdec_compile.detect.layers": {"specdec_compile.passes.lower"},
             "specdec_compile.runtime.batch": {"specdec_compile.artifact.reader"}}
    assert layer_violations(graph) == [
        "specdec_compile.detect.layers imports specdec_compile.passes.lower",
        "specdec_compile.artifact.reader imports specdec_compile.runtime.tokenizer"]


#: private names still imported across modules, each waiting for its fix (issue 32); the list only
#: shrinks
PRIVATE_IMPORTS_PENDING: set[str] = set()


def private_imports(path: Path, rel: str) -> set[str]:
    """Names starting with one underscore that a module takes from another package module: by
    ``from X import _name`` or as ``module._name`` after ``from . import module`` / ``import a.b``."""
    tree = ast.parse(path.read_text())
    out, modules = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").split(".")[0] in PACKAGE_NAMES):
            out |= {f"{rel}: {a.name}" for a in node.names if a.name.startswith("_") and not a.name.startswith("__")}
            modules |= {a.asname or a.name for a in node.names}
        elif isinstance(node, ast.Import):
            modules |= {a.asname or a.name.split(".")[0] for a in node.names if a.name.split(".")[0] in PACKAGE_NAMES}
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in modules
                and node.attr.startswith("_") and not node.attr.startswith("__")):
            out.add(f"{rel}: {node.attr}")
    return out


def test_no_private_name_is_used_outside_its_module():
    found = set()
    for path in _modules().values():
        found |= private_imports(path, path.relative_to(ROOT).as_posix())
    assert found <= PRIVATE_IMPORTS_PENDING, sorted(found - PRIVATE_IMPORTS_PENDING)


def test_private_import_check_finds_planted_uses(tmp_path):
    p = tmp_path / "m.py"
    p.write_text("from .generation import _Generation, OnTokens\nfrom . import metrics\n"
                 "x = metrics._Meter\nfrom os import _exit\n")
    assert private_imports(p, "m.py") == {"m.py: _Generation", "m.py: _Meter"}


def test_layer_check_keeps_the_workshop_below_the_demo():
    graph = {"workshop.distill": {"demo.real_demo"}, "demo.real_demo": {"workshop.distill", "bench.spec"},
             "bench.spec": {"demo.real_demo", "workshop.train_pair"}}
    assert layer_violations(graph) == ["workshop.distill imports demo.real_demo", "demo.real_demo imports bench.spec"]
