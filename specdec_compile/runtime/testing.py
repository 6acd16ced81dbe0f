"""A FAKE backend for tests: a numpy "language model" with a retained-state cache.

Not a model of anything; it exists so the decoding loop can be tested fast
and exactly, without ONNX. It behaves like a compiled artifact in everything
the loop can observe:

* its cache holds one token per slot; a call writes the token at position p
  into slot p, padding (position -1) writes a junk token into slot ctx_len-1
  (as QEfficient's ScatterND does), and nothing else is ever cleared;
* the logits of a query at position p are a pseudo-random function of the
  whole cache content in slots 0..p, so any token the loop forgets to feed,
  feeds at the wrong position, or fails to overwrite, changes them;
* calls must match its specializations (batch, seq_len), like the device.

``logits_fn(history)`` gives the same logits directly from a token list, for
reference decoders in tests. A DLM that agrees with a TLM most of the time is
the TLM's function plus ``noise`` times another pseudo-random vector.
"""
from __future__ import annotations

import zlib
from dataclasses import replace
from pathlib import Path

import numpy as np

from ..artifact.reader import Artifact
from .backends import Backend


class FakeLM:
    """Logits as a deterministic function of a token history."""

    def __init__(self, vocab: int, salt: int = 0, scale: float = 3.0, noise: float = 0.0,
                 noise_salt: int = 1, bias=None):
        self.vocab = vocab
        self.salt = salt
        self.scale = scale
        self.noise = noise
        self.noise_salt = noise_salt
        self.bias = None if bias is None else np.asarray(bias, np.float64)

    def _vec(self, hist: np.ndarray, salt: int) -> np.ndarray:
        h = zlib.crc32(np.ascontiguousarray(hist, dtype=np.int64).tobytes())
        return np.random.default_rng([h, salt, len(hist)]).standard_normal(self.vocab)

    def __call__(self, history) -> np.ndarray:
        hist = np.asarray(history, np.int64)
        x = self.scale * self._vec(hist, self.salt)
        if self.noise:
            x = x + self.noise * self._vec(hist, self.noise_salt + 7919)
        if self.bias is not None:
            x = x + self.bias
        return x.astype(np.float32)


def fake_artifact(role: str, *, batch_size=1, ctx_len=64, prefill_len=8, k=4, k_list=None, vocab=23,
                  seq_lens=None, target="ort", eos_token_id=None, embedding_rows=None,
                  manifest=None) -> Artifact:
    if seq_lens is None:
        if role == "dlm":
            seq_lens = {prefill_len, 1, 2}
        else:
            ks = sorted(set(k_list or ()) | {k})
            seq_lens = {prefill_len, k} | {j + 1 for j in ks}
    return Artifact(path=Path(f"<fake {role}>"), role=role, target=target, batch_size=batch_size,
                    ctx_len=ctx_len, prefill_len=prefill_len, seq_lens=tuple(sorted(seq_lens)),
                    k=k if role == "tlm" else None,
                    k_list=tuple(sorted(set(k_list or ()) | {k})) if role == "tlm" else (),
                    vocab_size=vocab, eos_token_id=eos_token_id, embedding_rows=embedding_rows,
                    manifest=dict(manifest or {}))


class FakeBackend(Backend):
    """FAKE: a FakeLM behind the Backend interface (see the module doc)."""

    kind = "fake"

    def __init__(self, artifact: Artifact, lm: FakeLM, call_log: list | None = None, cost: float = 0.0):
        super().__init__(artifact)
        self.lm = lm
        self.cache = np.zeros((artifact.batch_size, artifact.ctx_len), np.int64)
        self.log = call_log
        self.cost = cost
        self._junk = 0

    def _reset(self):
        self.cache[:] = 0

    def _run(self, ids, pos):
        B, S = ids.shape
        V = self.artifact.vocab_size
        if self.cost:
            import time
            t = time.perf_counter()
            while time.perf_counter() - t < self.cost * (1 + 0.05 * S):
                pass
        if self.log is not None:
            self.log.append((self.artifact.role, S, [int(p) for p in pos[0]], [int(t) for t in ids[0]]))
        out = np.zeros((B, S, V), np.float32)
        for b in range(B):
            for s in range(S):
                p = pos[b, s]
                if p < 0:  # padding: scribbles on the last slot, junk logits
                    self._junk += 1
                    self.cache[b, -1] = 1000 + self._junk
                    out[b, s] = np.float32(np.sin(self._junk))
                else:
                    self.cache[b, p] = ids[b, s]
            for s in range(S):
                p = pos[b, s]
                if p >= 0:
                    out[b, s] = self.lm(self.cache[b, : p + 1])
        if self.role == "dlm":
            last = np.zeros((B, 1, V), np.float32)
            for b in range(B):
                valid = np.nonzero(pos[b] >= 0)[0]
                last[b, 0] = out[b, valid[-1]] if len(valid) else np.float32(0.5)
            return last
        return out


