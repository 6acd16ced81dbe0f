"""Feature drafts (EAGLE-style) in the loop, on FAKE backends (runtime/testing.py).

The fake TLM's feature at position p is the history it attended to; the fake
feature draft rebuilds the history from the feature it is given plus its token.
Fed the contract's pairing (row p: x_p and the target's f_{p-1}; the draft's own
feature where the target's is not known yet) it is exactly the target: greedy
acceptance 1.0. Any other pairing rebuilds another history: low acceptance.
"""
from __future__ import annotations

import numpy as np
import pytest
from runtime_helpers import PROMPT, chi2, chi2_crit, sample_counts, same_as_target, sequence_dist

from specdec_compile.errors import SpecdecError
from specdec_compile.runtime import (DlmDraft, FeatureDraft, SamplingParams, SpecDecoder, TargetOnlyDecoder,
                                     WidthPolicy)
from specdec_compile.runtime.drafts.feature import FeatureDrafter
from specdec_compile.runtime.testing import fake_feature_pair, fake_pair

PROMPTS = [PROMPT, [5, 6, 7], [1] * 12, [2, 3], [9, 9, 9, 9, 9], [4, 8, 15, 16, 22, 19, 7]]


@pytest.mark.parametrize("k", [1, 2, 4])
def test_greedy_equals_target_only_and_the_exact_draft_accepts_everything(k):
    log = []
    tlm, d, _ = fake_feature_pair(k=k, call_log=log)
    spec = SpecDecoder(tlm, d)
    assert isinstance(spec.source, FeatureDraft) and spec.dlm is d
    for p in PROMPTS[:3]:
        r = spec.generate(p, max_new_tokens=30)
        assert r.generated_ids == TargetOnlyDecoder(tlm).generate(p, max_new_tokens=30).generated_ids
        assert r.metrics["acceptance_rate"] == 1.0
        assert r.metrics["mean_tokens_per_tlm_call"] > k
    # the draft's calls: prompt chunks of PL, then per round one ingest (a+1 = k+1 rows) and k-1 drafts
    widths = {s for role, s, *_ in log if role == "dlm"}
    assert widths <= {8, k + 1, 1}


def test_a_noisy_draft_keeps_greedy_output_and_rejects_some():
    tlm, d, _ = fake_feature_pair(k=3, noise=2.0)
    r = same_as_target(SpecDecoder(tlm, d), TargetOnlyDecoder(tlm), PROMPTS[:3])
    assert all(0.0 < x.metrics["acceptance_rate"] < 1.0 for x in r)


class _Shifted(FeatureDrafter):
    """A WRONG pairing, for the control: row p gets f_p (its own position's feature)."""

    def _inputs(self, p0, q):
        rows = super()._inputs(p0, q)
        name = self.src.input_name
        f = np.zeros_like(rows[name])
        n = min(q, self.known) - p0
        if n > 0:
            f[:n] = self.feats[p0:p0 + n]
        return {name: f}


class _NoFeedback(FeatureDrafter):
    """A WRONG loop, for the control: drafts after the first get zeros, not the draft's own feature."""

    def __init__(self, source, ctx):
        super().__init__(source, ctx)
        real = self.r.call

        def call(tokens, start, width, prefill=False, inputs=None):
            if width == 1 and inputs is not None:
                inputs = {k: np.zeros_like(v) for k, v in inputs.items()}
            return real(tokens, start, width, prefill, inputs)
        self.r.call = call


@pytest.mark.parametrize("wrong, most", [(_Shifted, 0.3), (_NoFeedback, 0.7)])
def test_the_draft_gets_the_targets_features_paired_as_the_contract_says(wrong, most):
    tlm, d, _ = fake_feature_pair(k=4)
    good = SpecDecoder(tlm, d).generate(PROMPT, max_new_tokens=40)
    assert good.metrics["acceptance_rate"] == 1.0

    class Wrong(FeatureDraft):
        def drafter(self, ctx):
            return wrong(self, ctx)
    bad = SpecDecoder(tlm, draft=Wrong(d)).generate(PROMPT, max_new_tokens=40)
    assert bad.generated_ids == good.generated_ids           # the output is the target's all the same
    assert bad.metrics["acceptance_rate"] < most


@pytest.mark.parametrize("k", [1, 3])
def test_batches_and_continuous_batching(k):
    tlm, d, _ = fake_feature_pair(k=k, batch_size=3)
    r = same_as_target(SpecDecoder(tlm, d), TargetOnlyDecoder(tlm), PROMPTS)     # 6 prompts through 3 rows
    assert all(x.metrics["acceptance_rate"] == 1.0 for x in r)


def test_prefill_longer_than_a_chunk_and_context_limit():
    tlm, d, _ = fake_feature_pair(k=4, ctx_len=40, prefill_len=4)
    prompts = [list(range(1, 20)), [3] * 33, [5] * 38]
    r = same_as_target(SpecDecoder(tlm, d), TargetOnlyDecoder(tlm), prompts, n=40)
    assert [len(x.generated_ids) for x in r] == [21, 7, 2]


class _Cycle(WidthPolicy):
    """Rounds of 0, 0, 3, 0, 2, 1, ... drafts: catch-ups after rounds without drafts."""

    def choose(self, row):
        self.n = getattr(self, "n", -1) + 1
        return (0, 0, 3, 0, 2, 1)[self.n % 6]


