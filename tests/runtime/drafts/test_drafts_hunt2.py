"""Defects found by a hunt in the draft sources (runtime/drafts/) and sampling.py, each with the
case that showed it. FAKE backends (specdec_compile.runtime.testing): exact and fast."""
from __future__ import annotations

import re

import numpy as np
import pytest
from runtime_helpers import ProposeDraft, reference_greedy
from test_ngram_draft import PROMPT, CopyLM, tlm_of

from specdec_compile.errors import SpecdecError
from specdec_compile.runtime import (DlmDraft, HybridDraft, NgramDraft, SamplingParams, SpecDecoder, SuffixDraft,
                                     TargetOnlyDecoder)
from specdec_compile.runtime.drafts import DraftContext, make_draft_source
from specdec_compile.runtime.drafts.ngram import NgramIndex
from specdec_compile.runtime.testing import FakeBackend, FakeLM, fake_artifact, fake_pair


def _ctx(vocab=None):
    return DraftContext(SamplingParams(), None, vocab, runner=None)


def _cache_is_consistent(src: SuffixDraft) -> None:
    """The shared cache counts exactly the tokens of its entries, and the trie exactly its live nodes."""
    c = src.cache

    def live(node):
        return sum(1 + live(k) for k in (node.kids or {}).values())
    assert c.tokens == sum(len(e.tokens) for e in c.entries.values())
    assert c.trie.nodes == live(c.trie.root)


def test_a_huge_spec_factor_drafts_instead_of_overflowing():
    """spec_factor near float's maximum times a match of 2 tokens is inf: int(inf) raised
    OverflowError in the middle of a generation."""
    m = CopyLM(23)
    tlm = tlm_of(m, k=4)
    want = reference_greedy(m, PROMPT, 30, tlm.ctx_len)
    res = SpecDecoder(tlm, draft=SuffixDraft(spec_factor=1e308)).generate(PROMPT, max_new_tokens=30)
    assert res.generated_ids == want
    assert res.metrics["mean_tokens_per_tlm_call"] > 1.5


def test_generations_that_cache_nothing_leave_no_entry_behind():
    """Every generation opened an entry in the shared cache when it started; one that adds no token
    (max_new_tokens=0, or --k 0: no draft is ever asked for) left it there for good, so the entry
    table grew with every such request whatever the cap."""
    tlm, _, _ = fake_pair(k_list=[0, 1, 2, 3])
    src = SuffixDraft(cache_tokens=64)
    for dec, n in ((SpecDecoder(tlm, draft=src), 0), (SpecDecoder(tlm, draft=src, k=0), 5)):
        for _ in range(25):
            dec.generate([1, 2, 3, 4, 5], max_new_tokens=n)
    assert len(src.cache.entries) == 0 and src.cache.tokens == 0
    SpecDecoder(tlm, draft=src).generate([1, 2, 3, 4, 5], max_new_tokens=5)
    assert len(src.cache.entries) == 1
    _cache_is_consistent(src)


def test_clear_while_a_generation_is_live_keeps_the_cache_true():
    """A drafter's entry from before ``clear()`` shared its id with a new cache's entry: its tokens
    went into the new cache's count but into no entry there, so the count never came down again."""
    src = SuffixDraft(max_depth=4, cache_tokens=40)
    a = src.drafter(_ctx())
    a.first([1, 2, 3, 4])
    src.clear()
    b = src.drafter(_ctx())
    b.first([7, 8, 9])
    a.draft([1, 2, 3, 4, 5, 6, 1, 2], 8, 3)          # a goes on after the clear
    b.draft([7, 8, 9, 5, 7, 8], 6, 3)
    _cache_is_consistent(src)
    for i in range(60):                               # the cap still holds, and evicts cleanly
        b.draft([7, 8, 9, 5, 7, 8] + list(range(i + 1)), 7 + i, 2)
        a.draft([1, 2, 3, 4, 5, 6, 1, 2] + list(range(i + 1)), 9 + i, 2)
    assert src.cache.tokens <= 40
    _cache_is_consistent(src)


def test_clear_from_a_callback_mid_batch_keeps_output_and_cache_true():
    lm = FakeLM(23)
    tlm = FakeBackend(fake_artifact("tlm", k=4, batch_size=2), lm)
    src = SuffixDraft(max_depth=4, cache_tokens=30)
    dec = SpecDecoder(tlm, draft=src)
    prompts = [PROMPT, PROMPT[:5], PROMPT[3:], [4, 4, 4], PROMPT[::-1]]
    seen = []

    def cb(i, ids, srcs):
        seen.append(i)
        if len(seen) == 3:
            src.clear()
    res = dec.generate_many(prompts, max_new_tokens=30, on_tokens=cb)
    for p, r in zip(prompts, res):
        assert r.generated_ids == reference_greedy(lm, p, 30, tlm.ctx_len)
    _cache_is_consistent(src)
    assert src.cache.tokens <= 30


def test_drafts_stop_at_an_id_the_target_lacks():
    """A SuffixDraft shared with a decoder of a larger vocabulary holds ids this target lacks; they
    were filtered out of the path and the tokens after them moved up a position (drafted for the
    wrong place). The drafts now end before the first such id."""
    src = SuffixDraft()
    wide = src.drafter(_ctx(40))
    wide.first([1, 2, 3, 4])
    wide.finish([1, 2, 3, 4, 5, 30, 7, 8])
    narrow = src.drafter(_ctx(23))
    narrow.first([9, 9, 1, 2, 3, 4])
    assert narrow.draft([9, 9, 1, 2, 3, 4], 6, 4) == [5]
    assert src.drafter(_ctx(40)).draft([9, 1, 2, 3, 4], 5, 4) == [5, 30, 7, 8]
    ix = NgramIndex(3, 1, 23)                          # the n-gram index cuts the same way
    assert ix.draft([1, 2, 40, 3, 1, 2], 6, 3) == []
    assert ix.draft([1, 2, 5, 40, 3, 9, 1, 2], 8, 3) == [5]


