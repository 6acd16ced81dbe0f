"""Tokenizers from local directories, and the checks that TLM and DLM share one
(the same tokens for the ids both can emit, the same special tokens; their
lengths, like the models' table sizes, may differ)."""
from __future__ import annotations

import os
from pathlib import Path

from ..errors import SpecdecError


def load_tokenizer(path):
    """A ``transformers`` tokenizer from a local directory (never downloads). An empty path is
    refused: ``Path("")`` is the working directory, whose tokenizer would load unasked."""
    if not os.fspath(path):
        raise SpecdecError("no tokenizer directory given (an empty path)")
    p = Path(path)
    if not p.is_dir():
        raise SpecdecError(f"{p}: no such tokenizer directory")
    try:
        from transformers import AutoTokenizer
    except ImportError:
        raise SpecdecError("--tokenizer needs the transformers package (pip install transformers)") from None
    try:   # transformers' own warnings stay under the application's logging settings
        tok = AutoTokenizer.from_pretrained(str(p), local_files_only=True)
    except Exception as e:  # transformers raises many kinds
        msg = " ".join(str(e).split())[:200]
        raise SpecdecError(f"{p}: cannot load a tokenizer from it ({type(e).__name__}: {msg})") from None
    return tok


def eos_ids(tok, tokenizer_dir=None) -> list[int]:
    """Every end-of-sequence id: the tokenizer's, plus ``eos_token_id`` of the
    generation_config.json beside it (an id or a list; instruct models list
    several, and HF ``generate`` stops at each)."""
    ids = []
    if getattr(tok, "eos_token_id", None) is not None:
        ids.append(int(tok.eos_token_id))
    if tokenizer_dir is not None:
        gc = Path(tokenizer_dir) / "generation_config.json"
        if gc.is_file():
            import json
            try:
                val = json.loads(gc.read_text(encoding="utf-8")).get("eos_token_id")
            except (ValueError, UnicodeDecodeError, AttributeError, RecursionError):
                raise SpecdecError(f"{gc}: not a JSON object") from None
            vals = val if isinstance(val, list) else ([] if val is None else [val])
            for v in vals:
                if isinstance(v, bool) or not isinstance(v, int):
                    raise SpecdecError(f"{gc}: eos_token_id {val!r} is not an id or a list of ids")
                ids.append(v)
    return sorted(set(ids))


def tokenizer_vocab_size(tok) -> int:
    return len(tok)


def check_tokenizer_fits(tok, vocab_size: int | None, what: str) -> None:
    """Every token id of ``tok`` must be a row of the model's logits."""
    if vocab_size and tokenizer_vocab_size(tok) > vocab_size:
        raise SpecdecError(f"the tokenizer has {tokenizer_vocab_size(tok)} tokens but the {what} "
                           f"has a vocabulary of {vocab_size}: they do not belong together")


#: the named special tokens both tokenizers must agree on
SPECIAL_TOKENS = (("eos_token", "EOS"), ("bos_token", "BOS"), ("pad_token", "pad"), ("unk_token", "unknown"))


def _tokens_by_id(tok) -> dict[int, str]:
    return {i: t for t, i in tok.get_vocab().items()}


def check_tokenizers_agree(tlm_tok, dlm_tok, limit: int | None = None) -> int:
    """TLM and DLM tokenizers must be one tokenizer where it matters: the same
    token for every id both can emit (ids below both lengths and ``limit``, the
    smaller logits width), and the same special tokens. Their lengths may differ.
    Returns the number of ids compared; a mismatch names the first id that differs.
    """
    for tok, who in ((tlm_tok, "TLM"), (dlm_tok, "DLM")):
        if not (callable(getattr(tok, "get_vocab", None)) and hasattr(tok, "__len__")):
            raise SpecdecError(f"the {who} tokenizer ({type(tok).__name__}) has no get_vocab() or length, so the "
                               f"pair's tokenizers cannot be compared; give a tokenizer object or a local directory")
    n = min(tokenizer_vocab_size(tlm_tok), tokenizer_vocab_size(dlm_tok), limit or 1 << 62)
    if tlm_tok is dlm_tok:
        return n
    a, b = _tokens_by_id(tlm_tok), _tokens_by_id(dlm_tok)
    for i in range(n):
        if a.get(i) != b.get(i):
            raise SpecdecError(f"TLM and DLM tokenizers differ at id {i}: {a.get(i)!r} (TLM) vs "
                               f"{b.get(i)!r} (DLM); speculative decoding needs one shared tokenizer")
    for attr, what in SPECIAL_TOKENS:
        ia, ib = getattr(tlm_tok, f"{attr}_id", None), getattr(dlm_tok, f"{attr}_id", None)
        if ia != ib:
            raise SpecdecError(f"TLM and DLM tokenizers differ in the {what} token: id {ia} "
                               f"({getattr(tlm_tok, attr, None)!r}, TLM) vs id {ib} ({getattr(dlm_tok, attr, None)!r}, "
                               f"DLM)")
    sa = {i for i in getattr(tlm_tok, "all_special_ids", ()) if i is not None and i < n}
    sb = {i for i in getattr(dlm_tok, "all_special_ids", ()) if i is not None and i < n}
    if sa != sb:
        first = min(sa ^ sb)
        raise SpecdecError(f"TLM and DLM tokenizers differ in their special tokens: id {first} "
                           f"({a.get(first)!r}) is special for the {'TLM' if first in sa else 'DLM'} only")
    return n


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

    def flush(self) -> str:
        """At the end of a generation: the text held back (an incomplete character, shown as
        U+FFFD, and whatever came with it), as ``TextIteratorStreamer.end()`` gives it."""
        if self.read == len(self.ids):
            return ""
        before = self._decode(self.ids[self.prefix:self.read])
        after = self._decode(self.ids[self.prefix:])
        self.prefix = self.read = len(self.ids)
        return after[len(before):]
