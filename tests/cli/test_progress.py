"""Logging and progress: the library logs through ``logging`` under ``specdec_compile``
(no handler of its own, quiet by default); the CLIs show the steps on stderr on a
terminal or with --progress, never with --quiet; an error is still the last line."""
from __future__ import annotations

import logging
import sys

import pytest

from specdec_compile import cli, passes
from specdec_compile.cli import run as run_cli
from specdec_compile.pipeline import rewrite
from specdec_compile.options import Options


def _compile(fixture_path, tmp_path, *extra):
    return [str(fixture_path("llama_gqa")), "--role", "tlm", "--k", "3", "--target", "ort", "--ctx-len", "64",
            "--prefill-len", "8", "-o", str(tmp_path / "out"), "--force", *extra]


def _progress_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("specdec-compile: [")]


def test_the_library_configures_no_handler_and_logs_each_step(fixture_path, caplog):
    assert logging.getLogger("specdec_compile").handlers == []
    with caplog.at_level(logging.INFO, logger="specdec_compile"):
        rewrite(fixture_path("llama_gqa"), Options(role="tlm", k=3, target="ort"))
    msgs = [r.getMessage() for r in caplog.records if r.name.startswith("specdec_compile")]
    n = len(passes.select("tlm", "ort"))
    assert any(m.startswith("loaded ") for m in msgs) and any(m.startswith("detected ") for m in msgs)
    assert sum(m.startswith("pass ") for m in msgs) == n and any(m.startswith("checking ") for m in msgs)


def test_cli_progress_on_request_and_quiet_by_default_off_a_terminal(fixture_path, tmp_path, capsys):
    assert cli.main(_compile(fixture_path, tmp_path)) == 0
    assert _progress_lines(capsys.readouterr().err) == []          # not a terminal: no progress
    assert cli.main(_compile(fixture_path, tmp_path, "--progress", "--json")) == 0
    lines = _progress_lines(capsys.readouterr().err)
    text = "\n".join(lines)
    for step in ("loaded ", "detecting ", "detected ", "pass 1/", "checking ", "writing the artifact", "wrote "):
        assert step in text, step
    assert sum(" pass " in x for x in lines) == len(passes.select("tlm", "ort"))
    assert logging.getLogger("specdec_compile").handlers == []    # removed when the command ends
    out = tmp_path / "out" / "model.onnx"
    assert cli.main(["verify", str(fixture_path("llama_gqa")), str(out), "--progress"]) == 0
    assert "specdec-compile verify: [" in capsys.readouterr().err


def test_quiet_silences_a_terminal(fixture_path, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    assert cli.main(_compile(fixture_path, tmp_path, "--json")) == 0
    assert _progress_lines(capsys.readouterr().err)
    assert cli.main(_compile(fixture_path, tmp_path, "--quiet", "--json")) == 0
    assert _progress_lines(capsys.readouterr().err) == []


def test_an_error_stays_the_last_line(fixture_path, tmp_path, capsys):
    q = tmp_path / "bad.onnx"
    q.write_bytes(fixture_path("gpt2").read_bytes()[:5000])
    assert cli.main([str(q), "--role", "dlm", "-o", str(tmp_path / "o"), "--progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("specdec-compile: error: ") and "Traceback" not in "\n".join(err)
    assert cli.main(["x.onnx", "--role", "dlm", "-o", "o", "--quiet", "--progress"]) == 2
    assert "not allowed with argument" in capsys.readouterr().err


def test_specdec_run_quiet_and_progress(capsys):
    with pytest.raises(SystemExit):
        run_cli.build_parser().parse_args(["--help"])
    assert "--quiet" in capsys.readouterr().out
