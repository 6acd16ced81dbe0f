"""Runtime defects of issue 31 seen through the Python API, on fakes (testing.py) with real
tokenizers: two live generations on one decoder, stop strings (long emoji / CJK strings, a
stop string that begins in the prompt, the stop reason when EOS completes one), EOS ids given as
a string, bad arguments found only mid-run, and the end of a text stream. Each test failed
before the fix."""
from __future__ import annotations

import pytest
from runtime_helpers import make_tokenizer, reference_greedy

from specdec_compile.errors import SpecdecError
from specdec_compile.runtime import SamplingParams, SpecDecoder, TargetOnlyDecoder
from specdec_compile.runtime.drafts.ngram import NgramDraft
from specdec_compile.runtime.streaming import StopStrings
from specdec_compile.runtime.testing import fake_pair

V = 211
IDS = [5, 9, 33, 7, 100, 42, 17, 3, 8, 55]


@pytest.fixture(scope="module")
def word_tok(tmp_path_factory):
    from specdec_compile.runtime.tokenizer import load_tokenizer
    return load_tokenizer(make_tokenizer(tmp_path_factory.mktemp("tok31") / "tok", n=V))


@pytest.fixture(scope="module")
def byte_tok():
    """A byte-level tokenizer without merges: every UTF-8 byte is one token (an emoji four, a
    rare CJK character three), as byte-level BPE tokenizers spend on rare characters."""
    from tokenizers import Tokenizer, decoders, models as tm, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    t = Tokenizer(tm.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    t.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=t, eos_token="</s>")


def _decoders(batch_size=1, vocab=V):
    tlm, dlm, lm = fake_pair(vocab=vocab, k=3, batch_size=batch_size, ctx_len=64)
    return tlm, dlm, lm


# ----------------------------------------------------------------------------- 1. two live generations

@pytest.mark.parametrize("kind", ["target", "dlm", "ngram"])
def test_a_second_live_generation_on_one_decoder_is_refused(kind):
    tlm, dlm, lm = _decoders()
    dec = {"target": lambda: TargetOnlyDecoder(tlm), "dlm": lambda: SpecDecoder(tlm, dlm),
           "ngram": lambda: SpecDecoder(tlm, draft=NgramDraft(3))}[kind]()
    want = reference_greedy(lm, IDS, 20, 64)
    first = dec.stream(IDS, max_new_tokens=20)
    got = list(next(first))
    second = dec.stream([9, 4, 9, 120], max_new_tokens=20)
    with pytest.raises(SpecdecError, match="still live") as e:
        next(second)                                  # it would reset the cache the first one reads
    assert "\n" not in str(e.value)
    with pytest.raises(SpecdecError, match="still live"):
        dec.generate([3, 4], max_new_tokens=4)
    for chunk in first:
        got += chunk
    assert got == want                                # the first one is untouched
    assert dec.generate(IDS, max_new_tokens=20).generated_ids == want   # and the decoder is free again


def test_two_decoders_over_one_model_are_one_model():
    tlm, dlm, lm = _decoders()
    spec, base = SpecDecoder(tlm, dlm), TargetOnlyDecoder(tlm)
    first = spec.stream(IDS, max_new_tokens=20)
    got = list(next(first))
    with pytest.raises(SpecdecError, match="still live"):
        base.generate_many([IDS, [3, 4]], max_new_tokens=4)
    assert got + [t for chunk in first for t in chunk] == reference_greedy(lm, IDS, 20, 64)


def test_an_abandoned_stream_frees_the_decoder():
    tlm, dlm, lm = _decoders()
    dec = SpecDecoder(tlm, dlm)
    s = dec.stream(IDS, max_new_tokens=20)
    next(s)
    s.close()
    assert dec.generate(IDS, max_new_tokens=20).generated_ids == reference_greedy(lm, IDS, 20, 64)


def test_a_generation_from_inside_on_tokens_is_refused():
    tlm, dlm, _ = _decoders()
    dec = SpecDecoder(tlm, dlm)
    with pytest.raises(SpecdecError, match="still live"):
        dec.generate(IDS, max_new_tokens=8, on_tokens=lambda ids, src: dec.generate([3], max_new_tokens=2))


