"""The one place an ONNX Runtime ``InferenceSession`` is made, for the runtime's ORT backend and
for ``verify`` alike: quiet logging, the providers, the thread count, idle threads between calls,
and a one-line ``SpecdecError`` when ONNX Runtime cannot load the model.

Idle threads: speculative decoding alternates two sessions (the TLM and the draft model), and an
ONNX Runtime thread pool spin-waits after each call by default, so the pool of the session that
just ran holds the cores the other one's call needs. Every session made here stops its threads
spinning when a call returns (``session.force_spinning_stop``; they still spin inside a call), unless
the caller's options set that entry. Measured in docs/serving.md ("End of text, threads, host work").
"""
from __future__ import annotations

from .errors import SpecdecError

CPU, CUDA = "CPUExecutionProvider", "CUDAExecutionProvider"
SPIN_STOP = "session.force_spinning_stop"


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
    if not has_entry(so, SPIN_STOP):
        so.add_session_config_entry(SPIN_STOP, "1")
    try:
        return ort.InferenceSession(str(path), sess_options=so,
                                    providers=list(providers) if providers else default_providers())
    except Exception as e:  # onnxruntime raises its own exception types
        msg = " ".join(str(e).split())[:300]
        raise SpecdecError(f"{path}: ONNX Runtime cannot load it: {msg}") from None


def has_entry(so, key: str) -> bool:
    """Whether session options ``so`` set the config entry ``key``."""
    try:
        so.get_session_config_entry(key)
    except RuntimeError:    # onnxruntime: "SessionOptions does not have configuration with key"
        return False
    return True
