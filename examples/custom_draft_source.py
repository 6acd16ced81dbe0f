"""Decode with a draft source of your own: drafts copied from a reference text.

    python examples/custom_draft_source.py TLM_ARTIFACT_DIR

A draft source has bind(tlm), backends() and drafter(ctx); a drafter has first, draft,
verified, rollback and finish (docs/serving.md, "the draft-source interface").
Drafts are only proposals: the target keeps the tokens it would have chosen itself.
"""
import sys

from specdec_compile.runtime import OrtBackend, SpecDecoder, TargetOnlyDecoder


class ReferenceDraft:
    """Find the sequence's last two tokens in a reference text; propose what follows there."""

    kind = "reference"

    def __init__(self, reference: list[int]):
        self.reference = list(reference)

    def bind(self, tlm) -> None:       # nothing to check against the target
        pass

    def backends(self) -> list:        # no draft model to reset or warm up
        return []

    def drafter(self, ctx) -> "ReferenceDraft":
        return self

    def draft(self, seq: list[int], q: int, n: int) -> list[int]:
        tail, ref = seq[q - 2:q], self.reference
        for i in range(len(ref) - 2, -1, -1):   # the latest occurrence wins
            if ref[i:i + 2] == tail:
                return ref[i + 2:i + 2 + n]
        return []

    def first(self, prompt):             # the first draft, right after the prefill
        d = self.draft(list(prompt), len(prompt), 1)
        return d[0] if d else None

    def verified(self, step) -> None: pass
    def rollback(self, valid: int) -> None: pass
    def finish(self, seq) -> None: pass


def main(tlm_dir: str) -> None:
    tlm = OrtBackend(tlm_dir)
    prompt = [5, 9, 33, 7, 100, 42]
    base = TargetOnlyDecoder(tlm).generate(prompt, max_new_tokens=32)
    reference = prompt + base.generated_ids   # a text the answer is known to follow
    res = SpecDecoder(tlm, draft=ReferenceDraft(reference)).generate(prompt, max_new_tokens=32)
    print("tokens per target call:", round(res.metrics.mean_tokens_per_tlm_call, 2))
    print("identical to target-only:", res.generated_ids == base.generated_ids)


if __name__ == "__main__":
    main(sys.argv[1])
