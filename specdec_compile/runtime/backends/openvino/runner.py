"""Running on OpenVINO: the cache lives in the infer request's state variables.

``load_openvino`` made every ``past_*.{i}`` / ``_RetainedState`` pair a state
variable (``MakeStateful``), so a call passes only the ids, the positions (and a
feature draft's features) and gets back only the logits (and the extra
outputs): the cache never crosses to the host. ``reset`` zeroes the state
inside the engine (``reset_state``).

Precision: ``precision=None`` runs at what OpenVINO picks for the CPU (bf16 on
a CPU with AMX or avx512_bf16, else f32). Below f32 a position's logits can
depend on the width of the call (the GEMMs block differently), so greedy
speculative output can differ from target-only decoding: ``exact`` says whether
the backend runs at f32, and ``exactness()`` is what the CLI prints and records.

The fused cache (``OpenVinoModel.cache == "fused"``, see ``fused.py``) grows by
each call's width; ``fused.Cursor`` knows which position each slot holds. A call
that starts earlier than the cache ends (the rows a rejected draft wrote, or
padding took) marks those slots stale, hidden by the mask, and the state is
compacted once enough are stale (or, with ``stale_limit`` 0, trimmed back to the
call's first position at once); a call that starts past the last valid position
written plus one is refused (the fixed cache would show it the slots in between).
"""
from __future__ import annotations

import numpy as np

from ....contract import INPUT_IDS, LOGITS, POSITION_IDS
from ....errors import SpecdecError
from ..base import Backend, check_role, resolve_artifact
from .fused import Cursor, check_stale_limit, default_stale_limit, state_array
from .loader import OpenVinoModel, load_openvino