# ----------------------------------------------------------------------------- 4. stop strings

@pytest.mark.parametrize("stop", ["\U0001F600" * 6, "龘靐齉爩麤龘"])
def test_long_emoji_and_cjk_stop_strings_fire(byte_tok, stop):
    ids = byte_tok("ab " + stop + " tail")["input_ids"]
    n_stop = len(byte_tok("ab " + stop)["input_ids"])
    assert n_stop - 3 > len(stop) + StopStrings.MARGIN       # more tokens than the old window held
    prompt = byte_tok("x")["input_ids"]
    seq = prompt + ids
    assert StopStrings(byte_tok, [stop]).cut(seq, len(ids)) == n_stop
    for j in range(1, len(ids) + 1):                      # token by token too, as target-only feeds it
        if StopStrings(byte_tok, [stop]).cut(seq[:len(prompt) + j], 1) is not None:
            assert j == n_stop
            break
    else:
        raise AssertionError("never stopped")


def _hf_stops(tok, ids, n_prompt, stop):
    """transformers' StopStringCriteria, token by token over prompt + output: the first output
    token at which it stops (1-based), or None."""
    torch = pytest.importorskip("torch")
    from transformers.generation.stopping_criteria import StopStringCriteria
    crit = StopStringCriteria(tok, [stop])
    for j in range(1, len(ids) - n_prompt + 1):
        if bool(crit(torch.tensor([ids[:n_prompt + j]]), None)[0]):
            return j
    return None


def test_a_stop_string_that_begins_in_the_prompt_stops_as_in_transformers(word_tok, byte_tok):
    tlm, dlm, lm = _decoders()
    out = reference_greedy(lm, IDS, 12, 64)
    stop = f"w{IDS[-1]} w{out[0]}"                         # the prompt's last word, the first new one
    for dec in (SpecDecoder(tlm, dlm, tokenizer=word_tok), TargetOnlyDecoder(tlm, tokenizer=word_tok)):
        r = dec.generate(IDS, max_new_tokens=12, stop_strings=[stop])
        assert (r.generated_ids, r.stop_reason) == (out[:1], "stop_string")
    # a stop string wholly inside the prompt stops nothing (transformers neither)
    inside = f"w{IDS[0]} w{IDS[1]}"
    r = SpecDecoder(tlm, dlm, tokenizer=word_tok).generate(IDS, max_new_tokens=12, stop_strings=[inside])
    assert r.generated_ids == out
    # byte-level text: "Hello wor" + "ld! ..." with "world", and other cut points, as transformers
    # (which refuses stop strings of characters no token decodes to whole, such as emoji here)
    text = "Hello world! \U0001F600\U0001F600 done"
    ids = byte_tok(text)["input_ids"]
    for stop in ("world", "o w", "d! ", "Hello", " done"):
        for n_prompt in (3, 8, 9, 13, 15):
            ours = StopStrings(byte_tok, [stop]).cut(ids, len(ids) - n_prompt)
            assert ours == _hf_stops(byte_tok, ids, n_prompt, stop), (stop, n_prompt)


def test_eos_that_completes_a_stop_string_is_eos_for_both_decoders(word_tok):
    tlm, dlm, lm = _decoders()
    out = reference_greedy(lm, IDS, 20, 64)
    i = next(j for j in range(3, 20) if out[j] not in out[:j] and not any(
        str(t).startswith(str(out[j])) for t in out[:j] + IDS))
    stop = f"w{out[i]}"
    for dec in (SpecDecoder(tlm, dlm, tokenizer=word_tok), TargetOnlyDecoder(tlm, tokenizer=word_tok)):
        r = dec.generate(IDS, max_new_tokens=20, stop_strings=[stop])
        assert (r.generated_ids, r.stop_reason) == (out[:i + 1], "stop_string")
    for dec in (SpecDecoder(tlm, dlm, tokenizer=word_tok, eos_token_id=out[i]),
                TargetOnlyDecoder(tlm, tokenizer=word_tok, eos_token_id=out[i])):
        r = dec.generate(IDS, max_new_tokens=20, stop_strings=[stop])
        assert (r.generated_ids, r.stop_reason) == (out[:i + 1], "eos"), type(dec)


