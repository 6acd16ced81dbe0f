"""Prompts for the real-model demo: the held-out demo instructions, and the
instructions the draft is distilled on (built from the Python standard
library's own docstrings, so nothing is downloaded).

The demo prompts are written by hand and never appear in the distillation
set (``training_instructions`` drops any instruction that shares a
function name or topic word with them; a test checks it).
"""
from __future__ import annotations

import ast
import hashlib
import re
import sysconfig
from pathlib import Path

# What `make demo` decodes: real instructions, through SmolLM2's chat template.
DEMO_PROMPTS: list[str] = [
    "Write a Python function that checks whether a string is a palindrome.",
    "Explain the difference between a list and a tuple in Python.",
    "Write a Python function that counts how many times each word appears in a text.",
    "Give three tips for writing readable code.",
]

# The warm-up before the timed runs (every width once); not a demo prompt, not a training one.
WARMUP_PROMPT = "Write a short poem about the sea."

# words that tie an instruction to a demo prompt; such instructions are left out
_HELD_OUT_WORDS = ("palindrome", "tuple", "word count", "count words", "words", "readable")

# Instruction templates. {name}: function name, {sig}: signature, {what}: the
# docstring's first sentence with a lower-case first letter and no final stop,
# {mod}: module, {topic}: a language reference topic.
_FUNC_TEMPLATES = [
    "Write a Python function `{name}{sig}` that {what}.",
    "Write a Python function that {what}.",
    "What does the Python function `{mod}.{name}` do? Its documentation says: \"{doc}\"",
    "Explain, with a short example, how to use `{mod}.{name}`.",
    "Write a Python function that {what}. Add a docstring and a usage example.",
    "Implement `{name}{sig}` in Python: {what}.",
]
_CLASS_TEMPLATES = [
    "Write a Python class `{name}` that {what}.",
    "Explain what the class `{mod}.{name}` is for: \"{doc}\"",
]
_MODULE_TEMPLATES = [
    "What is the Python module `{mod}` used for? Its documentation begins: \"{doc}\"",
    "Give an example program that uses the Python module `{mod}`.",
]
_TOPIC_TEMPLATES = [
    "Explain {topic} in Python.",
    "Explain {topic} in Python, with an example.",
]


# Prose instructions (``prose_instructions``): advice, comparisons, summaries, whose answers are
# lists and paragraphs rather than code. {mod}: module; {a}, {b}: two public functions of it;
# {doc}: the module docstring's first sentence; {topic}: a language reference topic.
_PROSE_MODULE_TEMPLATES = [
    "Give three tips for using the Python module `{mod}`.",
    "What are common mistakes people make with the Python module `{mod}`, and how can they be avoided?",
    "List the main steps to get started with the Python module `{mod}`.",
    "Write a short paragraph that explains to a beginner what the Python module `{mod}` is for.",
    "What are the advantages and disadvantages of using the Python module `{mod}`?",
    "Summarize in plain English, in a few sentences: \"{doc}\"",
]
_PROSE_PAIR_TEMPLATES = [
    "Explain the difference between `{mod}.{a}` and `{mod}.{b}`.",
    "When should I use `{mod}.{a}` instead of `{mod}.{b}`?",
    "Compare `{mod}.{a}` and `{mod}.{b}` in a few sentences.",
]
_PROSE_TOPIC_TEMPLATES = [
    "Give three tips about {topic} in Python.",
    "Summarize {topic} in Python in a few sentences, for a beginner.",
    "What are common mistakes with {topic} in Python?",
    "List the key points to remember about {topic} in Python.",
]


def stdlib_dir() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def _first_sentence(doc: str) -> str | None:
    para = doc.strip().split("\n\n")[0]
    text = " ".join(para.split())
    m = re.match(r"(.+?[.!?])(\s|$)", text)
    s = (m.group(1) if m else text).strip()
    if not (12 <= len(s) <= 160) or not s[0].isalpha():
        return None
    if any(ch in s for ch in "<>{}|\\") or s.lower().startswith(("deprecated", "internal", "helper")):
        return None
    return s


def _what(sentence: str) -> str:
    s = sentence.rstrip(".!?")
    first = s.split(" ", 1)[0]
    # "Return the ..." -> "returns the ..."; "Get ..." -> "gets ..."
    if first.isalpha() and first[0].isupper() and first[1:].islower():
        verb = first.lower()
        if verb.endswith(("s", "sh", "ch", "x", "z")):
            verb += "es"
        elif verb.endswith("y") and verb[-2:-1] not in "aeiou":
            verb = verb[:-1] + "ies"
        else:
            verb += "s"
        rest = s[len(first):]
        return verb + rest
    return s[0].lower() + s[1:]


def _signature(fn: ast.FunctionDef) -> str:
    args = [a.arg for a in fn.args.posonlyargs + fn.args.args if a.arg not in ("self", "cls")]
    if fn.args.vararg:
        args.append("*" + fn.args.vararg.arg)
    args += [a.arg for a in fn.args.kwonlyargs]
    if fn.args.kwarg:
        args.append("**" + fn.args.kwarg.arg)
    return "(" + ", ".join(args) + ")"


