"""Pass canonical_dims: the contract's interface, names and order."""
from __future__ import annotations

from pass_helpers import load

from specdec_compile import passes
from specdec_compile.passes import REGISTRY, PassContext


def test_canonical_dims_gives_exactly_the_contract_interface(fixture_path):
    g, det = load(fixture_path("llama_dynamo"))
    ctx = PassContext(detection=det, role="tlm")
    for p in REGISTRY[:passes.names().index("canonical_dims")]:  # the passes that run before it
        g = p.run(g, ctx)
    out = passes.canonical_dims(g, ctx)
    assert [t.name for t in out.inputs] == ["input_ids", "position_ids", "past_key.0", "past_value.0",
                                            "past_key.1", "past_value.1"]
    assert [t.name for t in out.outputs] == ["logits", "past_key.0_RetainedState", "past_value.0_RetainedState",
                                             "past_key.1_RetainedState", "past_value.1_RetainedState"]
    assert out.inputs[0].shape == ["batch_size", "seq_len"]
    assert out.outputs[0].shape == ["batch_size", "seq_len", 211]
    assert out.outputs[1].shape == ["batch_size", 2, "ctx_len", 16]
