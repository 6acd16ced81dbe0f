"""Bad inputs to the runtime's Python API (SpecDecoder / TargetOnlyDecoder, generate / generate_many /
stream, SamplingParams through HF's keywords, the width policy, the draft sources' constructors):
each is a one-line SpecdecError naming the problem, never a deep traceback, a hang or a silently
different reading, and the decoder still decodes the target's own greedy text afterwards. On fakes
(testing.py). Each test failed before its fix."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from runtime_helpers import make_tokenizer, reference_greedy

from specdec_compile.errors import SpecdecError
from specdec_compile.runtime import (DlmDraft, HybridDraft, NgramDraft, SpecDecoder, SuffixDraft, TargetOnlyDecoder,
                                     WidthPolicy)
from specdec_compile.runtime.testing import FakeBackend, fake_pair

V = 211
IDS = [5, 9, 33, 7, 100, 42, 17, 3, 8, 55]


def _pair(**kw):
    return fake_pair(vocab=V, k=3, ctx_len=64, **kw)


def _one_line(call, *needles):
    with pytest.raises(SpecdecError) as e:
        call()
    msg = str(e.value)
    assert "\n" not in msg, msg
    for n in needles:
        assert n in msg, (n, msg)
    return msg


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    from specdec_compile.runtime.tokenizer import load_tokenizer
    return load_tokenizer(make_tokenizer(tmp_path_factory.mktemp("tok_api") / "tok", n=V))


class _Streamer:
    def __init__(self):
        self.puts, self.ended = 0, 0

    def put(self, value):
        self.puts += 1

    def end(self):
        self.ended += 1


# ----------------------------------------------------------------------------- a refused call ends its streamer

@pytest.mark.parametrize("call", [
    lambda d, s: d.generate(IDS, streamer=s, max_new_tokens=-1),
    lambda d, s: d.generate(IDS, streamer=s, temperature=-1.0),
    lambda d, s: d.generate(IDS, streamer=s, prompt_index=-1),
    lambda d, s: d.generate(np.array([IDS, IDS]), streamer=s),
    lambda d, s: d.generate_many([IDS, IDS], streamer=s),
    lambda d, s: d.stream(IDS, streamer=s, top_p=2.0),
])
def test_a_refused_call_ends_its_streamer(call):
    """A TextIteratorStreamer's consumer (another thread, docs/runtime.md's example) waits for end():
    a call refused before the run never ended it, so the consumer waited for ever."""
    tlm, dlm, lm = _pair()
    dec, s = SpecDecoder(tlm, dlm), _Streamer()
    with pytest.raises(SpecdecError):
        call(dec, s)
    assert s.ended == 1
    assert dec.generate(IDS, max_new_tokens=12).generated_ids == reference_greedy(lm, IDS, 12, 64)


def test_a_real_text_iterator_streamer_is_not_left_waiting(tok):
    import threading
    transformers = pytest.importorskip("transformers")
    tlm, dlm, _ = _pair()
    dec = SpecDecoder(tlm, dlm, tokenizer=tok)
    st = transformers.TextIteratorStreamer(tok, skip_prompt=True, timeout=20)
    errors = []

    def run():
        try:
            dec.generate("w5 w9 w33", streamer=st, max_new_tokens=-1)
        except SpecdecError as e:
            errors.append(e)
    th = threading.Thread(target=run)
    th.start()
    assert "".join(st) == ""            # ends at once (before the fix: queue.Empty after the timeout)
    th.join()
    assert len(errors) == 1


# ----------------------------------------------------------------------------- HF keywords and prompts

@pytest.mark.parametrize("kw, needle", [
    (dict(temperature="0.5"), "temperature must be a number (got '0.5')"),
    (dict(do_sample=True, temperature="0.5"), "temperature must be a number"),      # was a TypeError
    (dict(do_sample=True, temperature=[1.0]), "temperature must be a number"),
    (dict(temperature=True), "temperature must be a number (got True)"),            # was read as 1.0
    (dict(temperature=0.7, top_p="0.9"), "top_p must be a number"),
    (dict(temperature=0.7, top_p=True), "top_p must be a number (got True)"),
])
def test_sampling_keywords_are_numbers_not_strings_or_bools(kw, needle):
    tlm, dlm, _ = _pair()
    _one_line(lambda: SpecDecoder(tlm, dlm).generate(IDS, max_new_tokens=4, **kw), needle)


def test_hf_sampling_keywords_still_take_numpy_scalars():
    tlm, dlm, _ = _pair()
    dec = SpecDecoder(tlm, dlm)
    a = dec.generate(IDS, max_new_tokens=8, temperature=np.float32(0.75), top_p=np.float64(0.9), seed=3)
    b = dec.generate(IDS, max_new_tokens=8, temperature=0.75, top_p=0.9, seed=3)
    assert a.generated_ids == b.generated_ids


@pytest.mark.parametrize("call, needle", [
    (lambda d: d.generate([IDS, IDS[:3]], attention_mask=[[1] * 10, [1, 1]]), "attention_mask: expected"),
    (lambda d: d.generate(IDS, token_type_ids=[[0], [0, 0]]), "token_type_ids: expected"),
    (lambda d: d.generate([[True, 2], [3, 4]]), "prompt 1: expected a list of integer token ids"),   # was id 1
    (lambda d: d.generate([[3, 4], [5, False]]), "prompt 2: expected a list of integer token ids"),
    (lambda d: d.generate([5, None, 7]), "item 2 is None, not a token id"),
    (lambda d: d.generate([5, 7.0]), "item 2 is 7.0, not a token id"),
])
def test_ragged_and_mixed_prompts_are_named(call, needle):
    tlm, dlm, lm = _pair()
    dec = SpecDecoder(tlm, dlm)
    _one_line(lambda: call(dec), needle)
    assert dec.generate(IDS, max_new_tokens=10).generated_ids == reference_greedy(lm, IDS, 10, 64)


class _LenTok:
    """A tokenizer that only knows its length (what the vocabulary check reads)."""

    def __len__(self):
        return V


def test_tokenizers_of_the_wrong_kind_are_refused(tok):
    tlm, dlm, _ = _pair()
    for bad in (5, 2.5, True):
        _one_line(lambda: SpecDecoder(tlm, dlm, tokenizer=bad), "tokenizer must be a tokenizer object")
        _one_line(lambda: TargetOnlyDecoder(tlm, tokenizer=bad), "tokenizer must be a tokenizer object")
        _one_line(lambda: SpecDecoder(tlm, dlm, dlm_tokenizer=bad), "tokenizer must be a tokenizer object")
        _one_line(lambda: SpecDecoder(tlm, dlm).generate(IDS, tokenizer=bad), "tokenizer must be a tokenizer object")
    dec = SpecDecoder(tlm, dlm, tokenizer=_LenTok())
    _one_line(lambda: dec.generate("w5 w9"), "needs a tokenizer that encodes")
    _one_line(lambda: dec.generate(IDS, stop_strings="w5"), "stop_strings needs a tokenizer with decode()")


def test_a_tokenizer_without_decode_streams_ids():
    """stream() with a tokenizer that only has a length (a vocabulary check's) raised AttributeError
    at the first token; it streams token ids, as without a tokenizer."""
    tlm, dlm, lm = _pair()
    chunks = list(SpecDecoder(tlm, dlm, tokenizer=_LenTok()).stream(IDS, max_new_tokens=12))
    assert [t for c in chunks for t in c] == reference_greedy(lm, IDS, 12, 64)


def test_a_negative_prompt_id_is_refused_when_the_vocabulary_size_is_unknown():
    tlm, dlm, lm = _pair()
    blind = FakeBackend(replace(tlm.artifact, vocab_size=None), lm)
    _one_line(lambda: TargetOnlyDecoder(blind).generate([5, -3, 7], max_new_tokens=2), "-3 is negative")


# ----------------------------------------------------------------------------- decoders and policies

def test_eos_given_as_a_zero_d_array_is_one_id():
    tlm, dlm, lm = _pair()
    ref = reference_greedy(lm, IDS, 30, 64)
    i = next(i for i in range(2, 30) if ref[i] not in ref[:i])
    for dec in (SpecDecoder(tlm, dlm, eos_token_id=np.array(ref[i])),          # was a TypeError
                TargetOnlyDecoder(tlm, eos_token_id=np.array(ref[i], dtype=np.int32))):
        r = dec.generate(IDS, max_new_tokens=30)
        assert r.generated_ids == ref[:i + 1] and r.stop_reason == "eos"


@pytest.mark.parametrize("make, needle", [
    (lambda t, d: SpecDecoder("out/tlm", d), "the tlm must be a backend"),
    (lambda t, d: SpecDecoder(None, draft="ngram"), "the tlm must be a backend"),
    (lambda t, d: TargetOnlyDecoder("out/tlm"), "the tlm must be a backend"),
    (lambda t, d: SpecDecoder(t, draft=DlmDraft("out/dlm")), "the draft model must be a backend"),
    (lambda t, d: SpecDecoder(t, draft=NgramDraft), "is a class: give a source object"),
    (lambda t, d: SpecDecoder(t, d, policy="adaptive"), "policy must be a WidthPolicy"),
    (lambda t, d: SpecDecoder(t, d, policy=WidthPolicy), "policy must be a WidthPolicy"),
    (lambda t, d: SpecDecoder(t, d, fallback="no"), "fallback must be True or False (got 'no')"),
    (lambda t, d: SpecDecoder(t, d, adaptive="no"), "adaptive must be True or False (got 'no')"),
    (lambda t, d: SpecDecoder(t, d, policy=WidthPolicy(adaptive="off")), "adaptive must be True or False"),
    (lambda t, d: WidthPolicy(costs=5), "costs must be a CostModel"),
    (lambda t, d: SpecDecoder(t, draft="suffix", ngram_max=5), "ngram_max is for draft='ngram' or"),
    (lambda t, d: SpecDecoder(t, d, ngram_max=5), "ngram_max is for draft='ngram' or"),
    (lambda t, d: SpecDecoder(t, draft=SuffixDraft(), ngram_max=5), "ngram_max is for draft='ngram' or"),
])
def test_decoders_refuse_what_is_not_theirs(make, needle):
    tlm, dlm, _ = _pair(k_list=[0, 1, 3])
    _one_line(lambda: make(tlm, dlm), needle)


def test_a_policy_reads_true_and_false_as_before():
    tlm, dlm, lm = _pair(k_list=[0, 1, 3])
    want = reference_greedy(lm, IDS, 20, 64)
    for kw in (dict(adaptive=True), dict(adaptive=False), dict(fallback=False), dict(adaptive=np.bool_(True))):
        assert SpecDecoder(tlm, dlm, **kw).generate(IDS, max_new_tokens=20).generated_ids == want
    assert SpecDecoder(tlm, dlm, fallback=False).policy.fallback is False


# ----------------------------------------------------------------------------- the draft sources' sizes

BAD_WHOLE = [None, float("nan"), float("inf"), True, "3", 2.5]


@pytest.mark.parametrize("bad", BAD_WHOLE)
def test_ngram_sizes_must_be_whole_numbers(bad):
    tlm, _, _ = _pair()
    _one_line(lambda: NgramDraft(bad), "n-gram size must be")
    _one_line(lambda: NgramDraft(3, min_n=bad), "minimum n-gram size must be")
    if bad is not None:                  # ngram_max=None: the default size
        _one_line(lambda: SpecDecoder(tlm, draft="ngram", ngram_max=bad), "n-gram size must be")


@pytest.mark.parametrize("kw, needle", [(dict(max_depth=b), "suffix depth") for b in BAD_WHOLE]
                         + [(dict(cache_tokens=b), "suffix cache size") for b in BAD_WHOLE]
                         + [(dict(min_prob=b), "suffix min_prob") for b in (None, "0.1", float("nan"), True)]
                         + [(dict(spec_factor=b), "suffix spec_factor") for b in (None, "1", float("inf"), True)])
def test_suffix_sizes_are_checked_at_construction(kw, needle):
    """spec_factor=inf passed construction and raised OverflowError in the middle of a generation."""
    _one_line(lambda: SuffixDraft(**kw), needle)


@pytest.mark.parametrize("kw, needle", [(dict(min_drafts=b), "min_drafts") for b in (None, float("nan"), True, "2")]
                         + [(dict(min_alpha=b), "min_alpha") for b in (None, "0.1", float("nan"))])
def test_hybrid_thresholds_are_checked(kw, needle):
    _, dlm, _ = _pair()
    _one_line(lambda: HybridDraft(NgramDraft(3), DlmDraft(dlm), **kw), "hybrid draft: " + needle)


def test_a_decoder_decodes_the_target_after_every_refusal():
    """Refusals before and after the first call leave nothing half-done: the next generation is the
    target's own, for a DLM, n-gram and suffix decoder alike."""
    tlm, dlm, lm = _pair(k_list=[0, 1, 3])
    want = reference_greedy(lm, IDS, 24, 64)
    for dec in (SpecDecoder(tlm, dlm), SpecDecoder(tlm, draft="ngram"), SpecDecoder(tlm, draft="suffix")):
        for bad in (dict(temperature="1"), dict(top_p=True, temperature=1.0), dict(max_new_tokens=-1)):
            with pytest.raises(SpecdecError):
                dec.generate(IDS, **bad)
        with pytest.raises(SpecdecError):
            dec.generate([[1, 2], [3, 4, 5]], attention_mask=[[1, 1], [1]])
        assert dec.generate(IDS, max_new_tokens=24).generated_ids == want
        assert [r.generated_ids for r in dec.generate_many([IDS, IDS[:4]], max_new_tokens=24)] == \
            [want, reference_greedy(lm, IDS[:4], 24, 64)]
