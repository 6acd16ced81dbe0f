"""A strict reader of the safetensors format, with numpy only.

A file is an 8-byte little-endian header length N, N bytes of JSON (an object:
tensor name -> {"dtype", "shape", "data_offsets": [begin, end]}, plus an
optional "__metadata__" object of strings), then the raw little-endian data;
offsets count from the end of the header. Every check fails in one line
(``SpecdecError``): a short file, a header that is not JSON, an unknown dtype,
a shape that is not a list of non-negative integers, offsets outside the data,
a byte count that does not match the shape, tensors that overlap or leave
bytes that belong to no tensor, or a name (or key) given twice, which would
leave which one is read to the parser.
"""
from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np

from ..errors import SpecdecError

#: safetensors dtype -> numpy dtype (BF16 is read as its raw 16 bits, then widened)
DTYPES = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "BF16": "<u2", "I64": "<i8", "I32": "<i4",
          "I16": "<i2", "I8": "i1", "U8": "u1", "BOOL": "?"}
_MAX_HEADER = 100 << 20


def _bad(path: Path, what: str) -> SpecdecError:
    return SpecdecError(f"{path}: not a valid safetensors file: {what}")


def _short(value, limit: int = 120) -> str:
    """``repr(value)`` cut to ``limit`` characters: a hostile header's values can be megabytes long (and an
    integer of thousands of digits cannot be printed at all)."""
    if isinstance(value, list) and len(value) > 16:
        return f"[{', '.join(_short(v, 24) for v in value[:8])}, ... ({len(value)} in all)]"
    try:
        text = repr(value)
    except ValueError:
        return f"<an integer of {value.bit_length()} bits>"
    return text if len(text) <= limit else text[:limit] + "..."


def _nbytes(shape: list[int], itemsize: int, limit: int) -> int | None:
    """The bytes ``shape`` holds, or None past ``limit``: multiplied one dimension at a time and stopped
    there, since the product of thousands of huge dimensions takes minutes."""
    if 0 in shape:
        return 0
    n = itemsize
    for d in shape:
        n *= d
        if n > limit:
            return None
    return n


def _object(path: Path, pairs: list) -> dict:
    """A JSON object of the header, refused when it names a key twice (json keeps the last silently)."""
    out = {}
    for k, v in pairs:
        if k in out:
            raise _bad(path, f"the header names {k!r} twice")
        out[k] = v
    return out


def _header(path: Path, data: bytes) -> dict:
    if len(data) < 8:
        raise _bad(path, f"{len(data)} bytes, shorter than the 8-byte header length")
    (n,) = struct.unpack("<Q", data[:8])
    if n > len(data) - 8:
        raise _bad(path, f"header length {n} is past the end of the file ({len(data)} bytes)")
    if n > _MAX_HEADER:
        raise _bad(path, f"header length {n} is larger than the {_MAX_HEADER} bytes a header may have")
    try:
        head = json.loads(data[8:8 + n].decode("utf-8"), object_pairs_hook=lambda p: _object(path, p))
    except (ValueError, RecursionError) as e:
        # ValueError: JSONDecodeError, UnicodeDecodeError, an integer of more than 4300 digits;
        # RecursionError: arrays nested thousands deep
        raise _bad(path, f"the header is not JSON ({type(e).__name__}: {str(e)[:200]})") from None
    if not isinstance(head, dict):
        raise _bad(path, "the header is not a JSON object")
    meta = head.pop("__metadata__", {})
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        raise _bad(path, "__metadata__ is not an object of strings")
    return head


