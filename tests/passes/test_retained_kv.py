"""Pass retained_kv: growing Concat cache -> fixed cache written at position_ids."""
from __future__ import annotations

from pass_helpers import ctx, load, serialized

from specdec_compile import passes
from specdec_compile.contract import CACHE_WRITE, SPECDEC_DOMAIN


def test_retained_kv_replaces_each_concat_with_a_cache_write(fixture_path):
    g, det = load(fixture_path("llama_gqa"))
    before = serialized(g)
    out = passes.retained_kv(g, ctx(det))
    assert serialized(g) == before, "a pass must not modify its input graph"
    writes = [n for n in out.nodes if n.op == CACHE_WRITE and n.domain == SPECDEC_DOMAIN]
    assert [n.outputs[0].name for n in writes] == [
        "past_key.0_RetainedState", "past_value.0_RetainedState",
        "past_key.1_RetainedState", "past_value.1_RetainedState"]
    names = {t.name: t for t in out.inputs}
    assert names["past_key.1"].shape == ["batch_size", 2, "ctx_len", 16]
    assert not any(n.op == "Concat" and n.inputs and n.inputs[0].name.startswith("past_") for n in out.nodes)
    assert not [t.name for t in out.outputs if t.name.startswith("present")]


def test_retained_kv_gives_surviving_past_shapes_a_virtual_length(fixture_path):
    """The dynamo export computes the GQA Expand from Shape(past)+seq: after the
    pass no Shape reads a cache input directly."""
    g, det = load(fixture_path("llama_dynamo"))
    assert any(n.op == "Shape" for t in g.inputs if t.name.startswith("past_") for n in t.outputs)
    out = passes.retained_kv(g, ctx(det))
    for t in out.inputs:
        if t.name.startswith("past_"):
            direct = [n for n in t.outputs if n.op == "Shape" and "virtual_past" not in n.name]
            assert not direct
