"""Suffix drafts (runtime/drafts/suffix.py): no draft model, the target's output unchanged;
a global trie over earlier requests' outputs with a memory cap.

FAKE backends (specdec_compile.runtime.testing) for the loop; the CLI tests run a
real tiny export on ONNX Runtime.
"""
from __future__ import annotations

import json

import numpy as np
import pytest
from runtime_helpers import (chi2, chi2_crit, one_line_error, reference_greedy, run, sample_counts,
                             sequence_dist)
from test_batch import PROMPTS
from test_run_serving import IDS, arts, ids_of  # noqa: F401  (the module's export fixture)
from test_ngram_draft import PROMPT, CopyLM, tlm_of

from specdec_compile.errors import SpecdecError
from specdec_compile.runtime import NgramDraft, SamplingParams, SpecDecoder, SuffixDraft, TargetOnlyDecoder
from specdec_compile.runtime.drafts.suffix import SuffixCache, SuffixTrie
from specdec_compile.runtime.testing import FakeBackend, FakeLM, fake_artifact


def _trie_of(seq, depth=6):
    t = SuffixTrie(depth)
    f = [t.root]
    for x in seq:
        f = t.extend(f, x)
    return t, f


def _live_nodes(node) -> int:
    return sum(1 + _live_nodes(k) for k in (node.kids or {}).values())


def test_trie_counts_matches_and_follows_the_most_frequent_path():
    t, _ = _trie_of([1, 2, 3, 1, 2, 4, 1, 2, 3, 9])
    n12 = t.find([1, 2])
    assert (n12.count, n12.cont, n12.best) == (3, 3, 3)            # "1 2" thrice: followed by 3, 4, 3
    assert t.longest_match([7, 3, 1, 2]) == (t.find([3, 1, 2]), 3)   # "3 1 2" (then 4) is the longest
    assert t.longest_match([7, 1, 2]) == (n12, 2)
    assert t.longest_match([5, 3, 1])[1] == 2                       # "3 1"
    toks, score = t.walk(n12, 2, [1, 2], 4, 0.0)
    assert toks == [3, 1, 2, 4] and score == pytest.approx(2 / 3 + 3 * (1 / 3))   # p: 2/3, then x 1/2, 1, 1
    assert t.walk(n12, 2, [1, 2], 4, 0.7)[0] == []                  # p(3 | 1 2) = 2/3 < 0.7: nothing
    assert t.walk(n12, 2, [1, 2], 1, 0.6)[0] == [3]
    assert t.longest_match([8]) == (None, 0)
    assert t.nodes == _live_nodes(t.root)
    t.remove([1, 2, 3, 1, 2, 4, 1, 2, 3, 9])
    assert t.nodes == 0 and not t.root.kids and t.root.cont == 0


def test_removal_keeps_the_best_child_right():
    t, _ = _trie_of([5, 1, 5, 1, 5, 2], depth=4)
    f = [t.root]
    for x in [5, 2, 5, 2, 5, 2]:                    # another request into the same trie
        f = t.extend(f, x)
    assert t.find([5]).best == 2                    # 2 follows 5 four times, 1 twice
    t.remove([5, 2, 5, 2, 5, 2])
    assert t.find([5]).best == 1 and t.nodes == _live_nodes(t.root)


@pytest.mark.parametrize("k", [1, 3, 7])
@pytest.mark.parametrize("lm", ["copy", "random"])
def test_greedy_equals_target_only(k, lm):
    m = CopyLM(23) if lm == "copy" else FakeLM(23)
    tlm = tlm_of(m, k=k)
    ref = reference_greedy(m, PROMPT, 40, 64)
    assert TargetOnlyDecoder(tlm).generate(PROMPT, max_new_tokens=40).generated_ids == ref
    for dec in (SpecDecoder(tlm, None, draft="suffix"), SpecDecoder(tlm, SuffixDraft(max_depth=4))):
        for _ in range(2):                          # the second time the global trie knows the answer
            res = dec.generate(PROMPT, max_new_tokens=40)
            assert res.generated_ids == ref
        if k > 1:
            assert res.metrics["mean_tokens_per_tlm_call"] > 1.5


@pytest.mark.parametrize("k", [1, 3, 7])
@pytest.mark.parametrize("B", [1, 3])
def test_rows_equal_target_only(k, B):
    lm = FakeLM(23)
    tlm = FakeBackend(fake_artifact("tlm", k=k, batch_size=B), lm)
    dec = SpecDecoder(tlm, SuffixDraft(cache_tokens=50))
    prompts = PROMPTS + PROMPTS[:3]                # more prompts than rows, some asked again
    res = dec.generate_many(prompts, max_new_tokens=30)
    assert [r.prompt_ids for r in res] == prompts
    for p, r in zip(prompts, res):
        assert r.generated_ids == reference_greedy(lm, p, 30, tlm.ctx_len), p
    assert dec.source.cache.tokens <= 50


