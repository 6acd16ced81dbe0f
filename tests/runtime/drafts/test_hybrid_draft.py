"""The hybrid draft source (runtime/drafts/hybrid.py): prompt lookup when it matches, a draft model
or feature draft otherwise, on FAKE backends (runtime/testing.py). Greedy output equals target-only
in batches and continuous batching, the model's cache catches up after the lookup's rounds (an
exact feature draft stays exact), sampling is exact (chi-square), and bad compositions are refused."""
from __future__ import annotations

import numpy as np
import pytest
from runtime_helpers import (PROMPT, ProposeDraft, chi2, chi2_crit, one_line_error, run, same_as_target, sample_counts,
                             sequence_dist)

from specdec_compile.errors import SpecdecError
from specdec_compile.runtime import (FeatureDraft, HybridDraft, NgramDraft, SamplingParams, SpecDecoder,
                                     TargetOnlyDecoder)
from specdec_compile.runtime.drafts.dlm import DlmDraft
from specdec_compile.runtime.testing import fake_feature_pair, fake_pair

PROMPTS = [PROMPT, [5, 6, 7, 5, 6, 7, 5, 6], [1] * 12, [2, 3], [9, 9, 9, 9, 9], [4, 8, 15, 16, 4, 8, 15, 7]]


class _Recorded:
    """A source wrapper that records (q, drafts) of every round its drafter drafted."""

    def __init__(self, src, log, rollbacks=None):
        self.src, self.log, self.rollbacks = src, log, rollbacks if rollbacks is not None else []

    def bind(self, tlm):
        self.src.bind(tlm)

    def backends(self):
        return self.src.backends()

    def drafter(self, ctx):
        inner, log, rollbacks = self.src.drafter(ctx), self.log, self.rollbacks

        class D:
            def __getattr__(self, a):
                return getattr(inner, a)

            def rollback(self, valid):
                rollbacks.append(valid)
                inner.rollback(valid)

            def draft(self, seq, q, n):
                out = inner.draft(seq, q, n)
                d = (yield from out) if hasattr(out, "send") else out
                log.append((q, list(d)))
                return d
        return D()


def _every_other_round():
    state = {"n": 0}

    def propose(seq, q, n):
        state["n"] += 1
        return [0] * n if state["n"] % 2 else []
    return propose


def _every_other():
    """A lookup stand-in: wrong drafts (token 0 x n) every other round, none otherwise."""
    return ProposeDraft(_every_other_round)


@pytest.mark.parametrize("batch_size", [1, 3])
def test_greedy_equals_target_only_with_a_feature_draft_and_both_sources_draft(batch_size):
    tlm, d, _ = fake_feature_pair(k=3, noise=1.0, batch_size=batch_size)
    log_l, log_m = [], []
    src = HybridDraft(_Recorded(NgramDraft(3, 1), log_l), _Recorded(FeatureDraft(d), log_m))
    same_as_target(SpecDecoder(tlm, draft=src), TargetOnlyDecoder(tlm), PROMPTS)          # 6 prompts through the rows
    assert any(d_ for _, d_ in log_l) and log_m, "both the lookup and the model drafted"
    # the string spelling builds the same composition
    spec = SpecDecoder(tlm, d, draft="hybrid")
    assert isinstance(spec.source, HybridDraft) and isinstance(spec.source.model, FeatureDraft)
    assert spec.source.lookup.min_n == 2 and spec.backends() == [tlm, d]


@pytest.mark.parametrize("model", ["feature", "dlm"])
def test_the_models_cache_catches_up_after_lookup_rounds(model):
    """An exact draft (a feature draft, or a DLM that is the target) behind a lookup that drafts
    (wrongly) every other round: every model round's drafts are still the target's tokens, so its
    cache (and features) stayed in step through the lookup's rounds and their rollbacks."""
    if model == "feature":
        tlm, d, _ = fake_feature_pair(k=3)
        inner = FeatureDraft(d)
    else:
        tlm, d, _ = fake_pair(k=3, dlm="same")
        inner = DlmDraft(d)
    log, rollbacks = [], []
    src = HybridDraft(_every_other(), _Recorded(inner, log, rollbacks))
    r = SpecDecoder(tlm, draft=src).generate(PROMPT, max_new_tokens=40)
    ref = TargetOnlyDecoder(tlm).generate(PROMPT, max_new_tokens=40)
    assert r.generated_ids == ref.generated_ids
    full = list(PROMPT) + ref.generated_ids
    assert len(log) >= 4
    for q, drafts in log:
        assert drafts == full[q:q + len(drafts)], q
    assert 0.0 < r.metrics["acceptance_rate"] < 1.0          # the lookup's rounds were all rejected
    assert rollbacks, "the model sees the rollbacks of the lookup's rejected rounds"


def test_greedy_with_a_draft_model_and_k0_fallback():
    tlm, d, _ = fake_pair(k=3, k_list=[0, 1, 2, 3], batch_size=2)
    src = HybridDraft(NgramDraft(3, 2), DlmDraft(d))
    same_as_target(SpecDecoder(tlm, draft=src), TargetOnlyDecoder(tlm), PROMPTS)
    same_as_target(SpecDecoder(tlm, draft=src, k=0), TargetOnlyDecoder(tlm), PROMPTS[:2])


class _Kept(HybridDraft):
    """Keeps the drafters it made, to read their counts."""

    def drafter(self, ctx):
        d = super().drafter(ctx)
        self.made = getattr(self, "made", []) + [d]
        return d


