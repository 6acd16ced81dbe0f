"""Printing a generation as it streams: the prompt dimmed, accepted drafts in green."""
from __future__ import annotations


class Stream:
    def __init__(self, tok, console, enabled: bool):
        from specdec_compile.runtime.tokenizer import StreamDecoder
        self._SD = StreamDecoder
        self.tok, self.console, self.enabled = tok, console, enabled
        self.sd = None

    def start(self, prompt_ids, title: str, shown: str | None = None):
        """A rule with ``title``, then the prompt (``shown``, or the decoded ids) dimmed."""
        if not self.enabled:
            return
        self.console.rule(title, style="dim")
        text = self.tok.decode(prompt_ids) if shown is None else shown
        self.console.print(text, style="dim", end="", highlight=False, markup=False)
        self.sd = self._SD(self.tok, prompt_ids)

    def __call__(self, ids, sources):
        if not self.enabled:
            return
        for t, s in zip(ids, sources):
            text = self.sd.push(t)
            if text:
                self.console.print(text, style="green" if s == "draft" else "bold", end="",
                                   highlight=False, markup=False, soft_wrap=True)

    def end(self):
        if self.enabled:
            self.console.print()
