"""Backends: one compiled model with its retained state kept inside.

The interface is tiny::

    backend = OrtBackend(artifact_dir)        # or QaicBackend(artifact_dir, device_ids=[0])
    logits = backend.run(input_ids, position_ids)   # int64 [B, S] each -> float32 logits
    backend.reset()                           # forget the sequence (zero the cache)

Every call must match one of the artifact's specializations (batch, seq_len)
exactly, as the device demands; anything else is a ``SpecdecError``. Positions
must be in ``[-1, ctx_len)``, with padding (-1) only at the right end of a row.

ONNX Runtime: the cache lives in OrtValues bound with IO binding. For an
``ort`` target (TensorScatter) each ``past_*.{i}_RetainedState`` output is
bound to the same buffer as its input, so ONNX Runtime updates the cache in
place; for a ``qaic`` target (ScatterND in a function) the outputs go to a
second set of buffers that are swapped with the inputs after the call.
``inplace=False`` forces the swap path for an ``ort`` target too (for
measuring what in-place buys).

Cloud AI 100: the QPC is loaded with ``qaicrt``; the retained-state buffers
are given as zero-size buffers, so the device keeps the cache on its side.
"""
from __future__ import annotations

import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

from ..errors import SpecdecError
from .artifact import Artifact, load_artifact

_ORT_TYPES = {
    "tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(double)": np.float64,
    "tensor(int64)": np.int64, "tensor(int32)": np.int32, "tensor(bfloat16)": None,
}


class Backend:
    """A model with retained state. Subclasses implement ``_run`` and ``_reset``."""

    kind = "abstract"

    def __init__(self, artifact: Artifact):
        self.artifact = artifact
        self.calls = 0
        self.time_s = 0.0

    # -- shape facts ---------------------------------------------------
    @property
    def role(self) -> str:
        return self.artifact.role

    @property
    def batch_size(self) -> int:
        return self.artifact.batch_size

    @property
    def ctx_len(self) -> int:
        return self.artifact.ctx_len

    @property
    def prefill_len(self) -> int:
        return self.artifact.prefill_len

    @property
    def seq_lens(self) -> tuple[int, ...]:
        return self.artifact.seq_lens

    @property
    def vocab_size(self) -> int | None:
        return self.artifact.vocab_size

    # -- calls ----------------------------------------------------------
    def check_inputs(self, input_ids, position_ids) -> tuple[np.ndarray, np.ndarray]:
        ids = np.ascontiguousarray(input_ids, dtype=np.int64)
        pos = np.ascontiguousarray(position_ids, dtype=np.int64)
        if ids.ndim != 2 or pos.shape != ids.shape:
            raise SpecdecError(f"{self.artifact.name}: input_ids {list(ids.shape)} and position_ids "
                               f"{list(pos.shape)} must both be [batch, seq_len]")
        self.artifact.check_call(*ids.shape)
        if pos.size:
            if pos.min() < -1 or pos.max() >= self.ctx_len:
                raise SpecdecError(f"{self.artifact.name}: positions must lie in [-1, {self.ctx_len}) "
                                   f"(got {int(pos.min())}..{int(pos.max())})")
            pad = pos < 0
            # padding only at the right end of a row: once padded, stays padded
            if np.any(pad[:, :-1] & ~pad[:, 1:]):
                raise SpecdecError(f"{self.artifact.name}: padding (position -1) must be at the right end of a row")
        v = self.vocab_size
        if v and ids.size and (ids.min() < 0 or ids.max() >= v):
            raise SpecdecError(f"{self.artifact.name}: token id out of range [0, {v})")
        return ids, pos

    def run(self, input_ids, position_ids) -> np.ndarray:
        """Run one call; returns float32 logits (TLM [B, S, V], DLM [B, 1, V])."""
        ids, pos = self.check_inputs(input_ids, position_ids)
        t0 = time.perf_counter()
        out = self._run(ids, pos)
        self.time_s += time.perf_counter() - t0
        self.calls += 1
        return out

    def reset(self) -> None:
        """Forget the current sequence: the cache goes back to zeros."""
        self._reset()

    def warmup(self, rounds: int = 1) -> None:
        """Run every specialization once (all padding), then reset: first-call
        costs (allocation, kernel selection) stay out of measurements."""
        B = self.batch_size
        for _ in range(rounds):
            for s in self.seq_lens:
                ids = np.zeros((B, s), np.int64)
                pos = np.full((B, s), -1, np.int64)
                pos[:, 0] = 0   # one valid token per row, so every role has logits to give
                self._run(ids, pos)
        self.reset()

    def close(self) -> None:
        pass

    def _run(self, ids: np.ndarray, pos: np.ndarray) -> np.ndarray:  # pragma: no cover
        raise NotImplementedError

    def _reset(self) -> None:  # pragma: no cover
        raise NotImplementedError

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def describe(self) -> str:
        a = self.artifact
        return (f"{self.kind} {a.role.upper()} {a.path} (target {a.target}, B={a.batch_size}, "
                f"PL={a.prefill_len}, CL={a.ctx_len}, seq_lens={list(a.seq_lens)})")