def test_k0_fallback_and_catch_up_after_rounds_without_drafts():
    log = []
    tlm, d, _ = fake_feature_pair(k=3, k_list=[0, 1, 2, 3], call_log=log)
    base = TargetOnlyDecoder(tlm)
    ref = base.generate(PROMPT, max_new_tokens=30).generated_ids
    r0 = SpecDecoder(tlm, d, k=0).generate(PROMPT, max_new_tokens=30)
    assert r0.generated_ids == ref and not [x for x in log if x[0] == "dlm"]      # K=0: the draft never runs
    rc = SpecDecoder(tlm, d, policy=_Cycle()).generate(PROMPT, max_new_tokens=30)
    assert rc.generated_ids == ref and rc.metrics["acceptance_rate"] == 1.0
    tlm, d, _ = fake_feature_pair(k=3, k_list=[0, 1, 3], batch_size=3)
    same_as_target(SpecDecoder(tlm, d, policy=_Cycle()), TargetOnlyDecoder(tlm), PROMPTS)


@pytest.mark.parametrize("dlm_vocab", [19, 29])
def test_padded_vocabularies(dlm_vocab):
    tlm, d, _ = fake_feature_pair(k=3, dlm_vocab=dlm_vocab, batch_size=2)
    spec = SpecDecoder(tlm, d)
    assert spec.source.vocab is not None
    r = same_as_target(spec, TargetOnlyDecoder(tlm), PROMPTS[:4])
    acc = [x.metrics["acceptance_rate"] for x in r]
    # a wider draft reads every id: exact; a narrower one reads the ids it lacks as a fill id (and so
    # rebuilds another history from then on) and never proposes them
    assert all(a == 1.0 for a in acc) if dlm_vocab > 23 else 0.0 < np.mean(acc) < 1.0


def test_sampling_seeded_equals_target_only_one_row_and_batched():
    tlm, d, _ = fake_feature_pair(k=3, noise=1.0, batch_size=3)
    params = SamplingParams(0.9, top_k=10, seed=11)
    s = same_as_target(SpecDecoder(tlm, d), TargetOnlyDecoder(tlm), PROMPTS, sampling=params)
    assert 0.0 < np.mean([x.metrics["acceptance_rate"] for x in s]) < 1.0
    one = SpecDecoder(tlm, d).generate(PROMPTS[2], max_new_tokens=25, sampling=params, prompt_index=2)
    assert one.generated_ids == s[2].generated_ids


def test_sampling_draws_from_the_target_distribution_through_the_feature_loop():
    V, N, n = 6, 3000, 3
    params = SamplingParams(1.0)
    tlm, d, lm = fake_feature_pair(k=2, vocab=V, ctx_len=32, prefill_len=4, noise=1.5, scale=1.0)
    prompt = [1, 2, 3]
    expect = sequence_dist(lm, prompt, n, params)
    counts, acc = sample_counts(SpecDecoder(tlm, d), prompt, n, params, np.random.default_rng(99), N)
    stat, df = chi2(counts, expect, N)
    assert stat < chi2_crit(df), (stat, df)
    assert 0.1 < np.mean(acc) < 0.95     # accepts and rejects both happened


@pytest.mark.parametrize("kw, msg", [
    (dict(draft_layers=(0,)), "the target was compiled with --hidden-states -1 but the draft reads layers 0"),
    (dict(width=32), "the target's hidden states are 64 wide but the draft reads 32"),
    # widths equal, yet two layers: its own features would stand in for a concatenation of two
    (dict(layers=(0, -1)), r"the draft reads 2 target layers \(0,-1\)"),
])
def test_mismatched_pairs_are_refused(kw, msg):
    tlm, d, _ = fake_feature_pair(**kw)
    with pytest.raises(SpecdecError, match=msg):
        SpecDecoder(tlm, d)


def test_target_without_hidden_states_and_draft_misuse_are_refused():
    plain, _, _ = fake_pair()
    tlm, d, _ = fake_feature_pair()
    with pytest.raises(SpecdecError, match="exposes no hidden states: compile it with --hidden-states -1"):
        SpecDecoder(plain, d)
    with pytest.raises(SpecdecError, match="run it as FeatureDraft"):
        SpecDecoder(tlm, draft=DlmDraft(d))
    _, ordinary, _ = fake_pair()
    with pytest.raises(SpecdecError, match="not a feature draft"):
        SpecDecoder(tlm, draft=FeatureDraft(ordinary))
    ordinary_with_hidden_target = SpecDecoder(tlm, ordinary)   # an ordinary DLM ignores the hidden states
    ref = TargetOnlyDecoder(tlm).generate(PROMPT, max_new_tokens=10).generated_ids
    assert ordinary_with_hidden_target.generate(PROMPT, max_new_tokens=10).generated_ids == ref


def test_backend_extra_tensors():
    tlm, d, _ = fake_feature_pair()
    ids, pos = np.array([[3, 4, 5, 6, 7, 8, 9, 10]]), np.arange(8)[None]
    out = tlm.run_outputs(ids, pos)
    assert set(out) == {"logits", "hidden_states"} and out["hidden_states"].shape == (1, 8, 64)
    assert np.array_equal(tlm.run(ids, pos), out["logits"])
    one = np.array([[5]]), np.array([[0]])
    assert d.run_outputs(*one)["draft_hidden_states"].shape == (1, 1, 64)      # features default to zeros
    with pytest.raises(SpecdecError, match="no input 'nope'"):
        d.run(*one, inputs={"nope": np.zeros((1, 1, 64))})
    with pytest.raises(SpecdecError, match=r"hidden_states is \[1, 1, 3\], expected \[1, 1, 64\]"):
        d.run(*one, inputs={"hidden_states": np.zeros((1, 1, 3))})
