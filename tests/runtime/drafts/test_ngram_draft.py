"""n-gram (prompt lookup) drafts: no draft model, the target's output unchanged.

FAKE backends (specdec_compile.runtime.testing) for the loop; the CLI test runs
a real tiny export on ONNX Runtime.
"""
from __future__ import annotations

import numpy as np
import pytest
from runtime_helpers import reference_greedy

from specdec_compile.errors import SpecdecError
from specdec_compile.runtime import NgramDraft, SamplingParams, SpecDecoder, TargetOnlyDecoder
from specdec_compile.runtime.drafts.ngram import NgramIndex
from specdec_compile.runtime.sampling import Noise, SamplingParams, verify
from specdec_compile.runtime.testing import FakeBackend, FakeLM, fake_artifact

PROMPT = [3, 4, 5, 6, 7, 8, 9, 10, 3, 4, 5, 11, 12, 3, 4]


class CopyLM(FakeLM):
    """Repeats its history with a period (greedy), else a FakeLM: n-gram drafts hit."""

    def __init__(self, vocab, period=5, **kw):
        super().__init__(vocab, **kw)
        self.period = period

    def __call__(self, history):
        x = super().__call__(history)
        if len(history) >= self.period:
            x = x.copy()
            x[int(history[-self.period])] += 20.0
        return x


def tlm_of(lm, **kw):
    kw = {"k": 4, "vocab": 23, **kw}
    return FakeBackend(fake_artifact("tlm", **kw), lm)


def test_index_finds_the_longest_latest_match():
    ix = NgramIndex(3, 1, None)
    seq = [1, 2, 3, 9, 9, 2, 3, 7, 8, 1, 2, 3]
    # "1 2 3" occurred at 0 -> followed by 9 9 2; the 2-gram "2 3" occurred later (at 5)
    assert ix.propose(seq, 3) == [9, 9, 2]
    assert ix.propose(seq + [4], 2) == []          # "3 4", "4": never seen
    fresh = NgramIndex(3, 1, None)   # an index follows one growing sequence
    assert fresh.propose([1, 2, 3, 9, 9, 2, 3, 7, 8, 5, 2, 3], 2) == [7, 8]   # latest "2 3" wins
    assert NgramIndex(1, 1, None).propose([5, 6, 5], 4) == [6, 5]
    with pytest.raises(SpecdecError):
        NgramDraft(0)


@pytest.mark.parametrize("k", [1, 3, 7])
@pytest.mark.parametrize("lm", ["copy", "random"])
def test_greedy_equals_target_only(k, lm):
    m = CopyLM(23) if lm == "copy" else FakeLM(23)
    tlm = tlm_of(m, k=k)
    for dec in (SpecDecoder(tlm, None, draft="ngram", ngram_max=3), SpecDecoder(tlm, NgramDraft(2))):
        res = dec.generate(PROMPT, max_new_tokens=40)
        ref = reference_greedy(m, PROMPT, 40, 64)
        assert res.generated_ids == ref
        assert TargetOnlyDecoder(tlm).generate(PROMPT, max_new_tokens=40).generated_ids == ref
        if lm == "copy" and k > 1:
            assert res.metrics["accepted_tokens"] >= 20
            assert res.metrics["mean_tokens_per_tlm_call"] > 1.5


def test_ngram_needs_no_dlm_and_refuses_both():
    tlm = tlm_of(FakeLM(23))
    with pytest.raises(SpecdecError, match="DLM backend or draft='ngram'"):
        SpecDecoder(tlm, None)
    d = FakeBackend(fake_artifact("dlm", vocab=23), FakeLM(23))
    with pytest.raises(SpecdecError, match="not both"):
        SpecDecoder(tlm, d, draft="ngram")
    with pytest.raises(SpecdecError, match="unknown draft source"):
        SpecDecoder(tlm, None, draft="bigram")


def test_one_hot_draft_keeps_the_target_distribution():
    rng = np.random.default_rng(0)
    p = rng.dirichlet(np.ones(6))
    q = np.zeros(6)
    q[2] = 1.0
    n = 40000
    noise, sp = Noise(3), SamplingParams(1.0)
    logits = np.log(p)
    out = [verify([2], logits[None].repeat(2, 0), pos, sp, noise) for pos in range(n)]
    toks = [2 if a == 1 else t for a, t in out]          # accepted: the draft; else the target's token
    counts = np.bincount(toks, minlength=6)
    assert np.abs(counts / n - p).max() < 0.012
    assert abs(np.mean([a for a, _ in out]) - p[2]) < 0.012   # accepted exactly when the target drew it


def test_sampling_with_ngram_drafts_matches_target_only_in_distribution():
    m = CopyLM(11, period=3, scale=0.7)
    tlm = tlm_of(m, vocab=11, k=3)
    sp = SamplingParams(temperature=1.0)
    prompt = [1, 2, 3, 1, 2, 3, 1]
    spec, base = SpecDecoder(tlm, None, draft="ngram"), TargetOnlyDecoder(tlm)
    n = 300
    a = [tuple(spec.generate(prompt, max_new_tokens=3, sampling=sp, rng=np.random.default_rng(i)).generated_ids)
         for i in range(n)]
    b = [tuple(base.generate(prompt, max_new_tokens=3, sampling=sp, rng=np.random.default_rng(10 ** 6 + i))
               .generated_ids) for i in range(n)]
    # the first two tokens' marginals agree (the draft distribution is one-hot)
    for pos in (0, 1):
        fa = np.bincount([x[pos] for x in a], minlength=11) / n
        fb = np.bincount([x[pos] for x in b], minlength=11) / n
        assert np.abs(fa - fb).max() < 0.12