def _artifact(artifact_or_path, expect_role, need_model) -> Artifact:
    if isinstance(artifact_or_path, Artifact):
        return artifact_or_path
    return load_artifact(artifact_or_path, expect_role=expect_role, need_model=need_model)


def _with_vocab(a: Artifact, vocab: int | None, where: str) -> Artifact:
    if vocab is None:
        return a
    if a.vocab_size is not None and a.vocab_size != vocab:
        raise SpecdecError(f"{a.path}: manifest.json says vocab {a.vocab_size} but the {where} has {vocab}")
    if a.vocab_size == vocab:
        return a
    from dataclasses import replace
    return replace(a, vocab_size=vocab)


# ----------------------------------------------------------------------------
# ONNX Runtime
# ----------------------------------------------------------------------------

def _kv_names(names: list[str]) -> list[str]:
    past = [n for n in names if n.startswith("past_key.") or n.startswith("past_value.")]

    def key(n):
        kind, _, i = n.partition(".")
        return (int(i) if i.isdigit() else 1 << 30, kind)
    return sorted(past, key=key)


class OrtBackend(Backend):
    """ONNX Runtime with IO binding; CUDA when onnxruntime-gpu is installed.

    ``inplace``: None (default) = in place for ``ort`` targets, swap for ``qaic``
    targets; False forces the swap (copy) path; True forces in place.
    ``providers``: ONNX Runtime providers; default CUDA if available, else CPU.
    """

    kind = "ort"

    def __init__(self, artifact, *, inplace: bool | None = None, providers=None, device_id: int = 0,
                 expect_role: str | None = None, session_options=None, intra_op_threads: int | None = None):
        import onnxruntime as ort

        art = _artifact(artifact, expect_role, need_model=True)
        super().__init__(art)
        self._ort = ort
        available = ort.get_available_providers()
        if providers is None:
            providers = ["CUDAExecutionProvider"] if "CUDAExecutionProvider" in available else []
            providers.append("CPUExecutionProvider")
        self.providers = list(providers)
        self.device = "cuda" if self.providers[0] == "CUDAExecutionProvider" else "cpu"
        self.device_id = device_id if self.device == "cuda" else 0
        so = session_options or ort.SessionOptions()
        so.log_severity_level = 3
        if intra_op_threads is None and os.environ.get("SPECDEC_ORT_THREADS"):
            intra_op_threads = int(os.environ["SPECDEC_ORT_THREADS"])
        if intra_op_threads:
            so.intra_op_num_threads = intra_op_threads
        try:
            self.session = ort.InferenceSession(str(art.model_path), sess_options=so, providers=self.providers)
        except Exception as e:  # onnxruntime raises its own exception types
            msg = " ".join(str(e).split())[:300]
            raise SpecdecError(f"{art.model_path}: ONNX Runtime cannot load it: {msg}") from None

        ins = {i.name: i for i in self.session.get_inputs()}
        outs = {o.name: o for o in self.session.get_outputs()}
        for need in ("input_ids", "position_ids"):
            if need not in ins:
                raise SpecdecError(f"{art.model_path}: no {need!r} input; not a graph rewritten by specdec-compile")
        if "logits" not in outs:
            raise SpecdecError(f"{art.model_path}: no 'logits' output")
        extra = sorted(set(ins) - {"input_ids", "position_ids"} - set(_kv_names(list(ins))))
        if extra:
            raise SpecdecError(f"{art.model_path}: unexpected inputs {extra}; the contract allows only "
                               f"input_ids, position_ids and past_key/past_value")
        self.kv_names = _kv_names(list(ins))
        if not self.kv_names:
            raise SpecdecError(f"{art.model_path}: no past_key.{{i}} / past_value.{{i}} inputs")
        for n in self.kv_names:
            if f"{n}_RetainedState" not in outs:
                raise SpecdecError(f"{art.model_path}: input {n} has no {n}_RetainedState output")

        # cache geometry: [batch_size, n_kv_heads, ctx_len, head_dim]
        self.kv_shapes = {}
        self.kv_dtypes = {}
        for n in self.kv_names:
            shape = list(ins[n].shape)
            if len(shape) != 4:
                raise SpecdecError(f"{art.model_path}: {n} has rank {len(shape)}, expected 4")
            fixed = [art.batch_size, shape[1], art.ctx_len, shape[3]]
            for dim, (val, name) in enumerate(zip(shape, ("batch_size", "n_kv_heads", "ctx_len", "head_dim"))):
                if isinstance(val, int) and val != fixed[dim] and dim in (0, 2):
                    raise SpecdecError(f"{art.model_path}: {n} has {name}={val} but the specializations say {fixed[dim]}")
            if not isinstance(fixed[1], int):
                fixed[1] = art.num_kv_heads
            if not isinstance(fixed[3], int):
                fixed[3] = art.head_dim
            if not all(isinstance(d, int) and d > 0 for d in fixed):
                raise SpecdecError(f"{art.model_path}: cannot tell the cache shape of {n} ({shape})")
            dt = _ORT_TYPES.get(ins[n].type)
            if dt is None:
                raise SpecdecError(f"{art.model_path}: {n} has type {ins[n].type}, not supported by this runtime")
            self.kv_shapes[n] = tuple(fixed)
            self.kv_dtypes[n] = np.dtype(dt)
        lshape = outs["logits"].shape
        vocab = lshape[-1] if lshape and isinstance(lshape[-1], int) else None
        self.artifact = _with_vocab(art, vocab, "graph's logits")
        self.logits_dtype = np.dtype(_ORT_TYPES.get(outs["logits"].type) or np.float32)

        self.inplace = (art.target == "ort") if inplace is None else bool(inplace)
        self._io = self.session.io_binding()
        self._a = {n: self._zeros(n) for n in self.kv_names}
        self._b = None if self.inplace else {n: self._zeros(n) for n in self.kv_names}
        # logits is bound first so that it is output 0 of the binding
        self._io.bind_output("logits", self.device, self.device_id)
        self._bind_cache()

    def _zeros(self, name):
        arr = np.zeros(self.kv_shapes[name], self.kv_dtypes[name])
        return self._ort.OrtValue.ortvalue_from_numpy(arr, self.device, self.device_id)

    def _bind_cache(self):
        io = self._io
        for n in self.kv_names:
            src = self._a[n]
            dst = src if self.inplace else self._b[n]
            io.bind_ortvalue_input(n, src)
            io.bind_ortvalue_output(f"{n}_RetainedState", dst)

    def _run(self, ids, pos):
        io = self._io
        io.bind_cpu_input("input_ids", ids)
        io.bind_cpu_input("position_ids", pos)
        io.bind_output("logits", self.device, self.device_id)
        try:
            self.session.run_with_iobinding(io)
        except Exception as e:
            msg = " ".join(str(e).split())[:300]
            raise SpecdecError(f"{self.artifact.name}: ONNX Runtime failed: {msg}") from None
        logits = io.get_outputs()[0]
        out = logits.numpy() if self.device == "cpu" else io.copy_outputs_to_cpu()[0]
        if not self.inplace:
            self._a, self._b = self._b, self._a
            self._bind_cache()
        return np.array(out, dtype=np.float32, copy=True)

    def _reset(self):
        for bufs in (self._a, self._b):
            if bufs:
                for n, ov in bufs.items():
                    ov.update_inplace(np.zeros(self.kv_shapes[n], self.kv_dtypes[n]))

    def cache(self, name: str) -> np.ndarray:
        """A copy of the current cache ``name`` (for tests)."""
        return self._a[name].numpy().copy()

    def close(self):
        self._io = None
        self.session = None


