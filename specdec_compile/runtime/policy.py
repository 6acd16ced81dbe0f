"""How many drafts a round makes: the width policy, one object a decoder is given.

With one compiled width (or a fixed ``k``) every round drafts k. With several
(``k_list`` in the TLM manifest) each round picks the number of drafts j (a TLM
width >= j+1) that maximizes expected tokens per unit of time,

    (1 - a^(j+1)) / (1 - a)  over  j * t_dlm + t_tlm(j+1) + host(j > 0)

from a decayed acceptance estimate a (pooled over the rows decoding together:
they share the draft calls and the TLM call's width) and the measured call
times (costs.py). With 0 compiled (``--k-list 0,...``) j = 0 is a choice (the
fallback): width 1 is timed once before it is judged, and after 4, 8, ... 64
rounds without drafts a round drafts again (a probe) to see if drafts pay now.
A probe whose source proposes nothing (a lookup without a match) is no evidence:
it stays due, and the clock backs off only once a probe has been verified.
Round 1 of a generation (the first draft accepted) drafts k - 1 (contract
section 6), or the fixed k.

A generation's estimate starts from what the decoder's earlier generations saw
(a slowly decayed acceptance over all of them, weighted as ``PRIOR_WEIGHT``
checked drafts), not from an even guess: with the guess alone, one failed first
round at the start of an answer dropped the estimate to 0.25, which chose K = 0,
and each failed probe then doubled the wait (docs/runtime.md, "The decoding loop").
"""
from __future__ import annotations

import numbers

import numpy as np

from ..errors import SpecdecError
from .costs import CostModel


class RowState:
    """One generation's part of the policy: its acceptance counts and probe clock."""

    def __init__(self, policy: "WidthPolicy"):
        self.policy = policy
        self.acc, self.chk = 0.0, 0.0          # decayed counts: accepted / checked drafts
        self.draft_cost_share = 1.0            # the share of drafts that call the draft model (a hybrid's < 1)
        self.zero_rounds, self.probe_every = 0, policy.PROBE_FIRST
        self.probe_due = False                 # a probe was chosen but its source drafted nothing yet

    def alpha(self) -> float:
        return (self.acc + 0.5) / (self.chk + 1.0)


