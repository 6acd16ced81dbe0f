"""``--interface qeff``: what the artifact writer needs beyond the graph (contract section 7).

QEfficient (quic/efficient-transformers, ``QEFFAutoModelForCausalLM``'s
``build_prefill_specialization`` / ``build_decode_specialization``) has two
interfaces, and so do we:

* plain SpD (``--interface qeff``): prefill ``{batch_size: B, seq_len: PL,
  ctx_len, num_logits_to_keep: 1 (TLM)}``, then one decode per K of its list
  (``num_speculative_tokens``, 0 allowed) ``{batch_size: B, seq_len: K+1, ctx_len,
  num_logits_to_keep: K+1}``; a DLM's decode is ``seq_len 1`` without
  ``num_logits_to_keep``. A decode whose seq_len equals PL is dropped as the
  prefill's duplicate, so such a K is refused here (the prefill keeps 1 column).
* continuous batching (``--full-batch-size N``, ``continuous_batching``): prefill
  ``{batch_size: 1, seq_len: PL, ctx_len, num_logits_to_keep: 1 (TLM),
  full_batch_size: N, full_batch_exec_size: 1}`` (batch N when PL is 1), decodes
  ``{batch_size: N, seq_len: K+1, ctx_len, num_logits_to_keep: K+1,
  full_batch_size: N}``. Here ``--batch-size`` is ``full_batch_size``.

Keys are in QEfficient's order, values strings, in the flat file format (the
one that works with several devices: docs/qefficient.md).
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
        widths = sorted({options.k, *options.k_list})
        too_wide = [j for j in widths if j + 1 > options.prefill_len]
        if too_wide:
            raise SpecdecError(f"--interface qeff: k={too_wide[0]} needs num_logits_to_keep {too_wide[0] + 1}, "
                               f"more than --prefill-len {options.prefill_len} (QEfficient requires "
                               f"prefill_seq_len >= num_speculative_tokens + 1)")
        same = [j for j in widths if j + 1 == options.prefill_len]
        if same and not options.continuous_batching:
            raise SpecdecError(f"--interface qeff: k={same[0]} verifies at seq_len {same[0] + 1} = --prefill-len, "
                               f"and QEfficient's plain interface drops that decode as the prefill's duplicate "
                               f"(whose num_logits_to_keep is 1): use --prefill-len {options.prefill_len + 1} "
                               f"or more, or --full-batch-size")


def specializations(options) -> list[list[tuple[str, int]]]:
    """QEfficient's specializations for these options: a list of (key, value) lists, in its key order."""
    B, tlm, cb = options.batch_size, options.role == "tlm", options.continuous_batching
    prefill_batch = B if (options.prefill_len == 1 or not cb) else 1
    prefill = [("batch_size", prefill_batch), ("seq_len", options.prefill_len), ("ctx_len", options.ctx_len)]
    prefill += [(NUM_LOGITS_TO_KEEP, 1)] if tlm else []
    prefill += [(FULL_BATCH, B), ("full_batch_exec_size", prefill_batch)] if cb else []
    specs = [prefill]
    for j in (options.widths() if tlm else [0]):
        if j + 1 == options.prefill_len and not cb:   # QEfficient's plain interface drops the prefill's twin
            continue
        decode = [("batch_size", B), ("seq_len", j + 1), ("ctx_len", options.ctx_len)]
        decode += [(NUM_LOGITS_TO_KEEP, j + 1)] if tlm else []
        specs.append(decode + ([(FULL_BATCH, B)] if cb else []))
    return specs


def manifest_record(options) -> dict | None:
    """The manifest's ``qeff`` object (None for the default interface): with continuous batching
    ``full_batch_size`` and ``batch_index``, without them ``batch_size``."""
    if options.interface != "qeff":
        return None
    if options.continuous_batching:
        record = {"full_batch_size": options.batch_size, "batch_index": BATCH_INDEX}
    else:
        record = {"batch_size": options.batch_size}
    record["specializations"] = [dict(s) for s in specializations(options)]
    if options.role == "tlm":
        record["num_logits_to_keep"] = NUM_LOGITS_TO_KEEP
        record["num_speculative_tokens"] = options.widths()
    return record