def fake_pair(*, vocab=23, ctx_len=64, prefill_len=8, k=4, k_list=None, batch_size=1, dlm="close",
              noise=1.5, tlm_salt=0, call_log=None, dlm_vocab=None, dlm_reads=None):
    """(tlm, dlm, tlm_lm) fakes. ``dlm``: "same" (always agrees), "close" (TLM + noise), "independent".

    ``dlm_vocab``: the DLM's logits width when it differs from the TLM's; a
    FakeLM of fewer rows gives the first rows of the wider one's logits, so
    "same" is then a draft whose table is a prefix of the target's.
    ``dlm_reads``: the ids the DLM reads (its embedding rows; default its width).
    """
    dv = vocab if dlm_vocab is None else dlm_vocab
    tlm_lm = FakeLM(vocab, salt=tlm_salt)
    if dlm == "same":
        dlm_lm = FakeLM(dv, salt=tlm_salt)
    elif dlm == "close":
        dlm_lm = FakeLM(dv, salt=tlm_salt, noise=noise)
    else:
        dlm_lm = FakeLM(dv, salt=tlm_salt + 12345)
    t = FakeBackend(fake_artifact("tlm", batch_size=batch_size, ctx_len=ctx_len, prefill_len=prefill_len,
                                  k=k, k_list=k_list, vocab=vocab), tlm_lm, call_log)
    d = FakeBackend(fake_artifact("dlm", batch_size=batch_size, ctx_len=ctx_len, prefill_len=prefill_len,
                                  vocab=dv, embedding_rows=dlm_reads), dlm_lm, call_log)
    return t, d, tlm_lm


def known_costs(dlm=None, tlm=None, host=None):
    """A CostModel (costs.py) holding these measurements, for tests of the width
    policy: ``dlm`` (calls, seconds each) of width 1, ``tlm`` {width: (calls,
    seconds each)}, ``host`` {drafting: (rounds, seconds each)}."""
    from .costs import CostModel
    cm = CostModel()
    if dlm is not None:
        cm.calls("dlm").add(1, dlm[1], n=dlm[0])
    for w, (n, t) in (tlm or {}).items():
        cm.calls("tlm").add(w, t, n=n)
    for drafting, (n, t) in (host or {}).items():
        cm.note_host(drafting, t, n=n)
    return cm


def nominal_costs(call_time):
    """A CostModel that books ``call_time(role, width)`` seconds for every call instead
    of the measured time, so a test of the width choice does not depend on a shared
    machine's timer: ``SpecDecoder(..., policy=WidthPolicy(costs=nominal_costs(f)))``."""
    from .costs import CallCosts, CostModel

    class _Calls(CallCosts):
        def __init__(self, role):
            super().__init__()
            self.role = role

        def add(self, width, dt, n=1):
            super().add(width, call_time(self.role, width), n)

    class _Costs(CostModel):
        def calls(self, role):
            return self._calls.setdefault(role, _Calls(role))

    return _Costs()


# ----------------------------------------------------------------------------- feature drafts (FAKE)

def encode_history(hist, width: int) -> np.ndarray:
    """A FAKE feature: the token history itself, ids + 1, zeros after (width >= len(hist))."""
    f = np.zeros(width, np.float32)
    f[: len(hist)] = np.asarray(hist, np.float32) + 1
    return f


