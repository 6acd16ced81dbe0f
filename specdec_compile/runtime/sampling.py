"""Token choice: greedy, sampling (temperature, top-k, top-p), and how a
draft is checked against the target.

Sampling is *position-keyed*: the token at position i of prompt j is
argmax(log p_i + g_i), p_i the processed target distribution (temperature,
top-k, top-p) and g_i Gumbel noise drawn from a stream keyed by
(seed, j, i) (:class:`Noise`). That is an exact draw from p_i (the Gumbel-max
trick), and it depends on nothing but the prompt, the seed, the settings and
the models: not on how many drafts a round made, the batch size, or which API
ran it. A draft for position i is drawn the same way from the draft's own
distribution q_i with the *same* g_i, and it is accepted when it equals the
target's token. The output is therefore exactly what sampling the target alone
with that seed gives, token for token; the draft only decides how many tokens
one target call yields. (A draft is accepted with probability
P(argmax(log q + g) = argmax(log p + g)), a little below the 1 - TV(p, q) of the
rejection rule of Leviathan et al. 2023, which cannot keep a seeded text
independent of the schedule: whether a position was drafted changes its draw.)

Temperature 0 (and anything below :data:`GREEDY_BELOW`) means greedy: g = 0,
drafts are the draft model's argmax, accepted while they equal the target's.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import SpecdecError

#: temperatures below this behave as greedy (dividing logits by less overflows float64)
GREEDY_BELOW = 1e-5


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0   # 0 (or < GREEDY_BELOW): greedy
    top_k: int = 0             # 0: off
    top_p: float = 1.0         # 1: off
    seed: int | None = None    # None: a fresh seed per run

    def __post_init__(self):
        for name in ("temperature", "top_p"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)):
                raise SpecdecError(f"{name.replace('_', '-')} must be a number (got {_shown(v)})")
        t = self.temperature      # (an int past float's range: np.isfinite cannot take it)
        if t < 0 or (abs(t) >= 2 ** 1023 if isinstance(t, (int, np.integer)) else not np.isfinite(t)):
            raise SpecdecError(f"temperature must be a finite number >= 0 (got {_shown(t)})")
        if _not_int(self.top_k) or self.top_k < 0:
            raise SpecdecError(f"top-k must be a non-negative integer (got {_shown(self.top_k)})")
        if not (0.0 < self.top_p <= 1.0):
            raise SpecdecError(f"top-p must be in (0, 1] (got {_shown(self.top_p)})")
        if self.seed is not None and (_not_int(self.seed) or not 0 <= self.seed < 2 ** 64):
            raise SpecdecError(f"seed must be an integer in [0, 2**64) (got {_shown(self.seed)})")

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_BELOW

    def run_seed(self, rng: np.random.Generator | None = None) -> int:
        """The seed of one run: ``seed``; else one draw from ``rng``; else fresh entropy."""
        if self.seed is not None:
            return int(self.seed)
        if rng is not None:
            return int(rng.integers(0, 2 ** 63))
        return int(np.random.SeedSequence().entropy) % 2 ** 63   # entropy has 128 bits; a seed is < 2**64

    def noise(self, index: int = 0, rng: np.random.Generator | None = None) -> "Noise | None":
        """The randomness of prompt ``index`` of a run (None when greedy)."""
        return None if self.greedy else Noise(self.run_seed(rng), index)


def _shown(v) -> str:
    """A refused value as an error shows it: an int too long to print (past 4300 digits Python
    refuses to) by its size."""
    if isinstance(v, int) and not isinstance(v, bool) and v.bit_length() > 256:
        return f"an integer of {v.bit_length()} bits"
    return repr(v)


def _not_int(v) -> bool:
    """Not an integer (a bool, a float such as 5.0, a string): refused, not rounded."""
    return isinstance(v, bool) or not isinstance(v, (int, np.integer))


class Noise:
    """Gumbel noise for each position of one generation, from a random stream keyed
    by (seed, prompt index, position): the same numbers whatever order positions are
    asked in, and however often. Kept for the few positions a round looks at."""

    KEEP = 64

    def __init__(self, seed: int, index: int = 0):
        self.seed, self.index = int(seed), int(index)
        self._g: dict[int, np.ndarray] = {}

    def gumbel(self, pos: int, size: int) -> np.ndarray:
        g = self._g.get(pos)
        if g is None or len(g) != size:
            g = np.random.default_rng([self.seed, self.index, int(pos)]).gumbel(size=size)
            if len(self._g) >= self.KEEP:
                self._g.pop(min(self._g))
            self._g[pos] = g
        return g


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


def choose(logits, params: SamplingParams, noise: Noise | None, pos: int) -> int:
    """The token at position ``pos``: the argmax when greedy, else the Gumbel-max draw
    argmax(log p + g_pos) from the processed distribution p of ``logits`` [V]."""
    if params.greedy or noise is None:
        return int(np.argmax(logits))
    return choose_from(probs(logits, params), noise, pos)


def choose_from(p: np.ndarray, noise: Noise, pos: int) -> int:
    """The Gumbel-max draw from distribution ``p`` [V] at position ``pos``."""
    with np.errstate(divide="ignore"):
        return int(np.argmax(np.log(p) + noise.gumbel(pos, len(p))))


def verify(drafts, target_logits, start: int, params: SamplingParams, noise: Noise | None,
           bonus: bool = True) -> tuple[int, int | None]:
    """Check ``drafts`` (for positions start..) against the target.

    ``target_logits`` has len(drafts)+1 rows (len(drafts) with ``bonus=False``):
    row i is the target's logits for position start+i. The target's token at
    each position is :func:`choose`'s; a draft is accepted while it equals it. ``drafts`` are token
    ids (ints): the decode loop checks a source's drafts once, before the target's call
    (generation.draft_ids), so a float is never rounded into a token here.
    Returns (number accepted, the next token: the target's at the first
    mismatch, or the bonus token; None after a full accept without ``bonus``).
    """
    n = len(drafts)
    rows = n + 1 if bonus else n
    if params.greedy or noise is None:
        want = np.argmax(target_logits[:rows], axis=-1)
        a = 0
        while a < n and int(drafts[a]) == int(want[a]):
            a += 1
        return a, (int(want[a]) if a < rows else None)
    for i in range(rows):        # after a mismatch the later rows are never needed
        t = choose(target_logits[i], params, noise, start + i)
        if i == n or int(drafts[i]) != t:
            return i, t
    return n, None
