"""Content hashes of tensors: sha256 of inline data, external data streamed in chunks."""
from __future__ import annotations

import hashlib
from pathlib import Path

from onnx import TensorProto

from ..errors import SpecdecError

CHUNK_SIZE = 1 << 20  # bytes read at a time from an external data file


def _ext_info(t: TensorProto) -> dict:
    return {e.key: e.value for e in t.external_data}


def _is_external(t: TensorProto) -> bool:
    return t.data_location == TensorProto.EXTERNAL


class TensorHasher:
    """sha256 of tensor contents; external data streamed in CHUNK_SIZE pieces.

    Results for external data are cached by (file identity, offset, length), so
    hard-linked weight files and repeated snapshots are read at most once.
    """

    def __init__(self) -> None:
        self._cache: dict[tuple, str] = {}

    def identity(self, t: TensorProto, base_dir) -> tuple | None:
        """(device, inode, size, mtime, offset, length) of external bytes, or None."""
        if not _is_external(t) or base_dir is None:
            return None
        info = _ext_info(t)
        path = Path(base_dir) / info.get("location", "")
        try:
            st = path.stat()
        except OSError:
            raise SpecdecError(f"missing external data file {path} (needed by tensor {t.name!r})") from None
        off = int(info.get("offset", 0) or 0)
        length = int(info["length"]) if info.get("length", "") != "" else st.st_size - off
        return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, off, length)

    def digest(self, t: TensorProto, base_dir) -> str:
        if _is_external(t):
            info = _ext_info(t)
            loc = info.get("location", "")
            if base_dir is None:  # snapshots without a directory: compare references
                return f"ref:{loc}@{info.get('offset', '0')}+{info.get('length', '')}"
            ident = self.identity(t, base_dir)
            if ident in self._cache:
                return self._cache[ident]
            path = Path(base_dir) / loc
            off, remaining = ident[4], ident[5]
            h = hashlib.sha256()
            with open(path, "rb") as f:
                f.seek(off)
                while remaining > 0:
                    chunk = f.read(min(CHUNK_SIZE, remaining))
                    if not chunk:
                        raise SpecdecError(f"external data file {path} is truncated (tensor {t.name!r})")
                    h.update(chunk)
                    remaining -= len(chunk)
            d = "sha256:" + h.hexdigest()
            self._cache[ident] = d
            return d
        h = hashlib.sha256()
        if t.HasField("raw_data"):
            h.update(t.raw_data)
        elif t.data_type == TensorProto.STRING:
            for s in t.string_data:
                h.update(len(s).to_bytes(8, "little"))
                h.update(s)
        else:
            from onnx import numpy_helper
            h.update(numpy_helper.to_array(t).tobytes())
        return "sha256:" + h.hexdigest()

    def equal(self, ta: TensorProto, a_dir, tb: TensorProto, b_dir) -> bool:
        if ta.data_type != tb.data_type or list(ta.dims) != list(tb.dims):
            return False
        ia, ib = self.identity(ta, a_dir), self.identity(tb, b_dir)
        if ia is not None and ia == ib:
            return True
        return self.digest(ta, a_dir) == self.digest(tb, b_dir)


def short_digest(d: str | None) -> str:
    if d is None:
        return "-"
    if d.startswith("sha256:"):
        return "sha256:" + d[7:19]
    return d