class OpenVinoBackend(Backend):
    """OpenVINO's CPU plugin, the cache kept in state variables.

    ``artifact``: an artifact directory compiled with ``--target openvino``, an
    ``Artifact``, or an ``OpenVinoModel`` already loaded by ``load_openvino``.
    ``precision``: "f32", "bf16", "f16" (where the CPU has it) or None (OpenVINO's pick).
    ``threads``: inference threads (default: OpenVINO's, or ``SPECDEC_OV_THREADS``).
    ``cache``: "fused", "copy" or None (fused where the graph allows it, else copy; ``loader``).
    ``stale_limit``: rolled-back slots a fused cache keeps masked before it compacts them
    (``fused.Cursor``; 0: trimmed at every rollback; default ``fused.default_stale_limit``:
    0 below f32 on one thread, else ``fused.STALE_LIMIT``).
    """

    kind = "openvino"

    def __init__(self, artifact, *, precision: str | None = None, threads: int | None = None,
                 expect_role: str | None = None, cache: str | None = None, stale_limit: int | None = None):
        if isinstance(artifact, OpenVinoModel):
            given = [n for n, v in (("precision", precision), ("threads", threads), ("cache", cache)) if v is not None]
            if given:   # compiled already: these would be dropped without a word
                raise SpecdecError(f"{artifact.artifact.name}: {', '.join(given)} given with a model load_openvino "
                                   f"already compiled; pass them to load_openvino (or give the artifact directory)")
            check_role(artifact.artifact, expect_role)
        if stale_limit is not None:     # before anything compiles
            art = artifact.artifact if isinstance(artifact, OpenVinoModel) else resolve_artifact(artifact, expect_role,
                                                                                                  need_model=True)
            check_stale_limit(stale_limit, art.name, art.ctx_len)
            artifact = artifact if isinstance(artifact, OpenVinoModel) else art
        model = artifact if isinstance(artifact, OpenVinoModel) else \
            load_openvino(artifact, precision=precision, threads=threads, expect_role=expect_role, cache=cache)
        if stale_limit is not None and model.cache != "fused":
            raise SpecdecError(f"{model.artifact.name}: stale_limit is for the fused cache, and this backend "
                               f"copies the cache ({model.cache_note or 'cache=copy'})")
        super().__init__(model.artifact)
        self.model = model
        self.compiled = model.compiled
        self.kv_names = model.kv_names
        self.precision = model.precision
        self.threads = model.threads
        self.extra_names = list(self.extra_outputs)
        # a feature draft's features in the graph's own float type (a float16 export takes float16)
        self.input_dtypes = {n: self.compiled.input(n).get_element_type().to_dtype() for n in self.extra_inputs}
        self.cache_kind = model.cache
        self._cursor = Cursor(list(model.state_names.values()), self.artifact.name,
                              default_stale_limit(model.precision, model.threads) if stale_limit is None else stale_limit) \
            if model.cache == "fused" else None
        self._request = self.compiled.create_infer_request()
        self._request.reset_state()

    @property
    def exact(self) -> bool:
        """True when the backend runs at f32: a position's logits do not depend on the call's width."""
        return self.precision == "f32"

    def exactness(self, speculative: bool = True) -> dict:
        """What a run on this backend records (docs/CONTRACT.md): the precision, whether greedy
        speculative output is guaranteed equal to target-only decoding (f32, or no speculation),
        and the one line to say when it is not (None when it is)."""
        exact = self.exact or not speculative
        trimmed = self._cursor is not None and self._cursor.stale_limit == 0
        why = ("with the fused cache trimmed, a position's logits were the same at every call width where "
               "measured, but nothing guarantees it" if trimmed else "its logits may depend on the call width")
        note = None if exact else (
            f"OpenVINO runs the TLM at {self.precision}: {why}, so greedy speculative output may differ from "
            f"target-only decoding (--ov-precision f32 is exact)")
        return {"kind": self.kind, "precision": self.precision, "threads": self.threads,
                "cache": self.cache_kind, "cache_note": self.model.cache_note if self.model else None,
                "greedy_equals_target_only": exact, "note": note}

    def _run(self, ids, pos):
        return self._run_outputs(ids, pos, {n: np.zeros((*ids.shape, w), np.float32)
                                            for n, w in self.extra_inputs.items()})[LOGITS]

    def _run_outputs(self, ids, pos, extra):
        feed = {INPUT_IDS: ids, POSITION_IDS: pos}
        if self._cursor is not None:
            feed.update(self._cursor.feeds(self._request, pos))
        for n, a in extra.items():
            feed[n] = np.ascontiguousarray(a, dtype=self.input_dtypes[n])
        try:
            self._request.infer(feed, share_inputs=True)
        except Exception as e:
            msg = " ".join(str(e).split())[:300]
            raise SpecdecError(f"{self.artifact.name}: OpenVINO failed: {msg}") from None
        req = self._request
        out = {LOGITS: np.array(req.get_tensor(LOGITS).data, dtype=np.float32, copy=True)}
        for n in self.extra_names:
            out[n] = np.array(req.get_tensor(n).data, dtype=np.float32, copy=True)
        return out

    def _reset(self):
        self._request.reset_state()
        if self._cursor is not None:
            self._cursor.reset()

    def states(self) -> dict[str, object]:
        """Cache input name -> its OpenVINO state variable (for tests)."""
        self.check_open()
        by_name = {s.name: s for s in self._request.query_state()}
        return {n: by_name[v] for n, v in self.model.state_names.items() if v in by_name}

    def cache(self, name: str) -> np.ndarray:
        """A copy of the current cache ``name``, read from its state variable (for tests). A fused
        cache is given in the contract's shape: the slots it holds up to the last valid position
        written, zeros past them (the slots a padded token took are not the contract's)."""
        state = self.states().get(name)
        if state is None:
            raise SpecdecError(f"{self.artifact.name}: no cache state {name!r}")
        data = state_array(state.state)
        if self._cursor is None:
            return data
        return self._cursor.contract_view(data, self.model.kv_shapes[name])

    def describe(self) -> str:
        return f"{super().describe()} at {self.precision}, {self.threads} threads, {self.cache_kind} cache"

    def close(self):
        super().close()
        self._request = None
        self.compiled = None
        self.model = None
