"""Draft sources chosen by name in one place: ``make_draft_source`` (runtime/drafts/__init__.py).

SpecDecoder and specdec-run both come through it; no other module of the package
builds a draft source class itself. FAKE backends (specdec_compile.runtime.testing).
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from specdec_compile.errors import SpecdecError
from specdec_compile.runtime import SpecDecoder
from specdec_compile.runtime.drafts import NAMES, make_draft_source
from specdec_compile.runtime.drafts.dlm import DlmDraft
from specdec_compile.runtime.drafts.hybrid import HybridDraft
from specdec_compile.runtime.drafts.ngram import NgramDraft
from specdec_compile.runtime.drafts.suffix import SuffixDraft
from specdec_compile.runtime.testing import FakeBackend, FakeLM, fake_artifact, fake_pair

PKG = Path(__file__).resolve().parents[3] / "specdec_compile"
SOURCE_CLASSES = {"NgramDraft", "SuffixDraft", "HybridDraft", "DlmDraft", "FeatureDraft"}


def test_no_module_outside_drafts_builds_a_draft_source():
    found = []
    for p in sorted(PKG.rglob("*.py")):
        if (PKG / "runtime" / "drafts") in p.parents:
            continue
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.Call):
                name = getattr(node.func, "id", None) or getattr(node.func, "attr", None)
                if name in SOURCE_CLASSES:
                    found.append(f"{p.relative_to(PKG)}:{node.lineno} {name}")
    assert not found, found


def test_the_command_line_offers_the_names_make_draft_source_knows():
    from specdec_compile.cli.run import build_parser
    action = next(a for a in build_parser()._actions if a.dest == "draft")
    assert tuple(action.choices) == NAMES == ("dlm", "ngram", "suffix", "hybrid")


def test_each_name_gives_its_source():
    tlm, d, _ = fake_pair(k=3, dlm="close")
    assert type(make_draft_source("ngram", ngram_max=5)) is NgramDraft
    assert make_draft_source("ngram", ngram_max=5).max_n == 5
    suffix = make_draft_source("suffix", suffix={"max_depth": 7, "cache_tokens": None})
    assert type(suffix) is SuffixDraft and suffix.max_depth == 7
    assert type(make_draft_source("dlm", d)) is DlmDraft and make_draft_source(None, d).backend is d
    hybrid = make_draft_source("hybrid", d, ngram_max=4)
    assert type(hybrid) is HybridDraft
    own = NgramDraft(2)
    assert make_draft_source(own) is own and make_draft_source(None, own) is own
    for bad, msg in ((lambda: make_draft_source("bigram"), "unknown draft source 'bigram'"),
                     (lambda: make_draft_source("hybrid"), "needs a DLM backend"),
                     (lambda: make_draft_source("ngram", d), "not both"),
                     (lambda: make_draft_source(object()), "is not a draft source")):
        with pytest.raises(SpecdecError, match=msg):
            bad()


def test_spec_decoder_takes_the_dlm_positionally_only():
    tlm, d, _ = fake_pair(k=3, dlm="close")
    assert SpecDecoder(tlm, d).dlm is d
    with pytest.raises(TypeError):
        SpecDecoder(tlm, dlm=d)            # the keyword spelling is gone: draft= or the second argument
    t = FakeBackend(fake_artifact("tlm", vocab=23), FakeLM(23))
    assert SpecDecoder(t, draft="ngram").dlm is None
