"""Small predicates over graph tensors shared by the finders."""
from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs

_INT_DTYPES = (np.dtype(np.int64), np.dtype(np.int32))


def dtype_of(t: gs.Tensor):
    try:
        return np.dtype(t.dtype) if t.dtype is not None else None
    except TypeError:  # bfloat16 and other onnx-only types
        return None


def is_int(t: gs.Tensor) -> bool:
    return dtype_of(t) in _INT_DTYPES


def is_float(t: gs.Tensor) -> bool:
    d = dtype_of(t)
    return d is not None and d.kind == "f"


def rank(t: gs.Tensor) -> int | None:
    return len(t.shape) if t.shape is not None else None


def names(ts) -> str:
    """``a, b, c`` (or ``none``), for error messages."""
    return ", ".join(t.name for t in ts) or "none"


def through(t: gs.Tensor, ops: tuple[str, ...]) -> list[gs.Tensor]:
    """``t`` and every tensor reached from it forward through nodes of ``ops``."""
    res, frontier = [], [t]
    while frontier:
        x = frontier.pop()
        res.append(x)
        frontier += [o for c in x.outputs if c.op in ops for o in c.outputs]
    return res


def is_bfloat16(t: gs.Tensor) -> bool:
    """True for a bfloat16 tensor (numpy has no such dtype; gs reports it in
    several ways depending on the onnx version)."""
    d = t.dtype
    if d is None:
        return False
    if d == onnx.TensorProto.BFLOAT16:
        return True
    return "bfloat16" in str(d).lower()
