"""Finder: position sources (no position_ids input; ALiBi key positions)."""
from __future__ import annotations


import numpy as np
import onnx_graphsurgeon as gs
import pytest
from detect_helpers import graph, parts
from families import tiny_config
from models import export_spec

from specdec_compile.detect import detect
from specdec_compile.detect.integer_inputs import find_integer_inputs
from specdec_compile.detect.positions import check_query_uses, find_position_sources
from specdec_compile.errors import UnsupportedPatternError


def _export(family, **extra):
    return export_spec(f"cov-{family}" if not extra else f"cov-{family}-x",
                       {"kind": family, "exporter": "optimum", "config": tiny_config(family, extra or None)})


def _sources(path):
    g = graph(path)
    nodes, hints, concats = parts(g)
    inputs = find_integer_inputs(g, hints, concats, 211)
    return g, find_position_sources(g, nodes, inputs, concats)


@pytest.mark.slow
def test_gemma_positions_come_from_a_range_over_the_past_length():
    g, src = _sources(_export("gemma"))
    assert [n.op for n in src.ranges] == ["Range"] and len(src.query) == 1
    assert src.query[0].inputs[0].op == "Unsqueeze" and not src.key
    det = detect(g)
    assert det.synthesize_position_ids and det.position_ids == "position_ids"
    assert [s.kind for s in det.position_sources] == ["query"]


@pytest.mark.slow
def test_bloom_alibi_key_positions_come_from_a_cumsum_of_the_mask():
    g, src = _sources(_export("bloom"))
    assert len(src.key) == 1 and not src.query
    det = detect(g)
    key = [s for s in det.position_sources if s.kind == "key"]
    assert len(key) == 1 and key[0].rank == 3
    # the ALiBi bias is not taken for a mask: every site is the causal/padding mask
    assert all(s.kind == "additive" for s in det.mask_sites) and len(det.mask_sites) == 2


def test_an_export_with_position_ids_has_no_query_source(fixture_path):
    g, src = _sources(fixture_path("llama_gqa"))
    assert not src.ranges and not src.query and not src.key


@pytest.mark.slow
def test_a_range_used_outside_mask_and_rotary_is_refused():
    g, src = _sources(_export("gemma"))
    check_query_uses(src, [])    # the Range feeds only the rotary position_ids (and a Shape)
    leak = gs.Variable("leak", dtype=np.int64)
    g.nodes.append(gs.Node("Identity", inputs=[src.ranges[0].outputs[0]], outputs=[leak]))
    g.outputs.append(leak)
    with pytest.raises(UnsupportedPatternError, match="positions computed from the past length reach 'leak'"):
        check_query_uses(src, [])


@pytest.mark.slow
def test_detection_refuses_an_untraceable_mask_through_the_cli(tmp_path, capsys):
    """A graph whose positions reach a value it cannot feed: one line, exit 2, nothing written."""
    import onnx

    from specdec_compile import cli
    g, src = _sources(_export("gemma"))
    leak = gs.Variable("leak", dtype=np.int64, shape=["s"])
    g.nodes.append(gs.Node("Identity", inputs=[src.ranges[0].outputs[0]], outputs=[leak]))
    g.outputs.append(leak)
    bad = tmp_path / "bad.onnx"
    onnx.save(gs.export_onnx(g), str(bad))
    out = tmp_path / "out"
    assert cli.main([str(bad), "--role", "tlm", "--k", "3", "-o", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "positions computed from the past length reach 'leak'" in err[0]
    assert not out.exists()
