"""``--interface qeff``: what the artifact writer needs beyond the graph (contract section 7).

QEfficient (quic/efficient-transformers) builds its specializations with
continuous batching as: prefill ``{batch_size: 1, seq_len: PL, ctx_len,
num_logits_to_keep: 1 (TLM), full_batch_size, full_batch_exec_size: 1}``, then
one decode per K of its list (``num_speculative_tokens``, 0 allowed: a plain
decode) ``{batch_size: full_batch_size, seq_len: K+1, ctx_len,
num_logits_to_keep: K+1, full_batch_size}``; a DLM's decode is ``seq_len 1``
without ``num_logits_to_keep``. Here ``--batch-size`` is ``full_batch_size``.
Keys are in that order, values strings (the flat file format, which works
with several devices).
"""
from __future__ import annotations

from ..contract import BATCH_INDEX, FULL_BATCH, NUM_LOGITS_TO_KEEP
from ..errors import SpecdecError


def check_qeff_options(options) -> None:
    """One-line refusal of what QEfficient's interface cannot express."""
    if options.hidden_states or options.feature_layers:
        raise SpecdecError("--interface qeff has no hidden-state inputs or outputs: drop --hidden-states / "
                           "--feature-layers, or use the default interface")
    if options.role == "tlm" and options.k is not None:
        too_wide = [j for j in sorted({options.k, *options.k_list}) if j + 1 > options.prefill_len]
        if too_wide:
            raise SpecdecError(f"--interface qeff: k={too_wide[0]} needs num_logits_to_keep {too_wide[0] + 1}, "
                               f"more than --prefill-len {options.prefill_len} (QEfficient requires "
                               f"prefill_seq_len >= num_speculative_tokens + 1)")


def specializations(options) -> list[list[tuple[str, int]]]:
    """QEfficient's specializations for these options: a list of (key, value) lists, in its key order."""
    fbs, tlm = options.batch_size, options.role == "tlm"
    prefill_batch = fbs if options.prefill_len == 1 else 1
    prefill = [("batch_size", prefill_batch), ("seq_len", options.prefill_len), ("ctx_len", options.ctx_len)]
    prefill += [(NUM_LOGITS_TO_KEEP, 1)] if tlm else []
    prefill += [(FULL_BATCH, fbs), ("full_batch_exec_size", prefill_batch)]
    specs = [prefill]
    for j in (options.widths() if tlm else [0]):
        decode = [("batch_size", fbs), ("seq_len", j + 1), ("ctx_len", options.ctx_len)]
        decode += [(NUM_LOGITS_TO_KEEP, j + 1)] if tlm else []
        specs.append(decode + [(FULL_BATCH, fbs)])
    return specs


def manifest_record(options) -> dict | None:
    """The manifest's ``qeff`` object (None for the default interface)."""
    if options.interface != "qeff":
        return None
    record = {"full_batch_size": options.batch_size, "batch_index": BATCH_INDEX,
              "specializations": [dict(s) for s in specializations(options)]}
    if options.role == "tlm":
        record["num_logits_to_keep"] = NUM_LOGITS_TO_KEEP
        record["num_speculative_tokens"] = options.widths()
    return record