# ----------------------------------------------------------------------------
# Cloud AI 100 (qaicrt)
# ----------------------------------------------------------------------------

def import_qaicrt():
    """(qaicrt, QAicApi_pb2) from the Cloud AI 100 platform SDK, or a SpecdecError."""
    mods = []
    for name, extra in (("qaicrt", f"/opt/qti-aic/dev/lib/{platform.machine()}"),
                        ("QAicApi_pb2", "/opt/qti-aic/dev/python")):
        try:
            mods.append(__import__(name))
            continue
        except ImportError:
            pass
        if os.path.isdir(extra) and extra not in sys.path:
            sys.path.append(extra)
        try:
            mods.append(__import__(name))
        except ImportError:
            raise SpecdecError(f"--backend qaic needs the Cloud AI 100 runtime ({name} not importable; "
                               f"install the platform SDK under /opt/qti-aic)") from None
    return mods[0], mods[1]


def find_qpc(artifact: Artifact, qpc=None) -> Path:
    """The QPC directory of an artifact: ``qpc`` if given, else OUT/qpc (or the
    -aic-binary-dir named by the manifest); it must hold programqpc.bin."""
    cands = []
    if qpc is not None:
        cands = [Path(qpc)]
    else:
        m = artifact.manifest
        for key in ("qpc_dir", "qpc", "aic_binary_dir"):
            if isinstance(m.get(key), str):
                q = Path(m[key])
                cands.append(q if q.is_absolute() else artifact.path / q)
        cands += [artifact.path / "qpc", artifact.path / "qpcs", artifact.path]
    for c in cands:
        if (c / "programqpc.bin").is_file():
            return c
        if c.name == "programqpc.bin" and c.is_file():
            return c.parent
    raise SpecdecError(f"{artifact.path}: no compiled QPC (programqpc.bin) in "
                       f"{', '.join(str(c) for c in cands)}; run its compile.sh first")


