"""Token choice: greedy, sampling (temperature, top-k, top-p) and the
speculative acceptance rule of Leviathan et al. 2023 / Chen et al. 2023.

The rule, for a draft token d drawn from the draft distribution q while the
target distribution is p: accept d with probability min(1, p(d) / q(d));
on rejection draw from norm(max(0, p - q)). The token that comes out is
distributed exactly as p. After k accepted drafts the target's next
distribution gives a bonus token. Both p and q are the *processed*
distributions (temperature, top-k, top-p applied to each model's logits), so
the output is distributed as the target model sampled with those settings.

Temperature 0 means greedy: drafts are the draft model's argmax, accepted
while they equal the target's argmax.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import SpecdecError


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0   # 0: greedy
    top_k: int = 0             # 0: off
    top_p: float = 1.0         # 1: off
    seed: int | None = None

    def __post_init__(self):
        if not np.isfinite(self.temperature) or self.temperature < 0:
            raise SpecdecError(f"temperature must be >= 0 (got {self.temperature})")
        if int(self.top_k) != self.top_k or self.top_k < 0:
            raise SpecdecError(f"top-k must be a non-negative integer (got {self.top_k})")
        if not (0.0 < self.top_p <= 1.0):
            raise SpecdecError(f"top-p must be in (0, 1] (got {self.top_p})")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def rng(self) -> np.random.Generator:
        return np.random.default_rng(self.seed)


def probs(logits, params: SamplingParams) -> np.ndarray:
    """The sampling distribution (float64) of one logits vector [V] (or rows [n, V])."""
    x = np.asarray(logits, dtype=np.float64)
    one = x.ndim == 1
    x = np.atleast_2d(x) / (params.temperature if params.temperature > 0 else 1.0)
    x = np.where(np.isfinite(x), x, -np.inf)
    V = x.shape[-1]
    if params.top_k and params.top_k < V:
        kth = np.partition(x, V - params.top_k, axis=-1)[:, V - params.top_k][:, None]
        x = np.where(x < kth, -np.inf, x)  # ties with the k-th value are kept
    m = np.max(x, axis=-1, keepdims=True)
    if not np.all(np.isfinite(m)):
        raise SpecdecError("the model produced logits with no finite value")
    e = np.exp(x - m)
    p = e / e.sum(axis=-1, keepdims=True)
    if params.top_p < 1.0:
        keep = np.stack([_top_p_keep(row, params.top_p) for row in p])
        p = np.where(keep, p, 0.0)
        p = p / p.sum(axis=-1, keepdims=True)
    return p[0] if one else p


def _top_p_keep(p: np.ndarray, top_p: float) -> np.ndarray:
    """The tokens top-p keeps in one row: in the order of decreasing probability (ties by
    id), those whose more probable tokens hold less than ``top_p`` of the mass.

    Sorting a 49152-token vocabulary costs milliseconds per call, several calls per
    speculative round; so the m most probable tokens are sorted first (m = 64, 512, ...)
    and the answer is taken from them when it provably equals the full sort's: some
    candidate is left out by the rule and the last kept token is strictly more probable
    than every token outside the candidates.
    """
    V = p.shape[-1]
    m = 64
    while m < V:
        cand = np.argpartition(-p, m)[:m]
        order = cand[np.lexsort((cand, -p[cand]))]
        sp = p[order]
        kept = int(((np.cumsum(sp) - sp) < top_p).sum())
        if kept < m and sp[kept - 1] > sp[-1]:
            keep = np.zeros(V, dtype=bool)
            keep[order[:kept]] = True
            return keep
        m *= 8
    order = np.argsort(-p, kind="stable")
    sp = p[order]
    keep = np.zeros(V, dtype=bool)
    keep[order[(np.cumsum(sp) - sp) < top_p]] = True    # the first token is always kept
    return keep


def sample(p: np.ndarray, rng: np.random.Generator) -> int:
    """One draw from distribution ``p`` [V]."""
    c = np.cumsum(p)
    i = int(np.searchsorted(c, rng.random() * c[-1], side="right"))
    i = min(i, len(p) - 1)
    while p[i] <= 0 and i > 0:   # never land on a zero-probability token by rounding
        i -= 1
    return i


def residual(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """norm(max(0, p - q)); ``p`` itself when that is all zeros (p == q up to rounding)."""
    r = np.maximum(p - q, 0.0)
    s = r.sum()
    return r / s if s > 1e-12 else p


def accept_or_resample(p: np.ndarray, q: np.ndarray, d: int, rng: np.random.Generator) -> tuple[bool, int]:
    """The Leviathan/Chen rule for one draft ``d ~ q``: (accepted, token)."""
    qd = q[d]
    if qd > 0 and rng.random() * qd < p[d]:   # u < p(d)/q(d), without dividing
        return True, d
    return False, sample(residual(p, q), rng)


def verify(drafts, draft_dists, target_logits, params: SamplingParams, rng,
           bonus: bool = True) -> tuple[int, int | None]:
    """Check ``drafts`` against the target.

    ``target_logits`` has len(drafts)+1 rows (len(drafts) with
    ``bonus=False``): row i is the target's logits for the position of
    draft i, the last row gives the bonus token. ``draft_dists`` are the
    draft distributions the drafts were drawn from (unused when greedy).
    Returns (number accepted, the next token: the target's correction at the
    first rejection, or the bonus token; None after a full accept without
    ``bonus``).
    """
    n = len(drafts)
    rows = n + 1 if bonus else n
    if params.greedy:
        want = np.argmax(target_logits[:rows], axis=-1)
        a = 0
        while a < n and int(drafts[a]) == int(want[a]):
            a += 1
        return a, (int(want[a]) if a < rows else None)
    # row by row: after an early rejection the later rows' distributions are never needed
    for i in range(n):
        ok, tok = accept_or_resample(probs(target_logits[i], params), draft_dists[i], int(drafts[i]), rng)
        if not ok:
            return i, tok
    return n, (sample(probs(target_logits[n], params), rng) if bonus else None)


def pick(logits, params: SamplingParams, rng) -> tuple[int, np.ndarray | None]:
    """A token from one logits vector, and the distribution it was drawn from (None if greedy)."""
    if params.greedy:
        return int(np.argmax(logits)), None
    p = probs(logits, params)
    return sample(p, rng), p