def decode_history(f) -> list[int]:
    """The history a FAKE feature encodes (its leading nonzero entries, minus 1)."""
    f = np.asarray(f)
    end = int(np.argmax(f == 0)) if np.any(f == 0) else len(f)
    return [int(x) - 1 for x in f[:end]]


class FakeHiddenTLM(FakeBackend):
    """FAKE TLM compiled with --hidden-states: the feature at position p is the whole
    history it attended to (``encode_history(cache[:p+1])``), so a draft can rebuild the
    text from it."""

    def _run_outputs(self, ids, pos, extra):
        logits = self._run(ids, pos)
        B, S = ids.shape
        W = self.artifact.hidden_states["width"]
        hs = np.zeros((B, S, W), np.float32)
        for b in range(B):
            for s in range(S):
                if pos[b, s] >= 0:
                    hs[b, s] = encode_history(self.cache[b, : pos[b, s] + 1], W)
        return {"logits": logits, "hidden_states": hs}


class FakeFeatureDraft(FakeBackend):
    """FAKE feature draft: the row (x_p, f) rebuilds the history as decode(f) + [x_p] and
    gives ``lm`` of it (the logits for p+1) and that history encoded as its own feature.
    Fed the target's f_{p-1} (the contract's pairing) it is the target exactly (with
    ``lm`` the target's); any other feature gives another history, another guess."""

    def _run_outputs(self, ids, pos, extra):
        B, S = ids.shape
        W = self.artifact.feature_draft["width"]
        feats = extra["hidden_states"]
        if self.log is not None:
            self.log.append((self.artifact.role, S, [int(p) for p in pos[0]], [int(t) for t in ids[0]]))
        V = self.artifact.vocab_size
        logits = np.full((B, 1, V), np.float32(0.5), np.float32)
        own = np.zeros((B, S, W), np.float32)
        for b in range(B):
            for s in range(S):
                if pos[b, s] >= 0:
                    hist = decode_history(feats[b, s]) + [int(ids[b, s])]
                    own[b, s] = encode_history(hist, W)
                    logits[b, 0] = self.lm(hist)
        return {"logits": logits, "draft_hidden_states": own}


def fake_feature_pair(*, vocab=23, ctx_len=64, prefill_len=8, k=4, k_list=None, dlm_k=None, batch_size=1,
                      noise=0.0, call_log=None, layers=(-1,), draft_layers=None, width=None, dlm_vocab=None,
                      scale=3.0, draft_salt=0):
    """(tlm, feature draft, tlm_lm) fakes: a TLM with hidden states (``layers`` of 2) and a
    feature draft reading ``draft_layers`` (default the same) whose logits are the target's
    plus ``noise`` times another pseudo-random vector (``draft_salt`` != 0: another function
    altogether). ``width``: the draft's feature width (default the TLM's: ctx_len)."""
    W = ctx_len
    idx = [x + 2 if x < 0 else x for x in layers]
    tlm_lm = FakeLM(vocab, scale=scale)
    dv = vocab if dlm_vocab is None else dlm_vocab
    hs = {"layers": list(layers), "layer_indices": idx, "hidden_size": W, "width": W, "output": "hidden_states"}
    t_art = fake_artifact("tlm", batch_size=batch_size, ctx_len=ctx_len, prefill_len=prefill_len, k=k,
                          k_list=k_list, vocab=vocab, manifest={"hidden_states": hs})
    t = FakeHiddenTLM(replace(t_art, num_layers=2), tlm_lm, call_log)
    dk = k if dlm_k is None else dlm_k
    fw = W if width is None else width
    fd = {"target_layers": list(draft_layers or layers), "width": fw, "input": "hidden_states",
          "draft_output": "draft_hidden_states", "draft_width": fw}
    seq_lens = {prefill_len, 1, dk + 1}
    d = FakeFeatureDraft(fake_artifact("dlm", batch_size=batch_size, ctx_len=ctx_len, prefill_len=prefill_len,
                                       vocab=dv, seq_lens=seq_lens, manifest={"feature_draft": fd}),
                         FakeLM(dv, salt=draft_salt, scale=scale, noise=noise), call_log)
    return t, d, tlm_lm
