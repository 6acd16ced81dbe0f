"""Finder: per-layer sliding windows, read off what each layer's mask computes."""
from __future__ import annotations

import numpy as np
import pytest
from detect_helpers import graph
from families import WINDOW, tiny_config
from models import export_spec

from specdec_compile.detect import detect
from specdec_compile.detect.windows import visibility, window_of
from specdec_compile.errors import UnsupportedPatternError


def _causal(past, seq, window=None):
    q = np.arange(past, past + seq)[:, None]
    c = np.arange(past + seq)[None]
    vis = c <= q
    if window:
        vis &= c > q - window
    return vis


def test_window_of_reads_causal_and_windowed_masks():
    assert window_of(_causal(8, 3), 8, "l") is None
    assert window_of(_causal(20, 3, 4), 20, "l") == 4
    with pytest.raises(UnsupportedPatternError, match="not causal: the query at position 8 sees 0..10"):
        window_of(np.ones((3, 11), bool), 8, "l")
    with pytest.raises(UnsupportedPatternError, match="not causal"):
        window_of(np.zeros((3, 11), bool), 8, "l")


def test_visibility_of_each_mask_kind():
    vis = _causal(4, 2)
    additive = np.where(vis, 0.0, np.finfo(np.float32).min)[None, None]
    assert np.array_equal(visibility("additive", additive, 4, 2, "l"), vis)
    assert np.array_equal(visibility("visible", vis, 4, 2, "l"), vis)
    assert np.array_equal(visibility("masked", ~vis, 4, 2, "l"), vis)
    with pytest.raises(UnsupportedPatternError, match="values other than 0 and a large negative"):
        visibility("additive", np.where(vis, 0.0, -0.5), 4, 2, "l")
    with pytest.raises(UnsupportedPatternError, match="mask operand has shape"):
        visibility("visible", vis[:, :3], 4, 2, "l")


def test_no_window_on_a_plain_llama(fixture_path):
    assert [layer.window for layer in detect(graph(fixture_path("llama_gqa"))).layers] == [None, None]


@pytest.mark.slow
@pytest.mark.parametrize("family,windows", [("mistral", [WINDOW, WINDOW]), ("gemma3_text", [WINDOW, None]),
                                            ("gpt_neo", [None, WINDOW])])
def test_windows_per_layer(family, windows):
    path = export_spec(f"cov-{family}", {"kind": family, "exporter": "optimum", "config": tiny_config(family)})
    assert [layer.window for layer in detect(graph(path)).layers] == windows
