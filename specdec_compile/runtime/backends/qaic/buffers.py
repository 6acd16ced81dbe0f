"""Cloud AI 100 buffer types: the ``QAicApi_pb2`` type constants a QPC's bindings carry, as
numpy storage (the set QEfficient's ``QAICInferenceSession`` maps), and how values go in and out.

Every mapped type may hold retained state (the runner skips those buffers, or uploads zero
bytes at a reset). A binding whose values the runner writes or reads must hold them exactly:

- integer inputs (``input_ids``, ``position_ids``, ``batch_index``, ``num_logits_to_keep``):
  ``INT64_I_TYPE`` or ``INT32_I_TYPE``;
- float tensors (``logits``, a feature draft's features, hidden states): ``FLOAT_TYPE``,
  ``FLOAT_16_TYPE`` or ``BFLOAT16_TYPE`` (bfloat16 is converted bit-exactly: read as the top 16
  bits of a float32, written rounded to nearest even; not read as float16);
- the quantized types (``*_Q_TYPE``) carry a scale and offset this runtime does not read: a value
  binding of such a type is refused at load, never read as raw integers.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ....errors import SpecdecError

#: QAicApi_pb2 constant name -> numpy storage; QEfficient takes BFLOAT16_TYPE as 11 where the
#: SDK's module lacks the name
STORAGE = {"FLOAT_TYPE": np.float32, "FLOAT_16_TYPE": np.float16, "BFLOAT16_TYPE": np.uint16,
           "INT8_Q_TYPE": np.int8, "UINT8_Q_TYPE": np.uint8, "INT16_Q_TYPE": np.int16,
           "INT32_Q_TYPE": np.int32, "INT32_I_TYPE": np.int32, "INT64_I_TYPE": np.int64,
           "INT8_TYPE": np.int8}
BFLOAT16_DEFAULT = 11
INT_VALUES = ("INT64_I_TYPE", "INT32_I_TYPE")
FLOAT_VALUES = ("FLOAT_TYPE", "FLOAT_16_TYPE", "BFLOAT16_TYPE")


@dataclass(frozen=True)
class BufType:
    """One buffer type: its constant's name and numpy storage."""

    name: str
    storage: np.dtype

    @property
    def itemsize(self) -> int:
        return self.storage.itemsize

    def zeros(self, shape) -> np.ndarray:
        return np.zeros(tuple(shape), self.storage)

    def encode(self, values: np.ndarray) -> np.ndarray:
        """``values`` in this type's storage (bfloat16: rounded to nearest even)."""
        if self.name == "BFLOAT16_TYPE":
            return to_bfloat16(values)
        return np.ascontiguousarray(values, dtype=self.storage)

    def decode(self, raw: bytes, shape) -> np.ndarray:
        """A float32 array of the values held in ``raw`` (a float binding)."""
        a = np.frombuffer(raw, self.storage).reshape(shape)
        if self.name == "BFLOAT16_TYPE":
            return from_bfloat16(a)
        return a.astype(np.float32)


def to_bfloat16(values) -> np.ndarray:
    """float32 values as bfloat16 bits (uint16), rounded to nearest even; NaN stays NaN."""
    a = np.ascontiguousarray(values, dtype=np.float32)
    u = a.view(np.uint32).astype(np.uint64)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    return np.where(np.isnan(a), np.uint16(0x7FC0), r)


def from_bfloat16(bits: np.ndarray) -> np.ndarray:
    """bfloat16 bits (uint16) as float32 values (exact)."""
    return (np.asarray(bits, np.uint16).astype(np.uint32) << 16).view(np.float32)


def buffer_types(api) -> dict:
    """QAicApi type value -> BufType, for every mapped constant the module has."""
    out = {}
    for name, storage in STORAGE.items():
        value = getattr(api, name, BFLOAT16_DEFAULT if name == "BFLOAT16_TYPE" else None)
        if value is not None:
            out[value] = BufType(name, np.dtype(storage))
    return out


def check_value_binding(where, binding, types: dict, kind: str) -> None:
    """A binding the runner writes or reads as values must be of an exact type of ``kind``
    ("int" or "float"); one line otherwise."""
    t = types[binding.type]
    allowed = INT_VALUES if kind == "int" else FLOAT_VALUES
    if t.name not in allowed:
        why = " (a quantized type: its scale and offset are not read here)" if t.name.endswith("_Q_TYPE") else ""
        raise SpecdecError(f"{where}: binding {binding.name} is {t.name}{why}; the runtime reads and writes it "
                           f"as one of {', '.join(allowed)}")
