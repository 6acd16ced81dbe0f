"""The backend interface: one compiled model with its retained state kept inside.

It is tiny, so that every backend (ONNX Runtime, Cloud AI 100, the test fakes)
is interchangeable under the decoding loop::

    logits = backend.run(input_ids, position_ids)   # int64 [B, S] each -> float32 logits
    backend.reset()                                 # forget the sequence (zero the cache)

A model with extra tensors (a TLM compiled with ``--hidden-states``, a feature
draft) names them in ``extra_inputs`` / ``extra_outputs``;
``run_outputs(ids, pos, inputs={name: [B, S, width]})`` returns every output by
name (``logits`` and the extras, float32). An extra input not given is zeros.

Every call must match one of the artifact's specializations (batch, seq_len)
exactly, as the device demands; anything else is a ``SpecdecError``. Positions
must be in ``[-1, ctx_len)``, with padding (-1) only at the right end of a row.
A backend subclass implements ``_run`` and ``_reset``; loading (reading and
checking the model) lives apart, in each backend's ``loader`` module.
"""
from __future__ import annotations

import numbers
import os
import time
from dataclasses import replace

import numpy as np

from ...contract import LOGITS, MANIFEST_FILE
from ...errors import SpecdecError
from ...artifact.reader import Artifact, embedding_rows, load_artifact


