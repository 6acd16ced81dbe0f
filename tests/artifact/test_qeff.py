"""--interface qeff against QEfficient itself: its TLM and DLM (continuous batching, SpD TLM),
exported from the same weights (the llama_gqa fixture) and run on its own calls, recorded in
tests/qeff_data/ by scripts/record_qeff.py. Names, dtypes, dims, specializations and logits."""
from __future__ import annotations

import json

import pytest
from qeff_helpers import (BS, FBS, K, PL, PLAIN, RECORD, Replay, assert_interface_is, assert_logits_are, recorded_calls,
                          rewrite)

from specdec_compile.artifact.writer import Options, write_artifact


@pytest.mark.parametrize("role", ["tlm", "dlm"])
@pytest.mark.parametrize("target", ["ort", "qaic"])
def test_interface_is_qeffs(fixture_path, role, target):
    """Same input and output names, order and dtypes as QEfficient's export; the same dims,
    except that ours name the logits' dims (QEfficient's exporter leaves them anonymous)."""
    assert_interface_is(rewrite(fixture_path("llama_gqa"), role, target).model, RECORD[role]["interface"], role)


@pytest.mark.parametrize("role", ["tlm", "dlm"])
@pytest.mark.parametrize("target", ["ort", "qaic"])
def test_logits_equal_qeffs_on_its_calls(fixture_path, role, target):
    """A prompt prefilled at batch 1 into row 2 of 4, another into row 0, then all 4 rows (routed
    out of order; TLM: a verification with num_logits_to_keep k+1, a K=0 decode, and a decode as
    QEfficient's TextGeneration loop pads it, on the left): QEfficient's logits within 1e-5 at
    every position it computes (its padded positions are NaN, ours finite)."""
    replay = Replay(rewrite(fixture_path("llama_gqa"), role, target).model, FBS)
    calls = recorded_calls(role)
    assert len(calls) == (5 if role == "tlm" else 3)
    assert_logits_are(replay, calls)


@pytest.mark.parametrize("plain", [False, True], ids=["continuous_batching", "plain"])
@pytest.mark.parametrize("role", ["tlm", "dlm"])
def test_specializations_are_qeffs(fixture_path, tmp_path, role, plain):
    """specializations.json: QEfficient's keys, order and values (its internal _graph_name aside),
    for both interfaces (plain: no full_batch_size / full_batch_exec_size); the manifest's qeff
    object records full_batch_size and batch_index, or (plain) batch_size."""
    res = rewrite(fixture_path("llama_gqa"), role, "qaic", cb=not plain)
    record, rows = (PLAIN, BS) if plain else (RECORD, FBS)
    cases = {"k3": (), "k_list_0_3": (0,)} if role == "tlm" else {"default": ()}
    for name, k_list in cases.items():
        opts = Options(role=role, k=K if role == "tlm" else None, k_list=k_list, prefill_len=PL,
                       ctx_len=RECORD["ctx_len"], batch_size=rows, interface="qeff", continuous_batching=not plain)
        out = tmp_path / f"{role}-{name}"
        art = write_artifact(res, opts, out)
        got = json.loads((out / "specializations.json").read_text())["specializations"]
        want = [{k: str(v) for k, v in s.items() if k != "_graph_name"}
                for s in record[role]["specializations"][name]]
        assert got == want
        q = art.record.qeff
        assert (q["batch_size"] == BS and "batch_index" not in q) if plain else (
            q["full_batch_size"] == FBS and q["batch_index"] == "batch_index")
        assert art.record.batch_size == rows
        assert list(art.record.specializations) == [int(s["seq_len"]) for s in got]


@pytest.mark.parametrize("fixture", ["llama_gqa", "gpt2", "codegen", "qwen2", "mistral", "phi3"])
@pytest.mark.parametrize("role", ["tlm", "dlm"])
def test_qaic_qeff_graph_uses_only_ops_with_device_precedent(fixture_path, fixture, role):
    """The qaic lowering of --interface qeff: the cache ops are QEfficient's own continuous-batching
    custom ops (CtxScatterCB, CtxGatherCB), and every op, in the graph and in their bodies, has
    device precedent (specdec_compile/qaic_precedent.tsv)."""
    from specdec_compile.artifact.qaic_ops import op_set, without_precedent

    model = rewrite(fixture_path(fixture), role, "qaic").model
    assert without_precedent(model) == []
    ops = op_set(model)
    assert {"com.qualcomm.cloud::CtxScatterCB", "com.qualcomm.cloud::CtxGatherCB"} <= set(ops["graph"])
    assert "ScatterND" in ops["functions"]["com.qualcomm.cloud::CtxScatterCB"]
    assert "GatherND" in ops["functions"]["com.qualcomm.cloud::CtxGatherCB"]