def _module_files() -> list[tuple[str, Path]]:
    root = stdlib_dir()
    out = []
    for p in sorted(root.glob("*.py")):
        out.append((p.stem, p))
    for pkg in ("json", "email", "http", "urllib", "collections", "concurrent/futures", "importlib",
                "logging", "xml/etree", "unittest", "asyncio", "sqlite3", "html", "wsgiref", "zoneinfo"):
        for p in sorted((root / pkg).glob("*.py")):
            mod = (pkg.replace("/", ".") + ("" if p.stem == "__init__" else "." + p.stem))
            out.append((mod, p))
    return [(m, p) for m, p in out if not m.startswith(("_", "test", "this", "antigravity"))]


def _items(mod: str, path: Path):
    try:
        tree = ast.parse(path.read_text(encoding="utf-8", errors="replace"))
    except (SyntaxError, ValueError):
        return
    doc = ast.get_docstring(tree)
    if doc and _first_sentence(doc):
        yield "module", mod, mod, None, _first_sentence(doc)
    for node in tree.body:
        nodes = [node]
        if isinstance(node, ast.ClassDef):
            nodes += [n for n in node.body if isinstance(n, ast.FunctionDef)]
        for n in nodes:
            if not isinstance(n, (ast.FunctionDef, ast.ClassDef)) or n.name.startswith("_"):
                continue
            d = ast.get_docstring(n)
            s = _first_sentence(d) if d else None
            if not s:
                continue
            kind = "class" if isinstance(n, ast.ClassDef) else "func"
            yield kind, mod, n.name, (_signature(n) if kind == "func" else None), s


def _pick(templates: list[str], key: str) -> str:
    i = int(hashlib.sha256(key.encode()).hexdigest()[:8], 16)
    return templates[i % len(templates)]


def _held_out(text: str) -> bool:
    t = text.lower()
    return any(w in t for w in _HELD_OUT_WORDS)


def _collector():
    """(add, out): ``add(s)`` appends s to ``out`` unless it is there already or held out."""
    seen: set[str] = set()
    out: list[str] = []

    def add(s: str):
        if s not in seen and not _held_out(s):
            seen.add(s)
            out.append(s)
    return add, out


def training_instructions() -> list[str]:
    """Every instruction the standard library yields, in a fixed order (deduplicated);
    callers shuffle with their own seed."""
    add, out = _collector()

    for mod, path in _module_files():
        for kind, m, name, sig, sentence in _items(mod, path):
            vals = {"name": name, "sig": sig or "", "what": _what(sentence), "doc": sentence, "mod": m}
            if kind == "module":
                add(_pick(_MODULE_TEMPLATES, mod).format(**vals))
            elif kind == "class":
                add(_pick(_CLASS_TEMPLATES, f"{m}.{name}").format(**vals))
            else:
                add(_pick(_FUNC_TEMPLATES, f"{m}.{name}").format(**vals))
    try:
        from pydoc_data.topics import topics
    except ImportError:  # pragma: no cover
        topics = {}
    for key in sorted(topics):
        title = key.replace("-", " ")
        add(_pick(_TOPIC_TEMPLATES, key).format(topic=f"`{title}`" if " " not in title else title))
    return out


def _topics() -> list[str]:
    try:
        from pydoc_data.topics import topics
    except ImportError:  # pragma: no cover
        return []
    return [f"`{k.replace('-', ' ')}`" if "-" not in k else k.replace("-", " ") for k in sorted(topics)]


def prose_instructions() -> list[str]:
    """Instructions whose answers are prose (advice, comparisons, summaries), from the same
    standard library: per module one advice or summary instruction and one comparison of two of
    its public functions, per language topic one; held-out words dropped as in
    ``training_instructions``. Fixed order, deduplicated; callers shuffle."""
    add, out = _collector()

    for mod, path in _module_files():
        items = list(_items(mod, path))
        docs = [sentence for kind, _, _, _, sentence in items if kind == "module"]
        funcs = sorted({name for kind, _, name, _, _ in items if kind == "func"})
        add(_pick(_PROSE_MODULE_TEMPLATES, "prose:" + mod).format(mod=mod, doc=docs[0] if docs else mod))
        if len(funcs) >= 2:
            i = int(hashlib.sha256(("pair:" + mod).encode()).hexdigest()[:8], 16)
            a, b = funcs[i % len(funcs)], funcs[(i // len(funcs) + 1 + i) % len(funcs)]
            if a != b:
                add(_pick(_PROSE_PAIR_TEMPLATES, "pair:" + mod).format(mod=mod, a=a, b=b))
    for t in _topics():
        add(_pick(_PROSE_TOPIC_TEMPLATES, "prose:" + t).format(topic=t))
    return out
