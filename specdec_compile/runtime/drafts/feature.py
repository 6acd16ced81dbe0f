"""Drafts from a feature draft (EAGLE-style): a head that reads the target's own hidden states.

The pair (contract sections 2, 5 and 6): a TLM compiled with ``--hidden-states
LAYERS`` returns, with its logits, the feature f_p of every position p it runs;
a DLM compiled with ``--role dlm --feature-layers LAYERS`` takes, at each row,
a token and a feature, and returns its logits and its own ``draft_hidden_states``.
Row at position p: the token x_p and the target's feature f_{p-1} (zeros at
p = 0). The loop, one row of a batch:

* the TLM's prefill chunks and each verification hand the drafter the target's
  features of the tokens the TLM keeps (``verified``: TargetStep.outputs);
* there is no first draft from the prompt alone (``first`` returns None): the
  first token is the target's own, from the prefill's logits;
* each round (``draft(seq, q, n)``, x_{q-1} the last token, the TLM behind it
  by that one token) first *ingests* every row the draft's cache does not hold
  with target features: positions valid..q-1 with (x_p, f_{p-1}). After the
  prompt that is the whole prompt and x_n (PL chunks, the last one padded);
  after a round with a accepted drafts it is the a drafts and the bonus token,
  a+1 <= k+1 rows in one call of a compiled width. The last row's logits give
  d1 (for position q), its ``draft_hidden_states`` row f^_{q-1};
* then one seq_len-1 call per further draft: (d_i, f^_{q+i-2}) at q+i-1 gives
  d_{i+1} and f^_{q+i-1}: the draft's own feature stands in for the target's,
  which is not known until the TLM verifies d_i;
* the rows of drafted tokens were written with stand-in features, so the
  draft's cache holds target-fed rows only below q (``valid``): the next round
  rewrites q.. with the target's features, whatever was accepted;
* a draft with an own-feature slot (an EAGLE-3 head: manifest ``own_offset``)
  reads n target layers: its rows are [f_{p-1} ; 0] when ingested and
  [0 ; f^_{p-1}] when drafted (contract section 2).

Greedy output is the target's whatever the draft proposes (drafts are checked
against the target's tokens), so a wrong pairing shows only as low acceptance;
tests/runtime/drafts/test_feature_draft.py checks that the pairing is this one.
"""
from __future__ import annotations

import numpy as np

from ...errors import SpecdecError
from ..pairing import check_feature_pair
from .dlm import DlmDraft, DlmDrafter


class FeatureDraft(DlmDraft):
    """A feature-draft DLM backend as a draft source (see the module doc).
    ``tokenizer`` / ``dlm_tokenizer`` as for :class:`~.dlm.DlmDraft`."""

    kind = "feature"

    def bind(self, tlm) -> None:
        self.check_target(tlm)
        d = self.backend.artifact
        fd = d.feature_draft
        if fd is None:
            raise SpecdecError(f"{d.path}: not a feature draft (compiled without --feature-layers)")
        check_feature_pair(tlm.artifact, d)
        self.target_output = tlm.artifact.hidden_states.get("output", "hidden_states")
        self.input_name = fd.get("input", "hidden_states")
        self.own_output = fd.get("draft_output", "draft_hidden_states")
        self.width = int(fd["width"])
        # an EAGLE-3 head (contract section 2): its input is [target features (target_width) ; own slot]
        self.target_width = int(fd.get("target_width", self.width))
        self.own_offset = fd.get("own_offset")
        if self.target_output not in tlm.extra_outputs:
            raise SpecdecError(f"the {tlm.kind} backend of {tlm.artifact.path} does not return "
                               f"{self.target_output!r}, which the feature draft reads")
        if self.input_name not in self.backend.extra_inputs or self.own_output not in self.backend.extra_outputs:
            raise SpecdecError(f"the {self.backend.kind} backend of {d.path} does not pass the feature "
                               f"draft's {self.input_name!r} / {self.own_output!r}")
        self._bind_pair(tlm)

    def drafter(self, ctx) -> "FeatureDrafter":
        return FeatureDrafter(self, ctx)

    def __repr__(self):
        return f"FeatureDraft({self.backend.artifact.path})"


class FeatureDrafter(DlmDrafter):
    """One sequence: the target's features so far, and how far the draft's cache
    holds rows fed with them (``valid``)."""

    def __init__(self, source: FeatureDraft, ctx):
        super().__init__(source, ctx)
        self.src = source
        b = source.backend
        self.feats = np.zeros((b.ctx_len, source.target_width), np.float32)   # f_p of every position kept
        self.known = 0                                                  # f_p known for p < known
        decode = [w for w in b.seq_lens if w < b.prefill_len]
        self.widest = max(decode, default=0)                            # wider catch-ups run as prefill chunks

    def first(self, prompt):
        """No draft from the prompt alone: the first token is the target's (its rows ride with
        the first round's catch-up, where the target's feature of the last prompt token is known)."""
        return None

    def verified(self, step) -> None:
        rows = step.outputs.get(self.src.target_output)
        if rows is None:
            raise SpecdecError(f"the TLM returned no {self.src.target_output!r} for the feature draft")
        n = len(step.tokens)
        self.feats[step.start:step.start + n] = rows[:n]
        self.known = step.start + n

    def _inputs(self, p0: int, q: int) -> dict:
        """The feature rows of positions p0..q-1: f_{p-1} (zeros at p = 0)."""
        if self.known < q - 1:
            raise AssertionError(f"target features known below {self.known}, rows up to {q - 1} asked for")
        rows = np.zeros((q - p0, self.src.width), np.float32)   # an own slot, if any, stays zero
        lo = max(p0, 1)
        rows[lo - p0:, :self.src.target_width] = self.feats[lo - 1:q - 1]
        return {self.src.input_name: rows}

    def _own_input(self, own) -> dict:
        """The input row of a drafted token: the draft's own feature (in the own slot, zeros elsewhere)."""
        if self.src.own_offset is None:
            return {self.src.input_name: own[None]}
        row = np.zeros((1, self.src.width), np.float32)
        row[0, int(self.src.own_offset):] = own
        return {self.src.input_name: row}

    def _ingest(self, tokens, p0: int, inputs: dict):
        """(generator) Run rows p0.. of the text with the target's features; returns (logits of the
        last row, the draft's own feature there)."""
        L, r = len(tokens), self.r
        if L > self.widest:                      # the prompt, or a catch-up after rounds without drafts
            logits = yield from r.prefill(tokens, p0, inputs=inputs)
            return logits, r.outputs[self.src.own_output][r.taken - 1]
        width = min(w for w in r.b.seq_lens if w >= L)
        logits = (yield from r.call(tokens, p0, width, inputs=inputs))[0]
        return logits, r.outputs[self.src.own_output][L - 1]

    def draft(self, seq, q: int, n: int):
        """(generator) Up to ``n`` drafts for positions q.. (the rows below q first, with target
        features)."""
        if n <= 0:
            return []
        p0 = self.valid
        logits, own = yield from self._ingest(seq[p0:q], p0, self._inputs(p0, q))
        self.valid = q
        last = [own]

        def step(tok, pos):
            out = (yield from self.r.call([tok], pos, 1, inputs=self._own_input(last[0])))[0]
            last[0] = self.r.outputs[self.src.own_output][0]
            return out
        return (yield from self.chain(logits, q, n, step))
