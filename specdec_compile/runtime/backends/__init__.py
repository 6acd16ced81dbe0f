"""Backends: one compiled model with its retained state kept inside.

The interface is tiny (``base.Backend``)::

    backend = OrtBackend(artifact_dir)        # or QaicBackend(artifact_dir, device_ids=[0])
    logits = backend.run(input_ids, position_ids)   # int64 [B, S] each -> float32 logits
    backend.reset()                           # forget the sequence (zero the cache)

One folder per backend, loading apart from running: ``ort/loader.py`` makes
and checks the ONNX Runtime session, ``ort/runner.py`` binds the cache and runs
it; ``qaic/loader.py`` finds, checks and activates the QPC, ``qaic/runner.py``
runs it with the cache kept on the device; ``openvino/loader.py`` reads a ``--target openvino``
graph and makes its cache state variables, ``openvino/runner.py`` runs it (optional dependency).
"""
from __future__ import annotations

from ...errors import SpecdecError
from .base import Backend, check_device_ids
from .openvino import OpenVinoBackend, load_openvino
from .ort import OrtBackend, OrtModel, load_ort
from .qaic import QaicBackend, QaicProgram, find_qpc, import_qaicrt, load_qaic

__all__ = ["Backend", "OpenVinoBackend", "OrtBackend", "OrtModel", "QaicBackend", "QaicProgram", "find_qpc", "import_qaicrt",
           "load_openvino", "load_ort", "load_qaic",
           "open_backend"]


def open_backend(artifact, kind: str = "ort", *, expect_role=None, device_ids=None, **kw) -> Backend:
    """Open an artifact directory with the named backend (``ort``, ``qaic`` or ``openvino``)."""
    import logging
    logging.getLogger(__name__).info("loading %s on %s", getattr(artifact, "path", artifact), kind)
    import inspect
    cls = {"ort": OrtBackend, "qaic": QaicBackend, "openvino": OpenVinoBackend}.get(kind) \
        if isinstance(kind, str) else None
    if cls is None:
        raise SpecdecError(f"unknown backend {kind!r} (ort, qaic or openvino)")
    known = set(inspect.signature(cls.__init__).parameters) - {"self", "artifact"}
    unknown = sorted(set(kw) - known)
    if unknown:         # one line, not Python's TypeError about __init__
        raise SpecdecError(f"the {kind} backend takes no option {unknown[0]!r} (it takes: {', '.join(sorted(known))})")
    if device_ids is not None:
        device_ids = check_device_ids(device_ids)
    if kind == "ort":
        if device_ids is not None:
            if len(device_ids) > 1:
                raise SpecdecError(f"the ort backend runs a model on one device, got device ids {device_ids}")
            kw.setdefault("device_id", device_ids[0])
        return OrtBackend(artifact, expect_role=expect_role, **kw)
    if kind == "qaic":
        return QaicBackend(artifact, expect_role=expect_role, device_ids=device_ids, **kw)
    if device_ids is not None:
        raise SpecdecError(f"the openvino backend runs on the CPU: it takes no device ids (got {device_ids})")
    return OpenVinoBackend(artifact, expect_role=expect_role, **kw)