# ----------------------------------------------------------------------------- 5, 8. bad arguments

@pytest.mark.parametrize("eos", ["12", [2, None], [2, 1.0], -3, [True], {"a": 1}])
def test_bad_eos_ids_are_refused(eos):
    tlm, dlm, _ = _decoders()
    for make in (lambda: SpecDecoder(tlm, dlm, eos_token_id=eos), lambda: TargetOnlyDecoder(tlm, eos_token_id=eos)):
        with pytest.raises(SpecdecError, match="eos_token_id"):
            make()


def test_eos_ids_as_ids_still_work():
    tlm, dlm, lm = _decoders()
    out = reference_greedy(lm, IDS, 20, 64)
    want = out[:out.index(out[4]) + 1]
    for eos in (out[4], [out[4]], (out[4], 2), {out[4]}):
        assert SpecDecoder(tlm, dlm, eos_token_id=eos).generate(IDS, max_new_tokens=20).generated_ids == want


@pytest.mark.parametrize("kw, needle", [
    ({"top_k": 5.0}, "top-k"), ({"temperature": 0.7, "top_k": 5.0}, "top-k"),
    ({"prompt_index": -1}, "prompt_index"), ({"prompt_index": "x"}, "prompt_index"),
    ({"prompt_index": 1.5}, "prompt_index"), ({"stop_strings": 5}, "stop_strings"),
    ({"stop": 5}, "stop_strings"), ({"on_tokens": lambda ids: None}, "on_tokens"),
    ({"on_tokens": lambda a, b, c: None}, "on_tokens"), ({"on_tokens": 5}, "on_tokens"),
    ({"rng": 5, "temperature": 0.5}, "rng"), ({"sampling": 0.5}, "sampling"),
    ({"temperature": "hot"}, "sampling"),
])
def test_bad_api_arguments_are_refused_before_any_call(word_tok, kw, needle):
    tlm, dlm, _ = _decoders()
    for dec in (SpecDecoder(tlm, dlm, tokenizer=word_tok), TargetOnlyDecoder(tlm, tokenizer=word_tok)):
        calls = tlm.calls
        with pytest.raises(SpecdecError, match=needle) as e:
            dec.generate(IDS, max_new_tokens=8, **kw)
        assert "\n" not in str(e.value) and tlm.calls == calls


def test_several_prompts_want_a_three_argument_callback():
    tlm, dlm, _ = _decoders()
    dec = SpecDecoder(tlm, dlm)
    with pytest.raises(SpecdecError, match="on_tokens"):
        dec.generate_many([IDS, [3, 4]], max_new_tokens=4, on_tokens=lambda ids, src: None)
    seen = []
    dec.generate_many([IDS, [3, 4]], max_new_tokens=4, on_tokens=lambda i, ids, src: seen.append(i))
    assert sorted(set(seen)) == [0, 1]


def test_sampling_params_refuse_non_integers():
    for bad in ({"top_k": 5.0}, {"top_k": True}, {"seed": 1.0}, {"temperature": "0.5"}, {"top_p": None}):
        with pytest.raises(SpecdecError):
            SamplingParams(**bad)
    assert SamplingParams(0.7, top_k=5, seed=3).top_k == 5


# ----------------------------------------------------------------------------- the end of a stream

def test_a_stream_ends_with_the_trailing_incomplete_character(byte_tok):
    vocab = len(byte_tok)
    tlm, dlm, lm = fake_pair(vocab=vocab, k=3, ctx_len=64)
    prompt = byte_tok("Voil")["input_ids"]
    cases = 0
    for n in range(1, 30):
        out = reference_greedy(lm, prompt, n, 64)
        text = byte_tok.decode(out, skip_special_tokens=True)
        if not text.endswith("\ufffd"):
            continue
        cases += 1
        for dec in (SpecDecoder(tlm, dlm, tokenizer=byte_tok), TargetOnlyDecoder(tlm, tokenizer=byte_tok)):
            assert "".join(dec.stream(prompt, max_new_tokens=n)) == text
    assert cases >= 2                       # the fake's bytes end mid-character in some lengths
