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
#: the targets a pair is built for (verify runs both on ONNX Runtime)
TARGETS = ("ort", "qaic")


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
    inside OUT, present), the target, k and settings' types. ``missing_ok``: None when OUT has no pair.json."""
    out = Path(out)
    path = out / PAIR_FILE
    if not path.is_file():
        if missing_ok:
            return None
        what = ("no such directory" if not out.exists() else
                f"a file, not the directory that holds it (give --pair {out.parent})" if out.name == PAIR_FILE
                else "not a directory" if not out.is_dir() else f"no {PAIR_FILE} in it")
        raise SpecdecError(f"--pair {out}: {what} (a pair directory is what specdec-compile pair -o OUT writes)")
    try:
        m = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError, OSError) as e:
        raise SpecdecError(f"{path}: not readable JSON ({type(e).__name__})") from None
    if not isinstance(m, dict) or m.get("format") != FORMAT:
        raise SpecdecError(f"{path}: not a pair manifest (format {FORMAT!r} expected)")
    if m.get("format_version") != FORMAT_VERSION or type(m.get("format_version")) is not int:
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
    _check_fields(path, m)
    return m


def _check_fields(path: Path, m: dict) -> None:
    """The fields a reader acts on, of the types pair.json has: never read as something else."""
    if m.get("target") not in TARGETS:
        raise SpecdecError(f"{path}: target {m.get('target')!r} is not one of {', '.join(TARGETS)}")
    k = m.get("k")
    if type(k) is not int or k < 1:
        raise SpecdecError(f"{path}: k {k!r} is not an integer >= 1")
    settings = m.get("settings")
    if settings is not None and not isinstance(settings, dict):
        raise SpecdecError(f"{path}: settings {settings!r} is not an object")
    qaic = (settings or {}).get("qaic")
    if qaic is not None and not isinstance(qaic, dict):
        raise SpecdecError(f"{path}: settings.qaic {qaic!r} is not an object")
    group = (qaic or {}).get("device_group")
    if group is not None and (not isinstance(group, list) or not group or len(set(map(repr, group))) != len(group)
                              or not all(type(i) is int and i >= 0 for i in group)):
        raise SpecdecError(f"{path}: settings.qaic.device_group {group!r} is not a list of distinct device ids "
                           f">= 0 like [0, 1]")


def inside(out: Path, rel, what: str) -> Path:
    """``out / rel`` for a relative path naming an existing folder inside ``out`` (a link that leads out
    of ``out`` is refused: the pair is what its directory holds)."""
    if not isinstance(rel, str) or not rel or os.path.isabs(rel) or ".." in Path(rel).parts:
        raise SpecdecError(f"{what} must be a folder name relative to the pair directory, got {rel!r}")
    p = out / rel
    if not p.is_dir():
        raise SpecdecError(f"{what}: {p} is missing")
    if Path(out).resolve() not in p.resolve().parents:
        raise SpecdecError(f"{what}: {p} is not a folder inside the pair directory (it is {p.resolve()})")
    return p
