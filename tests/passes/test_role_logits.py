"""Pass role_logits: TLM all positions, DLM the last valid token."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from pass_helpers import ctx, load, session

from specdec_compile import passes
from specdec_compile.errors import SpecdecError


def test_role_logits_dlm_picks_last_valid_before_the_head(fixture_path):
    path = fixture_path("llama_gqa")
    g, det = load(path)
    dlm = passes.role_logits(g, ctx(det, role="dlm"))
    logits = next(t for t in dlm.outputs if t.name == "logits")
    head = logits.inputs[0]
    assert head.op == "MatMul", "the last row is picked before the LM head"
    assert head.inputs[0].inputs[0].op == "GatherElements"
    # numerically: DLM logits == TLM logits at the last valid (largest) position
    rng = np.random.default_rng(1)
    feeds = {"input_ids": rng.integers(0, 211, (1, 4)), "position_ids": np.arange(4)[None],
             "attention_mask": np.ones((1, 4), np.int64)}
    for i in range(2):
        for kind in ("key", "value"):
            feeds[f"past_key_values.{i}.{kind}"] = np.zeros((1, 2, 0, 16), np.float32)
    full = session(onnx.load(str(path))).run(["logits"], feeds)[0]
    last = session(dlm).run(["logits"], feeds)[0]
    assert last.shape == (1, 1, 211)
    np.testing.assert_allclose(last[0, 0], full[0, -1], atol=1e-5)


def test_role_logits_dlm_without_a_plain_head_gathers_logits(fixture_path):
    """CodeGen's head has a bias and a Cast: the gather is still before the head."""
    g, det = load(fixture_path("codegen"))
    dlm = passes.role_logits(g, ctx(det, role="dlm"))
    assert [t.shape for t in dlm.outputs if t.name == "logits"] == [["batch_size", 1, 211]]


def test_role_logits_needs_a_role(fixture_path):
    """No role, no guess: the pass names the missing context field."""
    g, det = load(fixture_path("gpt2"))
    with pytest.raises(SpecdecError, match=r"pass role_logits needs ctx\.role"):
        passes.role_logits(g, ctx(det))


def test_role_logits_dlm_argmax_runs_on_int32_positions(fixture_path):
    """The last-valid pick is ArgMax over Cast(position_ids, int32), QEfficient's form."""
    g, det = load(fixture_path("gpt2"))
    dlm = passes.role_logits(g, ctx(det, role="dlm"))
    argmax = [n for n in dlm.nodes if n.op == "ArgMax"]
    assert len(argmax) == 1
    cast = argmax[0].inputs[0].inputs[0]
    assert cast.op == "Cast" and cast.attrs["to"] == onnx.TensorProto.INT32
    assert cast.inputs[0].name == det.position_ids