def test_the_hybrid_refuses_classes_and_non_sources_in_one_line():
    _, d, _ = fake_pair()
    model = DlmDraft(d)
    for kw, msg in (({"lookup": NgramDraft, "model": model}, "lookup NgramDraft is a class"),
                    ({"lookup": NgramDraft(), "model": DlmDraft}, "model DlmDraft is a class"),
                    ({"lookup": NgramDraft(), "model": model, "weak": NgramDraft}, "weak lookup NgramDraft is a class"),
                    ({"lookup": NgramDraft(), "model": model, "weak": 0}, "weak lookup int is not a draft source")):
        with pytest.raises(SpecdecError, match=msg):
            HybridDraft(**kw)


@pytest.mark.parametrize("bad", ["3", [3]])
def test_hybrid_ngram_max_is_checked_before_use(bad):
    """draft='hybrid' compared ngram_max with 2 before checking it: a TypeError."""
    _, d, _ = fake_pair()
    with pytest.raises(SpecdecError, match="n-gram size must be a whole number"):
        make_draft_source("hybrid", d, ngram_max=bad)


@pytest.mark.parametrize("make, msg", [
    (lambda: SuffixDraft(min_prob=10 ** 400), "suffix min_prob must be a float-sized number"),
    (lambda: SuffixDraft(spec_factor=10 ** 400), "suffix spec_factor must be a float-sized number"),
    (lambda: HybridDraft(NgramDraft(), DlmDraft(fake_pair()[1]), min_alpha=-10 ** 400), "min_alpha must be a float"),
    (lambda: NgramDraft(10 ** 5000), "n-gram size must be a whole number of magnitude below 2\\*\\*63"),
    (lambda: SuffixDraft(max_depth=-10 ** 5000), "suffix depth must be a whole number of magnitude"),
    (lambda: SuffixDraft(cache_tokens=1e300), "suffix cache size must be a whole number of magnitude"),
    (lambda: SamplingParams(temperature=10 ** 400), "temperature must be a finite number >= 0"),
    (lambda: SamplingParams(1.0, seed=10 ** 5000), "seed must be an integer in .* \\(got an integer of"),
    (lambda: SamplingParams(1.0, top_p=10 ** 5000), "top-p must be in"),
])
def test_numbers_past_floats_range_are_refused_in_one_line(make, msg):
    """np.isfinite cannot take an int past float's range (TypeError), and Python will not print
    one of over 4300 digits (ValueError) for the error message."""
    with pytest.raises(SpecdecError, match=msg):
        make()


def _fixed(values):
    """A draft source of one's own that proposes the given values every round."""
    return ProposeDraft(lambda: lambda seq, q, n: list(values)[:n])


@pytest.mark.parametrize("sampling", [SamplingParams(), SamplingParams(0.8, seed=3)])
def test_a_draft_that_is_no_integer_is_refused_not_rounded(sampling):
    """verify compared int(draft) with the target's token: a source proposing 11.5 where the target
    says 11 had it accepted, and 11.5 came out in the generated ids, exit 0."""
    m = CopyLM(23)
    tlm = tlm_of(m, k=4)
    want = TargetOnlyDecoder(tlm).generate(PROMPT, max_new_tokens=12, sampling=sampling).generated_ids
    assert SpecDecoder(tlm, draft=_fixed([np.int64(want[1])])).generate(
        PROMPT, max_new_tokens=12, sampling=sampling).generated_ids == want        # NumPy ints are ids
    for bad in (want[1] + 0.5, float(want[1]), True):
        with pytest.raises(SpecdecError, match="drafts are token ids"):
            SpecDecoder(tlm, draft=_fixed([bad] * 3)).generate(PROMPT, max_new_tokens=12, sampling=sampling)


def _first_too(values):
    """_fixed whose first draft (from the prefill's logits) is the first of ``values`` too."""
    return ProposeDraft(lambda: lambda seq, q, n: list(values)[:n], first=lambda prompt: values[0])


@pytest.mark.parametrize("source", [_fixed, _first_too])
def test_drafts_outside_the_vocabulary_are_refused_before_the_target_call(source):
    """The loop sent a custom source's drafts to the target unchecked: an id past the vocabulary or a
    negative one went into the call, 10**20 was an OverflowError and "a" a ValueError (tracebacks), and
    NumPy-int drafts came out as NumPy ints in generated_ids."""
    m = CopyLM(23)
    tlm = tlm_of(m, k=4)
    v = tlm.vocab_size
    want = TargetOnlyDecoder(tlm).generate(PROMPT, max_new_tokens=12).generated_ids
    got = SpecDecoder(tlm, draft=source([np.int64(t) for t in want])).generate(PROMPT, max_new_tokens=12)
    assert got.generated_ids == want and all(type(t) is int for t in got.generated_ids)
    for bad, words in ((v, f"the token id {v}, outside the target's vocabulary [0, {v})"), (-1, "token id -1"),
                       (10 ** 20, "token id of 67 bits"), ("a", "drafts are token ids")):
        with pytest.raises(SpecdecError, match=re.escape(words)):
            SpecDecoder(tlm, draft=source([bad] * 3)).generate(PROMPT, max_new_tokens=12)
