"""Finder: the growing KV cache (Concat(past, new, axis=2) per K and V)."""
from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs
import pytest
from detect_helpers import graph

from conftest import DECODERS
from specdec_compile.detect import detect
from specdec_compile.detect.cache_concats import find_cache_concats, present_outputs
from specdec_compile.errors import DetectionError, UnsupportedPatternError
from specdec_compile.graph_utils import topo_nodes


@pytest.mark.parametrize("name", DECODERS)
def test_finds_one_concat_per_past_input(fixture_path, name):
    g = graph(fixture_path(name))
    concats = find_cache_concats(g, topo_nodes(g))
    pasts = [t.name for t in g.inputs if t.dtype == np.float32]
    assert sorted(n.inputs[0].name for n in concats) == sorted(pasts) and len(concats) == 4
    assert all(n.op == "Concat" and len(n.inputs) == 2 for n in concats)


def test_present_outputs_follow_identity_and_cast(fixture_path):
    g = graph(fixture_path("gpt2"))
    concats = find_cache_concats(g, topo_nodes(g))
    assert sorted(present_outputs(g, n) for n in concats) == [
        ("present.0.key",), ("present.0.value",), ("present.1.key",), ("present.1.value",)]
    # a present reached through an Identity is still the same present
    out = next(t for t in g.outputs if t.name == "present.0.key")
    copy = gs.Variable("present.0.key.copy", dtype=out.dtype, shape=out.shape)
    g.nodes.append(gs.Node("Identity", inputs=[out], outputs=[copy]))
    g.outputs.append(copy)
    owner = next(n for n in concats if "present.0.key" in present_outputs(g, n))
    assert present_outputs(g, owner) == ("present.0.key", "present.0.key.copy")


def test_decoder_without_kv_cache(fixture_path):
    g = graph(fixture_path("llama_nocache"))
    with pytest.raises(DetectionError, match="without a KV cache"):
        find_cache_concats(g, topo_nodes(g))
    with pytest.raises(DetectionError, match="without a KV cache"):
        detect(g)


def test_cache_not_grown_by_concat(fixture_path):
    g = graph(fixture_path("gpt2"))
    for n in g.nodes:
        if n.op == "Concat" and n.inputs[0].name.startswith("past_key_values"):
            n.op = "Sum"
    with pytest.raises(UnsupportedPatternError, match=r"KV cache inputs \(past_key_values.0.key, .*\) are not "
                                                      r"grown by a Concat"):
        find_cache_concats(g, topo_nodes(g))
    with pytest.raises(UnsupportedPatternError, match="not grown by a Concat"):
        detect(g)


def test_a_concat_along_another_axis_is_not_a_cache(fixture_path):
    g = graph(fixture_path("gpt2"))
    for n in g.nodes:
        if n.op == "Concat" and n.inputs[0].name.startswith("past_key_values"):
            n.attrs["axis"] = 3
    with pytest.raises(UnsupportedPatternError, match="not grown by a Concat along the sequence axis"):
        find_cache_concats(g, topo_nodes(g))