class Backend:
    """A model with retained state. Subclasses implement ``_run`` and ``_reset``."""

    kind = "abstract"

    def __init__(self, artifact: Artifact):
        self.artifact = artifact
        self.calls = 0
        self.time_s = 0.0
        self._input_vocab: int | None = None
        self.closed = False         # close() sets it; a closed backend refuses every call

    def check_open(self) -> None:
        """A ``SpecdecError`` once ``close()`` has run: the session (or program) is gone."""
        if self.closed:
            raise SpecdecError(f"{self.artifact.name}: the {self.kind} backend was closed; open the artifact again")

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
        """Width of the logits: the ids the model can emit."""
        return self.artifact.vocab_size

    @property
    def input_vocab(self) -> int | None:
        """The ids the model can read: the rows of its embedding table when the
        artifact or its graph shows them (read once, on first use), else the
        logits width. A call with an id beyond the logits width is checked against it."""
        if self._input_vocab is None:
            a = self.artifact
            rows = a.embedding_rows
            if rows is None and a.model_path.is_file():
                rows = embedding_rows(a.model_path)
            self._input_vocab = rows or a.vocab_size or 0
        return self._input_vocab or None

    @property
    def extra_inputs(self) -> dict[str, int]:
        """Inputs beyond ids, positions and cache: name -> width ([B, S, width] float)."""
        return self.artifact.extra_inputs

    @property
    def extra_outputs(self) -> dict[str, int]:
        """Outputs beyond logits and cache: name -> width ([B, S, width] float32)."""
        return self.artifact.extra_outputs

    # -- calls ----------------------------------------------------------
    def check_inputs(self, input_ids, position_ids) -> tuple[np.ndarray, np.ndarray]:
        ids, pos = np.asarray(input_ids), np.asarray(position_ids)
        for what, a in (("input_ids", ids), ("position_ids", pos)):
            if a.size and a.dtype.kind not in "iu":     # 1.7 would be cast to token 1 without a word
                raise SpecdecError(f"{self.artifact.name}: {what} must be integers, got dtype {a.dtype}")
        ids, pos = np.ascontiguousarray(ids, dtype=np.int64), np.ascontiguousarray(pos, dtype=np.int64)
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
            v = self.input_vocab     # the embedding may have more rows than the LM head
            if ids.min() < 0 or ids.max() >= v:
                raise SpecdecError(f"{self.artifact.name}: token id out of range [0, {v})")
        return ids, pos

    def run(self, input_ids, position_ids, *, check: bool = True, inputs: dict | None = None,
            rows=None) -> np.ndarray:
        """Run one call; returns float32 logits (TLM [B, S, V], DLM [B, 1, V]).

        ``check=False``: the caller built int64 [B, S] arrays with valid ids and
        positions (the decoding loop does); only the shape is checked against the
        specializations, which saves the per-call numpy checks. ``inputs``: the
        extra inputs, ``rows`` an --interface qeff model's cache rows (see ``run_outputs``)."""
        return self.run_outputs(input_ids, position_ids, check=check, inputs=inputs, rows=rows)[LOGITS]

    def run_outputs(self, input_ids, position_ids, *, check: bool = True, inputs: dict | None = None,
                    rows=None) -> dict:
        """Run one call; returns {"logits": ..., and each of ``extra_outputs``: [B, S, width]}.
        ``inputs``: each of ``extra_inputs`` as [B, S, width] (zeros when not given).
        ``rows`` (continuous batching, --full-batch-size): the cache row of each row of the call, its
        ``batch_index``; default 0..B-1 for a call of every row."""
        self.check_open()
        if check:
            ids, pos = self.check_inputs(input_ids, position_ids)
        else:
            ids, pos = input_ids, position_ids
            self.artifact.check_call(*ids.shape)
        if self.artifact.cache_rows:
            self._set_rows(self.check_rows(rows, ids.shape[0]))
        elif rows is not None:
            raise SpecdecError(f"{self.artifact.name}: has no batch_index input (compiled without "
                               f"--full-batch-size)")
        extra = self._extra(ids.shape, inputs or {}, check)
        t0 = time.perf_counter()
        out = self._run_outputs(ids, pos, extra)
        self.time_s += time.perf_counter() - t0
        self.calls += 1
        self.check_logits(out[LOGITS], ids.shape)
        return out

    def check_logits(self, logits, shape) -> None:
        """The graph's logits for a call of ``shape`` [B, S] must be what the manifest's role says:
        a TLM's [B, S, V] (every position), a DLM's [B, 1, V] (the last valid token); a graph of the
        other role under a relabelled manifest would decode wrong tokens without an error."""
        B, S = shape
        want = (B, S if self.role == "tlm" else 1)
        got = tuple(np.shape(logits))
        if got[:2] != want:
            kind = "every position, a TLM's" if got[1:2] == (S,) and S > 1 else "one position, a DLM's"
            raise SpecdecError(f"{self.artifact.name}: a call of [{B}, {S}] gave logits {list(got)} ({kind}) but the "
                               f"manifest's role {self.role} needs [{want[0]}, {want[1]}, V]: the manifest does not "
                               f"describe this graph")

    def check_rows(self, rows, n: int) -> np.ndarray:
        """``rows`` as the int64 [n, 1] batch_index of a call of n rows: distinct cache rows in
        [0, batch_size), one per row of the call; a bad one is refused before anything runs."""
        B = self.batch_size
        if rows is None:
            if n != B:
                raise SpecdecError(f"{self.artifact.name}: a call of {n} rows needs their cache rows (batch_index)")
            rows = range(B)
        r = np.asarray(rows).reshape(-1)
        if r.dtype.kind not in "iu" or r.size != n:
            raise SpecdecError(f"{self.artifact.name}: batch_index must be {n} integers, got {np.asarray(rows).tolist()}")
        if r.size and (r.min() < 0 or r.max() >= B):
            raise SpecdecError(f"{self.artifact.name}: batch_index {r.tolist()} out of range [0, {B})")
        if len(set(r.tolist())) != r.size:
            raise SpecdecError(f"{self.artifact.name}: batch_index {r.tolist()} names a cache row twice")
        return np.ascontiguousarray(r.reshape(-1, 1), dtype=np.int64)

    def _set_rows(self, rows: np.ndarray) -> None:
        raise SpecdecError(f"{self.artifact.name}: the {self.kind} backend does not drive --interface qeff artifacts")

    def _extra(self, shape, inputs: dict, check: bool) -> dict:
        """Every extra input as a [B, S, width] array (zeros when not given); unknown names refused."""
        want = self.extra_inputs
        unknown = sorted(set(inputs) - set(want))
        if unknown:
            raise SpecdecError(f"{self.artifact.name}: no input {unknown[0]!r} (extra inputs: {sorted(want)})")
        out = {}
        for name, width in want.items():
            a = inputs.get(name)
            if a is None:
                a = np.zeros((*shape, width), np.float32)
            elif check and tuple(np.shape(a)) != (*shape, width):
                raise SpecdecError(f"{self.artifact.name}: {name} is {list(np.shape(a))}, expected "
                                   f"{[*shape, width]}")
            out[name] = a
        return out

    def reset(self) -> None:
        """Forget the current sequence: the cache goes back to zeros."""
        self.check_open()
        self._reset()

    def warmup(self, rounds: int = 1) -> None:
        """Run every specialization once (all padding), then reset: first-call
        costs (allocation, kernel selection) stay out of measurements."""
        self.check_open()
        if isinstance(rounds, bool) or not isinstance(rounds, numbers.Integral) or rounds < 0:
            raise SpecdecError(f"{self.artifact.name}: warmup rounds must be an integer >= 0, got {rounds!r}")
        for _ in range(rounds):
            for B, s in self.artifact.shapes():
                ids = np.zeros((B, s), np.int64)
                pos = np.full((B, s), -1, np.int64)
                pos[:, 0] = 0   # one valid token per row, so every role has logits to give
                if self.artifact.cache_rows:
                    self._set_rows(np.arange(B, dtype=np.int64).reshape(-1, 1))
                self.check_logits(self._run_outputs(ids, pos, self._extra(ids.shape, {}, False))[LOGITS],
                                  ids.shape)
        self.reset()

    def close(self) -> None:
        """Let go of the session (or program); later calls are refused in one line (``check_open``).
        A subclass releases its own handles and calls this."""
        self.closed = True

    def _run(self, ids: np.ndarray, pos: np.ndarray) -> np.ndarray:  # pragma: no cover
        raise NotImplementedError

    def _run_outputs(self, ids: np.ndarray, pos: np.ndarray, extra: dict) -> dict:
        """Every output by name; a backend without extra tensors implements ``_run`` alone."""
        if extra or self.extra_outputs:
            raise SpecdecError(f"{self.artifact.name}: the {self.kind} backend does not pass extra tensors "
                               f"({sorted(extra) + sorted(self.extra_outputs)})")
        return {LOGITS: self._run(ids, pos)}

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


