"""Running on Cloud AI 100 via ``qaicrt``: the retained-state buffers are given
as zero-size buffers, so the device keeps the cache on its side."""
from __future__ import annotations

import numpy as np

from ....contract import BATCH_INDEX, INPUT_IDS, LOGITS, NUM_LOGITS_TO_KEEP, POSITION_IDS
from ....errors import SpecdecError
from ..base import Backend, check_role
from .loader import QaicProgram, guarded, load_qaic


class QaicBackend(Backend):
    """Cloud AI 100 via ``qaicrt``: retained state stays on the device.

    ``artifact``: an artifact directory, an ``Artifact``, or a ``QaicProgram``
    already loaded by ``load_qaic``. ``qaicrt_module`` / ``aicapi_module``
    replace the SDK modules (tests pass fakes); ``device_ids``: the devices of
    this model (several = a multi-device QPC). ``qpc``: the QPC directory
    (default: OUT/qpc).
    """

    kind = "qaic"

    def __init__(self, artifact, *, device_ids=None, qpc=None, expect_role: str | None = None,
                 qaicrt_module=None, aicapi_module=None):
        if isinstance(artifact, QaicProgram):
            given = [n for n, v in (("device_ids", device_ids), ("qpc", qpc), ("qaicrt_module", qaicrt_module),
                                    ("aicapi_module", aicapi_module)) if v is not None]
            if given:   # loaded already: these would be dropped without a word
                raise SpecdecError(f"{artifact.artifact.name}: {', '.join(given)} given with a program load_qaic "
                                   f"already loaded; pass them to load_qaic (or give the artifact directory)")
            check_role(artifact.artifact, expect_role)
            loaded = artifact
        else:
            loaded = load_qaic(artifact, device_ids=device_ids, qpc=qpc, expect_role=expect_role,
                               qaicrt_module=qaicrt_module, aicapi_module=aicapi_module)
        super().__init__(loaded.artifact)
        self.loaded = loaded
        self.rt = loaded.rt
        self.qpc_path = loaded.qpc_path
        self.device_ids = loaded.device_ids
        self.program = loaded.program
        self.bindings, self.index, self.allowed = loaded.bindings, loaded.index, loaded.allowed
        self.retained = loaded.retained
        self.logits_type = loaded.logits_type
        self._dtypes = loaded.dtypes
        self._zero_next = False
        # buffers: retained state skipped (zero-size), the rest set per call
        self.qbuffers = [self.rt.QBuffer(bytes(0)) for _ in self.bindings]
        self.dims = [(self._dtypes[b.type].itemsize, [0]) for b in self.bindings]

    def _set(self, name, values: np.ndarray):
        """``values`` into the binding's buffer, in its type (buffers.py)."""
        i = self.index[name]
        arr = self._dtypes[self.bindings[i].type].encode(values)
        self.qbuffers[i] = self.rt.QBuffer(arr.tobytes())
        self.dims[i] = (arr.itemsize, list(arr.shape) if arr.shape else [1])

    def _get(self, outs, name, shape) -> np.ndarray:
        """A float output's values as float32; a buffer not of the call's size is refused (never
        reshaped from another call's rows)."""
        i = self.index[name]
        t = self._dtypes[self.bindings[i].type]
        raw = guarded(self.artifact.name, f"getData ({name})", lambda: bytes(outs[i]))
        if len(raw) != t.itemsize * int(np.prod(shape)):
            raise SpecdecError(f"{self.qpc_path}: the device gave {name} of {len(raw)} bytes, not the "
                               f"{list(shape)} {t.name} ({t.itemsize * int(np.prod(shape))} bytes) of this call")
        return t.decode(raw, shape)

    def _exec(self) -> list:
        """One run of the buffers set: setData, enqueue, wait, getData (every status checked; an
        exception from qaicrt is one line too)."""
        rt, lp, where = self.rt, self.loaded, self.artifact.name
        dims = guarded(where, "BufferDimensionsVecRef", rt.BufferDimensionsVecRef, self.dims)
        lp.check(guarded(where, "setData", lp.exec_obj.setData, self.qbuffers, dims), "setData")
        lp.check(guarded(where, "enqueue", lp.queue.enqueue, lp.exec_obj), "enqueue")
        lp.check(guarded(where, "run (waitForCompletion)", lp.exec_obj.waitForCompletion), "run (waitForCompletion)")
        status, outs = guarded(where, "getData", lp.exec_obj.getData)
        lp.check(status, "getData")
        return outs

    def _skip(self, name):
        i = self.index[name]
        self.qbuffers[i] = self.rt.QBuffer(bytes(0))
        self.dims[i] = (self._dtypes[self.bindings[i].type].itemsize, [0])

    def _run(self, ids, pos):
        return self._run_outputs(ids, pos, {n: np.zeros((*ids.shape, w), np.float32)
                                            for n, w in self.extra_inputs.items()})[LOGITS]

    def _set_rows(self, rows):
        self._rows = rows

    def _kept(self, B: int, S: int) -> int:
        """The logits columns a TLM call of [B, S] gives: S, or an --interface qeff
        specialization's num_logits_to_keep (1 at prefill): the manifest's, else the QPC's largest."""
        if not (self.artifact.qeff and self.role == "tlm"):
            return S
        # the manifest's specialization first: load_qaic checked that the QPC has it
        ns = [int(sp["num_logits_to_keep"]) for sp in (self.artifact.manifest.get("qeff") or {}).get(
            "specializations", []) if (int(sp["batch_size"]), int(sp["seq_len"])) == (B, S)]
        ns = ns or [a[NUM_LOGITS_TO_KEEP][0] for a in self.allowed
                    if a.get(INPUT_IDS) == (B, S) and NUM_LOGITS_TO_KEEP in a]
        return max(ns) if ns else S

    def _run_outputs(self, ids, pos, extra):
        B, S = ids.shape
        n = self._kept(B, S)
        out_s = n if self.role == "tlm" else 1
        logits_shape = (B, out_s, self.vocab_size)
        if self.allowed and not any(a.get(INPUT_IDS) == (B, S) and a.get(LOGITS, logits_shape) == logits_shape
                                    for a in self.allowed):
            raise SpecdecError(f"{self.qpc_path}: no matching dimension for input_ids [{B}, {S}] in the QPC")
        self._set(INPUT_IDS, ids)
        self._set(POSITION_IDS, pos)
        if self.artifact.cache_rows:    # contract section 7: the call's cache rows
            self._set(BATCH_INDEX, self._rows)
        if self.artifact.qeff:          # a TLM's kept columns
            if self.role == "tlm":
                self._set(NUM_LOGITS_TO_KEEP, np.zeros((n, 1), np.int64))
        self._set(LOGITS, self.logits_type.zeros(logits_shape))
        for n, a in extra.items():          # a feature draft's features, in the binding's type (float16 per custom IO)
            self._set(n, a)
        for n, w in self.extra_outputs.items():
            self._set(n, np.zeros((B, S, w), np.float32))
        for n in self.retained:
            b = self.bindings[self.index[n]]
            if self._zero_next and n.startswith("past_") and not n.endswith("_RetainedState"):
                self._set(n, self._dtypes[b.type].zeros(b.dims))
            else:
                self._skip(n)
        outs = self._exec()
        self._zero_next = False     # only once a call ran: a failed one leaves the zeros to the next
        res = {LOGITS: self._get(outs, LOGITS, logits_shape)}
        if out_s != S and self.role == "tlm":
            res[LOGITS] = place_kept(res[LOGITS], pos, S)
        for n, w in self.extra_outputs.items():
            res[n] = self._get(outs, n, (B, S, w))
        return res

    def _reset(self):
        # the next call uploads zero caches once; later calls skip them again
        self._zero_next = True

    def close(self):
        super().close()
        prog = getattr(self, "program", None)
        if prog is not None:
            try:
                prog.deactivate()
            except Exception:
                pass
            self.program = None


def place_kept(kept: np.ndarray, pos: np.ndarray, S: int) -> np.ndarray:
    """[B, n, V] logits of an --interface qeff TLM call (the n columns ending at each row's last
    valid column L, or 0..n-1 when L+1 < n: contract section 7) placed in a [B, S, V] array at
    those columns; the columns the device did not give are NaN, never another column's values."""
    B, n, V = kept.shape
    out = np.full((B, S, V), np.nan, np.float32)
    for r in range(B):
        last = int(np.argmax(pos[r])) if np.any(pos[r] >= 0) else -1   # the largest position's column
        first = max(last + 1 - n, 0)
        out[r, first:first + n] = kept[r]
    return out