class SoftCopyLM(FakeLM):
    """Leans towards repeating its history with a period: drafts accepted and rejected."""

    def __call__(self, history):
        x = super().__call__(history).copy()
        if len(history) >= 2:
            x[int(history[-2])] += 1.5
        return x


def test_sampling_is_exact_chi_square():
    V = 6
    lm = SoftCopyLM(V, salt=3, scale=1.0)
    tlm = FakeBackend(fake_artifact("tlm", k=3, vocab=V, ctx_len=32, prefill_len=4), lm)
    params, prompt, n, N = SamplingParams(1.0), [1, 2, 1, 2, 1], 3, 3000
    expect = sequence_dist(lm, prompt, n, params)
    dec = SpecDecoder(tlm, SuffixDraft())
    counts, acc = sample_counts(dec, prompt, n, params, np.random.default_rng(7), N)
    stat, df = chi2(counts, expect, N)
    assert stat < chi2_crit(df), (stat, df)
    acc = [a for a in acc if a is not None]
    assert 0.05 < np.mean(acc) < 0.95               # the acceptance rule was exercised both ways


def test_seeded_sampling_equals_target_only():
    lm = CopyLM(23, period=4, scale=1.0)
    tlm = tlm_of(lm, k=4)
    dec, base = SpecDecoder(tlm, SuffixDraft()), TargetOnlyDecoder(tlm)
    for seed in range(6):
        sp = SamplingParams(0.9, top_k=8, seed=seed)
        want = base.generate(PROMPT, max_new_tokens=30, sampling=sp).generated_ids
        assert dec.generate(PROMPT, max_new_tokens=30, sampling=sp).generated_ids == want
        assert dec.generate(PROMPT, max_new_tokens=30, sampling=sp).generated_ids == want


def test_memory_stays_under_the_cap_over_a_long_stream():
    rng = np.random.default_rng(0)
    D, cap = 8, 300
    cache = SuffixCache(D, cap)
    biggest = 0
    for r in range(200):                            # 200 requests of 5..60 tokens, some repeats
        toks = rng.integers(0, 50, size=int(rng.integers(5, 60))).tolist()
        e = cache.open()
        for t in toks:
            e = cache.append(e, t)
            assert cache.tokens <= cap
            biggest = max(biggest, cache.trie.nodes)
    assert cache.evicted > 100
    assert biggest <= cap * D
    assert cache.trie.nodes == _live_nodes(cache.trie.root)          # counts kept right by eviction
    assert sum(len(e.tokens) for e in cache.entries.values()) == cache.tokens
    # through the decoder: a long stream of requests keeps the global trie under its cap
    lm = FakeLM(23)
    src = SuffixDraft(max_depth=6, cache_tokens=120)
    dec = SpecDecoder(tlm_of(lm, k=4), src)
    for i in range(30):
        p = rng.integers(0, 23, size=6).tolist()
        assert dec.generate(p, max_new_tokens=20).generated_ids == reference_greedy(lm, p, 20, 64)
        assert src.cache.tokens <= 120 and src.cache.trie.nodes <= 120 * 6


def test_a_repeated_request_drafts_more_than_ngram():
    lm = FakeLM(23)                                  # prose-like: no self-repetition to look up
    tlm = tlm_of(lm, k=7, ctx_len=128)
    prompt = [3, 4, 5, 6, 7, 8]
    spec = SpecDecoder(tlm, SuffixDraft())
    spec.generate(prompt, max_new_tokens=60)         # an earlier request
    again = [3, 4, 5, 6, 7, 8]
    s = spec.generate(again, max_new_tokens=60).metrics["mean_tokens_per_tlm_call"]
    n = SpecDecoder(tlm, NgramDraft(3)).generate(again, max_new_tokens=60).metrics["mean_tokens_per_tlm_call"]
    assert s >= 1.5 * n and s > 3.0, (s, n)


def test_fallback_k0_with_suffix_drafts():
    lm = FakeLM(23)
    t = FakeBackend(fake_artifact("tlm", k=4, k_list=[0, 2, 4], ctx_len=96), lm, cost=0.001)
    for fb in (True, False):
        src = SuffixDraft()
        for _ in range(2):
            res = SpecDecoder(t, src, fallback=fb).generate(PROMPT, max_new_tokens=50)
            assert res.generated_ids == reference_greedy(lm, PROMPT, 50)
    res = SpecDecoder(t, SuffixDraft(), k=0).generate(PROMPT, max_new_tokens=20)
    assert res.generated_ids == reference_greedy(lm, PROMPT, 20)


