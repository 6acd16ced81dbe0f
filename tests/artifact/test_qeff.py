"""--interface qeff against QEfficient itself: its TLM and DLM (continuous batching, SpD TLM),
exported from the same weights (the llama_gqa fixture) and run on its own calls, recorded in
tests/qeff_data/ by scripts/record_qeff.py. Names, dtypes, dims, specializations and logits."""
from __future__ import annotations

import json

import numpy as np
import pytest
from qeff_helpers import FBS, K, PL, RECORD, Replay, recorded_calls, rewrite

from specdec_compile.artifact.writer import Options, write_artifact


def _io(model, kind: str) -> list[tuple[str, str, list]]:
    import onnx
    vis = model.graph.input if kind == "inputs" else model.graph.output
    return [(v.name, onnx.helper.tensor_dtype_to_np_dtype(v.type.tensor_type.elem_type).name,
             [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]) for v in vis]


@pytest.mark.parametrize("role", ["tlm", "dlm"])
@pytest.mark.parametrize("target", ["ort", "qaic"])
def test_interface_is_qeffs(fixture_path, role, target):
    """Same input and output names, order and dtypes as QEfficient's export; the same dims,
    except that ours name the logits' dims (QEfficient's exporter leaves them anonymous)."""
    model = rewrite(fixture_path("llama_gqa"), role, target).model
    want = RECORD[role]["interface"]
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
def test_logits_equal_qeffs_on_its_calls(fixture_path, role, target):
    """A prompt prefilled at batch 1 into row 2 of 4, another into row 0, then all 4 rows (routed
    out of order; TLM: a verification with num_logits_to_keep k+1, a K=0 decode, and a decode as
    QEfficient's TextGeneration loop pads it, on the left): QEfficient's logits within 1e-5 at
    every position it computes (its padded positions are NaN, ours finite)."""
    replay = Replay(rewrite(fixture_path("llama_gqa"), role, target).model, FBS)
    calls = recorded_calls(role)
    assert len(calls) == (5 if role == "tlm" else 3)
    for n, c in enumerate(calls):
        got = replay(c["input_ids"], c["position_ids"], c["batch_index"], c.get("num_logits_to_keep"))
        want = c["logits"]
        assert got.shape == want.shape, n
        assert np.isfinite(got).all(), n
        ok = ~np.isnan(want)
        assert ok.sum() >= want.size // 4, n
        np.testing.assert_allclose(got[ok], want[ok], atol=1e-5, err_msg=f"call {n}")


@pytest.mark.parametrize("role", ["tlm", "dlm"])
def test_specializations_are_qeffs(fixture_path, tmp_path, role):
    """specializations.json: QEfficient's keys, order and values (its internal _graph_name aside)."""
    res = rewrite(fixture_path("llama_gqa"), role, "qaic")
    cases = {"k3": (), "k_list_0_3": (0,)} if role == "tlm" else {"default": ()}
    for name, k_list in cases.items():
        opts = Options(role=role, k=K if role == "tlm" else None, k_list=k_list, prefill_len=PL,
                       ctx_len=RECORD["ctx_len"], batch_size=FBS, interface="qeff", continuous_batching=True)
        out = tmp_path / f"{role}-{name}"
        art = write_artifact(res, opts, out)
        got = json.loads((out / "specializations.json").read_text())["specializations"]
        want = [{k: str(v) for k, v in s.items() if k != "_graph_name"}
                for s in RECORD[role]["specializations"][name]]
        assert got == want
        assert art.record.qeff["full_batch_size"] == FBS and art.record.batch_size == FBS
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
