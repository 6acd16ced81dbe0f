"""The one place an ONNX Runtime ``InferenceSession`` is made, for the runtime's ORT backend and
for ``verify`` alike: quiet logging, the providers, the thread count, idle threads between calls,
and a one-line ``SpecdecError`` when ONNX Runtime cannot load the model.

Idle threads: speculative decoding alternates two sessions (the TLM and the draft model), and an
ONNX Runtime thread pool spin-waits after each call by default, so the pool of the session that
just ran holds the cores the other one's call needs. Every session made here stops its threads
spinning when a call returns (``session.force_spinning_stop``; they still spin inside a call), unless
the caller's options set that entry. Measured in docs/serving.md ("End of text, threads, host work").

Options are checked before ONNX Runtime sees them (``check_threads``, ``check_providers``): a thread
count that is not a positive integer, or so large that making the pool would take minutes
(``max_threads``), a provider this ONNX Runtime lacks, or a thread count given twice with two values
is one line, never an option quietly dropped or replaced.
"""
from __future__ import annotations

import numbers
import os

from .errors import SpecdecError

CPU, CUDA = "CPUExecutionProvider", "CUDAExecutionProvider"
SPIN_STOP = "session.force_spinning_stop"
#: thread counts above this many per core of the host (or MIN_MAX_THREADS) are refused: ONNX
#: Runtime took 54 s to make a pool of 1024 threads on 2 cores, and a count of 10**6 never returned
THREADS_PER_CORE, MIN_MAX_THREADS = 4, 64


def max_threads() -> int:
    """The largest thread count a session (or OpenVINO's plugin) is given here."""
    return max(MIN_MAX_THREADS, THREADS_PER_CORE * (os.cpu_count() or 1))


def check_threads(n, what: str, *, zero_ok: bool = False) -> int:
    """``n`` as a thread count: an integer (not a bool) in [1, ``max_threads()``] ([0, ...] with
    ``zero_ok``: ONNX Runtime's own default); anything else is one line naming ``what``."""
    if isinstance(n, bool) or not isinstance(n, numbers.Integral):
        raise SpecdecError(f"{what} must be an integer number of threads, got {n!r}")
    top, lo = max_threads(), 0 if zero_ok else 1
    if not lo <= n <= top:
        raise SpecdecError(f"{what} must be in [{lo}, {top}] (at most {THREADS_PER_CORE} per core of this host, "
                           f"or {MIN_MAX_THREADS}), got {n}")
    return int(n)


def threads_from_env(var: str) -> int | None:
    """The thread count environment variable ``var`` gives (None when unset or empty), checked."""
    text = os.environ.get(var, "").strip()
    if not text:
        return None
    try:
        n = int(text)
    except ValueError:
        raise SpecdecError(f"{var} must be an integer number of threads, got {text!r}") from None
    return check_threads(n, var)


def default_providers() -> list[str]:
    """CUDA when onnxruntime-gpu has it, then CPU."""
    import onnxruntime as ort

    return ([CUDA] if CUDA in ort.get_available_providers() else []) + [CPU]


def provider_name(p) -> str:
    """The name of a providers entry: a name, or ONNX Runtime's (name, options) pair."""
    return p[0] if isinstance(p, tuple) else p


def check_providers(providers) -> list | None:
    """``providers`` as a list (None: the default), each a provider this ONNX Runtime has, named as a
    string or as ONNX Runtime's (name, options dict) pair; ONNX Runtime itself would fall back to
    the CPU on an unknown name while the caller believes it runs where it asked."""
    if providers is None:
        return None
    import onnxruntime as ort
    if isinstance(providers, (str, bytes)) or not isinstance(providers, (list, tuple)):
        raise SpecdecError(f"providers must be a list of ONNX Runtime provider names, got {providers!r}")
    have = ort.get_available_providers()
    for p in providers:
        ok = isinstance(p, str) or (isinstance(p, tuple) and len(p) == 2 and isinstance(p[0], str)
                                    and isinstance(p[1], dict))
        if not ok:
            raise SpecdecError(f"providers: {p!r} is not a provider name (or a (name, options) pair)")
        if provider_name(p) not in have:
            raise SpecdecError(f"providers: this ONNX Runtime has no {provider_name(p)} (it has {', '.join(have)})")
    if not providers:
        raise SpecdecError(f"providers is empty: name at least one (this ONNX Runtime has {', '.join(have)})")
    return list(providers)


def create_session(path, *, providers=None, session_options=None, intra_op_threads: int | None = None):
    """An ONNX Runtime session for the model file ``path`` (quiet logging); a
    ``SpecdecError`` of one line when ONNX Runtime cannot load it, or when an option is bad
    (``check_threads``, ``check_providers``; ``intra_op_threads`` and a thread count in
    ``session_options`` that differ). The caller's ``session_options`` keep their thread count."""
    import onnxruntime as ort

    if session_options is not None and not isinstance(session_options, ort.SessionOptions):
        raise SpecdecError(f"session_options must be an onnxruntime.SessionOptions, got "
                           f"{type(session_options).__name__}")
    asked = check_providers(providers)
    so = session_options or ort.SessionOptions()
    own = check_threads(so.intra_op_num_threads, "session_options.intra_op_num_threads", zero_ok=True)
    n = None if intra_op_threads is None else check_threads(intra_op_threads, "intra_op_threads")
    if n is not None and own and own != n:
        raise SpecdecError(f"intra_op_threads={n} but session_options.intra_op_num_threads={own}: "
                           f"give the thread count once")
    so.log_severity_level = 3
    if n:
        so.intra_op_num_threads = n
    if not has_entry(so, SPIN_STOP):
        so.add_session_config_entry(SPIN_STOP, "1")
    try:
        session = ort.InferenceSession(str(path), sess_options=so, providers=asked or default_providers())
    except Exception as e:  # onnxruntime raises its own exception types
        msg = " ".join(str(e).split())[:300]
        raise SpecdecError(f"{path}: ONNX Runtime cannot load it: {msg}") from None
    finally:
        so.intra_op_num_threads = own     # the session holds its own copy of the options
    got = session.get_providers()
    if asked and (not got or got[0] != provider_name(asked[0])):
        raise SpecdecError(f"{path}: ONNX Runtime could not start {provider_name(asked[0])} (asked for "
                           f"{[provider_name(p) for p in asked]}, it runs {got})")
    return session


def has_entry(so, key: str) -> bool:
    """Whether session options ``so`` set the config entry ``key``."""
    try:
        so.get_session_config_entry(key)
    except RuntimeError:    # onnxruntime: "SessionOptions does not have configuration with key"
        return False
    return True
