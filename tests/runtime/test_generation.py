"""The decoding loop on FAKE in-memory backends (specdec_compile.runtime.testing).

The fake "models" are numpy functions of the whole cache content, so a loop
that forgets, misplaces or fails to overwrite a token produces different
logits. A reference decoder computes the same function directly from the
token list, without any cache, to check against.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
from runtime_helpers import PROMPT, chi2, chi2_crit, reference_greedy, sample_counts, sequence_dist

from specdec_compile.errors import SpecdecError
from specdec_compile.runtime import SamplingParams, SpecDecoder, TargetOnlyDecoder, aggregate_metrics
from specdec_compile.runtime.policy import WidthPolicy
from specdec_compile.runtime.sampling import Noise, choose, choose_from, probs, verify
from specdec_compile.runtime.testing import FakeBackend, FakeLM, fake_artifact, fake_pair, known_costs, nominal_costs


# ----------------------------------------------------------------------------- greedy

@pytest.mark.parametrize("k", [1, 2, 4, 7])
@pytest.mark.parametrize("dlm", ["same", "close", "independent"])
def test_greedy_equals_target_only_and_reference(k, dlm):
    tlm, d, lm = fake_pair(k=k, dlm=dlm)
    spec = SpecDecoder(tlm, d).generate(PROMPT, max_new_tokens=40)
    base = TargetOnlyDecoder(tlm).generate(PROMPT, max_new_tokens=40)
    ref = reference_greedy(lm, PROMPT, 40, tlm.ctx_len)
    assert spec.generated_ids == ref
    assert base.generated_ids == ref
    m = spec.metrics
    assert m["new_tokens"] == 40 and spec.stop_reason == "max_new_tokens"
    assert sum(m["acceptance_histogram"]) >= 1
    if dlm == "same":
        assert m["acceptance_rate"] == 1.0
        # every full round yields k+1 tokens (the last round may be cut by the budget)
        assert m["acceptance_histogram"][k] >= (40 // (k + 1)) - 1
    if dlm == "independent":
        assert m["acceptance_rate"] < 0.5
    # sources: accepted drafts are "draft", the rest "target"
    assert len(spec.sources) == 40
    assert spec.sources.count("draft") <= m["accepted_tokens"]
    assert set(spec.sources) <= {"draft", "target"}


def test_call_pattern_follows_contract():
    log = []
    tlm, d, lm = fake_pair(k=4, dlm="same", call_log=log, ctx_len=64, prefill_len=8)
    SpecDecoder(tlm, d).generate(PROMPT, max_new_tokens=14)
    tl = [c for c in log if c[0] == "tlm"]
    dl = [c for c in log if c[0] == "dlm"]
    # prefill: two PL chunks, the last right-padded with -1
    assert [c[1] for c in tl[:2]] == [8, 8]
    assert tl[1][2] == [8, 9, 10, -1, -1, -1, -1, -1]
    assert [c[1] for c in dl[:2]] == [8, 8]
    # round 1: DLM k-1 calls of seq_len 1 at n.., TLM seq_len k with [d1..dk] at n..n+k-1
    assert [(c[1], c[2]) for c in dl[2:5]] == [(1, [11]), (1, [12]), (1, [13])]
    assert tl[2][1] == 4 and tl[2][2] == [11, 12, 13, 14]
    # round 2 after a full accept: DLM seq_len 2 with [dk, t], TLM seq_len k+1 [t, d1..dk]
    assert dl[5][1] == 2 and dl[5][2] == [14, 15]
    assert tl[3][1] == 5 and tl[3][2] == [15, 16, 17, 18, 19]


def test_rejection_reuses_positions_and_dlm_seq_len_1():
    log = []
    tlm, d, lm = fake_pair(k=4, dlm="close", call_log=log)
    res = SpecDecoder(tlm, d).generate(PROMPT, max_new_tokens=30)
    assert res.generated_ids == reference_greedy(lm, PROMPT, 30, 64)
    assert 0 < res.metrics["acceptance_rate"] < 1
    tl = [c for c in log if c[0] == "tlm" and c[1] == 5]
    # after a rejection the next TLM call starts at the position right after the last accepted token
    starts = [c[2][0] for c in tl]
    assert starts == sorted(starts) and len(set(starts)) == len(starts)
    assert any(c[0] == "dlm" and c[1] == 1 for c in log)


def test_eos_in_the_middle_of_a_round():
    tlm, d, lm = fake_pair(k=7, dlm="same")
    ref = reference_greedy(lm, PROMPT, 40, 64)
    # an EOS id whose first occurrence is at output index 5: inside round 1 (k=7)
    i = next(i for i in range(3, 30) if ref[i] not in ref[:i])
    eos = ref[i]
    spec = SpecDecoder(tlm, d, eos_token_id=eos).generate(PROMPT, max_new_tokens=40)
    base = TargetOnlyDecoder(tlm, eos_token_id=eos).generate(PROMPT, max_new_tokens=40)
    assert spec.generated_ids == ref[: i + 1] == base.generated_ids
    assert spec.stop_reason == base.stop_reason == "eos"
    # several EOS ids: the first one met stops (the first listed, an id of the vocabulary, never occurs)
    never = next(t for t in range(tlm.vocab_size) if t not in ref[: i + 1])
    spec2 = SpecDecoder(tlm, d, eos_token_id=[never, eos]).generate(PROMPT, max_new_tokens=40)
    assert spec2.generated_ids == ref[: i + 1]


@pytest.mark.parametrize("k", [1, 2, 4, 7])
@pytest.mark.parametrize("dlm", ["same", "close"])
def test_prompt_running_into_the_context_limit(k, dlm):
    log = []
    tlm, d, lm = fake_pair(k=k, dlm=dlm, ctx_len=24, prefill_len=8, call_log=log)
    prompt = [3 + i % 19 for i in range(17)]
    spec = SpecDecoder(tlm, d).generate(prompt, max_new_tokens=100)
    base = TargetOnlyDecoder(tlm).generate(prompt, max_new_tokens=100)
    ref = reference_greedy(lm, prompt, 100, 24)
    assert len(ref) == 24 - 17
    assert spec.generated_ids == ref == base.generated_ids
    assert spec.stop_reason == base.stop_reason == "ctx_len"
    # never a position >= ctx_len; the end of fixed-width calls is padding
    for role, s, pos, ids in log:
        assert max(pos) < 24
        valid = [p for p in pos if p >= 0]
        assert pos[: len(valid)] == valid


def test_prompt_filling_the_context_but_one():
    tlm, d, lm = fake_pair(k=4, ctx_len=24, prefill_len=8)
    prompt = [3 + i % 19 for i in range(23)]
    spec = SpecDecoder(tlm, d).generate(prompt, max_new_tokens=10)
    assert spec.generated_ids == reference_greedy(lm, prompt, 10, 24) and len(spec.generated_ids) == 1
    assert spec.stop_reason == "ctx_len"


@pytest.mark.parametrize("n", [0, 1, 2, 3])
def test_small_budgets(n):
    tlm, d, lm = fake_pair(k=4, dlm="same")
    spec = SpecDecoder(tlm, d).generate(PROMPT, max_new_tokens=n)
    assert spec.generated_ids == reference_greedy(lm, PROMPT, n, 64)


def test_prompt_errors():
    tlm, d, lm = fake_pair(k=4, ctx_len=24)
    dec = SpecDecoder(tlm, d)
    with pytest.raises(SpecdecError, match="does not fit"):
        dec.generate([3] * 24)
    with pytest.raises(SpecdecError, match="empty prompt"):
        dec.generate([])
    with pytest.raises(SpecdecError, match="out of range"):
        dec.generate([3, 500])
    with pytest.raises(SpecdecError, match="does not fit"):
        TargetOnlyDecoder(tlm).generate([3] * 30)


def test_pair_mismatches_are_errors():
    lm = FakeLM(23)
    base = dict(batch_size=1, ctx_len=64, prefill_len=8, vocab=23)
    t = FakeBackend(fake_artifact("tlm", k=4, **base), lm)
    for change, what in ((dict(ctx_len=32), "context length"), (dict(prefill_len=4), "prefill length"),
                         (dict(batch_size=2), "batch size")):
        d = FakeBackend(fake_artifact("dlm", **{**base, **change}), lm)
        with pytest.raises(SpecdecError, match=what):
            SpecDecoder(t, d)
    # another table size is no mismatch (tests/runtime/test_vocab.py); another EOS id is
    SpecDecoder(t, FakeBackend(fake_artifact("dlm", **{**base, "vocab": 29}), FakeLM(29)))
    t2 = FakeBackend(fake_artifact("tlm", k=4, eos_token_id=2, **base), lm)
    with pytest.raises(SpecdecError, match="different EOS ids"):
        SpecDecoder(t2, FakeBackend(fake_artifact("dlm", eos_token_id=3, **base), lm))
    with pytest.raises(SpecdecError, match="DLM artifact"):
        SpecDecoder(FakeBackend(fake_artifact("dlm", **base), lm), t)
    with pytest.raises(SpecdecError, match="not compiled"):
        SpecDecoder(t, FakeBackend(fake_artifact("dlm", **base), lm), k=2)   # k-1 = 3 is compiled (width 4); 2 is not


def test_backend_rejects_calls_outside_the_specializations():
    tlm, d, lm = fake_pair(k=4)
    with pytest.raises(SpecdecError, match=r"matches no specialization"):
        tlm.run(np.zeros((1, 3), np.int64), np.arange(3)[None])
    with pytest.raises(SpecdecError, match=r"matches no specialization"):
        d.run(np.zeros((2, 1), np.int64), np.zeros((2, 1), np.int64))
    with pytest.raises(SpecdecError, match="positions"):
        tlm.run(np.zeros((1, 4), np.int64), np.array([[62, 63, 64, 65]]))
    with pytest.raises(SpecdecError, match="right end"):
        tlm.run(np.zeros((1, 4), np.int64), np.array([[0, -1, 2, 3]]))


def test_batch_greater_than_one_artifact_uses_row_zero():
    tlm, d, lm = fake_pair(k=3, dlm="close", batch_size=3)
    spec = SpecDecoder(tlm, d).generate(PROMPT, max_new_tokens=20)
    assert spec.generated_ids == reference_greedy(lm, PROMPT, 20, 64)


def test_reset_between_prompts():
    tlm, d, lm = fake_pair(k=4, dlm="close")
    dec = SpecDecoder(tlm, d)
    a = dec.generate(PROMPT, max_new_tokens=20).generated_ids
    dec.generate([5, 6, 7] * 5, max_new_tokens=30)
    assert dec.generate(PROMPT, max_new_tokens=20).generated_ids == a


# ----------------------------------------------------------------------------- several widths

def test_choose_drafts_cost_model():
    tlm, d, _ = fake_pair(k=3, k_list=[1, 3, 6])
    dec = SpecDecoder(tlm, d)
    dec.policy.costs = known_costs(dlm=(10, 0.001), tlm={4: (10, 0.01)})     # DLM call 1 ms, TLM call 10 ms
    assert dec.policy.choose_drafts(0.95) == 6
    assert dec.policy.choose_drafts(0.02) == 1
    dec.policy.costs = known_costs(dlm=(10, 0.01), tlm={4: (10, 0.01)})      # a DLM as slow as the TLM
    assert dec.policy.choose_drafts(0.6) in (1, 2)
    fixed = SpecDecoder(tlm, d, k=3)
    assert not fixed.policy.adaptive and fixed.policy.choose_drafts(0.02) == 3


def test_adaptive_width_same_output_and_sensible_choice():
    # a TLM call costs about 10 DLM calls
    for dlm, expect in (("same", "wide"), ("independent", "narrow")):
        tlm, d, lm = fake_pair(k=3, k_list=[1, 3, 6], dlm=dlm)
        dec = SpecDecoder(tlm, d, policy=WidthPolicy(costs=nominal_costs(
            lambda role, w: 2e-3 * (1 + 0.05 * w) if role == "tlm" else 2e-4)))
        assert dec.policy.adaptive
        res = dec.generate(PROMPT, max_new_tokens=45)
        assert res.generated_ids == reference_greedy(lm, PROMPT, 45, 64)
        widths = {int(j): c for j, c in res.metrics["verify_drafts_histogram"].items()}
        if expect == "wide":
            assert max(widths, key=widths.get) == 6
        else:
            assert max(widths, key=widths.get) == 1


def test_fixed_width_from_k_list():
    log = []
    tlm, d, lm = fake_pair(k=3, k_list=[1, 3, 6], dlm="close", call_log=log)
    res = SpecDecoder(tlm, d, k=6).generate(PROMPT, max_new_tokens=30)
    assert res.generated_ids == reference_greedy(lm, PROMPT, 30, 64)
    tl = [c for c in log if c[0] == "tlm" and c[1] != 8]
    # --k fixes every round, round 1 included: width 6+1 (near the budget's end a
    # narrower compiled width holds the fewer drafts)
    assert tl[0][1] == 7
    assert {c[1] for c in tl} <= {2, 3, 4, 7}


def test_fixed_k_minus_one_and_every_round():
    log = []
    tlm, d, lm = fake_pair(k=4, dlm="same", call_log=log)
    res = SpecDecoder(tlm, d, k=3).generate(PROMPT, max_new_tokens=30)
    assert res.generated_ids == reference_greedy(lm, PROMPT, 30, 64)
    tl = [c for c in log if c[0] == "tlm" and c[1] != 8]
    # round 1 carries [d1..d3] (width 4), every later round [t, d1..d3] (width 4)
    assert tl[0][2][:3] == [11, 12, 13] and tl[0][2][3] == -1
    assert {c[1] for c in tl} == {4}
    assert all(len([p for p in c[2] if p >= 0]) == 4 for c in tl[1:-1])


def test_expected_tokens_formula():
    tlm, d, _ = fake_pair(k=3, k_list=[1, 3, 6])
    dec = SpecDecoder(tlm, d)
    assert dec.policy.expected_tokens(0.0, 5) == 1.0
    assert dec.policy.expected_tokens(1.0, 5) == 6.0
    assert math.isclose(dec.policy.expected_tokens(0.5, 2), 1 + 0.5 + 0.25)


def test_metrics_keys_and_aggregate():
    tlm, d, _ = fake_pair(k=4, dlm="close")
    dec = SpecDecoder(tlm, d, record_calls=True)
    rs = [dec.generate(PROMPT, max_new_tokens=20), dec.generate(PROMPT[:5], max_new_tokens=10)]
    for r in rs:
        m = r.metrics
        for key in ("ttft_s", "decode_tokens_per_s", "acceptance_rate", "mean_tokens_per_tlm_call",
                    "acceptance_histogram", "dlm_time_s", "tlm_time_s", "host_time_s", "new_tokens"):
            assert key in m
        assert m["dlm_time_s"] > 0 and m["tlm_time_s"] > 0 and m["host_time_s"] >= 0
        assert len(m["calls"]) == m["dlm_calls"] + m["tlm_calls"]
        assert sum(c for c, _ in m["call_time_by_width"]["tlm"].values()) == m["tlm_calls"]
        assert m["accepted_tokens"] <= m["drafted_tokens"]
    agg = aggregate_metrics(rs)
    assert agg["new_tokens"] == 30 and agg["prompts"] == 2
    base = TargetOnlyDecoder(tlm).generate(PROMPT, max_new_tokens=10).metrics
    assert base["mean_tokens_per_tlm_call"] == 1.0 and base["acceptance_rate"] is None


# ----------------------------------------------------------------------------- sampling

def test_probs_filters():
    logits = np.array([3.0, 2.0, 1.0, 0.0, -1.0])
    p = probs(logits, SamplingParams(1.0))
    assert math.isclose(p.sum(), 1.0) and np.all(np.diff(p) < 0)
    pk = probs(logits, SamplingParams(1.0, top_k=2))
    assert np.count_nonzero(pk) == 2 and math.isclose(pk.sum(), 1.0)
    pp = probs(logits, SamplingParams(1.0, top_p=0.8))
    # smallest nucleus with mass >= 0.8: the first two hold 0.665+0.245 = 0.91 (first alone 0.665)
    assert np.count_nonzero(pp) == 2
    cold = probs(logits, SamplingParams(0.1))
    assert cold[0] > 0.99
    with pytest.raises(SpecdecError):
        SamplingParams(-1.0)
    with pytest.raises(SpecdecError):
        SamplingParams(1.0, top_p=0.0)
    with pytest.raises(SpecdecError):
        SamplingParams(1.0, top_k=-2)


def _random_dist(rng, V, zeros):
    x = rng.gamma(0.5, size=V)
    x[rng.choice(V, size=zeros, replace=False)] = 0.0
    return x / x.sum()


def test_position_keyed_draw_is_exactly_p():
    """argmax(log p + g_pos) over positions is a draw from p: never a token p excludes,
    frequencies pass a chi-square test; a fixed (seed, index, position) gives one token."""
    rng = np.random.default_rng(2)
    for trial in range(3):
        p = _random_dist(rng, 6, 2)
        noise = Noise(int(rng.integers(1 << 30)), trial)
        N = 20000
        draws = np.array([choose_from(p, noise, pos) for pos in range(N)])
        counts = np.bincount(draws, minlength=6)
        assert counts[p == 0].sum() == 0
        nz = p > 0
        stat = (((counts[nz] - N * p[nz]) ** 2) / (N * p[nz])).sum()
        assert stat < chi2_crit(int(nz.sum()) - 1), (stat, p, counts)
        assert all(choose_from(p, Noise(noise.seed, trial), pos) == draws[pos] for pos in (5, 0, 17, 5))


def test_noise_depends_on_seed_index_and_position_only():
    a, b = Noise(7, 0), Noise(7, 0)
    g = [a.gumbel(pos, 50) for pos in (3, 1, 2)]
    h = [b.gumbel(pos, 50) for pos in (1, 2, 3)]     # another order
    assert np.array_equal(g[0], h[2]) and np.array_equal(g[1], h[0]) and np.array_equal(g[2], h[1])
    assert not np.array_equal(Noise(7, 1).gumbel(3, 50), g[0])     # another prompt index
    assert not np.array_equal(Noise(8, 0).gumbel(3, 50), g[0])     # another seed
    for _ in range(Noise.KEEP + 5):                                # the cache forgets, the numbers stay
        a.gumbel(int(np.random.default_rng().integers(1000, 10 ** 6)), 50)
    assert np.array_equal(a.gumbel(3, 50), g[0])


def test_sampled_verify_accepts_exactly_the_targets_tokens():
    rng = np.random.default_rng(3)
    params = SamplingParams(0.9, top_k=5)
    noise = Noise(11, 0)
    for trial in range(50):
        L = rng.standard_normal((4, 9)) * 2
        want = [choose(L[i], params, noise, 20 + i) for i in range(4)]
        assert verify(want[:3], L, 20, params, noise) == (3, want[3])          # all accepted, then the bonus
        wrong = (want[1] + 1) % 9
        assert verify([want[0], wrong, want[2]], L, 20, params, noise) == (1, want[1])
        assert verify(want[:1], L[:1], 20, params, noise, bonus=False) == (1, None)


def test_tiny_temperatures_are_greedy_and_quiet():
    L = np.array([1.0, 3.0, 2.9, -5.0])
    for t in (1e-310, 1e-320, 1e-6):
        sp = SamplingParams(t)
        assert sp.greedy
        with np.errstate(all="raise"):
            assert choose(L, sp, sp.noise(0), 0) == 1
    assert not SamplingParams(1e-4).greedy
    with np.errstate(over="raise", divide="raise", invalid="raise"):
        p = probs(L * 1000, SamplingParams(1e-4))
    assert p[1] == 1.0


def test_seed_must_be_a_non_negative_integer():
    for bad in (-1, 2 ** 64, 1.5, True):
        with pytest.raises(SpecdecError, match="seed"):
            SamplingParams(0.5, seed=bad)
    assert SamplingParams(0.5, seed=0).seed == 0


def test_greedy_verify_prefix():
    L = np.eye(5)[[1, 2, 3, 4]] * 5.0     # argmax rows: 1, 2, 3, 4
    g = SamplingParams()
    assert verify([1, 2, 3], L, 0, g, None) == (3, 4)
    assert verify([1, 0, 3], L, 0, g, None) == (1, 2)
    assert verify([0, 2, 3], L, 0, g, None) == (0, 1)
    assert verify([], L[:1], 0, g, None) == (0, 1)


@pytest.mark.parametrize("params,N", [(SamplingParams(1.0), 4000),
                                      (SamplingParams(0.8, top_k=4, top_p=0.9), 3000)])
def test_speculative_sampling_draws_from_the_target_distribution(params, N):
    V = 6
    tlm_lm = FakeLM(V, salt=3, scale=1.0)
    dlm_lm = FakeLM(V, salt=99, scale=1.0)       # an independent draft: many rejections
    tlm = FakeBackend(fake_artifact("tlm", k=2, vocab=V, ctx_len=32, prefill_len=4), tlm_lm)
    dlm = FakeBackend(fake_artifact("dlm", vocab=V, ctx_len=32, prefill_len=4), dlm_lm)
    prompt = [1, 2, 3]
    n = 3
    expect = sequence_dist(tlm_lm, prompt, n, params)
    dec = SpecDecoder(tlm, dlm)
    rng = np.random.default_rng(1234)
    counts, acc = sample_counts(dec, prompt, n, params, rng, N)
    stat, df = chi2(counts, expect, N)
    assert stat < chi2_crit(df), (stat, df)
    assert 0.1 < np.mean(acc) < 0.9     # the rule was really exercised (accepts and rejects)

    # negative control: the draft model's own distribution fails the same test
    draft_expect = sequence_dist(dlm_lm, prompt, n, params)
    fake_counts = {k: int(round(v * N)) for k, v in draft_expect.items()}
    bad, bdf = chi2({k: fake_counts.get(k, 0) for k in expect}, expect, N)
    assert bad > chi2_crit(bdf)


def test_target_only_sampling_distribution():
    V = 6
    lm = FakeLM(V, salt=3, scale=1.0)
    tlm = FakeBackend(fake_artifact("tlm", k=2, vocab=V, ctx_len=32, prefill_len=4), lm)
    params = SamplingParams(1.0)
    expect = sequence_dist(lm, [1, 2, 3], 2, params)
    dec = TargetOnlyDecoder(tlm)
    rng = np.random.default_rng(7)
    N = 3000
    counts, _ = sample_counts(dec, [1, 2, 3], 2, params, rng, N)
    stat, df = chi2(counts, expect, N)
    assert stat < chi2_crit(df)


def test_sampling_is_reproducible_and_identical_draft_accepts_everything():
    tlm, d, lm = fake_pair(k=4, dlm="same")
    params = SamplingParams(1.0, top_k=10, seed=5)
    dec = SpecDecoder(tlm, d)
    a = dec.generate(PROMPT, max_new_tokens=25, sampling=params)
    b = dec.generate(PROMPT, max_new_tokens=25, sampling=params)
    assert a.generated_ids == b.generated_ids
    assert a.metrics["acceptance_rate"] == 1.0
