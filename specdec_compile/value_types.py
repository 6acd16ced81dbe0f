"""Dims and dtype names of a graph's values: the one place they are read.

``dims`` reads the shape of a ``ValueInfoProto`` (or a ``TypeProto``) as a list of ints
and dim symbols; what an unknown dim reads as (``"?"`` for a manifest or a report, 0 for
the contract check, None for a fact) and what a value without a shape reads as are the
caller's. ``dtype_name`` is the lower-case name of an ONNX element type, with FLOAT and
DOUBLE named ``float32`` and ``float64``.
"""
from __future__ import annotations

import onnx

_NAMES = {v: k.lower() for k, v in onnx.TensorProto.DataType.items()}
_NAMES.update({onnx.TensorProto.FLOAT: "float32", onnx.TensorProto.DOUBLE: "float64"})


def dtype_name(elem_type: int, unknown: str | None = None) -> str:
    """``float32``, ``int64``, ...; a code ONNX does not define: ``unknown``, else ``dtype<code>``."""
    if elem_type in _NAMES:
        return _NAMES[elem_type]
    return unknown if unknown is not None else f"dtype{elem_type}"


def dim(d: onnx.TensorShapeProto.Dimension, unknown="?"):
    """One dim: its value (an int), its symbol (a non-empty ``dim_param``), else ``unknown``."""
    if d.HasField("dim_value"):
        return int(d.dim_value)
    return d.dim_param or unknown


def dims(value: onnx.ValueInfoProto | onnx.TypeProto, unknown="?", no_shape=None) -> list | None:
    """The dims of a tensor value (``dim`` of each, ``unknown`` for unknown ones); ``no_shape``
    for a value with no shape (or no tensor type)."""
    tp = value.type if isinstance(value, onnx.ValueInfoProto) else value
    if tp.WhichOneof("value") != "tensor_type" or not tp.tensor_type.HasField("shape"):
        return no_shape
    return [dim(d, unknown) for d in tp.tensor_type.shape.dim]


__all__ = ["dim", "dims", "dtype_name"]
