"""Draft/target pairs with one tokenizer and tables of different sizes (issue 14),
on FAKE in-memory backends (specdec_compile.runtime.testing): the vocabulary
mapping, the loop on top of it (greedy equality, exact sampling), and the
pair-compatibility rule. Real exported models: tests/runtime/test_vocab_ort.py.
"""
from __future__ import annotations

import numpy as np
import pytest
from runtime_helpers import PROMPT, chi2, chi2_crit, chi2_p, make_tokenizer, reference_greedy, sample_counts, sequence_dist

from specdec_compile.errors import SpecdecError
from specdec_compile.runtime import SamplingParams, SpecDecoder, TargetOnlyDecoder, check_pair
from specdec_compile.runtime.testing import FakeBackend, FakeLM, fake_artifact, fake_pair
from specdec_compile.runtime.vocab import PairVocab

VT, VD = 29, 23          # target and draft logits widths


class _Tok:
    """Just a length: what the loop asks a tokenizer for."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n


# ----------------------------------------------------------------------------- the mapping

def test_pair_vocab_arrays_of_any_leading_shape():
    v = PairVocab.of(7, 5, tokenizer_len=4, draft_reads=5, fill_id=1)
    assert (v.propose, v.draft_reads, v.fill_id, v.same) == (4, 5, 1, False)
    logits = np.arange(2 * 3 * 5, dtype=np.float32).reshape(2, 3, 5)       # [B, S, V_d]
    assert v.draft_logits(logits).shape == (2, 3, 4)
    q = np.full((2, 4), 0.25)                                                # one row per batch row
    qt = v.draft_dist(q)
    assert qt.shape == (2, 7) and np.all(qt[:, 4:] == 0) and np.allclose(qt.sum(-1), 1)
    ids = np.array([[0, 4, 5, 6], [6, 6, 2, 0]])
    assert v.draft_ids(ids).tolist() == [[0, 4, 1, 1], [1, 1, 2, 0]]
    assert v.draft_dist(None) is None
    same = PairVocab.of(7, 7)
    assert same.same and same.propose == 7
    assert PairVocab.of(7, 9).propose == 7           # a wider draft still drafts only the target's ids
    assert not PairVocab.of(7, 7, tokenizer_len=6).same


# ----------------------------------------------------------------------------- greedy

@pytest.mark.parametrize("k", [1, 2, 4, 7])
@pytest.mark.parametrize("dlm", ["same", "close", "independent"])
def test_greedy_with_a_smaller_draft_table_equals_target_only(k, dlm):
    log = []
    tlm, d, lm = fake_pair(k=k, dlm=dlm, vocab=VT, dlm_vocab=VD, call_log=log)
    spec = SpecDecoder(tlm, d).generate(PROMPT, max_new_tokens=40)
    base = TargetOnlyDecoder(tlm).generate(PROMPT, max_new_tokens=40)
    ref = reference_greedy(lm, PROMPT, 40, tlm.ctx_len)
    assert spec.generated_ids == base.generated_ids == ref
    assert any(t >= VD for t in ref)                          # the target emits ids the draft lacks
    assert all(t < VD for t, s in zip(spec.generated_ids, spec.sources) if s == "draft")
    # the draft never reads an id beyond its table: those are read as the fill id
    assert all(t < VD for role, _, _, ids in log if role == "dlm" for t in ids)
    assert spec.metrics["acceptance_rate"] > 0 if dlm == "same" else True


def test_a_draft_with_a_cut_head_still_reads_every_id():
    log = []
    tlm, d, lm = fake_pair(k=4, dlm="same", vocab=VT, dlm_vocab=VD, dlm_reads=VT, call_log=log)
    spec = SpecDecoder(tlm, d).generate(PROMPT, max_new_tokens=40)
    assert spec.generated_ids == reference_greedy(lm, PROMPT, 40, tlm.ctx_len)
    assert d.input_vocab == VT
    # the same history as the target: it agrees wherever the target's argmax is one of its rows
    assert spec.metrics["acceptance_rate"] > 0.5
    assert any(t >= VD for role, _, _, ids in log if role == "dlm" for t in ids)   # read as they are


def test_a_larger_draft_table_and_the_tokenizer_length_bound_the_drafts():
    tlm, d, lm = fake_pair(k=4, dlm="same", vocab=VD, dlm_vocab=VT)      # the draft is the wider one
    spec = SpecDecoder(tlm, d).generate(PROMPT, max_new_tokens=30)
    assert spec.generated_ids == reference_greedy(lm, PROMPT, 30, tlm.ctx_len)
    assert spec.metrics["acceptance_rate"] == 1.0
    tlm, d, lm = fake_pair(k=4, dlm="same", vocab=VT, dlm_vocab=VT)
    dec = SpecDecoder(tlm, d, tokenizer=_Tok(20))
    assert dec.vocab.propose == 20
    spec = dec.generate(PROMPT, max_new_tokens=40)
    assert spec.generated_ids == reference_greedy(lm, PROMPT, 40, tlm.ctx_len)
    assert all(t < 20 for t, s in zip(spec.generated_ids, spec.sources) if s == "draft")
    assert any(t >= 20 for t in spec.generated_ids)           # the target's own ids are its own


# ----------------------------------------------------------------------------- sampling

@pytest.mark.parametrize("draft,params,N", [
    ("prefix", SamplingParams(1.0), 4000),
    ("independent", SamplingParams(0.8, top_k=4, top_p=0.9), 3000)])
def test_speculative_sampling_with_a_smaller_draft_is_exact(draft, params, N):
    V, v = 7, 5
    tlm_lm = FakeLM(V, salt=3, scale=1.0)
    dlm_lm = FakeLM(v, salt=3 if draft == "prefix" else 99, scale=1.0)
    tlm = FakeBackend(fake_artifact("tlm", k=2, vocab=V, ctx_len=32, prefill_len=4), tlm_lm)
    dlm = FakeBackend(fake_artifact("dlm", vocab=v, ctx_len=32, prefill_len=4), dlm_lm)
    prompt, n = [1, 2, 3], 3
    expect = sequence_dist(tlm_lm, prompt, n, params)
    assert sum(p for s, p in expect.items() if max(s) >= v) > 0.05      # the rows the draft lacks matter
    dec = SpecDecoder(tlm, dlm)
    rng = np.random.default_rng(4321)
    counts, acc = sample_counts(dec, prompt, n, params, rng, N)
    stat, df = chi2(counts, expect, N)
    print(f"chi2 {draft}: stat {stat:.1f}, df {df}, p {chi2_p(stat, df):.3f}")
    assert stat < chi2_crit(df), (stat, df)
    assert 0.1 < np.mean(acc) < 0.95
    # negative control: the target restricted to the draft's rows (what a sampler that
    # ignored the extra rows would give) fails the same test
    cut = sequence_dist(lambda h: tlm_lm(h)[:v], prompt, n, params)
    bad, bdf = chi2({k: int(round(p * N)) for k, p in cut.items() if k in expect}, expect, N)
    assert bad > chi2_crit(bdf)


# ----------------------------------------------------------------------------- compatibility

def test_manifest_token_ids_decide_without_tokenizers():
    base = dict(batch_size=1, ctx_len=64, prefill_len=8)
    t = fake_artifact("tlm", k=4, vocab=VT, eos_token_id=2, manifest={"eos_token_ids": [7, 2], "bos_token_id": 1},
                      **base)
    ok = fake_artifact("dlm", vocab=VD, eos_token_id=7, manifest={"eos_token_ids": [2, 7], "bos_token_id": 1},
                       **base)
    check_pair(t, ok)                        # the same EOS set in another order, another table size
    for manifest, needle in (({"eos_token_ids": [2]}, "EOS ids: [2, 7]"), ({"bos_token_id": 0}, "BOS ids"),
                             ({"eos_token_ids": [2, 7, 9]}, "first at id 9")):
        d = fake_artifact("dlm", vocab=VD, manifest=manifest, **base)
        with pytest.raises(SpecdecError, match=needle.replace("[", r"\[").replace("]", r"\]")) as e:
            check_pair(t, d)
        assert "\n" not in str(e.value)


def test_tokenizers_decide_when_both_are_given(tmp_path):
    from specdec_compile.runtime.tokenizer import check_tokenizers_agree, load_tokenizer

    big = load_tokenizer(make_tokenizer(tmp_path / "t211"))
    small = load_tokenizer(make_tokenizer(tmp_path / "t150", n=150))
    assert check_tokenizers_agree(big, small) == 150                 # lengths differ, prefix agrees
    assert check_tokenizers_agree(big, big, limit=100) == 100
    swapped = load_tokenizer(make_tokenizer(tmp_path / "swap", swap=True))
    with pytest.raises(SpecdecError, match="differ at id 3: 'w3' .TLM. vs 'w4' .DLM."):
        check_tokenizers_agree(big, swapped)
    eos = load_tokenizer(make_tokenizer(tmp_path / "eos", eos="<s>"))
    with pytest.raises(SpecdecError, match="EOS token: id 2"):
        check_tokenizers_agree(big, eos)
    base = dict(batch_size=1, ctx_len=64, prefill_len=8)
    t = fake_artifact("tlm", k=4, vocab=VT, eos_token_id=2, **base)
    d = fake_artifact("dlm", vocab=VD, eos_token_id=9, **base)       # the manifests disagree ...
    check_pair(t, d, tokenizers=(big, small))                          # ... the tokenizers decide
    with pytest.raises(SpecdecError, match="different EOS ids"):
        check_pair(t, d, tokenizers=(big, None))
    with pytest.raises(SpecdecError, match="differ at id 3"):
        SpecDecoder(FakeBackend(t, FakeLM(VT)), FakeBackend(d, FakeLM(VD)), tokenizer=big, dlm_tokenizer=swapped)
