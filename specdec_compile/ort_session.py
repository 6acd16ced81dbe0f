"""The one place an ONNX Runtime ``InferenceSession`` is made, for the runtime's ORT backend and
for ``verify`` alike: quiet logging, the providers, the thread count, and a one-line
``SpecdecError`` when ONNX Runtime cannot load the model."""
from __future__ import annotations

from .errors import SpecdecError

CPU, CUDA = "CPUExecutionProvider", "CUDAExecutionProvider"


def default_providers() -> list[str]:
    """CUDA when onnxruntime-gpu has it, then CPU."""
    import onnxruntime as ort

    return ([CUDA] if CUDA in ort.get_available_providers() else []) + [CPU]


def create_session(path, *, providers=None, session_options=None, intra_op_threads: int | None = None):
    """An ONNX Runtime session for the model file ``path`` (quiet logging); a
    ``SpecdecError`` of one line when ONNX Runtime cannot load it."""
    import onnxruntime as ort

    so = session_options or ort.SessionOptions()
    so.log_severity_level = 3
    if intra_op_threads:
        so.intra_op_num_threads = intra_op_threads
    try:
        return ort.InferenceSession(str(path), sess_options=so,
                                    providers=list(providers) if providers else default_providers())
    except Exception as e:  # onnxruntime raises its own exception types
        msg = " ".join(str(e).split())[:300]
        raise SpecdecError(f"{path}: ONNX Runtime cannot load it: {msg}") from None
