"""``specdec-compile MODEL --role ... -o OUT``: options, errors, summary, --compile.

Option handling runs against a stand-in rewrite (fast); the end-to-end tests at
the bottom run the real pipeline on exported fixtures.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from specdec_compile import cli, pipeline
from specdec_compile.artifact import writer as artifacts
from specdec_compile.cli import common as cli_common
from specdec_compile.errors import SpecdecError
from test_writer import GOLDEN, SDK_DLM, SDK_TLM7, _fake_compiler, fake_result, listing

VENV_BIN = Path(sys.executable).parent


@pytest.fixture
def fake(tmp_path, monkeypatch):
    """A stand-in ``pipeline.rewrite`` returning a small contract-shaped result."""
    calls = []

    def rewrite(model, options, *, record=False, source=None):
        calls.append(dict(path=Path(source or model), role=options.role, target=options.target, k=options.k,
                          record=record, ctx_len=options.ctx_len))
        return fake_result(tmp_path, options.role, target=options.target)

    fake_result(tmp_path)  # creates src/model.onnx
    monkeypatch.setattr(pipeline, "rewrite", rewrite, raising=False)
    return SimpleRun(tmp_path, calls)


class SimpleRun:
    def __init__(self, tmp, calls):
        self.tmp, self.calls = tmp, calls
        self.model = tmp / "src" / "model.onnx"


def run(argv, capsys):
    rc = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


# --------------------------------------------------------------------------- bad inputs

BAD = [
    (["--role", "tlm", "--k", "0"], "k must be at least 1"),
    (["--role", "tlm", "--k", "256", "--ctx-len", "256"], "larger than --ctx-len"),
    (["--role", "tlm", "--k", "7", "--k-list", "3,x"], "--k-list must be"),
    (["--role", "tlm", "--k", "7", "--k-list", "300"], "larger than --ctx-len"),
    (["--role", "tlm"], "--k is required"),
    (["--role", "dlm", "--prefill-len", "300", "--ctx-len", "256"], "--prefill-len 300 is larger"),
    (["--role", "dlm", "--batch-size", "0"], "--batch-size must be at least 1"),
    (["--role", "dlm", "--k", "7"], "--k is for the target model only"),
    (["--role", "dlm", "--k-list", "3"], "--k-list is for the target"),
    (["--role", "xlm"], "invalid choice"),
    (["--role", "dlm", "--target", "cuda"], "invalid choice"),
    (["--role", "dlm", "--num-cores", "0"], "--num-cores"),
    (["--role", "dlm", "--ctx-len", "abc"], "invalid int value"),
    (["--role", "dlm", "--target", "ort", "--compile"], "needs --target qaic"),
]


@pytest.mark.parametrize("args,msg", BAD, ids=[m for _, m in BAD])
def test_bad_options_fail_fast_one_line(fake, capsys, args, msg):
    out = fake.tmp / "out"
    rc, so, se = run([fake.model, *args, "-o", out], capsys)
    assert rc == 2
    assert se.count("\n") == 1 and se.startswith("specdec-compile: error: ") and msg in se, se
    assert "Traceback" not in se and so == ""
    assert not out.exists() and fake.calls == []  # rejected before the rewrite


def test_missing_model_and_output_flag(fake, capsys):
    rc, _, se = run([fake.tmp / "nope.onnx", "--role", "dlm", "-o", fake.tmp / "o"], capsys)
    assert rc == 2 and "no such file" in se and se.count("\n") == 1
    rc, _, se = run([fake.model, "--role", "dlm"], capsys)
    assert rc == 2 and "-o/--output" in se and se.count("\n") == 1
    assert fake.calls == []


def test_non_empty_output_needs_force(fake, capsys):
    out = fake.tmp / "o"
    assert run([fake.model, "--role", "dlm", "-o", out], capsys)[0] == 0
    before = listing(out)
    rc, _, se = run([fake.model, "--role", "tlm", "--k", "7", "-o", out], capsys)
    assert rc == 2 and "use --force" in se and se.count("\n") == 1
    assert listing(out) == before and len(fake.calls) == 1
    rc, _, _ = run([fake.model, "--role", "tlm", "--k", "7", "-o", out, "--force"], capsys)
    assert rc == 0 and json.loads((out / "manifest.json").read_text())["role"] == "tlm"


def test_unwritable_output(fake, capsys, monkeypatch):
    blocker = fake.tmp / "afile"
    blocker.write_text("x")
    rc, _, se = run([fake.model, "--role", "dlm", "-o", blocker / "o"], capsys)
    assert rc == 2 and "not a directory" in se and se.count("\n") == 1
    rc, _, se = run([fake.model, "--role", "dlm", "-o", blocker], capsys)
    assert rc == 2 and "not a directory" in se
    ro = fake.tmp / "ro"
    ro.mkdir()
    real_access = os.access
    monkeypatch.setattr(artifacts.os, "access",  # root ignores modes: say "no" for this directory
                        lambda p, m, **kw: False if Path(p) == ro else real_access(p, m, **kw))
    rc, _, se = run([fake.model, "--role", "dlm", "-o", ro / "o"], capsys)
    assert rc == 2 and "is not writable" in se and se.count("\n") == 1
    assert list(ro.iterdir()) == [] and fake.calls == []


# --------------------------------------------------------------------------- success paths

def test_summary_and_files(fake, capsys):
    out = fake.tmp / "out" / "tlm"
    rc, so, se = run([fake.model, "--role", "tlm", "--k", "7", "-o", out], capsys)
    assert rc == 0, se
    assert fake.calls == [dict(path=fake.model, role="tlm", target="qaic", k=7, record=False, ctx_len=256)]
    assert json.loads((out / "specializations.json").read_text()) == SDK_TLM7
    for word in ("TLM k=7", "32/7/8", "- input  attention_mask", "+ input  past_key.{i}", "(i=0..1)",
                 "manifest.json", "compile.sh", "-aic-hw-version=", "-retained-state"):
        assert word in so, word


def test_json_summary(fake, capsys):
    out = fake.tmp / "d"
    rc, so, _ = run([fake.model, "--role", "dlm", "-o", out, "--json"], capsys)
    assert rc == 0
    d = json.loads(so)
    assert d["role"] == "dlm" and d["k"] is None and d["specializations"] == [32, 2, 1]
    assert sorted(d["files"]) == sorted(json.loads((out / "manifest.json").read_text())["files"])
    assert {"change": "removed", "kind": "input", "name": "attention_mask"}.items() <= \
        next(c for c in d["io_changes"] if c["name"] == "attention_mask").items()
    assert d["compile_command"][1:3] == ["-aic-hw", d["compile_command"][2]]
    assert "-network-specialization-config=specializations.json" in d["compile_command"]


def test_help_has_worked_example(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["--help"])
    assert e.value.code == 0
    so = capsys.readouterr().out
    assert "--role dlm" in so and "--role tlm --k 7" in so and "32/2/1" in so and "32/7/8" in so


def test_explain_prints_what_each_pass_changed(fake, capsys, monkeypatch):
    from test_writer import original_model, rewritten_model

    def rewrite(path, options, *, record=False, source=None):
        r = fake_result(fake.tmp, options.role)
        r.snapshots = [("original", original_model()), ("retain_kv", rewritten_model())] if record else []
        return r

    monkeypatch.setattr(pipeline, "rewrite", rewrite)
    rc, so, se = run([fake.model, "--role", "tlm", "--k", "7", "-o", fake.tmp / "o", "--explain"], capsys)
    assert rc == 0, se
    assert "retain_kv" in so and "attention_mask" in so
    rc, so, se = run([fake.model, "--role", "tlm", "--k", "7", "-o", fake.tmp / "j", "--explain", "--json"], capsys)
    assert rc == 0, se
    d = json.loads(so)
    assert d["explain"]["passes"][0]["pass"] == "retain_kv"
    # the names shown are the ones the pipeline recorded, whatever they are
    assert [p["pass"] for p in d["explain"]["passes"]] == ["retain_kv"]


def test_explain_off_records_nothing(fake, capsys):
    rc, so, se = run([fake.model, "--role", "tlm", "--k", "7", "-o", fake.tmp / "o"], capsys)
    assert rc == 0, se
    assert fake.calls[-1]["record"] is False and "explain:" not in so


# --------------------------------------------------------------------------- cli_common

def test_shared_parser_errors_are_one_line_specdec_errors():
    p = cli_common.Parser(prog="tool", help_hint=" (see tool --help)")
    p.add_argument("--n", type=int)
    with pytest.raises(SpecdecError) as e:
        p.parse_args(["--n", "x"])
    assert str(e.value).endswith("(see tool --help)") and "invalid int value" in str(e.value)
    plain = cli_common.Parser(prog="tool")  # its default behaviour
    with pytest.raises(SpecdecError) as e:
        plain.parse_args(["--bogus"])
    assert str(e.value) == "unrecognized arguments: --bogus"


@pytest.mark.parametrize("exc,code,line", [
    (SpecdecError("bad input"), 2, "tool: error: bad input"),
    (KeyboardInterrupt(), 130, "tool: interrupted"),
    (ValueError("a\nbug"), 3, "tool: internal error: ValueError: a bug (set SPECDEC_DEBUG=1 for the traceback)"),
])
def test_run_cli_turns_failures_into_one_line(capsys, monkeypatch, exc, code, line):
    monkeypatch.delenv("SPECDEC_DEBUG", raising=False)

    def fail(argv):
        raise exc

    assert cli_common.run_cli(fail, [], "tool") == code
    out, err = capsys.readouterr()
    assert out == "" and err == line + "\n"


def test_run_cli_passes_through_and_is_reexported_by_cli(capsys):
    assert cli_common.run_cli(lambda argv: len(argv), ["a", "b"], "tool") == 2

    def broken(argv):
        raise BrokenPipeError

    assert cli_common.run_cli(broken, [], "tool") == 141   # 128 + SIGPIPE: quiet, but not success
    assert cli.run_cli is cli_common.run_cli  # specdec_compile.cli re-exports it


# --------------------------------------------------------------------------- --compile

def _path_with(bindir: Path) -> str:
    return f"{bindir}:/usr/bin:/bin"


@pytest.mark.parametrize("rc_fake", [0, 3])
def test_compile_runs_compiler_and_returns_its_code(fake, capsys, monkeypatch, rc_fake):
    # FAKE qaic-exec (a test double that records argv), on PATH in a tmp dir
    _fake_compiler(fake.tmp / "bin", "qaic-exec", rc=rc_fake)
    log = fake.tmp / "argv.txt"
    monkeypatch.setenv("PATH", _path_with(fake.tmp / "bin"))
    monkeypatch.setenv("FAKE_QAIC_LOG", str(log))
    monkeypatch.delenv("QAIC_COMPILER", raising=False)
    out = fake.tmp / "o"
    rc = cli.main([str(fake.model), "--role", "tlm", "--k", "7", "-o", str(out), "--compile",
                   "--num-devices", "2", "--precision", "mx6"])
    assert rc == rc_fake
    cwd, *argv = log.read_text().splitlines()
    assert Path(cwd).resolve() == out.resolve()
    assert argv[:2] == ["-aic-hw", "-aic-hw-version=2.0"]  # qaic-exec's default
    assert "-m=model.onnx" in argv and "-mxfp6-matmul" in argv
    assert "-mdp-load-partition-config=mdp_partition.json" in argv
    assert (out / "manifest.json").is_file()


def test_compile_hw_version_flag(fake, capsys, monkeypatch):
    _fake_compiler(fake.tmp / "bin", "qaic-compile")  # FAKE, records argv
    log = fake.tmp / "argv.txt"
    monkeypatch.setenv("PATH", _path_with(fake.tmp / "bin"))
    monkeypatch.setenv("FAKE_QAIC_LOG", str(log))
    monkeypatch.delenv("QAIC_COMPILER", raising=False)
    rc = cli.main([str(fake.model), "--role", "dlm", "-o", str(fake.tmp / "o"), "--compile",
                   "--hw-version", "2.0"])
    assert rc == 0 and log.read_text().splitlines()[2] == "-aic-hw-version=2.0"


def test_compile_without_compiler_is_one_line(fake, capsys, monkeypatch):
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    monkeypatch.setattr(artifacts, "SDK_EXEC_DIR", fake.tmp / "no-sdk")
    out = fake.tmp / "o"
    rc, so, se = run([fake.model, "--role", "dlm", "-o", out, "--compile"], capsys)
    assert rc == 2 and se.count("\n") == 1
    assert "no Cloud AI 100 compiler" in se and str(out / "compile.sh") in se
    assert (out / "compile.sh").is_file()  # the artifact is there to be compiled elsewhere


# --------------------------------------------------------------------------- console script

def test_console_script_error_is_one_line(tmp_path):
    exe = VENV_BIN / "specdec-compile"
    if not exe.exists():
        pytest.skip("console script not installed (pip install -e .)")
    r = subprocess.run([str(exe), str(tmp_path / "missing.onnx"), "--role", "tlm", "--k", "7",
                        "-o", str(tmp_path / "o")], capture_output=True, text=True)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr and "no such file" in r.stderr
    assert not (tmp_path / "o").exists()
    r = subprocess.run([str(exe), str(tmp_path / "m.onnx"), "--role", "dlm", "--k", "3", "-o", str(tmp_path / "o")],
                       capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr


def test_python_m_specdec_compile_is_the_command(tmp_path, capsys):
    """``python -m specdec_compile`` runs the same main as ``specdec-compile`` (same help, same errors)."""
    root = Path(__file__).resolve().parents[2]
    m = subprocess.run([sys.executable, "-m", "specdec_compile", "--help"], capture_output=True, text=True, cwd=root)
    assert m.returncode == 0 and m.stdout.startswith("usage: specdec-compile ")
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    assert capsys.readouterr().out == m.stdout
    bad = subprocess.run([sys.executable, "-m", "specdec_compile", str(tmp_path / "missing.onnx"), "--role", "tlm",
                          "--k", "7", "-o", str(tmp_path / "o")], capture_output=True, text=True, cwd=root)
    assert bad.returncode == 2 and bad.stdout == ""
    assert bad.stderr.startswith("specdec-compile: error:") and bad.stderr.count("\n") == 1


# --------------------------------------------------------------------------- end to end, real exports

needs_pipeline = pytest.mark.skipif(not callable(getattr(pipeline, "rewrite", None)),
                                    reason="pipeline.rewrite not available yet")


@needs_pipeline
@pytest.mark.slow
def test_end_to_end_codegen_pair(tmp_path, capsys):
    from models import export_fixture

    src = export_fixture("codegen")
    d, t = tmp_path / "dlm", tmp_path / "tlm"
    assert cli.main([str(src), "--role", "dlm", "-o", str(d)]) == 0
    assert cli.main([str(src), "--role", "tlm", "--k", "7", "-o", str(t), "--logits-dtype", "float16"]) == 0
    capsys.readouterr()
    assert json.loads((d / "specializations.json").read_text()) == SDK_DLM
    assert (t / "specializations.json").read_bytes() == (GOLDEN / "tlm_specializations_7.json").read_bytes()
    assert (d / "custom_io.yaml").read_bytes() == (GOLDEN / "custom_io_2layers.yaml").read_bytes()
    assert (t / "custom_io.yaml").read_bytes() == (GOLDEN / "custom_io_2layers_logits.yaml").read_bytes()
    m = json.loads((t / "manifest.json").read_text())
    assert (m["role"], m["k"], m["num_layers"], m["vocab_size"]) == ("tlm", 7, 2, 211)
    assert m["source"]["file"] == "model.onnx" and m["passes"]
    names = [i["name"] for i in m["interface"]["inputs"]]
    assert names[:2] == ["input_ids", "position_ids"] or set(names[:2]) == {"input_ids", "position_ids"}
    assert "attention_mask" not in names
    r = subprocess.run(["bash", "-n", str(t / "compile.sh")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


@needs_pipeline
@pytest.mark.slow
@pytest.mark.parametrize("fixture", ["llama_gqa", "llama_dynamo"])
def test_end_to_end_deterministic(tmp_path, capsys, fixture):
    from models import export_fixture

    src = export_fixture(fixture)
    argv = [str(src), "--role", "tlm", "--k", "3", "--k-list", "2,5", "--num-devices", "2"]
    assert cli.main(argv + ["-o", str(tmp_path / "a")]) == 0
    assert cli.main(argv + ["-o", str(tmp_path / "b")]) == 0
    a, b = listing(tmp_path / "a"), listing(tmp_path / "b")
    assert sorted(a) == sorted(b)
    for name in a:
        assert a[name] == b[name], name
    assert json.loads(a["manifest.json"])["specializations"] == [32, 3, 4, 6]
    assert str(tmp_path).encode() not in b"".join(a.values())


@needs_pipeline
@pytest.mark.slow
def test_end_to_end_ort_target_runs(tmp_path, capsys):
    import numpy as np
    import onnxruntime as ort
    from models import export_fixture

    out = tmp_path / "ort"
    assert cli.main([str(export_fixture("llama_gqa")), "--role", "dlm", "--target", "ort", "--ctx-len", "64",
                     "-o", str(out), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert not (out / "compile.sh").exists() and d["compile_command"] is None
    sess = ort.InferenceSession(str(out / "model.onnx"), providers=["CPUExecutionProvider"])
    feeds = {"input_ids": np.array([[5, 6, 7]], np.int64), "position_ids": np.array([[0, 1, 2]], np.int64)}
    for i in sess.get_inputs():
        if i.name.startswith("past_"):
            shape = [1 if s == "batch_size" else 64 if s == "ctx_len" else s for s in i.shape]
            feeds[i.name] = np.zeros(shape, np.float32)
    logits = sess.run(["logits"], feeds)[0]
    assert logits.shape == (1, 1, 211) and np.isfinite(logits).all()
