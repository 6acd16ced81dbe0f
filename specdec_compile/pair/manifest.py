"""``pair.json``: the small manifest of a pair directory (docs/CONTRACT.md, "The pair directory").

Written by ``specdec-compile pair``, read by ``specdec-run --pair``. Paths in it are relative
to the pair directory and must stay inside it; a file that is not one is refused in one line.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from ..errors import SpecdecError

PAIR_FILE = "pair.json"
FORMAT = "specdec-pair"
FORMAT_VERSION = 1
#: what drafts: a compiled draft model, an imported speculators head, or no model
DRAFT_KINDS = ("model", "head", "ngram", "suffix")


def cache_key(settings: dict, inputs: dict) -> str:
    """The settings and the inputs' content hashes (not their paths): 16 hex digits."""
    from .. import __version__
    text = json.dumps({"format_version": FORMAT_VERSION, "version": __version__, "settings": settings,
                       "inputs": {k: v["sha256"] for k, v in inputs.items()}}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def dumps(m: dict) -> str:
    return json.dumps(m, indent=2, sort_keys=True) + "\n"


def read_pair(out: str | os.PathLike, *, missing_ok: bool = False) -> dict | None:
    """``OUT/pair.json``, checked: the format, the draft kind, the artifact folders (relative,
    inside OUT, present). ``missing_ok``: None when OUT has no pair.json."""
    out = Path(out)
    path = out / PAIR_FILE
    if not path.is_file():
        if missing_ok:
            return None
        what = "no such directory" if not out.exists() else f"no {PAIR_FILE} in it"
        raise SpecdecError(f"--pair {out}: {what} (a pair directory is what specdec-compile pair -o OUT writes)")
    try:
        m = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError, OSError) as e:
        raise SpecdecError(f"{path}: not readable JSON ({type(e).__name__})") from None
    if not isinstance(m, dict) or m.get("format") != FORMAT:
        raise SpecdecError(f"{path}: not a pair manifest (format {FORMAT!r} expected)")
    if m.get("format_version") != FORMAT_VERSION:
        raise SpecdecError(f"{path}: format_version {m.get('format_version')!r}; this specdec-compile reads "
                           f"{FORMAT_VERSION}: rebuild the pair with specdec-compile pair --force")
    if m.get("draft") not in DRAFT_KINDS:
        raise SpecdecError(f"{path}: draft {m.get('draft')!r} is not one of {', '.join(DRAFT_KINDS)}")
    want_dlm = m["draft"] in ("model", "head")
    for key in ("tlm", "dlm", "tokenizer"):
        if key == "dlm" and not want_dlm:
            if m.get("dlm") is not None:
                raise SpecdecError(f"{path}: draft {m['draft']!r} has no draft model, but dlm is {m['dlm']!r}")
            continue
        if key == "tokenizer" and m.get(key) is None:
            continue
        m[key] = str(inside(out, m.get(key), f"{path}: {key}"))
    return m


def inside(out: Path, rel, what: str) -> Path:
    """``out / rel`` for a relative path naming an existing folder inside ``out``."""
    if not isinstance(rel, str) or not rel or os.path.isabs(rel) or ".." in Path(rel).parts:
        raise SpecdecError(f"{what} must be a folder name relative to the pair directory, got {rel!r}")
    p = out / rel
    if not p.is_dir():
        raise SpecdecError(f"{what}: {p} is missing")
    return p
