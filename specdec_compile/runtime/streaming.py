"""Streaming and stopping as Hugging Face users know them.

* ``StopStrings``: end a generation at the token that completes one of the
  strings (HF's ``stop_strings``: the text keeps the stop string).
* ``TokenSink``: what ``on_tokens`` gathers from a generation: text chunks
  (incrementally detokenized, whole characters only) with a tokenizer that has
  ``decode``, token-id lists without; and forwards each accepted group to an HF streamer
  (``TextStreamer`` / ``TextIteratorStreamer``: ``put`` gets the prompt first,
  then the new ids, as ``[n]`` NumPy arrays; ``end`` when the generation ends).
"""
from __future__ import annotations

import numpy as np


class StopStrings:
    """Stop strings, with the semantics of transformers' ``StopStringCriteria``: a token stops
    the generation when a stop string ends inside its text (the text before it may be the
    prompt's: prompt "Hello wor", output "ld!", stop string "world" stops at "ld!"). A stop
    string wholly inside the prompt stops nothing.

    ``cut(ids, n_new)``: ``ids`` holds the prompt and the generated ids, the last ``n_new`` of
    them new; returns how many of the new ones to keep (through the one that completes a stop
    string) or None. Only the text of the last tokens is decoded: enough for the longest stop
    string at one UTF-8 byte per token (a byte-level tokenizer may spend one token per byte of
    an emoji or a rare CJK character) plus a margin."""

    MARGIN = 8

    def __init__(self, tokenizer, strings: list[str]):
        self.tok = tokenizer
        self.strings = list(strings)
        self.window = max(len(s.encode("utf-8")) for s in self.strings) + self.MARGIN

    def _text(self, ids) -> str:
        return self.tok.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)

    def cut(self, ids: list[int], n_new: int) -> int | None:
        base = len(ids) - n_new
        for j in range(1, n_new + 1):
            end = base + j
            lo = max(0, end - self.window)
            text, before = self._text(ids[lo:end]), self._text(ids[lo:end - 1])
            b = 0           # the text that token end-1 did not change
            while b < min(len(text), len(before)) and text[b] == before[b]:
                b += 1
            if any(text.find(s, max(0, b - len(s) + 1)) >= 0 for s in self.strings):
                return j
        return None


class TokenSink:
    """An ``on_tokens`` callback that keeps what a stream yields next (``take``) and feeds
    an HF streamer; ``user`` (a caller's own on_tokens) is called first."""

    def __init__(self, tokenizer, prompt: list[int], *, streamer=None, user=None, chunks: bool = True):
        from .tokenizer import StreamDecoder
        # a tokenizer that cannot decode (only its length, for the vocabulary) streams ids, as none does
        self.decoder = StreamDecoder(tokenizer, prompt) if callable(getattr(tokenizer, "decode", None)) else None
        self.streamer, self.user, self.keep = streamer, user, chunks
        self.pending: list = []
        if streamer is not None:
            streamer.put(np.asarray([prompt], dtype=np.int64))

    def __call__(self, ids, sources) -> None:
        if self.user is not None:
            self.user(ids, sources)
        if self.streamer is not None:
            self.streamer.put(np.asarray(list(ids), dtype=np.int64))
        if not self.keep:
            return
        if self.decoder is None:
            self.pending.append([int(t) for t in ids])
            return
        text = "".join(self.decoder.push(t) for t in ids)
        if text:
            self.pending.append(text)

    def take(self) -> list:
        out, self.pending = self.pending, []
        return out

    def flush(self) -> list:
        """At the end: the text the decoder held back (a trailing incomplete character), as one chunk."""
        text = self.decoder.flush() if self.decoder is not None and self.keep else ""
        return [text] if text else []

    def end(self) -> None:
        if self.streamer is not None:
            self.streamer.end()
