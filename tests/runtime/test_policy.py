"""The K=0 fallback: with 0 in the TLM's k_list the adaptive choice drafts nothing
(TLM width 1) when drafts do not pay, probes now and then, and drafts again when
they are accepted. FAKE backends (specdec_compile.runtime.testing)."""
from __future__ import annotations

import numpy as np
from runtime_helpers import PROMPT, reference_greedy

from specdec_compile.runtime import NgramDraft, SpecDecoder, TargetOnlyDecoder, WidthPolicy
from specdec_compile.runtime.drafts.ngram import NgramIndex
from specdec_compile.runtime.testing import FakeBackend, FakeLM, fake_artifact, known_costs, nominal_costs


class PhaseLM(FakeLM):
    """A draft that always disagrees with ``target`` while the history is shorter
    than ``until``, and equals it afterwards."""

    def __init__(self, target: FakeLM, until: int):
        super().__init__(target.vocab)
        self.target, self.until = target, until

    def __call__(self, history):
        x = self.target(history).copy()
        if len(history) < self.until:
            x[int(np.argmax(x))] -= 100.0
        return x


def Nominal(tlm, dlm):
    """The width choice fed nominal call times (TLM 1 + 0.05 per token, DLM 0.3)
    instead of measured ones, so the test does not depend on a shared machine's timer."""
    costs = nominal_costs(lambda role, width: 0.3 if role == "dlm" else 1.0 + 0.05 * width)
    return SpecDecoder(tlm, dlm, policy=WidthPolicy(costs=costs))


def pair(until, k_list=(0, 1, 4), log=None, ctx=160):
    lm = FakeLM(23)
    t = FakeBackend(fake_artifact("tlm", k=4, k_list=list(k_list), ctx_len=ctx), lm, log)
    d = FakeBackend(fake_artifact("dlm", ctx_len=ctx), PhaseLM(lm, until), log)
    return t, d, lm


def test_choice_with_known_costs():
    t, d, _ = pair(0)
    dec = SpecDecoder(t, d).policy
    assert dec.adaptive and dec.choices == [0, 1, 3, 4]
    dec.costs = known_costs(dlm=(10, 0.3), tlm={1: (10, 1.0), 2: (10, 1.1), 4: (10, 1.2), 5: (10, 1.3)})
    assert dec.choose_drafts(0.05) == 0              # drafts rarely accepted: plain decoding
    assert dec.choose_drafts(0.9) == 4               # drafts pay
    assert dec.choose_drafts(0.05, drafting=True) == 1   # the probe: the best j > 0
    nf = SpecDecoder(t, d, fallback=False).policy
    nf.costs = dec.costs
    assert 0 not in nf.choices and nf.choose_drafts(0.05) == 1


def test_falls_back_to_width_one_when_drafts_are_never_accepted():
    log = []
    t, d, lm = pair(until=10 ** 6, log=log)
    res = Nominal(t, d).generate(PROMPT, max_new_tokens=60)
    assert res.generated_ids == reference_greedy(lm, PROMPT, 60)
    assert res.generated_ids == TargetOnlyDecoder(t).generate(PROMPT, max_new_tokens=60).generated_ids
    assert res.metrics["accepted_tokens"] == 0
    widths = [c[1] for c in log if c[0] == "tlm" and c[1] != 8]
    assert widths.count(1) >= 0.7 * len(widths), widths          # mostly plain decoding
    assert len(widths) - widths.count(1) >= 2                     # but it probed
    hist = res.metrics["verify_drafts_histogram"]
    assert hist.get("0", 0) > sum(v for j, v in hist.items() if j != "0")