def test_the_model_is_asked_only_while_it_pays():
    """A hopeless DLM (another model) behind the lookup: after its acceptance estimate falls below
    min_alpha the rounds the lookup cannot draft go without drafts, with a probe every 8th; an
    exact DLM stays asked every time. Outputs are the target's either way."""
    prompts = [PROMPT, [5, 6, 7, 5, 6, 7, 5, 6]]
    runs = {}
    for kind, min_alpha in (("independent", 0.15), ("independent", 0.0), ("same", 0.15)):
        log = []
        tlm, d, _ = fake_pair(k=3, dlm=kind, call_log=log)
        src = _Kept(NgramDraft(3, 2), DlmDraft(d), min_alpha=min_alpha)
        same_as_target(SpecDecoder(tlm, draft=src), TargetOnlyDecoder(tlm), prompts, n=40)
        runs[kind, min_alpha] = (sum(1 for x in log if x[0] == "dlm"), src.made)
    gated, ungated, exact = runs["independent", 0.15], runs["independent", 0.0], runs["same", 0.15]
    assert gated[0] < ungated[0] / 2, (gated[0], ungated[0])          # far fewer DLM calls
    for dr in gated[1]:
        assert dr.rounds["none"] > 0 and dr.model_alpha() < 0.15
        assert dr.rounds["model"] >= 2                                   # the first rounds, then probes
    for dr in ungated[1]:
        assert dr.rounds["none"] == 0
    for dr in exact[1]:
        assert dr.rounds["none"] == 0 and dr.model_alpha() > 0.8
    # with a weak lookup (single-token matches), the gated rounds draft from it instead
    log = []
    tlm, d, _ = fake_pair(k=3, dlm="independent", call_log=log)
    src = _Kept(NgramDraft(3, 2), DlmDraft(d), weak=NgramDraft(3, 1))
    same_as_target(SpecDecoder(tlm, draft=src), TargetOnlyDecoder(tlm), prompts, n=40)
    assert sum(dr.rounds["weak"] for dr in src.made) > 0
    assert sum(1 for x in log if x[0] == "dlm") < ungated[0] / 2
    spec = SpecDecoder(tlm, d, draft="hybrid")               # the runtime's hybrid has one
    assert spec.source.weak.min_n == 1 and spec.source.lookup.min_n == 2


def test_sampling_draws_from_the_target_distribution_through_the_hybrid_loop():
    V, N, n = 6, 3000, 3
    params = SamplingParams(1.0)
    tlm, d, lm = fake_feature_pair(k=2, vocab=V, ctx_len=32, prefill_len=4, noise=1.5, scale=1.0)
    prompt = [1, 2, 1, 2, 3]
    expect = sequence_dist(lm, prompt, n, params)
    src = HybridDraft(NgramDraft(3, 1), FeatureDraft(d))
    counts, acc = sample_counts(SpecDecoder(tlm, draft=src), prompt, n, params, np.random.default_rng(7), N)
    stat, df = chi2(counts, expect, N)
    assert stat < chi2_crit(df), (stat, df)
    assert 0.05 < np.mean(acc) < 0.95


def test_bad_compositions_are_refused():
    tlm, d, _ = fake_feature_pair(k=3)
    with pytest.raises(SpecdecError, match="lookup source .* calls models"):
        HybridDraft(FeatureDraft(d), NgramDraft())
    with pytest.raises(SpecdecError, match="has no model"):
        HybridDraft(NgramDraft(), NgramDraft())
    with pytest.raises(SpecdecError, match="min_drafts"):
        HybridDraft(NgramDraft(), FeatureDraft(d), min_drafts=0)
    with pytest.raises(SpecdecError, match="calls models"):
        HybridDraft(NgramDraft(), FeatureDraft(d), weak=FeatureDraft(d))
    with pytest.raises(SpecdecError, match="min_alpha"):
        HybridDraft(NgramDraft(), FeatureDraft(d), min_alpha=1.0)
    with pytest.raises(SpecdecError, match="is not a draft source"):
        HybridDraft(object(), FeatureDraft(d))
    with pytest.raises(SpecdecError, match="needs a DLM"):
        SpecDecoder(tlm, draft="hybrid")


def test_cli_hybrid_needs_a_dlm(tmp_path, capsys):
    code, _, err = run(["--tlm", str(tmp_path), "--draft", "hybrid", "--prompt-ids", "1,2"], capsys)
    one_line_error(code, err, "--draft hybrid needs --dlm")
    code, _, err = run(["--tlm", str(tmp_path), "--dlm", str(tmp_path), "--ngram-max", "2", "--prompt-ids", "1"],
                       capsys)
    one_line_error(code, err, "--ngram-max is for --draft ngram or hybrid")


def test_the_policy_prices_lookup_drafts_at_no_model_call():
    """A draft model as dear as the target: at a middling acceptance the policy drafts nothing when
    every draft calls it, and drafts when a hybrid's lookup makes most of them (model_share)."""
    from specdec_compile.runtime import WidthPolicy
    from specdec_compile.runtime.testing import known_costs
    pol = WidthPolicy(costs=known_costs(dlm=(5, 1.0), tlm={w: (5, t) for w, t in ((1, 1.0), (2, 1.05), (3, 1.1), (4, 1.15))}))
    pol.bind(3, [0, 1, 2, 3], [1, 2, 3, 4])
    assert pol.choose_drafts(0.5) == 0
    assert pol.choose_drafts(0.5, share=0.1) > 0
    # the hybrid's share: the model's rounds over drafting rounds, decayed
    tlm, d, _ = fake_feature_pair(k=3)
    src = _Kept(_every_other(), FeatureDraft(d))
    SpecDecoder(tlm, draft=src).generate(PROMPT, max_new_tokens=30)
    dr = src.made[0]
    assert dr.rounds["lookup"] > 0 and dr.rounds["model"] > 0 and 0.3 < dr.model_share() < 0.7
