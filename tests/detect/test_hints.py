"""Finder support: family hints from patches/*.json."""
from __future__ import annotations

import json

from specdec_compile.detect import hints as H
from specdec_compile.resources import patches_dir


def test_default_hints_have_every_list_the_finders_read():
    h = H.load_hints(None)
    assert set(h["input_names"]) == {"input_ids", "position_ids", "attention_mask"}
    for key in ("logits_names", "score_ops", "layout_ops", "probs_ops"):
        assert isinstance(h[key], list) and h[key]
    assert h == json.loads((patches_dir() / "default.json").read_text())


def test_a_family_without_a_file_gets_the_defaults():
    assert H.load_hints("no-such-family") == H.load_hints(None)


def test_merge_extends_lists_merges_dicts_replaces_scalars():
    base = {"ops": ["Add", "Mul"], "names": {"a": ["x"], "b": ["y"]}, "description": "d"}
    extra = {"ops": ["Mul", "Tanh"], "names": {"b": ["z"]}, "description": "e", "new": 1}
    merged = H.merge_hints(base, extra)
    assert merged == {"ops": ["Add", "Mul", "Tanh"], "names": {"a": ["x"], "b": ["z"]}, "description": "e",
                      "new": 1}
    assert base["ops"] == ["Add", "Mul"] and base["names"]["b"] == ["y"], "inputs untouched"


def test_family_file_extends_the_defaults(tmp_path, monkeypatch):
    (tmp_path / "default.json").write_text(json.dumps({"score_ops": ["Add"], "input_names": {"ids": ["a"]}}))
    (tmp_path / "fam.json").write_text(json.dumps({"score_ops": ["Softcap"], "input_names": {"pos": ["p"]}}))
    monkeypatch.setattr(H, "patches_dir", lambda: tmp_path)
    H.load_hints.cache_clear()
    try:
        assert H.load_hints("fam") == {"score_ops": ["Add", "Softcap"], "input_names": {"ids": ["a"], "pos": ["p"]}}
        assert H.load_hints(None) == {"score_ops": ["Add"], "input_names": {"ids": ["a"]}}
    finally:
        H.load_hints.cache_clear()