def test_returns_to_drafting_when_drafts_are_accepted():
    log = []
    t, d, lm = pair(until=40, log=log, ctx=200)
    res = Nominal(t, d).generate(PROMPT, max_new_tokens=150)
    assert res.generated_ids == reference_greedy(lm, PROMPT, 150)
    tl = [c for c in log if c[0] == "tlm" and c[1] != 8]
    early = [c[1] for c in tl if 0 <= c[2][0] < 40]
    late = [c[1] for c in tl if c[2][0] >= 110]
    assert early.count(1) >= len(early) // 2, early               # fell back while drafts failed
    assert late and sum(w > 1 for w in late) >= 0.7 * len(late), late   # and drafts again
    assert res.metrics["accepted_tokens"] >= 60


def test_ngram_with_the_fallback_equals_target_only():
    lm = FakeLM(23)
    t = FakeBackend(fake_artifact("tlm", k=4, k_list=[0, 2, 4], ctx_len=96), lm, cost=0.001)
    for fb in (True, False):
        res = SpecDecoder(t, NgramDraft(2), fallback=fb).generate(PROMPT, max_new_tokens=50)
        assert res.generated_ids == reference_greedy(lm, PROMPT, 50)


def test_the_loops_host_work_counts_in_the_choice():
    t, d, _ = pair(0)
    dec = SpecDecoder(t, d).policy
    calls = dict(dlm=(10, 0.3), tlm={1: (10, 1.0), 2: (10, 1.1), 4: (10, 1.2), 5: (10, 1.3)})
    dec.costs = known_costs(**calls, host={False: (10, 0.0), True: (10, 0.0)})
    assert dec.choose_drafts(0.7) > 0
    dec.costs = known_costs(**calls, host={False: (10, 0.0), True: (10, 5.0)})   # drafting rounds cost 5 s of host work
    assert dec.choose_drafts(0.7) == 0
    gen_dec = SpecDecoder(t, d)
    gen_dec.generate(PROMPT, max_new_tokens=20)
    host = gen_dec.costs._host
    assert sum(n for n, _ in host.values()) >= 1 and all(s >= 0 for _, s in host.values())


def test_plain_decoding_is_timed_before_it_is_judged():
    """An untried width-1 call would be priced like the nearest wider call (1.2-1.9 target
    steps on a CPU) and never win; the choice times it once first."""
    t, d, _ = pair(0)
    dec = SpecDecoder(t, d).policy
    dec.costs = known_costs(dlm=(10, 0.3), tlm={2: (10, 1.1), 4: (10, 1.2), 5: (10, 1.3)})
    assert dec.choose_drafts(0.9) == 0                       # not yet timed: measure it
    assert dec.choose_drafts(0.9, drafting=True) > 0         # a probe still drafts
    dec.costs.calls("tlm").add(1, 1.0, n=10)
    assert dec.choose_drafts(0.9) == 4 and dec.choose_drafts(0.05) == 0
    nf = SpecDecoder(t, d, fallback=False).policy
    nf.costs = known_costs(dlm=(10, 0.3), tlm={2: (10, 1.1)})
    assert nf.choose_drafts(0.9) > 0                         # no fallback: nothing to time


class SparseLookup(NgramDraft):
    """A free draft source (no draft model, like n-gram) that proposes wrong tokens
    before position ``wrong_until``, nothing after it, and the target's own tokens in
    the windows where ``match(q)`` holds: the shape of an answer that starts in
    new text and later repeats lines."""

    def __init__(self, lm, wrong_until, match):
        super().__init__()
        self.lm, self.wrong_until, self.match = lm, wrong_until, match

    def drafter(self, ctx):
        src = self

        class Drafter(NgramIndex):          # its verified/rollback/finish: nothing to keep
            def first(self, prompt):
                return None

            def draft(self, seq, q, n):
                if q < src.wrong_until:
                    return [(int(np.argmax(src.lm(seq[:q]))) + 1) % src.lm.vocab]
                if not src.match(q):
                    return []
                out, s = [], list(seq[:q])
                for _ in range(n):
                    out.append(int(np.argmax(src.lm(s))))
                    s.append(out[-1])
                return out
        return Drafter(self.max_n, self.min_n, None)