class WidthPolicy:
    """The adaptive choice of drafts per round. ``k``: fix every round (round 1
    included) to k drafts; ``adaptive``: force the choice on or off (default: on
    when the TLM has several compiled widths and no ``k``); ``fallback``: j = 0
    (plain decoding) may be chosen when 0 is compiled."""

    PROBE_FIRST, PROBE_MAX, DECAY = 4, 64, 0.8
    PRIOR_WEIGHT, PRIOR_DECAY = 2.0, 0.98   # a new generation's start: earlier ones' acceptance, as 2 checks

    def __init__(self, k: int | None = None, adaptive: bool | None = None, fallback: bool = True,
                 costs: CostModel | None = None):
        if k is not None and (isinstance(k, bool) or not isinstance(k, numbers.Integral)):
            raise SpecdecError(f"k must be a whole number of drafts per round (got {k!r})")
        for name, v in (("adaptive", adaptive), ("fallback", fallback)):
            if not (v is None and name == "adaptive") and not isinstance(v, (bool, np.bool_)):
                # bool("no") is True: a string (or 0/1) would be read as the opposite of what it says
                raise SpecdecError(f"{name} must be True or False (got {v!r})")
        if costs is not None and not isinstance(costs, CostModel):
            raise SpecdecError(f"costs must be a CostModel (got {type(costs).__name__})")
        self.fixed_k = None if k is None else int(k)
        self._adaptive = None if adaptive is None else bool(adaptive)
        self.fallback = bool(fallback)
        self.costs = costs if costs is not None else CostModel()
        self.live: set = set()     # RowStates of generations decoding now: their acceptance is pooled
        self.seen = [0.0, 0.0]     # every generation's accepted / checked drafts, slowly decayed: a new one's prior
        self.bound = False

    def bind(self, k0: int, k_list, widths) -> "WidthPolicy":
        """Fit the policy to a TLM: its compiled k, k_list and seq_len widths."""
        self.k0 = k0                                  # the compiled k: round 1 is width k
        self.k_list = tuple(k_list) or (k0,)
        self.widths = sorted(widths)
        all_j = set(self.k_list) | ({k0 - 1} if k0 >= 1 else set())
        self.compiled_choices = sorted(j for j in all_j if j >= 0 and j + 1 in self.widths)
        k = self.fixed_k
        if k is not None and k not in self.compiled_choices:
            raise SpecdecError(f"k={k} is not compiled into the TLM (k_list {list(self.k_list)}; "
                               f"the drafts a round can verify: {self.compiled_choices})")
        self.k = k if k is not None else k0
        self.choices = [j for j in self.compiled_choices if j > 0 or self.fallback]
        a = self._adaptive
        self.adaptive = (len(self.k_list) > 1 and k is None) if a is None else bool(a)
        self.bound = True
        return self

    # -- per generation -------------------------------------------------------
    def row(self) -> RowState:
        """A new generation's state; its acceptance starts from the earlier generations' (if any)."""
        r = RowState(self)
        acc, chk = self.seen
        if chk > 0:
            r.acc, r.chk = self.PRIOR_WEIGHT * acc / chk, self.PRIOR_WEIGHT
        return r

    def round1_drafts(self) -> int:
        """Drafts of round 1 (after an accepted first draft): the TLM call has width k."""
        return (self.fixed_k if self.fixed_k is not None else self.k0) - 1

    def pooled_alpha(self, row: RowState) -> float:
        """The row's acceptance estimate, pooled with every row decoding beside it."""
        if len(self.live) <= 1:
            return row.alpha()
        acc = sum(r.acc for r in self.live)
        chk = sum(r.chk for r in self.live)
        return (acc + 0.5) / (chk + 1.0)

    def note_acceptance(self, row: RowState, accepted: int, drafted: int) -> None:
        lam, g = self.DECAY, self.PRIOR_DECAY
        checked = accepted + (1 if accepted < drafted else 0)     # the accepted drafts and the first rejected one
        row.acc = lam * row.acc + accepted
        row.probe_due = False
        row.chk = lam * row.chk + checked
        self.seen = [g * self.seen[0] + accepted, g * self.seen[1] + checked]

    def choose(self, row: RowState) -> int:
        """This round's draft count: the adaptive choice, with a probe now and then
        when it has settled on drafting nothing."""
        share = row.draft_cost_share
        j = self.choose_drafts(self.pooled_alpha(row), share=share)
        if j != 0 or not self.adaptive:
            row.zero_rounds, row.probe_every, row.probe_due = 0, self.PROBE_FIRST, False
            return j
        if not row.probe_due:
            row.zero_rounds += 1
            if row.zero_rounds < row.probe_every:
                return 0
            row.zero_rounds, row.probe_due = 0, True
            row.probe_every = min(2 * row.probe_every, self.PROBE_MAX)
        return self.choose_drafts(self.pooled_alpha(row), drafting=True, share=share)

    # -- the choice ------------------------------------------------------------
    def width_for(self, n_tokens: int) -> int:
        """The smallest compiled TLM width that holds ``n_tokens``."""
        for w in self.widths:
            if w >= n_tokens:
                return w
        raise AssertionError(f"no TLM width holds {n_tokens} tokens (widths {self.widths})")

    @staticmethod
    def expected_tokens(alpha: float, j: int) -> float:
        if alpha >= 1.0:
            return j + 1.0
        return (1.0 - alpha ** (j + 1)) / (1.0 - alpha)

    def choose_drafts(self, alpha: float, drafting: bool = False, share: float = 1.0) -> int:
        """The number of drafts j (from the compiled widths) with the most expected
        tokens per second; ``drafting``: the best j > 0 (a probe); ``share``: the share of
        drafts that call the draft model (a hybrid source's lookup drafts cost no call)."""
        if not self.adaptive:
            return self.k
        tlm = self.costs.calls("tlm")
        c_d = (self.costs.calls("dlm").estimate(1) or 0.0) * share
        seen = tlm.known()
        if not drafting and 0 in self.choices and self.width_for(1) not in seen:
            return 0  # time plain decoding once: priced like a wider call it would never be chosen
        h0, h1 = self.costs.host_per_round()
        best, best_score = None, -1.0
        for j in self.choices:
            if drafting and j == 0:
                continue
            c_t = tlm.estimate(self.width_for(j + 1))
            score = self.expected_tokens(alpha, j) / (j * c_d + (1.0 if c_t is None else c_t) + (h1 if j else h0))
            if score > best_score + 1e-12:
                best, best_score = j, score
        return self.k if best is None else best
