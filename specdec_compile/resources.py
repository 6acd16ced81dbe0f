"""Locate the data directories (templates/, patches/) in any install layout.

A wheel carries them inside the package (``specdec_compile/templates``); a
source checkout or editable install has them at the repository top level.
"""
from __future__ import annotations

from pathlib import Path

_PKG = Path(__file__).resolve().parent


def data_dir(name: str) -> Path:
    for candidate in (_PKG / name, _PKG.parent / name):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"data directory {name!r} not found next to {_PKG}")


def templates_dir() -> Path:
    return data_dir("templates")


def patches_dir() -> Path:
    return data_dir("patches")
