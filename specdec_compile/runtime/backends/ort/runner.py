"""Running on ONNX Runtime: the cache lives in OrtValues bound with IO binding.

For an ``ort`` target (TensorScatter) each ``past_*.{i}_RetainedState`` output
is bound to the same buffer as its input, so ONNX Runtime updates the cache in
place; for a ``qaic`` target (ScatterND in a function) the outputs go to a
second set of buffers that are swapped with the inputs after the call.
``inplace=False`` forces the swap path for an ``ort`` target too (for
measuring what in-place buys).
"""
from __future__ import annotations

import numpy as np

from ....contract import BATCH_INDEX, INPUT_IDS, LOGITS, NUM_LOGITS_TO_KEEP, POSITION_IDS
from ....errors import SpecdecError
from ..base import Backend, check_role
from .loader import OrtModel, load_ort


def output_plan(device: str, kv_names, extra=()) -> dict[str, str]:
    """Where each output of a call is bound: the logits and the extra outputs
    (hidden states) on the host (ORT copies just them off the device), every
    cache buffer on the model's device (written in place, or into the swap
    buffer). Nothing else crosses to the host: no ``copy_outputs_to_cpu``, which
    would copy the whole cache each call on CUDA."""
    plan = {LOGITS: "cpu"}
    for n in kv_names:
        plan[f"{n}_RetainedState"] = device
    for n in extra:
        plan[n] = "cpu"
    return plan


