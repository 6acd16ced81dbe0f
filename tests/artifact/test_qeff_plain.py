"""--interface qeff without --full-batch-size against QEfficient's plain SpD export
(``continuous_batching=False``): no batch_index, a cache of batch_size rows, every call at
batch_size rows. Recorded from the llama_gqa weights at efficient-transformers ebf55e8
(scripts/record_qeff.py --plain): names, dtypes, dims and logits (the specializations: test_qeff.py)."""
from __future__ import annotations

import pytest
from qeff_helpers import BS, PL, PLAIN, Replay, assert_interface_is, assert_logits_are, recorded_calls, rewrite

from specdec_compile.errors import SpecdecError
from specdec_compile.options import Options


@pytest.mark.parametrize("role", ["tlm", "dlm"])
@pytest.mark.parametrize("target", ["ort", "qaic"])
def test_plain_interface_is_qeffs(fixture_path, role, target):
    """QEfficient's plain TLM: input_ids, position_ids, the caches, num_logits_to_keep (no
    batch_index); its DLM: input_ids, position_ids, the caches. Cache dim 0 is batch_size."""
    want = PLAIN[role]["interface"]
    assert "batch_index" not in [w["name"] for w in want["inputs"]]
    assert_interface_is(rewrite(fixture_path("llama_gqa"), role, target, cb=False).model, want, role)


@pytest.mark.parametrize("role", ["tlm", "dlm"])
@pytest.mark.parametrize("target", ["ort", "qaic"])
def test_plain_logits_equal_qeffs_on_its_calls(fixture_path, role, target):
    """Both rows every call: a prefill (row 0 right-padded), then (TLM) a verification with
    num_logits_to_keep k+1, a K=0 decode and a left-padded decode, (DLM) two decodes:
    QEfficient's logits within 1e-5 wherever it computes them (its padded columns are NaN)."""
    replay = Replay(rewrite(fixture_path("llama_gqa"), role, target, cb=False).model, BS)
    calls = recorded_calls(role, plain=True)
    assert len(calls) == (4 if role == "tlm" else 3)
    assert all("batch_index" not in c for c in calls)
    assert_logits_are(replay, calls)


def test_a_width_qeff_drops_is_refused():
    """QEfficient's plain interface drops a decode of seq_len PL (recorded: k = PL-1 leaves the
    prefill alone, whose num_logits_to_keep is 1): such a k is refused, not compiled half."""
    assert len(PLAIN["tlm"]["specializations"]["k7_dropped"]) == 1
    with pytest.raises(SpecdecError, match="drops that decode as the prefill's duplicate"):
        Options(role="tlm", k=PL - 1, prefill_len=PL, interface="qeff")
    Options(role="tlm", k=PL - 1, prefill_len=PL, interface="qeff", continuous_batching=True)   # CB keeps it
