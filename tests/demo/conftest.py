"""Stand-ins the demo's decode tests share: a tokenizer that spells ids and a stream that shows nothing."""
from __future__ import annotations

import pytest


class SpellingTokenizer:
    def decode(self, ids, **kw):
        return " ".join(map(str, ids))


class SilentStream:
    def start(self, *a, **k): ...
    def __call__(self, *a): ...
    def end(self): ...


@pytest.fixture
def decode_standins():
    """(a tokenizer whose decode spells the ids, a stream that shows nothing), for ``decode_all``."""
    return SpellingTokenizer(), SilentStream()
