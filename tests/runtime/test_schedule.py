"""The shape of batched calls (runtime/schedule.py, batch.py): the width a call
runs at when some rows prefill, a batch's prompts prefilled in step, acceptance
pooled across rows, and sampling that does not depend on the schedule."""
from __future__ import annotations

import numpy as np
import pytest

from specdec_compile.runtime import SamplingParams, SpecDecoder, TargetOnlyDecoder
from specdec_compile.runtime.batch import BatchEngine
from specdec_compile.runtime.costs import CallCosts
from specdec_compile.runtime.schedule import choose_width
from specdec_compile.runtime.testing import fake_pair

WIDTHS = [1, 2, 3, 5, 32]


def costs(table: dict, n: int = 10 ** 6) -> CallCosts:
    c = CallCosts()
    for w, t in table.items():
        c.add(w, t, n)
    return c


# ------------------------------------------------------------------- costs

def test_estimate_interpolates_and_extrapolates():
    c = costs({2: 2.0, 6: 4.0}, n=1)
    assert c.estimate(2) == 2.0
    assert c.estimate(4) == pytest.approx(3.0)      # between: linear
    assert c.estimate(1) == 2.0                     # below: the narrowest measured
    assert c.estimate(12) == pytest.approx(7.0)     # above: the line through the two widest
    assert costs({4: 2.0}, n=1).estimate(9) == 2.0  # one width measured: its time
    assert CallCosts().estimate(3) is None
    c.add(2, 4.0)                                    # running mean
    assert c.estimate(2) == pytest.approx(3.0)


def test_a_narrow_width_never_costs_more_than_a_wider_one():
    c = costs({1: 0.200, 4: 0.050, 5: 0.055}, n=1)   # one slow width-1 call (a busy core, a new shape)
    assert c.estimate(1) == pytest.approx(0.050)      # not 0.200: that would lock width 1 out
    assert c.estimate(4) == pytest.approx(0.050) and c.estimate(5) == pytest.approx(0.055)
    assert c.estimate(3) == pytest.approx(0.050)


def test_the_fallback_is_chosen_after_a_noisy_first_width_1_call():
    """The K=0 fallback must not be locked out by one slow width-1 call: with acceptance near 0
    the policy decodes plainly (j = 0), as the measured wider calls cost at least as much."""
    from specdec_compile.runtime.costs import CostModel
    from specdec_compile.runtime.policy import WidthPolicy
    cm = CostModel()
    for w, t in {1: 0.200, 2: 0.049, 4: 0.053, 5: 0.055}.items():
        cm.calls("tlm").add(w, t, 1 if w == 1 else 50)
    cm.calls("dlm").add(1, 0.0036, 50)
    cm.note_host(False, 0.004)
    cm.note_host(True, 0.002, 50)
    pol = WidthPolicy(costs=cm).bind(4, (0, 1, 2, 3, 4), [1, 2, 3, 4, 5])
    assert pol.choose_drafts(0.023) == 0
    assert pol.choose_drafts(0.8) > 0


# ------------------------------------------------------------------- widths

def test_no_prefill_is_the_widest_decoding_row():
    assert choose_width(WIDTHS, [2, 5, 1], [], costs({1: 1.0})) == 5
    assert choose_width(WIDTHS, [], [], None) == 0


def test_unmeasured_takes_the_whole_chunk():
    assert choose_width(WIDTHS, [2], [20], None) == 32
    assert choose_width(WIDTHS, [], [4], CallCosts()) == 5
    assert choose_width(WIDTHS, [5], [2], None) == 5     # never narrower than a decoding row


def test_alone_the_cheapest_width_per_prompt_token():
    overhead = {1: 1.0, 2: 1.05, 3: 1.1, 5: 1.2, 32: 2.0}    # per-call overhead dominates
    assert choose_width(WIDTHS, [], [32], costs(overhead)) == 32
    assert choose_width(WIDTHS, [], [3], costs(overhead)) == 3
    assert choose_width(WIDTHS, [], [3, 30], costs(overhead)) == 32


def test_many_decoding_rows_and_a_dear_prefill_width_ride_at_the_decoding_width():
    compute = {1: 5.8, 2: 8.7, 3: 10.0, 5: 11.7, 32: 28.0}   # a batch-8 CPU call: width costs
    assert choose_width(WIDTHS, [5] * 7, [32], costs(compute)) == 5
    # few decoding rows: the prompt goes in whole and they verify inside the wide call
    assert choose_width(WIDTHS, [5], [32, 32, 32], costs(compute)) == 32


@pytest.mark.parametrize("dec", [[], [1], [3, 1], [5, 5, 5]])
@pytest.mark.parametrize("pre", [[1], [4], [32], [7, 32]])
def test_width_is_compiled_and_holds_every_decoding_row(dec, pre):
    for table in ({1: 1.0, 32: 2.0}, {1: 1.0, 2: 2.0, 3: 3.0, 5: 5.0, 32: 32.0}, {5: 9.0}):
        w = choose_width(WIDTHS, dec, pre, costs(table))
        assert w in WIDTHS and w >= max(dec, default=1)


# ------------------------------------------------------------------- the engine

class Recorder(BatchEngine):
    """Logs each call as (model, width, decoding rows, prefilling rows, prompt chunks cut short)."""

    def __init__(self, dec, preset=None):
        super().__init__(dec)
        self.log = []
        for backend, table in (preset or {}).items():    # the decoder's cost model, preset
            tracker = dec.costs.calls("tlm" if backend is dec.tlm else "dlm")
            for w, t in table.items():
                tracker.add(w, t, 10 ** 6)

    def _shape(self, group):
        w, rows = super()._shape(group)
        cut = sum(len(c.tokens) < len(g.tokens) for (_, c), (_, g) in zip(rows, group))
        self.log.append((group[0][1].runner.role, w, sum(not c.prefill for _, c in rows),
                         sum(c.prefill for _, c in rows), cut))
        return w, rows


