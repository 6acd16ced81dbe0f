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
from .base import Backend
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
    if kind == "ort":
        if device_ids:
            kw.setdefault("device_id", int(device_ids[0]))
        return OrtBackend(artifact, expect_role=expect_role, **kw)
    if kind == "qaic":
        return QaicBackend(artifact, expect_role=expect_role, device_ids=device_ids, **kw)
    if kind == "openvino":
        return OpenVinoBackend(artifact, expect_role=expect_role, **kw)
    raise SpecdecError(f"unknown backend {kind!r} (ort, qaic or openvino)")
