"""The generate API in the forms Hugging Face users hold: prompts as strings, id lists,
arrays, tokenizer outputs and chat messages; HF's generation keywords; stop strings;
text streaming (TextIteratorStreamer too); one-line errors. On fakes (testing.py) with
a real word-level tokenizer: greedy output is the target-only output, token for token."""
from __future__ import annotations

import logging
import threading

import numpy as np
import pytest
from runtime_helpers import make_tokenizer, reference_greedy

from specdec_compile.errors import SpecdecError
from specdec_compile.runtime import SamplingParams, SpecDecoder, TargetOnlyDecoder
from specdec_compile.runtime.testing import fake_pair

V = 211
TEXT = "w5 w9 w33 w7 w100 w42 w17 w3 w8 w55"
IDS = [5, 9, 33, 7, 100, 42, 17, 3, 8, 55]
CHAT = "{% for m in messages %}{{ m['content'] }} {% endfor %}{% if add_generation_prompt %}w3{% endif %}"


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    return make_tokenizer(tmp_path_factory.mktemp("hf_tok") / "tok", n=V)


@pytest.fixture
def tok(tok_dir):
    from specdec_compile.runtime.tokenizer import load_tokenizer
    return load_tokenizer(tok_dir)


def _pair(batch_size=1, **kw):
    tlm, dlm, lm = fake_pair(vocab=V, k=3, batch_size=batch_size, ctx_len=64, **kw)
    return tlm, dlm, lm


def _decoders(tok, batch_size=1):
    tlm, dlm, lm = _pair(batch_size)
    return SpecDecoder(tlm, dlm, tokenizer=tok), TargetOnlyDecoder(tlm, tokenizer=tok), lm


def test_every_prompt_form_gives_the_same_greedy_tokens(tok):
    spec, base, lm = _decoders(tok)
    want = reference_greedy(lm, IDS, 12, 64)
    forms = [TEXT, IDS, tuple(IDS), np.array(IDS), np.array([IDS], dtype=np.int32),
             {"input_ids": np.array([IDS])}, tok(TEXT, return_tensors="np")]
    for dec in (spec, base):
        for form in forms:
            r = dec.generate(form, max_new_tokens=12)
            assert r.generated_ids == want, type(form)
            assert r.text == tok.decode(want, skip_special_tokens=True)
        assert dec.generate(input_ids=np.array([IDS]), max_new_tokens=12).generated_ids == want


def test_torch_tensors_are_read_without_torch_in_the_package(tok):
    torch = pytest.importorskip("torch")
    spec, _, lm = _decoders(tok)
    want = reference_greedy(lm, IDS, 8, 64)
    assert spec.generate(torch.tensor([IDS]), max_new_tokens=8).generated_ids == want
    enc = tok(TEXT, return_tensors="pt")
    assert spec.generate(**enc, max_new_tokens=8).generated_ids == want


def test_batches_strings_arrays_and_padding_masks(tok):
    spec, base, lm = _decoders(tok, batch_size=2)
    texts = [TEXT, "w7 w8 w9", "w11 w12"]
    ids = [tok(t)["input_ids"] for t in texts]
    want = [reference_greedy(lm, p, 10, 64) for p in ids]
    for dec in (spec, base):
        assert [r.generated_ids for r in dec.generate(texts, max_new_tokens=10)] == want
        assert [r.generated_ids for r in dec.generate_many(texts, max_new_tokens=10)] == want
        got = dict(dec.stream(texts, max_new_tokens=10))
        assert [got[i].generated_ids for i in range(3)] == want
    tok.pad_token = "<unk>"
    for side in ("left", "right"):
        tok.padding_side = side
        enc = tok(texts, return_tensors="np", padding=True)
        assert enc["input_ids"].shape == (3, 10)
        assert [r.generated_ids for r in spec.generate(**enc, max_new_tokens=10)] == want
    same = np.array([IDS, IDS[::-1]])
    assert [r.generated_ids for r in spec.generate(same, max_new_tokens=6)] == \
        [reference_greedy(lm, list(p), 6, 64) for p in same]


