"""Lists of decoder layers given on the command line (``--hidden-states``,
``--feature-layers``): parsed, and resolved against a model's layer count.

Indices count from 0; negative ones count from the end (-1: the last layer,
its output before the final norm). A list is refused in one line when it is
empty, not integers, names a layer twice (also after resolving: 1 and -1 of
a 2-layer model) or a layer the model does not have."""
from __future__ import annotations

import re

from .errors import SpecdecError


#: one integer of a list: ASCII digits, an optional minus (int() would also read "1_0" as 10, "+3"
#: and other scripts' digits)
INTEGER = re.compile(r"-?[0-9]+")


def parse_ints(text: str, option: str, example: str, what: str = "integers") -> tuple[int, ...]:
    """``"3,5, 7"`` -> ``(3, 5, 7)``: comma-separated integers, spaces allowed around the commas. An
    empty item or a space inside one is refused ("3 5" is not 35, nor a guess at 3,5); one line each."""
    items = [x.strip() for x in str(text).split(",")]
    if items == [""]:
        raise SpecdecError(f"{option} is empty")
    if not all(INTEGER.fullmatch(x) for x in items):
        why = "an empty item" if "" in items else "not an integer"
        raise SpecdecError(f"{option} must be comma-separated {what} like {example}, got {text!r} ({why})")
    if max(len(x) for x in items) > 20:   # int() refuses over 4300 digits; no width or layer has 20
        raise SpecdecError(f"{option}: an item of {max(len(x) for x in items)} digits is too large")
    return tuple(int(x) for x in items)


def parse_layers(text: str, option: str) -> tuple[int, ...]:
    """``"2,5,-1"`` -> ``(2, 5, -1)`` (``parse_ints``' rules); duplicates refused here already."""
    if not str(text).strip():
        raise SpecdecError(f"{option} is empty: name at least one layer (e.g. -1, the last)")
    vals = parse_ints(text, option, "2,5,-1", "layer indices")
    dup = sorted({v for v in vals if vals.count(v) > 1})
    if dup:
        raise SpecdecError(f"{option} names layer {dup[0]} twice ({text})")
    return vals


def resolve_layers(layers: tuple[int, ...], num_layers: int, option: str) -> tuple[int, ...]:
    """Absolute indices 0..num_layers-1, in the given order."""
    out = []
    for v in layers:
        if not -num_layers <= v < num_layers:
            raise SpecdecError(f"{option}: layer {v} is out of range for a model of {num_layers} layers "
                               f"(valid: 0..{num_layers - 1} or -{num_layers}..-1)")
        out.append(v % num_layers)
    dup = sorted({v for v in out if out.count(v) > 1})
    if dup:
        raise SpecdecError(f"{option} {','.join(str(v) for v in layers)} names layer {dup[0]} twice "
                           f"(a model of {num_layers} layers)")
    return tuple(out)


def format_layers(layers) -> str:
    return ",".join(str(v) for v in layers)