def test_lookup_cost_does_not_grow_with_the_history():
    """The drafter indexes each new token once (O(depth)) and a lookup walks O(depth + drafts)
    nodes at most: node visits per round are the same after 100 or 3000 tokens."""
    rng = np.random.default_rng(1)
    src = SuffixDraft(max_depth=8)

    class Ctx:
        target_vocab = None

    d = src.drafter(Ctx())
    seq = rng.integers(0, 30, size=3200).tolist()
    d.first(seq[:10])
    per_round, drafted = {}, 0
    for q in range(11, 3200, 3):                     # three new tokens per round
        before = d.local.visits + src.cache.trie.visits
        drafted += len(d.draft(seq, q, 6))
        per_round[q] = d.local.visits + src.cache.trie.visits - before
    early = max(v for q, v in per_round.items() if q < 200)
    late = max(v for q, v in per_round.items() if q > 3000)
    bound = 3 * 2 * 9 + 2 * (9 + 6 + 8)   # extend both tries for 3 tokens; two lookups and walks
    assert late <= bound and early <= bound, (early, late, bound)
    assert late >= 3 * 2 * 8 and drafted > 500       # both tries indexed every token; drafts were made


def test_bad_options():
    for kw in ({"cache_tokens": 0}, {"cache_tokens": -3}, {"cache_tokens": 2.5}, {"max_depth": 1},
               {"max_depth": 1000}, {"min_prob": 2.0}, {"spec_factor": 0}):
        with pytest.raises(SpecdecError):
            SuffixDraft(**kw)
    tlm = tlm_of(FakeLM(23))
    with pytest.raises(SpecdecError, match="not both"):
        SpecDecoder(tlm, FakeBackend(fake_artifact("dlm", vocab=23), FakeLM(23)), draft="suffix")
    with pytest.raises(SpecdecError, match="'suffix'"):
        SpecDecoder(tlm, None, draft="suffixes")


# ----------------------------------------------------------------------------- specdec-run on a real export

def test_cli_suffix_equals_target_only(arts, capsys):  # noqa: F811
    base = ["--tlm", arts("llama_gqa", "tlm", k=4), "--max-new-tokens", 20, "--json", "--eos-id", -1]
    prompts = ["--prompt-ids", ",".join(map(str, IDS)), "--prompt-ids", "5,9,33,7",
               "--prompt-ids", ",".join(map(str, IDS))]
    code, out, err = run(base + prompts + ["--target-only"], capsys)
    assert code == 0, err
    want = ids_of(out)
    for extra in (["--draft", "suffix"], ["--draft", "suffix", "--suffix-cache-tokens", "8"],
                  ["--draft", "suffix", "--suffix-max-depth", "4", "--k", "3"]):
        code, out, err = run(base + prompts + extra, capsys)
        assert code == 0, err
        assert ids_of(out) == want, extra
    code, out, err = run(base + prompts + ["--draft", "suffix"], capsys)
    res = json.loads(out)["results"]
    assert res[2]["metrics"]["accepted_tokens"] > res[0]["metrics"]["accepted_tokens"]   # asked again


def test_cli_suffix_bad_input(arts, capsys):  # noqa: F811
    base = ["--tlm", arts("llama_gqa", "tlm", k=4), "--prompt-ids", "1,2,3"]
    dlm = arts("llama_gqa", "dlm")
    one_line_error(*run(base + ["--draft", "suffix", "--dlm", dlm], capsys)[::2], "no --dlm")
    for bad in ("0", "-5"):
        one_line_error(*run(base + ["--draft", "suffix", "--suffix-cache-tokens", bad], capsys)[::2],
                       "--suffix-cache-tokens", "positive")
    one_line_error(*run(base + ["--draft", "suffix", "--suffix-max-depth", "1"], capsys)[::2], "--suffix-max-depth")
    one_line_error(*run(base + ["--draft", "ngram", "--suffix-cache-tokens", "10"], capsys)[::2],
                   "--draft suffix")
    one_line_error(*run(base + ["--draft", "suffix", "--target-only"], capsys)[::2], "--target-only")


def test_a_finished_request_reaches_the_shared_cache_whole():
    """The loop's finish hook: the last round's tokens (after the last draft call) are
    cached too, so the whole answer is there for the next request."""
    lm = FakeLM(23)
    tlm = FakeBackend(fake_artifact("tlm", k=4), lm)
    src = SuffixDraft(cache_tokens=10_000)
    res = SpecDecoder(tlm, src).generate(PROMPT, max_new_tokens=25)
    lead = min(len(PROMPT), 8)                       # the prompt's last tokens lead the answer in
    assert src.cache.tokens == lead + len(res.generated_ids)