def test_a_probe_that_drafts_nothing_stays_due():
    """A probe whose source proposes nothing (a lookup that found no match) is no
    evidence: the next round asks again, and the probe clock only backs off once a
    probe has drafted. Before, an n-gram row that had its first probes rejected
    could spend its later probes on rounds without a match and never draft again
    (docs/demo.md: 4 probes, then 123 rounds at K=0 over an answer that repeats lines)."""
    lm = FakeLM(23)
    t = FakeBackend(fake_artifact("tlm", k=4, k_list=[0, 1, 4], ctx_len=400), lm)
    costs = nominal_costs(lambda role, width: 1.0 + 0.18 * (width - 1))   # w2/w1 = 1.18, as measured
    src = SparseLookup(lm, wrong_until=30, match=lambda q: q >= 120 and q % 9 < 3)
    res = SpecDecoder(t, src, policy=WidthPolicy(costs=costs)).generate(PROMPT, max_new_tokens=300)
    assert res.generated_ids == reference_greedy(lm, PROMPT, 300)
    assert res.metrics["accepted_tokens"] >= 60, res.metrics["verify_drafts_histogram"]


def test_the_probe_clock():
    t, d, _ = pair(0)
    pol = SpecDecoder(t, d).policy
    pol.costs = known_costs(dlm=(10, 0.0), tlm={1: (10, 1.0), 2: (10, 1.18), 5: (10, 1.5)})
    row = pol.row()
    row.acc, row.chk = 0.0, 20.0                     # drafts rejected: plain decoding pays
    seq = [pol.choose(row) for _ in range(pol.PROBE_FIRST)]
    assert seq[:-1] == [0] * (pol.PROBE_FIRST - 1) and seq[-1] > 0          # the first probe
    assert [pol.choose(row) for _ in range(3)] == [seq[-1]] * 3             # it drafted nothing: still due
    pol.note_acceptance(row, 0, 1)                                          # it drafted and was rejected
    nxt = [pol.choose(row) for _ in range(2 * pol.PROBE_FIRST)]
    assert nxt[:-1] == [0] * (2 * pol.PROBE_FIRST - 1) and nxt[-1] > 0      # backed off: twice as long


def test_a_generation_starts_from_the_earlier_ones_acceptance():
    """A new generation's estimate starts from the decoder's earlier generations (weighted as
    PRIOR_WEIGHT checks), so one failed first round does not send a good draft to K = 0."""
    t, d, _ = pair(0)
    pol = SpecDecoder(t, d).policy
    pol.costs = known_costs(dlm=(10, 0.3), tlm={1: (10, 1.0), 2: (10, 1.1), 4: (10, 1.2), 5: (10, 1.3)})
    fresh = pol.row()
    assert fresh.alpha() == 0.5                                   # nothing seen: the even guess
    pol.note_acceptance(fresh, 0, 3)
    assert pol.choose_drafts(fresh.alpha()) == 0                  # one failed round: 0.25, plain decoding
    for _ in range(20):                                           # a draft that is mostly right
        pol.note_acceptance(pol.row(), 4, 4)
    r = pol.row()
    assert r.alpha() > 0.75 and r.chk == pol.PRIOR_WEIGHT
    pol.note_acceptance(r, 0, 3)                                  # the same failed first round
    assert pol.pooled_alpha(r) > 0.4 and pol.choose_drafts(pol.pooled_alpha(r)) > 0
    for _ in range(200):                                          # drafts that stop paying: the prior follows
        pol.note_acceptance(pol.row(), 0, 4)
    assert pol.row().alpha() < 0.2


def test_every_generation_of_a_decoder_equals_target_only_with_the_prior():
    t, d, lm = pair(until=30, ctx=200)
    dec = Nominal(t, d)
    for n in (40, 60, 50):
        res = dec.generate(PROMPT, max_new_tokens=n)
        assert res.generated_ids == reference_greedy(lm, PROMPT, n)
    assert dec.policy.seen[1] > 0