class OrtBackend(Backend):
    """ONNX Runtime with IO binding; CUDA when onnxruntime-gpu is installed.

    ``artifact``: an artifact directory, an ``Artifact``, or an ``OrtModel``
    already loaded by ``load_ort`` (then a loading option given too is refused: it would be dropped).
    ``inplace``: None (default) = in place for ``ort`` targets, swap for ``qaic``
    targets; False forces the swap (copy) path; True forces in place.
    ``providers``: ONNX Runtime providers; default CUDA if available, else CPU.
    ``session_options``: ONNX Runtime's; they gain ``session.force_spinning_stop`` = 1 unless they
    set it (threads idle between calls: ``ort_session.create_session``).
    """

    kind = "ort"

    def __init__(self, artifact, *, inplace: bool | None = None, providers=None, device_id: int = 0,
                 expect_role: str | None = None, session_options=None, intra_op_threads: int | None = None):
        import onnxruntime as ort

        if isinstance(artifact, OrtModel):
            given = [n for n, v in (("providers", providers), ("session_options", session_options),
                                    ("intra_op_threads", intra_op_threads), ("device_id", device_id or None))
                     if v is not None]
            if given:   # the session exists: options for making one would be dropped without a word
                raise SpecdecError(f"{artifact.artifact.name}: {', '.join(given)} given with a model load_ort already "
                                   f"loaded; pass them to load_ort (or give OrtBackend the artifact directory)")
            check_role(artifact.artifact, expect_role)
            model = artifact
        else:
            model = load_ort(artifact, providers=providers, device_id=device_id, expect_role=expect_role,
                             session_options=session_options, intra_op_threads=intra_op_threads)
        super().__init__(model.artifact)
        self._ort = ort
        self.model = model
        self.session = model.session
        self.providers = model.providers
        self.device, self.device_id = model.device, model.device_id
        self.kv_names, self.kv_shapes, self.kv_dtypes = model.kv_names, model.kv_shapes, model.kv_dtypes
        self.logits_dtype = model.logits_dtype
        # an --interface qeff ort graph writes with ScatterND, bound in place too: the slots' old values
        # it reads (GatherND) feed the write, so they are read first, and attention reads its output
        if inplace not in (None, True, False):
            raise SpecdecError(f"{self.artifact.name}: inplace must be None, True or False, got {inplace!r}")
        self.inplace = (self.artifact.target == "ort") if inplace is None else bool(inplace)
        self._io = self.session.io_binding()
        self._a = {n: self._zeros(n) for n in self.kv_names}
        self._b = None if self.inplace else {n: self._zeros(n) for n in self.kv_names}
        self.extra_names = list(self.extra_outputs)
        self.input_dtypes = model.input_dtypes
        self.plan = output_plan(self.device, self.kv_names, self.extra_names)
        # (rows, width) -> {output: (OrtValue, the numpy array it wraps)}, the logits and each extra
        # output: a host buffer per call shape (an --interface qeff prefill runs at batch 1 and its
        # decode at full batch, possibly at the same width), bound once its shape is known, so that
        # a call with extra outputs binds and reads what a call without them does (no get_outputs)
        self._host: dict = {}
        self._bound = None          # the (rows, width) whose buffers are bound now
        # logits is bound first so that it is output 0 of the binding
        self._io.bind_output(LOGITS, self.plan[LOGITS])
        self._bind_cache()
        for n in self.extra_names:   # after the cache: outputs 1 + 2L.. of the binding
            self._io.bind_output(n, self.plan[n])

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
        return self._run_outputs(ids, pos, {n: np.zeros((*ids.shape, w), np.float32)
                                            for n, w in self.extra_inputs.items()})[LOGITS]

    def _set_rows(self, rows):
        self._rows = rows

    def _run_outputs(self, ids, pos, extra):
        io = self._io
        io.bind_cpu_input(INPUT_IDS, ids)
        io.bind_cpu_input(POSITION_IDS, pos)
        if self.artifact.cache_rows:    # contract section 7: the call's cache rows
            io.bind_cpu_input(BATCH_INDEX, self._rows)
        if self.artifact.qeff:          # the TLM keeps every column
            if self.artifact.role == "tlm":
                io.bind_cpu_input(NUM_LOGITS_TO_KEEP, np.zeros((ids.shape[1], 1), np.int64))
        for n, a in extra.items():
            io.bind_cpu_input(n, np.ascontiguousarray(a, dtype=self.input_dtypes.get(n, np.float32)))
        S = tuple(ids.shape)
        bufs = self._host.get(S)       # host buffers for this call shape, once its shapes are known
        if S != self._bound or bufs is None:
            for n in (LOGITS, *self.extra_names):
                if bufs is None:
                    io.bind_output(n, self.plan[n])     # ORT allocates them (only these reach the host)
                else:
                    io.bind_ortvalue_output(n, bufs[n][0])
            self._bound = S
        try:
            self.session.run_with_iobinding(io)
        except Exception as e:
            msg = " ".join(str(e).split())[:300]
            raise SpecdecError(f"{self.artifact.name}: ONNX Runtime failed: {msg}") from None
        if bufs is None:
            bufs = self._new_buffers(S, io.get_outputs())
        if not self.inplace:
            self._a, self._b = self._b, self._a
            self._bind_cache()
        # copies: the buffers are written again by the next call
        return {LOGITS: np.array(bufs[LOGITS][1], dtype=np.float32, copy=True),
                **{n: np.array(bufs[n][1], dtype=np.float32, copy=True) for n in self.extra_names}}

    def _new_buffers(self, S, got) -> dict:
        """Host buffers shaped as this first call of shape ``S`` returned its logits and extra outputs
        (filled with them), bound from the next call of this shape on."""
        outs = {LOGITS: got[0]}
        outs.update((n, got[1 + len(self.kv_names) + i]) for i, n in enumerate(self.extra_names))
        bufs = {}
        for n, ov in outs.items():
            arr = np.array(ov.numpy(), copy=True)
            bufs[n] = (self._ort.OrtValue.ortvalue_from_numpy(arr), arr)
        self._host[S] = bufs
        self._bound = None                  # bind the new buffers on the next call of this shape
        return bufs

    def _reset(self):
        for bufs in (self._a, self._b):
            if bufs:
                for n, ov in bufs.items():
                    ov.update_inplace(np.zeros(self.kv_shapes[n], self.kv_dtypes[n]))

    def cache(self, name: str) -> np.ndarray:
        """A copy of the current cache ``name`` (for tests)."""
        self.check_open()
        return self._a[name].numpy().copy()

    def close(self):
        super().close()
        self._io = None
        self.session = None
        self.model = None
