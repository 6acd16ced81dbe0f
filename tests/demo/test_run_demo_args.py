"""``python -m demo.run_demo`` refuses bad options in one line, exit 2, before any work: a 0 is not
read as 'the default', a missing --fdraft-head is not a traceback, a refusal found late is one line."""
from __future__ import annotations

import pytest

from demo import run_demo


@pytest.mark.parametrize("argv, words", [
    (["--k", "0"], "--k must be at least 1"),
    (["--decode-k", "-1"], "--decode-k must be at least 0"),
    (["--prefill-len", "0"], "--prefill-len must be at least 1 (got 0)"),
    (["--ctx-len", "1"], "--ctx-len must be at least 2"),
    (["--prompts", "0"], "--prompts must be at least 1"),
    (["--max-new-tokens", "0"], "--max-new-tokens must be at least 1"),
    (["--repeats", "0"], "--repeats must be at least 1"),
    (["--threads", "0"], "--threads must be at least 1"),
    (["--ort-threads", "0"], "--ort-threads must be at least 1"),
    (["--toy", "--k-list", "2,x"], "--k-list must be a comma list"),
    (["--fdraft-head", "no-such-head"], "no head.pt there"),
])
def test_bad_options_are_refused_before_any_work(tmp_path, capsys, argv, words):
    out = tmp_path / "out"
    assert run_demo.main([*argv, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("demo: ") and words in err and err.count("\n") == 1, err
    assert not out.exists()


def test_a_late_refusal_is_one_line(tmp_path, capsys, monkeypatch):
    """A SpecdecError from the stages (e.g. a --decode-k the compiled widths lack) ends in one line, exit 2."""
    from specdec_compile.errors import SpecdecError

    from demo import toy_demo

    def refuse(*_a, **_k):
        raise SpecdecError("k=9 is not compiled (widths 2, 3, 4)")
    monkeypatch.setattr(toy_demo, "main", refuse)
    assert run_demo.main(["--micro", "--decode-k", "9", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err == "demo: k=9 is not compiled (widths 2, 3, 4)\n"
