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


# ----------------------------------------------------------------- entries that checked less than their siblings

@pytest.mark.parametrize("bad, first", [([9999, 2], 9999), (V, V), (np.int64(V), V), ([2, V], V)])
def test_eos_ids_outside_the_vocabulary_are_refused_by_every_entry(bad, first):
    """An EOS id past the target's vocabulary (``eos_token_id=[9999, eos]``, vocab 211) was taken: it
    can never be generated, so it stopped nothing, without a word. Every entry that takes EOS ids
    (both decoders, any draft source, the generate function; BatchEngine runs a decoder's) refuses it;
    the vocabulary's last id is still an EOS id."""
    from specdec_compile.runtime.decoding import generate
    tlm, dlm, lm = _pair()
    for make in (lambda: SpecDecoder(tlm, dlm, eos_token_id=bad), lambda: TargetOnlyDecoder(tlm, eos_token_id=bad),
                 lambda: SpecDecoder(tlm, draft="ngram", eos_token_id=bad),
                 lambda: SpecDecoder(tlm, dlm, draft="hybrid", eos_token_id=bad),
                 lambda: generate(tlm, dlm, IDS, eos_token_id=bad), lambda: generate(tlm, None, IDS, eos_token_id=bad)):
        _one_line(make, "eos_token_id", f"{first} is outside the target's vocabulary [0, {V})")
    want = reference_greedy(lm, IDS, 12, 64)
    for dec in (SpecDecoder(tlm, dlm, eos_token_id=[V - 1, 2]), TargetOnlyDecoder(tlm, eos_token_id=np.int32(V - 1))):
        assert V - 1 in dec.eos
        if V - 1 not in want:
            assert dec.generate(IDS, max_new_tokens=12).generated_ids == want


@pytest.fixture(scope="module")
def swapped(tmp_path_factory):
    from specdec_compile.runtime.tokenizer import load_tokenizer
    return load_tokenizer(make_tokenizer(tmp_path_factory.mktemp("tok_swap") / "tok", n=V, swap=True))


@pytest.mark.parametrize("draft", [None, "hybrid"])
@pytest.mark.parametrize("call, streams", [
    (lambda d, t, s: d.generate("w5 w9 w33", tokenizer=t, streamer=s), 1),
    (lambda d, t, s: d.stream("w5 w9 w33", tokenizer=t, streamer=s), 1),
    (lambda d, t, s: d.generate(["w5 w9", "w33"], tokenizer=t), 0),
    (lambda d, t, s: d.generate_many(["w5 w9", "w33"], tokenizer=t), 0),
    (lambda d, t, s: d.stream(["w5 w9", "w33"], tokenizer=t), 0),
])
def test_a_per_call_tokenizer_is_checked_as_the_decoders_own(tok, swapped, call, streams, draft):
    """SpecDecoder(tlm, dlm, tokenizer=A, dlm_tokenizer=D) checks A against D; ``generate(...,
    tokenizer=B)`` used B to encode and decode without that check. The call's tokenizer now gets the
    constructor's check (check_pair), before it encodes; a refused call ends its streamer."""
    from specdec_compile.runtime.tokenizer import load_tokenizer
    tlm, dlm, lm = _pair()
    _one_line(lambda: SpecDecoder(tlm, dlm, draft=draft, tokenizer=swapped, dlm_tokenizer=tok), "differ at id 3")
    dec, s = SpecDecoder(tlm, dlm, draft=draft, tokenizer=tok, dlm_tokenizer=tok), _Streamer()
    _one_line(lambda: call(dec, swapped, s), "TLM and DLM tokenizers differ at id 3")
    assert s.ended == streams
    again = load_tokenizer(tok.name_or_path)          # the same tokenizer, another object: it passes
    res = dec.generate("w5 w9 w33", tokenizer=again, max_new_tokens=12)
    assert res.generated_ids == reference_greedy(lm, [5, 9, 33], 12, 64) and res.text is not None


def test_a_tokenizer_that_cannot_be_compared_is_refused_in_one_line(tok):
    """A length-only tokenizer beside a dlm_tokenizer was an AttributeError (get_vocab) from deep code,
    at the constructor and, with the per-call check, at the call."""
    tlm, dlm, lm = _pair()
    _one_line(lambda: SpecDecoder(tlm, dlm, tokenizer=_LenTok(), dlm_tokenizer=tok), "has no get_vocab()")
    dec = SpecDecoder(tlm, dlm, tokenizer=tok, dlm_tokenizer=tok)
    _one_line(lambda: dec.generate(IDS, tokenizer=_LenTok()), "TLM tokenizer (_LenTok) has no get_vocab()")
    # without a draft tokenizer there is nothing to compare it with: as at the constructor
    assert SpecDecoder(tlm, dlm).generate(IDS, tokenizer=_LenTok(), max_new_tokens=8).generated_ids == \
        reference_greedy(lm, IDS, 8, 64)


def test_one_dlm_draft_serves_one_target():
    """A DlmDraft keeps one vocabulary map; binding it to a second decoder over another target rewrote
    the first decoder's map. A second, different target is refused; the same one again is fine."""
    from specdec_compile.runtime import FeatureDraft
    from specdec_compile.runtime.testing import fake_feature_pair
    tlm, dlm, lm = fake_pair(vocab=V, dlm_vocab=150, k=3, ctx_len=64, dlm="same")
    other, _, _ = fake_pair(vocab=V + 20, k=3, ctx_len=64)
    src = DlmDraft(dlm)
    first = SpecDecoder(tlm, src)
    vocab = src.vocab
    SpecDecoder(tlm, src)                                   # the same target: the same map
    for make in (lambda: SpecDecoder(other, src), lambda: SpecDecoder(other, HybridDraft(NgramDraft(3), src))):
        _one_line(make, "is already bound to another target", "a DlmDraft of its own")
    assert src.vocab == vocab and src.target is tlm
    assert first.generate(IDS, max_new_tokens=16).generated_ids == reference_greedy(lm, IDS, 16, 64)
    t, d, _ = fake_feature_pair(vocab=V)
    t2, _, _ = fake_feature_pair(vocab=V)
    fsrc = FeatureDraft(d)
    SpecDecoder(t, fsrc)
    _one_line(lambda: SpecDecoder(t2, fsrc), "is already bound to another target", "a FeatureDraft of its own")


@pytest.mark.parametrize("bad", [-1, 2.5, None, True, "3"])
def test_batch_engine_stream_checks_max_new_tokens_as_generate_does(bad):
    """BatchEngine.stream took max_new_tokens=2.5 (it ran 3 tokens) and None (a TypeError from deep
    code); it now makes generate's check, at the call."""
    from specdec_compile.runtime.batch import BatchEngine
    tlm, dlm, lm = _pair()
    dec = SpecDecoder(tlm, dlm)
    want = f"max_new_tokens must be an integer >= 0 (got {bad!r})"
    if bad is not None:                     # generate(max_new_tokens=None): its default, as in HF
        assert _one_line(lambda: dec.generate(IDS, max_new_tokens=bad), "max_new_tokens") == want
    assert _one_line(lambda: BatchEngine(dec).stream([IDS], max_new_tokens=bad), "max_new_tokens") == want
    assert _one_line(lambda: BatchEngine(dec).check_prompts([IDS], bad), "max_new_tokens") == want
    [(i, r)] = list(BatchEngine(dec).stream([IDS], max_new_tokens=np.int64(6)))
    assert r.generated_ids == reference_greedy(lm, IDS, 6, 64)