# prompts of 1-3 chunks (PL 8) that finish at different times (different acceptance)
PROMPTS = [[3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 1], [5, 6], [7] * 20, [1, 2, 3, 1, 2, 3, 1, 2, 9, 9, 4, 4, 5],
           [9], [4, 9] * 9, [11, 3, 5], [2, 8, 2, 8, 6, 6, 6, 1, 1, 1, 2, 2]]


def run(dec, preset=None, max_new=(12, 20), sampling=None):
    eng = Recorder(dec, preset)
    # different budgets per prompt so rows free up at different times
    res = {}
    for i, r in eng.stream(PROMPTS, max_new_tokens=max_new[0], sampling=sampling):
        res[i] = r
    return eng.log, [res[i].generated_ids for i in range(len(PROMPTS))]


def reference(dec, max_new):
    return [dec.generate(p, max_new_tokens=max_new).generated_ids for p in PROMPTS]


@pytest.mark.parametrize("B", [2, 3])
def test_a_new_prompt_rides_in_the_decoding_calls_when_wide_calls_are_dear(B):
    tlm, d, _ = fake_pair(k=4, k_list=[0, 1, 2, 4], dlm="close", batch_size=B)
    dear = {1: 1.0, 2: 1.0, 3: 1.0, 4: 1.0, 5: 1.0, 8: 1000.0}
    dec = SpecDecoder(tlm, d, k=4)
    log, out = run(dec, {tlm: dear, d: {1: 1.0, 2: 1.0, 8: 1000.0}})
    assert out == reference(dec, 12)
    started = next(i for i, e in enumerate(log) if e[2])          # the first call with a decoding row
    later = log[started:]
    assert any(e[3] for e in later)                                 # prompts did come in later
    assert all(e[1] != 8 for e in later if e[2])                    # never a PL-wide call beside decoding rows
    assert any(e[2] and e[4] for e in later)                        # prompts rode with decoding rows


def test_a_new_prompt_comes_in_whole_and_decoding_rows_verify_inside_when_wide_calls_are_cheap():
    tlm, d, _ = fake_pair(k=4, k_list=[0, 1, 2, 4], dlm="close", batch_size=3)
    flat = {1: 1.0, 2: 1.0, 3: 1.0, 4: 1.0, 5: 1.0, 8: 1.0}
    dec = SpecDecoder(tlm, d, k=4)
    log, out = run(dec, {tlm: flat, d: {1: 1.0, 2: 1.0, 8: 1.0}})
    assert out == reference(dec, 12)
    started = next(i for i, e in enumerate(log) if e[2])
    mixed = [e for e in log[started:] if e[3]]
    assert mixed and not any(e[4] for e in mixed)                  # every chunk whole
    assert any(e[1] == 8 and e[2] for e in mixed)                   # decoding rows in the wide call


@pytest.mark.parametrize("target_only", [False, True])
def test_a_batch_prefills_in_step(target_only):
    tlm, d, _ = fake_pair(k=3, dlm="close", batch_size=4)
    dec = TargetOnlyDecoder(tlm) if target_only else SpecDecoder(tlm, d)
    eng = Recorder(dec)
    first = PROMPTS[:4]                       # 2, 1, 3 and 2 chunks
    list(eng.stream(first, max_new_tokens=6))
    head = eng.log[:next(i for i, e in enumerate(eng.log) if e[2])]
    assert head[0][:4] == ("tlm", 8, 0, 4)                          # every row's first chunk at once
    if not target_only:
        tlm_calls = [e for e in head if e[0] == "tlm"]
        assert [e[3] for e in tlm_calls] == [4, 3, 1]               # and every later chunk together
        first_dlm = next(i for i, e in enumerate(head) if e[0] == "dlm")
        assert all(e[0] == "tlm" for e in head[:first_dlm])         # the TLM's prefill first
        assert head[first_dlm][3] == 4                               # then the DLM's, all rows at once


def test_acceptance_is_pooled_across_live_rows():
    tlm, d, _ = fake_pair(k=3, dlm="close")
    dec = SpecDecoder(tlm, d)
    policy = dec.policy
    a, b = policy.row(), policy.row()
    a.acc, a.chk = 9.0, 10.0
    b.acc, b.chk = 0.0, 4.0
    assert policy.pooled_alpha(a) == a.alpha()                       # alone: its own
    policy.live.update([a, b])
    assert policy.pooled_alpha(a) == policy.pooled_alpha(b) == pytest.approx(9.5 / 15.0)
    policy.live.clear()


def test_generations_leave_the_pool_when_they_end():
    tlm, d, _ = fake_pair(k=4, k_list=[1, 2, 4], dlm="close", batch_size=3)
    dec = SpecDecoder(tlm, d)
    eng = Recorder(dec)
    list(eng.stream(PROMPTS, max_new_tokens=16))
    assert not dec.policy.live                                       # every generation left the pool


def test_seeded_sampling_does_not_depend_on_the_schedule():
    tlm, d, _ = fake_pair(k=4, k_list=[0, 1, 2, 4], dlm="close", batch_size=3)
    sp = SamplingParams(temperature=0.9, seed=11)
    dec = SpecDecoder(tlm, d, k=4)
    _, a = run(dec, {tlm: {1: 1.0, 5: 1.0, 8: 1000.0}}, sampling=sp)
    _, b = run(dec, {tlm: {1: 1.0, 5: 1.0, 8: 1.0}}, sampling=sp)
    assert a == b
    assert all(len(x) == 12 for x in a)
