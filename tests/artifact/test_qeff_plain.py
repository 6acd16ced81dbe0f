"""--interface qeff without --full-batch-size against QEfficient's plain SpD export
(``continuous_batching=False``): no batch_index, a cache of batch_size rows, every call at
batch_size rows. Recorded from the llama_gqa weights at efficient-transformers ebf55e8
(scripts/record_qeff.py --plain): names, dtypes, dims, specializations and logits."""
from __future__ import annotations

import json

import numpy as np
import pytest
from qeff_helpers import BS, K, PL, PLAIN, RECORD, Replay, recorded_calls, rewrite
from test_qeff import _io

from specdec_compile.artifact.writer import Options, write_artifact
from specdec_compile.errors import SpecdecError


@pytest.mark.parametrize("role", ["tlm", "dlm"])
@pytest.mark.parametrize("target", ["ort", "qaic"])
def test_plain_interface_is_qeffs(fixture_path, role, target):
    """QEfficient's plain TLM: input_ids, position_ids, the caches, num_logits_to_keep (no
    batch_index); its DLM: input_ids, position_ids, the caches. Cache dim 0 is batch_size."""
    model = rewrite(fixture_path("llama_gqa"), role, target, cb=False).model
    want = PLAIN[role]["interface"]
    assert "batch_index" not in [w["name"] for w in want["inputs"]]
    for kind in ("inputs", "outputs"):
        got = _io(model, kind)
        assert [(n, t) for n, t, _ in got] == [(w["name"], w["dtype"]) for w in want[kind]]
        for (name, _, dims), w in zip(got, want[kind]):
            if name == "logits":
                assert dims == ["batch_size", "num_logits_to_keep" if role == "tlm" else 1, w["dims"][2]]
            else:
                assert dims == w["dims"], name


@pytest.mark.parametrize("role", ["tlm", "dlm"])
@pytest.mark.parametrize("target", ["ort", "qaic"])
def test_plain_logits_equal_qeffs_on_its_calls(fixture_path, role, target):
    """Both rows every call: a prefill (row 0 right-padded), then (TLM) a verification with
    num_logits_to_keep k+1, a K=0 decode and a left-padded decode, (DLM) two decodes:
    QEfficient's logits within 1e-5 wherever it computes them (its padded columns are NaN)."""
    replay = Replay(rewrite(fixture_path("llama_gqa"), role, target, cb=False).model, BS)
    calls = recorded_calls(role, plain=True)
    assert len(calls) == (4 if role == "tlm" else 3)
    for n, c in enumerate(calls):
        got = replay(c["input_ids"], c["position_ids"], None, c.get("num_logits_to_keep"))
        want = c["logits"]
        assert got.shape == want.shape, n
        assert np.isfinite(got).all(), n
        ok = ~np.isnan(want)
        assert ok.sum() >= want.size // 4, n
        np.testing.assert_allclose(got[ok], want[ok], atol=1e-5, err_msg=f"call {n}")


@pytest.mark.parametrize("role", ["tlm", "dlm"])
def test_plain_specializations_are_qeffs(fixture_path, tmp_path, role):
    """specializations.json: QEfficient's keys, order and values (its _graph_name aside); no
    full_batch_size / full_batch_exec_size; the manifest's qeff object records batch_size."""
    res = rewrite(fixture_path("llama_gqa"), role, "qaic", cb=False)
    cases = {"k3": (), "k_list_0_3": (0,)} if role == "tlm" else {"default": ()}
    for name, k_list in cases.items():
        opts = Options(role=role, k=K if role == "tlm" else None, k_list=k_list, prefill_len=PL,
                       ctx_len=RECORD["ctx_len"], batch_size=BS, interface="qeff")
        out = tmp_path / f"{role}-{name}"
        art = write_artifact(res, opts, out)
        got = json.loads((out / "specializations.json").read_text())["specializations"]
        want = [{k: str(v) for k, v in s.items() if k != "_graph_name"}
                for s in PLAIN[role]["specializations"][name]]
        assert got == want
        assert art.record.qeff["batch_size"] == BS and "batch_index" not in art.record.qeff


def test_a_width_qeff_drops_is_refused():
    """QEfficient's plain interface drops a decode of seq_len PL (recorded: k = PL-1 leaves the
    prefill alone, whose num_logits_to_keep is 1): such a k is refused, not compiled half."""
    assert len(PLAIN["tlm"]["specializations"]["k7_dropped"]) == 1
    with pytest.raises(SpecdecError, match="drops that decode as the prefill's duplicate"):
        Options(role="tlm", k=PL - 1, prefill_len=PL, interface="qeff")
    Options(role="tlm", k=PL - 1, prefill_len=PL, interface="qeff", continuous_batching=True)   # CB keeps it
