"""HF-style arguments that the generate API read wrongly or answered with a traceback: an
attention mask ignored (a text or chat prompt) or read as anything non-zero (2, -1, 0.5, NaN), a
second mask or a tokenizer output's token_type_ids passed over, ``max_length`` counted without a
padded batch's padding, a tokenizer's ids truncated by ``int()`` (1.5 -> 1), an empty tokenizer
path loading the working directory's tokenizer. On fakes (testing.py) with a real word-level
tokenizer; each test failed before the fix."""
from __future__ import annotations

import numpy as np
import pytest
from runtime_helpers import reference_greedy

from specdec_compile.errors import SpecdecError
from specdec_compile.runtime import SpecDecoder, TargetOnlyDecoder
from specdec_compile.runtime.testing import fake_pair
# the shared prompt, ids, chat template and tokenizer fixtures of the HF-argument tests
from test_hf_args import CHAT, IDS, TEXT, V, tok, tok_dir  # noqa: F401


def _decoders(tok, batch_size=1):
    tlm, dlm, lm = fake_pair(vocab=V, k=3, batch_size=batch_size, ctx_len=64)
    return SpecDecoder(tlm, dlm, tokenizer=tok), TargetOnlyDecoder(tlm, tokenizer=tok), lm


def _one_line_error(call, needle):
    with pytest.raises(SpecdecError) as e:
        call()
    assert needle in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_attention_mask_applies_to_a_text_or_chat_prompt(tok):
    """A text prompt's (or a chat's) mask was ignored, shape and all: the masked tokens were generated from."""
    spec, base, lm = _decoders(tok)
    want = reference_greedy(lm, IDS[2:], 8, 64)
    for dec in (spec, base):
        r = dec.generate(TEXT, attention_mask=[0, 0] + [1] * 8, max_new_tokens=8)
        assert r.prompt_ids == IDS[2:] and r.generated_ids == want
        _one_line_error(lambda: dec.generate(TEXT, attention_mask=[1] * 3, max_new_tokens=8),
                        "attention_mask has shape")
    tok.chat_template = CHAT
    spec, _, lm = _decoders(tok)
    ids = tok("w5 w9 w3")["input_ids"]
    r = spec.generate(messages=[{"role": "user", "content": "w5 w9"}], attention_mask=[0, 1, 1], max_new_tokens=6)
    assert r.prompt_ids == ids[1:] and r.generated_ids == reference_greedy(lm, ids[1:], 6, 64)


@pytest.mark.parametrize("value", [2, -1, 0.5, np.nan])
def test_attention_mask_of_other_values_is_refused(tok, value):
    """2, -1, 0.5 and NaN were read as 'keep' (anything != 0): a mask no tokenizer makes, silently guessed."""
    spec, _, _ = _decoders(tok, batch_size=2)
    mask = np.ones((2, 10))
    mask[1, 0] = value
    _one_line_error(lambda: spec.generate(np.array([IDS, IDS[::-1]]), attention_mask=mask, max_new_tokens=2),
                    "attention_mask must hold 1 (token) and 0 (padding) only")


def test_a_second_mask_and_a_mappings_token_types_are_checked(tok):
    """``generate(enc, attention_mask=m)``: ``m`` silently replaced the encoding's own mask; the
    encoding's token_type_ids were never looked at (the keyword's were)."""
    spec, _, _ = _decoders(tok)
    enc = {"input_ids": np.array([IDS]), "attention_mask": np.ones((1, 10), dtype=np.int64)}
    _one_line_error(lambda: spec.generate(enc, attention_mask=np.array([[0] + [1] * 9]), max_new_tokens=2),
                    "give the attention mask once")
    enc = {"input_ids": np.array([IDS]), "token_type_ids": np.array([[0] * 5 + [1] * 5])}
    _one_line_error(lambda: spec.generate(enc, max_new_tokens=2), "token_type_ids other than 0")
    enc["token_type_ids"] = np.zeros((1, 10), dtype=np.int64)
    assert len(spec.generate(enc, max_new_tokens=2).generated_ids) == 2


def test_max_length_counts_a_padded_batchs_padding(tok):
    """HF counts the padded width in max_length: a batch padded to 16 tokens with max_length=20 makes 4 new
    tokens per row. The longest unpadded prompt (10) was counted: 10 new tokens."""
    spec, base, lm = _decoders(tok, batch_size=2)
    tok.pad_token = "<unk>"
    texts = [TEXT, "w5 w6"]
    for side in ("left", "right"):
        tok.padding_side = side
        enc = tok(texts, padding="max_length", max_length=16, return_tensors="np")
        assert enc["input_ids"].shape == (2, 16)
        for dec in (spec, base):
            got = dec.generate(**enc, max_length=20)
            assert [r.generated_ids for r in got] == [reference_greedy(lm, tok(t)["input_ids"], 4, 64) for t in texts]
    # unpadded prompts: the longest counts, as before
    assert [len(r.generated_ids) for r in spec.generate([IDS, IDS[:3]], max_length=14)] == [4, 4]


