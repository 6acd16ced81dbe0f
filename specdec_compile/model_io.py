"""Loading and saving ONNX models without ever loading their weights.

Graphs are read with ``load_external_data=False``: initializers stored in
external data files stay references (location, offset, length). A rewritten
model is saved next to a hard link (or, across file systems, a streamed copy)
of each data file it references, so weights are never re-serialized and a
model over 2 GB rewrites without its weights entering memory.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import stat
from pathlib import Path

import onnx
from google.protobuf.message import DecodeError

from .contract import (COMPILE_SCRIPT, CUSTOM_IO_FILE, MANIFEST_FILE, MODEL_FILE, PARTITION_FILE, QPC_DIR,
                       SPECIALIZATIONS_FILE)
from .errors import SpecdecError
from .model_checks import check_model_input, tensor_bytes

#: the largest .onnx file read (protobuf's own limit for one message: weights beyond it are external data)
MAX_MODEL_BYTES = 2 ** 31
#: the largest JSON or text file read (config.json, generation_config.json, manifest.json, --supported-ops)
MAX_TEXT_BYTES = 16 * 2 ** 20
#: names an external data file may not have: the artifact's own files (the copy would be overwritten)
ARTIFACT_NAMES = frozenset({MODEL_FILE, SPECIALIZATIONS_FILE, CUSTOM_IO_FILE, COMPILE_SCRIPT, PARTITION_FILE,
                            MANIFEST_FILE, QPC_DIR})

_log = logging.getLogger(__name__)


def is_ir_model(x) -> bool:
    """An ``onnx_ir.Model`` (checked without importing onnx_ir)."""
    return type(x).__name__ == "Model" and type(x).__module__.split(".")[0] == "onnx_ir"


def read_any(model_or_path, source=None) -> tuple[onnx.ModelProto, Path | None, Path | None, str]:
    """(proto, source file, directory its external data is relative to, kind) of a path,
    an ``onnx.ModelProto`` or an ``onnx_ir.Model``; ``kind`` is "path", "proto" or "ir".
    ``source``: the file a model in memory was read from. An ir model's external tensors
    name their directory themselves (their ``base_dir``)."""
    if source is not None and not isinstance(source, (str, os.PathLike)):
        raise SpecdecError(f"source= is the path of the file the model was read from, got {type(source).__name__}")
    if isinstance(model_or_path, (str, os.PathLike)):
        p = Path(model_or_path)
        return load_model(p), p, p.resolve().parent, "path"
    src = Path(source) if source is not None else None
    src_dir = src.resolve().parent if src is not None else None
    if isinstance(model_or_path, onnx.ModelProto):
        what = str(src) if src is not None else "the ModelProto"
        check_model_input(model_or_path, what)
        if src_dir is not None:
            check_external_data(model_or_path, src_dir, what=what)
        else:
            check_locations(model_or_path, what)
        return model_or_path, src, src_dir, "proto"
    if is_ir_model(model_or_path):
        import onnx_ir as ir
        dirs = {str(t.base_dir) for t in _ir_external(model_or_path) if t.base_dir}
        if len(dirs) > 1:
            raise SpecdecError(f"the onnx_ir model's external data lies in several directories ({sorted(dirs)})")
        if src_dir is None and dirs:
            src_dir = Path(dirs.pop()).resolve()
        proto = ir.to_proto(model_or_path)
        check_model_input(proto, "onnx_ir model")
        if src_dir is not None:
            check_external_data(proto, src_dir, what="onnx_ir model")
        else:
            check_locations(proto, "onnx_ir model")
        return proto, src, src_dir, "ir"
    raise SpecdecError(f"expected a model path, an onnx.ModelProto or an onnx_ir.Model, got {type(model_or_path).__name__}")


def _ir_external(model):
    import onnx_ir as ir
    for v in model.graph.initializers.values():
        if isinstance(v.const_value, ir.ExternalTensor):
            yield v.const_value


def as_kind(proto: onnx.ModelProto, kind: str, source_dir: Path | None):
    """``proto`` as the kind a caller gave (``read_any``): an ``onnx_ir.Model`` for "ir"
    (its external tensors read from ``source_dir``), else the proto itself."""
    if kind != "ir":
        return proto
    import onnx_ir as ir
    model = ir.from_proto(proto)
    if source_dir is not None:
        ir.external_data.set_base_dir(model.graph, source_dir)
    return model


def resolve_model_path(path: str | os.PathLike) -> Path:
    """``path``, or ``path/model.onnx`` when ``path`` is an artifact directory."""
    p = Path(path)
    if p.is_dir() and (p / MODEL_FILE).is_file():
        return p / MODEL_FILE
    return p


def load_model(path: str | os.PathLike, *, compiler: bool = True) -> onnx.ModelProto:
    """Read ``path`` without its external weights; check the weights exist.

    Raises SpecdecError (one line) for a missing, unreadable, truncated or
    non-ONNX file, and for external data files that are missing or shorter
    than the tensors that reference them. ``compiler=False``: without the
    compiler's own limits (``check_model_input``'s), for a reader such as ``diff``.
    """
    p = Path(path)
    data = read_limited(p, "an .onnx file", MAX_MODEL_BYTES)
    if not data:
        raise SpecdecError(f"{p}: empty file, not an ONNX model")
    model = onnx.ModelProto()
    try:
        model.ParseFromString(data)
    except (DecodeError, RuntimeError, ValueError) as e:
        raise SpecdecError(f"{p}: not a readable ONNX model (truncated or corrupt file: {e})") from None
    if not model.HasField("graph") or (not model.graph.node and not model.graph.output):
        raise SpecdecError(f"{p}: not an ONNX model (no graph)")
    if model.ir_version == 0 and not model.opset_import:
        raise SpecdecError(f"{p}: not an ONNX model (no IR version, no opset)")
    check_model_input(model, str(p), compiler=compiler)
    check_external_data(model, p.parent, what=str(p))
    _log.info("loaded %s: %d nodes, %d initializers (weights stay on disk)", p, len(model.graph.node),
              len(model.graph.initializer))
    return model


def external_tensors(model: onnx.ModelProto):
    """Every initializer (and Constant-node tensor) whose data lives in a file."""
    for t in model.graph.initializer:
        if t.data_location == onnx.TensorProto.EXTERNAL:
            yield t
    for node in model.graph.node:
        for a in node.attribute:
            if a.type == onnx.AttributeProto.TENSOR and a.t.data_location == onnx.TensorProto.EXTERNAL:
                yield a.t


def _external_info(t: onnx.TensorProto) -> dict:
    return {e.key: e.value for e in t.external_data}


def external_data_files(model: onnx.ModelProto) -> list[str]:
    """Sorted relative locations of the external data files ``model`` references."""
    return sorted({_external_info(t).get("location", "") for t in external_tensors(model)})


def check_locations(model: onnx.ModelProto, what: str = "model") -> None:
    """Each external location names a file inside the model's directory, not an artifact file's name."""
    for t in external_tensors(model):
        _location(t, _external_info(t), what)


def _location(t: onnx.TensorProto, info: dict, what: str) -> str:
    loc = info.get("location")
    if not loc:
        raise SpecdecError(f"{what}: tensor {t.name!r} is external but names no location")
    parts = Path(loc).parts
    if os.path.isabs(loc) or ".." in parts or "\\" in loc or "\0" in loc:
        raise SpecdecError(f"{what}: tensor {t.name!r} has an unsafe external data location {loc!r}")
    if parts and parts[0] in ARTIFACT_NAMES:
        raise SpecdecError(f"{what}: tensor {t.name!r} has its data in {loc!r}, the name of an artifact file "
                           f"(it would be overwritten in the artifact); rename the data file and its location")
    return loc


def _byte_count(info: dict, key: str, t: onnx.TensorProto, what: str) -> int | None:
    v = info.get(key)
    if v is None or v == "":
        return None
    if not (v.isascii() and v.isdigit()):
        raise SpecdecError(f"{what}: tensor {t.name!r} has external data {key} {v!r}, expected a byte count >= 0")
    return int(v)


def check_external_data(model: onnx.ModelProto, base_dir: Path, what: str = "model") -> None:
    """Every external tensor: a safe location (``check_locations``), a regular file inside
    ``base_dir``, an offset and length that are byte counts, a length equal to the tensor's
    size, and a file long enough for it."""
    sizes: dict[str, int] = {}
    for t in external_tensors(model):
        info = _external_info(t)
        loc = _location(t, info, what)
        if loc not in sizes:
            f = base_dir / loc
            if not f.is_file():
                raise SpecdecError(f"{what}: missing external data file {f} (needed by tensor {t.name!r})"
                                   if not f.exists() else
                                   f"{what}: external data file {f} is not a regular file (needed by tensor "
                                   f"{t.name!r})")
            _refuse_outside(f, base_dir, what)
            sizes[loc] = f.stat().st_size
        offset = _byte_count(info, "offset", t, what) or 0
        length = _byte_count(info, "length", t, what)
        need = tensor_bytes(t)
        if need is not None and length is not None and length != need:
            raise SpecdecError(f"{what}: tensor {t.name!r} has external data length {length}, its dims "
                               f"{list(t.dims)} and dtype need {need} bytes")
        end = offset + (length if length is not None else need or 0)
        if end > sizes[loc]:
            raise SpecdecError(f"{what}: external data file {base_dir / loc} is truncated "
                               f"(tensor {t.name!r} needs bytes up to {end}, file has {sizes[loc]})")


def _refuse_outside(f: Path, base_dir: Path, what: str) -> None:
    """Refuse a data file that resolves (through any symbolic link, of the file
    or of a directory on its way) outside the model's directory."""
    real, base = f.resolve(), base_dir.resolve()
    if real != base and base not in real.parents:
        raise SpecdecError(f"{what}: external data file {f} resolves to {real}, outside the model's "
                           f"directory {base} (a symbolic link out of it is refused)")


