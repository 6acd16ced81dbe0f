"""``verify --backend openvino``: the rewrite replayed on OpenVINO, its cache kept inside the engine.

``OpenVinoRewritten`` is the replay's rewritten model (``replay._Rewritten``'s
interface) run by OpenVINO's CPU plugin the way the runtime runs it: the cache
kept in state variables (``loader.keep_cache``: the fused cache where the
attention allows it and the batch is 1, else ``MakeStateful``), each call fed
only the ids, the positions (and a feature draft's features). After each call
the replay reads the state variables back to compare the cache (a copy made for
the check alone). A fused cache holds only the slots written up to the call's
last valid position; the view the replay compares takes those from the engine
and keeps the earlier view's slots past them (the fixed cache's stale slots,
which a grown cache drops): its cache check covers the slots the engine holds.

``backend_width_dependence``: the rewrite itself on this backend, one call of
k+1 tokens against k+1 calls of one after the same history: at f32 the top
tokens agree; at bf16 they may not (greedy speculative output then differs from
target-only decoding).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from ..contract import HIDDEN_STATES, INPUT_IDS, LOGITS, POSITION_IDS
from ..errors import SpecdecError
from ..runtime.backends.openvino.fused import Cursor, default_stale_limit, state_array
from ..runtime.backends.openvino.loader import keep_cache, read_and_compile, state_name

#: verify's backends: auto = openvino for a graph lowered for it, else ort
BACKENDS = ("auto", "ort", "openvino")
#: how ``keep_cache`` says that the attention is not the form the fused cache rebuilds
NO_FUSED = ": no fused OpenVINO cache: "


def pick_backend(backend: str, target: str | None) -> str:
    if backend not in BACKENDS:
        raise SpecdecError(f"unknown verify backend {backend!r} (choose from {', '.join(BACKENDS)})")
    if backend == "auto":
        return "openvino" if target == "openvino" else "ort"
    if backend == "openvino" and target not in ("openvino", None):
        raise SpecdecError(f"the graph was lowered for --target {target}; OpenVINO runs --target openvino graphs")
    return backend


class OpenVinoRewritten:
    """The replay's rewritten model on OpenVINO; ``base`` (an ORT ``_Rewritten`` of the same
    graph) gives the interface facts (names, role, cache shapes, features)."""

    def __init__(self, base, path: Path, batch: int, precision: str | None = "f32", cache: str | None = None):
        self.__dict__.update({k: v for k, v in vars(base).items() if k != "sess"})
        self.kv_shape = base.kv_shape     # the cache's declared shape: the same graph's inputs
        if self.qeff:
            raise SpecdecError(f"{path}: an --interface qeff graph; verify it with --backend ort")
        shapes = {n: tuple(s.shape) for n, s in zip(self.names, self.state)}
        extra = {HIDDEN_STATES: self.req.feature_width} if self.feature_dtype is not None else {}
        kept = {}

        def prepare(m):
            kept["cache"], _, cfg = keep_cache(m, batch, list(self.names), shapes, extra, cache, precision or "f32",
                                               path)
            return cfg

        self.compiled, self.precision, _ = read_and_compile(path, precision or "f32", 1, prepare)
        self.cache = kept["cache"]
        self.request = self.compiled.create_infer_request()
        self.request.reset_state()
        self._states = {s.name: s for s in self.request.query_state()}
        self._shapes = shapes
        self._cursor = Cursor([str(n) for n in self.names], str(path), default_stale_limit(self.precision, 1)) \
            if self.cache == "fused" else None

    def reset(self) -> None:
        self.request.reset_state()
        if self._cursor is not None:
            self._cursor.reset()
            self.state = [np.zeros(self._shapes[n], s.dtype) for n, s in zip(self.names, self.state)]

    def _read_state(self) -> list[np.ndarray]:
        if self._cursor is None:
            return [np.array(self._states[state_name(n)].state.data, copy=True) for n in self.names]
        return [self._cursor.contract_view(state_array(self._states[n].state), self._shapes[n], before)
                for n, before in zip(self.names, self.state)]

    def run(self, ids: np.ndarray, pos: np.ndarray, feats: np.ndarray | None = None):
        feeds = {INPUT_IDS: ids, POSITION_IDS: pos}
        if self._cursor is not None:
            feeds.update(self._cursor.feeds(self.request, pos))
        if self.feature_dtype is not None:
            feeds[HIDDEN_STATES] = feats.astype(self.feature_dtype)
        try:
            self.request.infer(feeds)
        except Exception as e:
            raise SpecdecError(f"the rewrite failed on OpenVINO on a call of {list(ids.shape)}: "
                               f"{' '.join(str(e).split())[:300]}") from None
        self.state = self._read_state()
        logits = np.array(self.request.get_tensor(LOGITS).data, dtype=np.float32, copy=True)
        want = (ids.shape[0], ids.shape[1] if self.role == "tlm" else 1)
        if logits.shape[:2] != want:
            raise SpecdecError(f"the rewrite failed on OpenVINO on a call of {list(ids.shape)}: logits "
                               f"{list(logits.shape)}, expected [{want[0]}, {want[1]}, vocab]")
        hidden = self.request.get_tensor(self.req.output).data.copy() if self.req.output else None
        return logits, hidden


def replay_both(replay, base, path: Path, batch: int, precision: str | None):
    """``replay(rewritten)`` on OpenVINO with the copy path (the graph's own cache write) and, at
    batch 1 where the attention allows it, again with the fused cache the runtime runs: one report,
    the fused replay's checks labelled "fused cache: ...", its width check counted with the other."""
    from dataclasses import replace
    report = replay(OpenVinoRewritten(base, path, batch, precision, cache="copy"))
    report.caches = ["copy"]
    if batch != 1:
        report.fused_note = f"batch {batch}: the fused cache holds one sequence"
        return report
    try:
        fused = OpenVinoRewritten(base, path, batch, precision, cache="fused")
    except SpecdecError as e:     # only an attention not of the form rebuilt is a note: the rest fails
        if NO_FUSED not in str(e):
            raise
        report.fused_note = str(e).split(NO_FUSED)[-1]
        return report
    other = replay(fused)
    report.caches.append("fused")
    report.checks += [replace(c, label=f"fused cache: {c.label}") for c in other.checks]
    if other.backend_width_max_abs_diff is not None:
        report.backend_width_max_abs_diff = max(report.backend_width_max_abs_diff or 0.0,
                                                other.backend_width_max_abs_diff)
        report.backend_width_top_token_changes = (report.backend_width_top_token_changes or 0) + \
            other.backend_width_top_token_changes
    return report


def backend_width_dependence(new: OpenVinoRewritten, tokens: np.ndarray, start: int, width: int,
                             feature_width: int | None) -> tuple[float, int]:
    """The rewrite's logits of positions start..start+width-1 after ``start`` tokens of history on
    this backend: one call of ``width`` tokens against ``width`` calls of one (max abs difference,
    positions whose top token differs). Leaves the state reset."""
    batch = new.state[0].shape[0]      # the graph's fixed batch: the same row in every row

    def call(lo, hi):
        ids = np.repeat(np.asarray(tokens[lo:hi], np.int64)[None], batch, axis=0)
        pos = np.repeat(np.arange(lo, hi, dtype=np.int64)[None], batch, axis=0)
        feats = np.zeros((batch, hi - lo, feature_width), np.float32) if feature_width else None
        return new.run(ids, pos, feats)[0][0]

    new.reset()
    call(0, start)
    wide = call(start, start + width)
    new.reset()
    call(0, start)
    narrow = np.stack([call(start + i, start + i + 1)[0] for i in range(width)])
    new.reset()
    return float(np.max(np.abs(wide - narrow))), int(np.sum(wide.argmax(-1) != narrow.argmax(-1)))