@pytest.mark.parametrize("value", [12.0, True, "20"])
def test_max_length_that_is_no_integer_says_so(tok, value):
    """max_length=12.0 was refused as 'leaves no room to generate after the 10-token prompt': untrue."""
    spec, _, _ = _decoders(tok)
    _one_line_error(lambda: spec.generate(IDS, max_length=value), "max_length must be an integer")


class _Tok:
    """A tokenizer object whose encoding is whatever it was given."""

    chat_template = "x"

    def __init__(self, out):
        self.out = out

    def __call__(self, text):
        return self.out

    def apply_chat_template(self, messages, **kw):
        return self.out["input_ids"] if isinstance(self.out, dict) else self.out

    def decode(self, ids, **kw):
        return " ".join(f"w{i}" for i in ids)


@pytest.mark.parametrize("out, needle", [
    ({"input_ids": [5, 9.7]}, "expected a list of integer token ids"),
    ({"input_ids": np.array([5.0, 9.0])}, "expected a list of integer token ids"),
    ({"input_ids": [[5, 9], [6, 7]]}, "expected a list of integer token ids"),
    ({"input_ids": "w5"}, "expected a list of integer token ids"),
    (None, "is no mapping with 'input_ids'"),
    ([5, 9], "is no mapping with 'input_ids'"),
])
def test_a_tokenizers_odd_output_is_refused(tok, out, needle):
    """Float ids were truncated by int() (9.7 -> 9: another prompt, silently); None, a plain list or rows
    were tracebacks (TypeError, ValueError)."""
    spec, _, _ = _decoders(tok)
    _one_line_error(lambda: spec.generate(TEXT, tokenizer=_Tok(out), max_new_tokens=2), needle)
    if isinstance(out, dict):
        _one_line_error(lambda: spec.generate(messages=[{"role": "user", "content": "w5"}], tokenizer=_Tok(out),
                                              max_new_tokens=2), needle)


def test_a_tokenizers_one_row_array_is_its_ids(tok):
    spec, _, lm = _decoders(tok)
    r = spec.generate(TEXT, tokenizer=_Tok({"input_ids": np.array([IDS])}), max_new_tokens=4)
    assert r.prompt_ids == IDS and r.generated_ids == reference_greedy(lm, IDS, 4, 64)


def test_an_empty_tokenizer_path_is_refused(tok, tok_dir, monkeypatch):
    """tokenizer="" is Path("") = the working directory: its tokenizer (if any) loaded unasked."""
    monkeypatch.chdir(tok_dir)
    spec, _, _ = _decoders(None)
    _one_line_error(lambda: spec.generate(TEXT, tokenizer="", max_new_tokens=2), "an empty path")
    _one_line_error(lambda: SpecDecoder(*fake_pair(vocab=V, k=3)[:2], tokenizer=""), "an empty path")


def test_a_huge_id_in_a_row_is_named_out_of_range(tok):
    """[[5, 2**64 - 1], [5]]: NumPy read the row as float64 and the message said 'not integer ids'."""
    spec, _, _ = _decoders(tok, batch_size=2)
    _one_line_error(lambda: spec.generate([[5, 2 ** 64 - 1], [5]], max_new_tokens=2), "out of range")


def test_pad_token_id_without_a_mask_is_padding_as_in_hf(tok):
    """HF's generate builds the mask from pad_token_id when none is given (unless the id is an EOS id);
    the pads were decoded as prompt text here. Padding between tokens is refused, as a mask's is."""
    spec, base, lm = _decoders(tok)
    want = [reference_greedy(lm, IDS[2:], 6, 64), reference_greedy(lm, IDS[:8], 6, 64)]
    batch = np.array([[0, 0] + IDS[2:], IDS[:8] + [0, 0]])
    for dec in (spec, base):
        rs = dec.generate(batch, pad_token_id=0, max_new_tokens=6)
        assert [r.prompt_ids for r in rs] == [IDS[2:], IDS[:8]]
        assert [r.generated_ids for r in rs] == want
        _one_line_error(lambda: dec.generate([5, 0, 9], pad_token_id=0, max_new_tokens=4), "padding between")
        _one_line_error(lambda: dec.generate([[0, 5, 9], [5]], pad_token_id=0, max_new_tokens=4),
                        "different lengths")
        _one_line_error(lambda: dec.generate([5, 9], pad_token_id=-1, max_new_tokens=4), "pad_token_id must be")
        # a given mask wins; an id the prompt does not hold changes nothing
        r = dec.generate([0, 5, 9], pad_token_id=0, attention_mask=[1, 1, 1], max_new_tokens=4)
        assert r.prompt_ids == [0, 5, 9]
        assert dec.generate([5, 9], pad_token_id=0, max_new_tokens=4).prompt_ids == [5, 9]
    # pad_token_id that is an EOS id: HF masks nothing (a chat's end-of-turn token is text)
    tlm, dlm, lm = fake_pair(vocab=V, k=3, ctx_len=64)
    for dec in (SpecDecoder(tlm, dlm, eos_token_id=[2]), TargetOnlyDecoder(tlm, eos_token_id=2)):
        assert dec.generate([5, 2, 9], pad_token_id=2, max_new_tokens=4).prompt_ids == [5, 2, 9]