class QaicBackend(Backend):
    """Cloud AI 100 via ``qaicrt``: retained state stays on the device.

    ``qaicrt_module`` / ``aicapi_module`` replace the SDK modules (tests pass
    fakes); ``device_ids``: the devices of this model (several = a multi-device
    QPC). ``qpc``: the QPC directory (default: OUT/qpc).
    """

    kind = "qaic"

    def __init__(self, artifact, *, device_ids=None, qpc=None, expect_role: str | None = None,
                 qaicrt_module=None, aicapi_module=None):
        if qaicrt_module is None or aicapi_module is None:
            rt, api = import_qaicrt()
            qaicrt_module = qaicrt_module or rt
            aicapi_module = aicapi_module or api
        art = _artifact(artifact, expect_role, need_model=False)
        super().__init__(art)
        self.rt = rt = qaicrt_module
        self.api = api = aicapi_module
        self.qpc_path = find_qpc(art, qpc)
        self.device_ids = list(device_ids) if device_ids else None
        ok = rt.QStatus.QS_SUCCESS

        def check(status, what):
            if status != ok:
                raise SpecdecError(f"{art.name}: qaicrt {what} failed ({status})")

        self._dtypes = {api.FLOAT_TYPE: np.dtype(np.float32), api.FLOAT_16_TYPE: np.dtype(np.float16),
                        api.INT64_I_TYPE: np.dtype(np.int64), api.INT32_I_TYPE: np.dtype(np.int32)}
        if self.device_ids:
            self.context = rt.Context(rt.QIDList(self.device_ids))
            self.queue = rt.Queue(self.context, self.device_ids[0])
        else:
            self.context = rt.Context()
            self.queue = rt.Queue(self.context, 0)
        qpc_obj = rt.Qpc(str(self.qpc_path))
        status, raw = qpc_obj.getIoDescriptor()
        check(status, "getIoDescriptor")
        iodesc = api.IoDesc()
        iodesc.ParseFromString(bytes(raw))
        self.bindings = list(iodesc.selected_set.bindings)
        self.index = {b.name: b.index for b in self.bindings}
        for need in ("input_ids", "position_ids", "logits"):
            if need not in self.index:
                raise SpecdecError(f"{self.qpc_path}: the QPC has no {need!r} binding")
        for b in self.bindings:
            if b.type not in self._dtypes:
                raise SpecdecError(f"{self.qpc_path}: binding {b.name} has an unsupported type {b.type}")
        # the shapes the device accepts, per specialization: {name: dims}
        self.allowed = []
        for shape_set in iodesc.allowed_shapes:
            self.allowed.append({b.name: tuple(s.dims) for b, s in zip(self.bindings, shape_set.shapes)})
        self.retained = [b.name for b in self.bindings
                         if b.name.startswith("past_") or b.name.endswith("_RetainedState")]
        lb = self.bindings[self.index["logits"]]
        self.artifact = _with_vocab(art, int(lb.dims[-1]), "QPC's logits binding")
        self.logits_dtype = self._dtypes[lb.type]
        # every (batch, seq_len) the artifact declares must be one the QPC accepts
        if self.allowed:
            qpc_shapes = {tuple(a["input_ids"]) for a in self.allowed if "input_ids" in a}
            missing = [s for s in art.shapes() if s not in qpc_shapes]
            if missing:
                raise SpecdecError(f"{self.qpc_path}: the QPC was compiled for input_ids shapes "
                                   f"{sorted(qpc_shapes)}, not the artifact's {missing}")

        props = rt.QAicProgramProperties()
        single = None
        if self.device_ids and len(self.device_ids) == 1:
            single = self.device_ids[0]
        elif self.device_ids:
            props.devMapping = ":".join(map(str, self.device_ids))
        self.program = rt.Program(self.context, single, qpc_obj, props)
        check(self.program.load(), "program load")
        check(self.program.activate(), "program activate")
        self.exec_obj = rt.ExecObj(self.context, self.program)
        self._check = check
        self._zero_next = False
        # buffers: retained state skipped (zero-size), the rest set per call
        self.qbuffers = [rt.QBuffer(bytes(0)) for _ in self.bindings]
        self.dims = [(self._dtypes[b.type].itemsize, [0]) for b in self.bindings]

    def _set(self, name, arr: np.ndarray):
        i = self.index[name]
        self.qbuffers[i] = self.rt.QBuffer(arr.tobytes())
        self.dims[i] = (arr.itemsize, list(arr.shape) if arr.shape else [1])

    def _skip(self, name):
        i = self.index[name]
        self.qbuffers[i] = self.rt.QBuffer(bytes(0))
        self.dims[i] = (self._dtypes[self.bindings[i].type].itemsize, [0])

    def _run(self, ids, pos):
        rt = self.rt
        B, S = ids.shape
        out_s = S if self.role == "tlm" else 1
        logits_shape = (B, out_s, self.vocab_size)
        if self.allowed and not any(a.get("input_ids") == (B, S) and a.get("logits", logits_shape) == logits_shape
                                    for a in self.allowed):
            raise SpecdecError(f"{self.qpc_path}: no matching dimension for input_ids [{B}, {S}] in the QPC")
        self._set("input_ids", ids)
        self._set("position_ids", pos)
        self._set("logits", np.zeros(logits_shape, self.logits_dtype))
        for n in self.retained:
            b = self.bindings[self.index[n]]
            if self._zero_next and n.startswith("past_") and not n.endswith("_RetainedState"):
                self._set(n, np.zeros(tuple(b.dims), self._dtypes[b.type]))
            else:
                self._skip(n)
        self._zero_next = False
        self._check(self.exec_obj.setData(self.qbuffers, rt.BufferDimensionsVecRef(self.dims)), "setData")
        self._check(self.queue.enqueue(self.exec_obj), "enqueue")
        self._check(self.exec_obj.waitForCompletion(), "run (waitForCompletion)")
        status, outs = self.exec_obj.getData()
        self._check(status, "getData")
        raw = bytes(outs[self.index["logits"]])
        return np.frombuffer(raw, self.logits_dtype).reshape(logits_shape).astype(np.float32)

    def _reset(self):
        # the next call uploads zero caches once; later calls skip them again
        self._zero_next = True

    def close(self):
        prog = getattr(self, "program", None)
        if prog is not None:
            try:
                prog.deactivate()
            except Exception:
                pass
            self.program = None


def open_backend(artifact, kind: str = "ort", *, expect_role=None, device_ids=None, **kw) -> Backend:
    """Open an artifact directory with the named backend (``ort`` or ``qaic``)."""
    if kind == "ort":
        if device_ids:
            kw.setdefault("device_id", int(device_ids[0]))
        return OrtBackend(artifact, expect_role=expect_role, **kw)
    if kind == "qaic":
        return QaicBackend(artifact, expect_role=expect_role, device_ids=device_ids, **kw)
    raise SpecdecError(f"unknown backend {kind!r} (ort or qaic)")
