"""Streaming and stopping as Hugging Face users know them.

* ``StopStrings``: end a generation at the token that completes one of the
  strings (HF's ``stop_strings``: the text keeps the stop string).
* ``TokenSink``: what ``on_tokens`` gathers from a generation: text chunks
  (incrementally detokenized, whole characters only) with a tokenizer, token-id
  lists without; and forwards each accepted group to an HF streamer
  (``TextStreamer`` / ``TextIteratorStreamer``: ``put`` gets the prompt first,
  then the new ids, as ``[n]`` NumPy arrays; ``end`` when the generation ends).
"""
from __future__ import annotations

import numpy as np


class StopStrings:
    """Stop strings over the generated text. ``cut(out, n_new)``: ``out`` holds the
    generated ids, the last ``n_new`` of them new; returns how many of the new ones to
    keep (through the one that completes a stop string) or None.

    Only the text of the last tokens is decoded: enough tokens for the longest
    stop string (one character per token at least) plus a margin."""

    MARGIN = 8

    def __init__(self, tokenizer, strings: list[str]):
        self.tok = tokenizer
        self.strings = list(strings)
        self.window = max(len(s) for s in self.strings) + self.MARGIN

    def _text(self, ids) -> str:
        return self.tok.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)

    def cut(self, out: list[int], n_new: int) -> int | None:
        base = len(out) - n_new
        lo = max(0, base - self.window)
        for j in range(1, n_new + 1):
            text = self._text(out[lo:base + j])
            if any(s in text for s in self.strings):
                return j
        return None


class TokenSink:
    """An ``on_tokens`` callback that keeps what a stream yields next (``take``) and feeds
    an HF streamer; ``user`` (a caller's own on_tokens) is called first."""

    def __init__(self, tokenizer, prompt: list[int], *, streamer=None, user=None, chunks: bool = True):
        from .tokenizer import StreamDecoder
        self.decoder = StreamDecoder(tokenizer, prompt) if tokenizer is not None else None
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

    def end(self) -> None:
        if self.streamer is not None:
            self.streamer.end()