def test_hf_keywords(tok):
    spec, base, lm = _decoders(tok)
    r = spec.generate(TEXT, max_length=len(IDS) + 7)
    assert len(r.generated_ids) == 7 and r.stop_reason == "max_new_tokens"
    assert len(spec.generate(TEXT, max_length=99, max_new_tokens=3).generated_ids) == 3   # HF: max_new_tokens wins
    greedy = reference_greedy(lm, IDS, 10, 64)
    assert spec.generate(TEXT, max_new_tokens=10, do_sample=False, temperature=0.9).generated_ids == greedy
    sampled = spec.generate(TEXT, max_new_tokens=10, do_sample=True, seed=7)
    # HF's defaults with do_sample=True: temperature 1, top_k 50
    assert sampled.generated_ids == base.generate(IDS, max_new_tokens=10,
                                                  sampling=SamplingParams(1.0, 50, 1.0, 7)).generated_ids
    assert sampled.generated_ids == base.generate(TEXT, max_new_tokens=10, do_sample=True, seed=7).generated_ids
    t = spec.generate(TEXT, max_new_tokens=10, temperature=0.7, top_k=5, top_p=0.9, seed=3)
    assert t.generated_ids == base.generate(IDS, max_new_tokens=10,
                                            sampling=SamplingParams(0.7, 5, 0.9, 3)).generated_ids
    assert spec.generate(TEXT, max_new_tokens=4, pad_token_id=0).generated_ids == greedy[:4]


def _stop_point(tok, ids, s):
    """How many tokens a generation stopped at ``s`` keeps: the first prefix whose text holds it."""
    for j in range(1, len(ids) + 1):
        if s in tok.decode(ids[:j], skip_special_tokens=True):
            return j
    return None


def test_stop_strings_end_the_text_where_it_appears(tok):
    spec, base, lm = _decoders(tok)
    full = reference_greedy(lm, IDS, 30, 64)
    words = [f"w{i}" for i in full if i > 2]
    s = " ".join(words[5:7])
    j = _stop_point(tok, full, s)
    assert j is not None and j < 30
    for dec in (spec, base):
        for kw in ({"stop_strings": s}, {"stop": [s, "no such text"]}):
            r = dec.generate(TEXT, max_new_tokens=30, **kw)
            assert r.generated_ids == full[:j] and r.stop_reason == "stop_string", kw
            assert r.text.endswith(s)
    rows = SpecDecoder(*_pair(batch_size=2)[:2], tokenizer=tok).generate_many([TEXT, TEXT], max_new_tokens=30,
                                                                               stop_strings=s)
    assert [r.generated_ids for r in rows] == [full[:j]] * 2


def test_stream_yields_text_chunks(tok):
    spec, base, lm = _decoders(tok)
    for dec in (spec, base):
        chunks = list(dec.stream(TEXT, max_new_tokens=15))
        assert all(isinstance(c, str) and c for c in chunks) and len(chunks) > 1
        assert "".join(chunks).strip() == tok.decode(reference_greedy(lm, IDS, 15, 64), skip_special_tokens=True)
    g = spec.stream(TEXT, max_new_tokens=5)
    with pytest.raises(StopIteration) as e:
        while True:
            next(g)
    assert e.value.value.generated_ids == reference_greedy(lm, IDS, 5, 64)
    no_tok = SpecDecoder(*_pair()[:2])
    assert sum(list(no_tok.stream(IDS, max_new_tokens=9)), []) == reference_greedy(lm, IDS, 9, 64)


def test_transformers_streamers(tok):
    from transformers import TextIteratorStreamer, TextStreamer
    spec, _, lm = _decoders(tok)
    want = tok.decode(reference_greedy(lm, IDS, 15, 64), skip_special_tokens=True)
    streamer = TextIteratorStreamer(tok, skip_prompt=True, timeout=30)
    box = {}
    t = threading.Thread(target=lambda: box.update(r=spec.generate(TEXT, max_new_tokens=15, streamer=streamer)))
    t.start()
    text = "".join(streamer)
    t.join()
    assert text.strip() == want == box["r"].text

    printed = []

    class Capture(TextStreamer):
        def on_finalized_text(self, text, stream_end=False):
            printed.append(text)
    spec.generate(TEXT, max_new_tokens=15, streamer=Capture(tok, skip_prompt=True))
    assert "".join(printed).strip() == want