def check_device_ids(device_ids) -> list[int]:
    """``device_ids`` as a list of distinct device numbers >= 0 (at least one); else one line."""
    if isinstance(device_ids, (str, bytes)) or not isinstance(device_ids, (list, tuple)):
        raise SpecdecError(f"device_ids must be a list of device numbers, e.g. [0] or [0, 1], got {device_ids!r}")
    if not device_ids or any(isinstance(d, bool) or not isinstance(d, numbers.Integral) or d < 0 for d in device_ids):
        raise SpecdecError(f"device_ids must be device numbers >= 0, at least one, got {list(device_ids)!r}")
    if len(set(device_ids)) != len(device_ids):
        raise SpecdecError(f"device_ids {list(device_ids)} names a device twice")
    return [int(d) for d in device_ids]


def check_role(a: Artifact, expect_role: str | None) -> Artifact:
    """``a`` when it is of ``expect_role`` (None: any), as load_artifact refuses a directory of the other
    role; for an Artifact or a model loaded already, which no manifest read checks."""
    if expect_role and a.role != expect_role:
        raise SpecdecError(f"{a.path}: is a {a.role.upper()} artifact, expected a {expect_role.upper()} "
                           f"(were --tlm and --dlm swapped?)")
    return a


def resolve_artifact(artifact_or_path, expect_role: str | None, need_model: bool) -> Artifact:
    """An ``Artifact`` as given, or read from its directory; of ``expect_role`` either way."""
    if expect_role not in (None, "tlm", "dlm"):
        raise SpecdecError(f"expect_role must be 'tlm', 'dlm' or None, got {expect_role!r}")
    if isinstance(artifact_or_path, Artifact):
        return check_role(artifact_or_path, expect_role)
    if not isinstance(artifact_or_path, (str, os.PathLike)):
        raise SpecdecError(f"expected an artifact directory (a path) or an Artifact, got "
                           f"{type(artifact_or_path).__name__} {artifact_or_path!r}"[:200])
    return load_artifact(artifact_or_path, expect_role=expect_role, need_model=need_model)


def with_vocab(a: Artifact, vocab: int | None, where: str) -> Artifact:
    """``a`` with the vocabulary the loaded model reports (checked against the manifest's)."""
    if vocab is None:
        return a
    if a.vocab_size is not None and a.vocab_size != vocab:
        raise SpecdecError(f"{a.path}: {MANIFEST_FILE} says vocab {a.vocab_size} but the {where} has {vocab}")
    if a.vocab_size == vocab:
        return a
    return replace(a, vocab_size=vocab)
