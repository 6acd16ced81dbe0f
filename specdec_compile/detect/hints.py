"""Finder support: the family hints, ``patches/default.json`` extended by
``patches/<family>.json`` (lists are extended, dicts merged, scalars replaced).

Hints are tie-breakers and op lists, never the primary evidence: detection is
structural first."""
from __future__ import annotations

import json
from functools import lru_cache

from ..resources import patches_dir


def merge_hints(base: dict, extra: dict) -> dict:
    """``base`` extended by ``extra`` (a new dict; neither argument changes)."""
    hints = dict(base)
    for key, value in extra.items():
        if isinstance(value, list) and isinstance(hints.get(key), list):
            hints[key] = hints[key] + [v for v in value if v not in hints[key]]
        elif isinstance(value, dict) and isinstance(hints.get(key), dict):
            hints[key] = {**hints[key], **value}
        else:
            hints[key] = value
    return hints


@lru_cache(maxsize=None)
def load_hints(family: str | None) -> dict:
    hints = json.loads((patches_dir() / "default.json").read_text())
    if family:
        fam = patches_dir() / f"{family}.json"
        if fam.exists():
            hints = merge_hints(hints, json.loads(fam.read_text()))
    return hints