def _entry(path: Path, name: str, e, size: int) -> tuple[str, tuple[int, ...], int, int]:
    if not isinstance(e, dict) or set(e) != {"dtype", "shape", "data_offsets"}:
        raise _bad(path, f"tensor {name!r}: expected keys dtype, shape, data_offsets")
    dt, shape, offs = e["dtype"], e["shape"], e["data_offsets"]
    if not isinstance(dt, str) or dt not in DTYPES:
        raise _bad(path, f"tensor {_short(name)}: unknown dtype {_short(dt)}")
    if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0
                                              for d in shape):
        raise _bad(path, f"tensor {_short(name)}: shape {_short(shape)} is not a list of non-negative integers")
    if (not isinstance(offs, list) or len(offs) != 2
            or not all(isinstance(o, int) and not isinstance(o, bool) for o in offs)
            or not 0 <= offs[0] <= offs[1] <= size):
        raise _bad(path, f"tensor {_short(name)}: data_offsets {_short(offs)} outside the {size} data bytes")
    need = _nbytes(shape, np.dtype(DTYPES[dt]).itemsize, 1 << 64)    # no file holds 2**64 bytes
    if offs[1] - offs[0] != need:
        expected = f"{need} expected" if need is not None else "more than 2**64 expected"
        raise _bad(path, f"tensor {_short(name)}: {offs[1] - offs[0]} bytes for {dt} {_short(shape)} ({expected})")
    return dt, tuple(shape), offs[0], offs[1]


def read_safetensors(path: str | Path) -> dict[str, np.ndarray]:
    """Every tensor of the file, as numpy arrays (floats of 16 bits widened to float32)."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as e:
        raise SpecdecError(f"{path}: cannot read: {e.strerror or e}") from None
    head = _header(path, data)
    (n,) = struct.unpack("<Q", data[:8])
    body = memoryview(data)[8 + n:]
    spans, out = [], {}
    for name, e in head.items():
        dt, shape, lo, hi = _entry(path, name, e, len(body))
        spans.append((lo, hi, name))
        try:
            a = np.frombuffer(body[lo:hi], dtype=DTYPES[dt]).reshape(shape)
        except ValueError:   # no bytes, but dimensions numpy cannot hold (past 2**63, more than 64 of them)
            raise _bad(path, f"tensor {_short(name)}: shape {_short(list(shape))} cannot be held") from None
        if dt == "BF16":
            a = (a.astype(np.uint32) << 16).view(np.float32)
        elif dt == "F16":
            a = a.astype(np.float32)
        elif dt == "BOOL" and np.any(np.frombuffer(body[lo:hi], np.uint8) > 1):   # numpy reads 2..255 as True
            raise _bad(path, f"tensor {_short(name)}: BOOL bytes other than 0 and 1")
        out[name] = a
    _check_spans(path, sorted(spans), len(body))
    return out


def _check_spans(path: Path, spans: list[tuple[int, int, str]], size: int) -> None:
    """The tensors must cover the data bytes exactly, as the format requires (its own library refuses a
    hole): no overlap, no byte that belongs to no tensor, nothing after the last one."""
    end, last = 0, None
    for lo, hi, name in spans:
        if lo < end:
            raise _bad(path, f"tensors {_short(last)} and {_short(name)} overlap")
        if lo > end:
            raise _bad(path, f"data bytes {end}..{lo} belong to no tensor (before {_short(name)})")
        end, last = hi, name
    if end != size:
        raise _bad(path, f"data bytes {end}..{size} belong to no tensor (after the last one)")


def write_safetensors(path: str | Path, tensors: dict[str, np.ndarray]) -> None:
    """Write ``tensors`` (float32/float16/int64/int32/bool arrays) as a safetensors file (tests, recordings)."""
    names = {np.dtype(v): k for k, v in DTYPES.items() if k != "BF16"}
    head, blobs, off = {}, [], 0
    for name, a in tensors.items():
        a = np.ascontiguousarray(a)
        raw = a.astype(a.dtype.newbyteorder("<")).tobytes()
        head[name] = {"dtype": names[a.dtype], "shape": list(a.shape), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    text = json.dumps(head, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    Path(path).write_bytes(struct.pack("<Q", len(text)) + text + b"".join(blobs))