def test_chat_messages(tok):
    tok.chat_template = CHAT
    spec, base, lm = _decoders(tok)
    msgs = [{"role": "user", "content": "w5 w9"}, {"role": "user", "content": "w7"}]
    ids = tok("w5 w9 w7 w3")["input_ids"]
    r = spec.generate(messages=msgs, max_new_tokens=8)
    assert r.prompt_ids == ids and r.generated_ids == reference_greedy(lm, ids, 8, 64)
    both = base.generate_many(messages=[msgs, msgs[:1]], max_new_tokens=4)
    assert [x.prompt_ids for x in both] == [ids, tok("w5 w9 w3")["input_ids"]]


def test_tokenizer_as_a_directory_or_an_object(tok, tok_dir):
    tlm, dlm, lm = _pair()
    want = reference_greedy(lm, IDS, 6, 64)
    assert SpecDecoder(tlm, dlm, tokenizer=str(tok_dir)).generate(TEXT, max_new_tokens=6).generated_ids == want
    assert SpecDecoder(tlm, dlm).generate(TEXT, tokenizer=tok, max_new_tokens=6).generated_ids == want
    assert TargetOnlyDecoder(tlm).generate(TEXT, tokenizer=tok_dir, max_new_tokens=6).text == \
        tok.decode(want, skip_special_tokens=True)


def test_loading_a_tokenizer_leaves_logging_alone(tok_dir):
    from specdec_compile.runtime.tokenizer import load_tokenizer
    logger = logging.getLogger("transformers")
    before = logger.level
    load_tokenizer(tok_dir)
    assert logger.level == before


@pytest.mark.parametrize("call, needle", [
    (lambda d: d.generate(IDS, num_beams=4), "does not support 'num_beams'"),
    (lambda d: d.generate_many([IDS], repetition_penalty=1.1, eos_token_id=2),
     "does not support 'eos_token_id', 'repetition_penalty'"),
    (lambda d: d.stream(TEXT, foo=1), "stream() does not support 'foo'"),
    (lambda d: d.generate(np.array([[1.0, 2.0]])), "integer token ids, got dtype float64"),
    (lambda d: d.generate(np.zeros((1, 2, 3), dtype=np.int64)), "[n] or [batch, n], got shape [1, 2, 3]"),
    (lambda d: d.generate(IDS, sampling=SamplingParams(), temperature=1.0), "either sampling= or temperature"),
    (lambda d: d.generate(IDS, do_sample=True, temperature=0.0), "do_sample=True needs temperature > 0"),
    (lambda d: d.generate(IDS, max_length=5), "max_length=5 leaves no room"),
    (lambda d: d.generate(IDS, stop="w5", stop_strings="w6"), "stop_strings= or stop=, not both"),
    (lambda d: d.generate(IDS, stop_strings=[""]), "non-empty string"),
    (lambda d: d.generate_many([IDS, IDS], streamer=object()), "put() and end()"),
    (lambda d: d.generate(np.array([IDS, IDS]), streamer=_Streamer()), "streams one prompt"),
    (lambda d: d.generate(messages=[{"role": "user", "content": "w5"}]), "no chat template"),
    (lambda d: d.generate(IDS, messages=[{"role": "user", "content": "w5"}]), "a prompt or messages="),
    (lambda d: d.generate(np.array([IDS]), attention_mask=np.array([[1, 0] * 5])), "padding between tokens"),
    (lambda d: d.generate(np.array([IDS]), attention_mask=np.ones((1, 3))), "attention_mask has shape"),
    (lambda d: d.generate([IDS, object()]), "prompt 2: expected a string or token ids"),
    (lambda d: d.generate([]), "empty prompt"),
    (lambda d: d.generate(IDS, max_new_tokens=-1), "max_new_tokens must be an integer >= 0"),
    (lambda d: d.generate(3.5), "expected a string, token ids or an integer array"),
])
def test_bad_arguments_are_one_line_errors(tok, call, needle):
    spec, _, _ = _decoders(tok)
    with pytest.raises(SpecdecError) as e:
        call(spec)
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_text_without_a_tokenizer_is_refused():
    tlm, dlm, _ = _pair()
    for call in (lambda d: d.generate("w5 w9"), lambda d: d.generate(IDS, stop_strings="w5"),
                 lambda d: d.generate(messages=[{"role": "user", "content": "w5"}])):
        with pytest.raises(SpecdecError, match="needs a tokenizer"):
            call(SpecDecoder(tlm, dlm))


class _Streamer:
    def put(self, value):
        pass

    def end(self):
        pass