def copy_file(src: Path, dst: Path) -> None:
    """Copy ``src`` to ``dst`` (streamed by the kernel where it can)."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    if dst.exists():
        dst.unlink()
    shutil.copyfile(src, dst)


def link_or_copy(src: Path, dst: Path) -> None:
    """Hard-link ``src`` to ``dst``; copy (streamed) where links are impossible."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    if dst.exists():
        dst.unlink()
    try:
        os.link(src, dst)
    except OSError:
        shutil.copyfile(src, dst)


def save_model(model: onnx.ModelProto, path: str | os.PathLike, source_dir: str | os.PathLike | None, *,
               link: bool = False) -> list[Path]:
    """Write ``model`` to ``path`` and place the data files it references beside it: copies,
    or with ``link`` hard links where the file system allows (no copy, but onnx >= 1.23's
    ``onnx.load`` and checker refuse a data file with several hard links).

    ``source_dir`` is the directory the external locations are relative to (the
    source model's directory). Returns the data files written.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    written = []
    check_locations(model, "the model to save")
    for loc in external_data_files(model):
        if source_dir is None:
            raise SpecdecError("model references external data but its source directory is unknown")
        src = Path(source_dir) / loc
        dst = path.parent / loc
        if path.parent.resolve() not in dst.resolve().parents:
            raise SpecdecError(f"external data location {loc!r} resolves outside {path.parent}; nothing written there")
        if src.resolve() != dst.resolve():
            (link_or_copy if link else copy_file)(src, dst)
        written.append(dst)
    data = model.SerializeToString(deterministic=True)
    path.write_bytes(data)
    return written


def read_limited(path: str | os.PathLike, what: str, limit: int) -> bytes:
    """The bytes of the regular file ``path``: one-line errors for a missing file, a directory, a FIFO,
    device or socket (never opened blocking: no hang) and a file over ``limit`` bytes (the bound is said)."""
    p = Path(path)
    try:
        fd = os.open(p, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        raise SpecdecError(f"{p}: no such file") from None
    except IsADirectoryError:
        raise SpecdecError(f"{p}: is a directory, expected {what}") from None
    except OSError as e:
        raise SpecdecError(f"{p}: cannot read: {e.strerror or e}") from None
    st = os.fstat(fd)   # before fdopen: it refuses a directory (opened read-only here) with IsADirectoryError
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        if stat.S_ISDIR(st.st_mode):
            raise SpecdecError(f"{p}: is a directory, expected {what}")
        raise SpecdecError(f"{p}: not a regular file (a FIFO, device or socket), expected {what}")
    with os.fdopen(fd, "rb") as f:
        if st.st_size > limit:
            raise SpecdecError(f"{p}: {st.st_size} bytes, over the {limit}-byte limit for {what}")
        try:
            data = f.read(limit + 1)
        except OSError as e:
            raise SpecdecError(f"{p}: cannot read: {e.strerror or e}") from None
    if len(data) > limit:
        raise SpecdecError(f"{p}: over the {limit}-byte limit for {what}")
    return data


def read_json(path: str | os.PathLike, what: str, limit: int = MAX_TEXT_BYTES):
    """The parsed JSON file ``path`` (``read_limited``'s checks): one-line errors for a file that is not
    UTF-8 JSON or is nested too deeply to parse."""
    p = Path(path)
    data = read_limited(p, what, limit)
    try:
        return json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise SpecdecError(f"{p}: cannot read {what}: not UTF-8 ({e.reason})") from None
    except json.JSONDecodeError as e:
        raise SpecdecError(f"{p}: corrupt JSON ({e.msg} at line {e.lineno})") from None
    except (RecursionError, ValueError) as e:
        reason = "nested too deeply" if isinstance(e, RecursionError) else " ".join(str(e).split())[:200]
        raise SpecdecError(f"{p}: cannot read {what}: {reason}") from None


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            b = f.read(chunk)
            if not b:
                break
            h.update(b)
    return h.hexdigest()
