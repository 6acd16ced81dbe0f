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


def test_k_list_is_the_toy_pairs_and_refused_for_the_real_model(tmp_path, capsys, monkeypatch):
    """The real model's TLMs are compiled with widths 0-8 whatever --k-list says: an explicit
    --k-list without --toy/--micro is refused in one line (it used to be ignored, and demo.json's
    settings recorded it as if used)."""
    pytest.importorskip("rich")
    from demo import real_demo

    def run(*a, **k):
        raise AssertionError("the real demo ran with a --k-list it ignores")
    monkeypatch.setattr(real_demo, "main", run)
    assert run_demo.main(["--k-list", "2,3", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("demo: --k-list is the toy pair's") and err.count("\n") == 1, err


def test_demo_json_records_the_widths_the_real_model_was_compiled_with(tmp_path):
    """demo.json's settings say the widths the TLMs were compiled with, not --k-list's toy default."""
    import argparse
    pytest.importorskip("rich")
    from demo import real_demo
    a = argparse.Namespace(out=tmp_path, k=4, k_list=None, decode_k=None, repeats=2)
    s = real_demo.settings(a)
    assert s["k_list"] == "0,1,2,3,4,5,6,7,8" == ",".join(map(str, real_demo.K_LIST))
    assert s["out"] == str(tmp_path) and s["k"] == 4 and s["repeats"] == 2
