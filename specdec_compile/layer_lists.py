"""Lists of decoder layers given on the command line (``--hidden-states``,
``--feature-layers``): parsed, and resolved against a model's layer count.

Indices count from 0; negative ones count from the end (-1: the last layer,
its output before the final norm). A list is refused in one line when it is
empty, not integers, names a layer twice (also after resolving: 1 and -1 of
a 2-layer model) or a layer the model does not have."""
from __future__ import annotations

from .errors import SpecdecError


def parse_layers(text: str, option: str) -> tuple[int, ...]:
    """``"2,5,-1"`` -> ``(2, 5, -1)``; duplicates refused here already."""
    try:
        vals = tuple(int(x) for x in str(text).replace(" ", "").split(",") if x)
    except ValueError:
        raise SpecdecError(f"{option} must be comma-separated layer indices like 2,5,-1, got {text!r}") from None
    if not vals:
        raise SpecdecError(f"{option} is empty: name at least one layer (e.g. -1, the last)")
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
