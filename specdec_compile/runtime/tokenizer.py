"""Tokenizers from local directories, and the checks that TLM and DLM share one."""
from __future__ import annotations

from pathlib import Path

from ..errors import SpecdecError


def load_tokenizer(path):
    """A ``transformers`` tokenizer from a local directory (never downloads)."""
    p = Path(path)
    if not p.is_dir():
        raise SpecdecError(f"{p}: no such tokenizer directory")
    try:
        from transformers import AutoTokenizer
    except ImportError:
        raise SpecdecError("--tokenizer needs the transformers package (pip install transformers)") from None
    try:
        import logging
        logging.getLogger("transformers").setLevel(logging.ERROR)
        tok = AutoTokenizer.from_pretrained(str(p), local_files_only=True)
    except Exception as e:  # transformers raises many kinds
        msg = " ".join(str(e).split())[:200]
        raise SpecdecError(f"{p}: cannot load a tokenizer from it ({type(e).__name__}: {msg})") from None
    return tok


def tokenizer_vocab_size(tok) -> int:
    return len(tok)


def check_tokenizer_fits(tok, vocab_size: int | None, what: str) -> None:
    """Every token id of ``tok`` must be a row of the model's logits."""
    if vocab_size and tokenizer_vocab_size(tok) > vocab_size:
        raise SpecdecError(f"the tokenizer has {tokenizer_vocab_size(tok)} tokens but the {what} "
                           f"has a vocabulary of {vocab_size}: they do not belong together")


def check_same_tokenizer(tlm_tok, dlm_tok) -> None:
    """TLM and DLM tokenizers must map the same strings to the same ids and agree on EOS."""
    if tlm_tok is dlm_tok:
        return
    a, b = tokenizer_vocab_size(tlm_tok), tokenizer_vocab_size(dlm_tok)
    if a != b:
        raise SpecdecError(f"TLM and DLM tokenizers differ: {a} vs {b} tokens")
    if tlm_tok.get_vocab() != dlm_tok.get_vocab():
        va, vb = tlm_tok.get_vocab(), dlm_tok.get_vocab()
        diff = sorted(set(va.items()) ^ set(vb.items()))[:1]
        raise SpecdecError(f"TLM and DLM tokenizers differ: token {diff[0][0]!r} has different ids")
    if tlm_tok.eos_token_id != dlm_tok.eos_token_id:
        raise SpecdecError(f"TLM and DLM tokenizers differ in EOS: {tlm_tok.eos_token_id} vs {dlm_tok.eos_token_id}")


class StreamDecoder:
    """Incremental detokenization: text for new ids, holding back incomplete characters."""

    def __init__(self, tok, prompt_ids=(), skip_special_tokens: bool = True):
        self.tok = tok
        self.skip = skip_special_tokens
        # a few prompt tokens give the decoder its context (leading spaces)
        self.ids: list[int] = [int(t) for t in prompt_ids][-5:]
        self.prefix = 0
        self.read = len(self.ids)

    def _decode(self, ids) -> str:
        return self.tok.decode(ids, skip_special_tokens=self.skip, clean_up_tokenization_spaces=False)

    def push(self, token: int) -> str:
        self.ids.append(int(token))
        before = self._decode(self.ids[self.prefix:self.read])
        after = self._decode(self.ids[self.prefix:])
        if len(after) > len(before) and not after.endswith("\ufffd"):
            self.prefix, self.read = self.read, len(self.ids)
            return after[len(before):]
        return ""
