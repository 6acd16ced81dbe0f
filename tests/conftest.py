"""Shared fixtures: tiny exported models, built once and cached on disk (tests/models.py)."""
from __future__ import annotations

import pytest

from models import export_fixture

#: every stock export the compiler must handle
DECODERS = ("llama_gqa", "gpt2", "codegen", "llama_dynamo")


@pytest.fixture(scope="session")
def fixture_path():
    """fixture_path(name) -> Path of the exported model.onnx (cached)."""
    cache = {}

    def get(name: str):
        if name not in cache:
            cache[name] = export_fixture(name)
        return cache[name]

    return get


# --------------------------------------------------------------------------- the demo's decode tests
class SpellingTokenizer:
    def decode(self, ids, **kw):
        return " ".join(map(str, ids))


class SilentStream:
    def start(self, *a, **k): ...
    def __call__(self, *a): ...
    def end(self): ...


@pytest.fixture
def decode_standins():
    """(a tokenizer whose decode spells the ids, a stream that shows nothing): decode_all in the demo tests."""
    return SpellingTokenizer(), SilentStream()
