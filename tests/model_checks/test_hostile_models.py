"""Hostile and malformed models (issue 35): each gets one line and exit 2, or a correct
artifact where the input is valid; never a traceback, exit 3, hang or half-written output.
The models come from tests/mutations.py (a small mutator of the llama_gqa fixture)."""
from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import onnx
import pytest

from mutations import build, save_external
from specdec_compile import cli
from specdec_compile.errors import SpecdecError
from specdec_compile.options import Options
from test_bad_inputs import _one_line


@contextlib.contextmanager
def deadline(seconds: int = 120):
    """Fail (instead of hanging the suite) when the block runs past ``seconds``."""
    def boom(*_):
        raise TimeoutError(f"still running after {seconds} s (a hang)")
    old = signal.signal(signal.SIGALRM, boom)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def refused(argv, capsys, *needles, out: Path | None = None) -> str:
    with deadline():
        code = cli.main([str(a) for a in argv])
    line = _one_line(capsys.readouterr().err)
    assert code == 2, line
    assert "internal error" not in line
    for n in needles:
        assert n in line, line
    if out is not None:
        assert not out.exists()
        assert not [p for p in out.parent.iterdir() if p.name.startswith(f".{out.name}.tmp-")]
    return line


REFUSED = {
    "ext-named-specializations": "the name of an artifact file",
    "ext-named-compile-sh": "'compile.sh', the name of an artifact file",
    "ext-named-manifest": "'manifest.json', the name of an artifact file",
    "ext-named-model-onnx": "'model.onnx', the name of an artifact file",
    "ext-location-traversal": "unsafe external data location '../secret.bin'",
    "ext-length-short": "external data length 8, its dims [211, 64] and dtype need 54016 bytes",
    "ext-length-negative": "length '-5', expected a byte count",
    "ext-offset-negative": "offset '-4', expected a byte count",
    "ext-offset-abc": "offset 'abc'",
    "ext-offset-float": "offset '1e3'",
    "kv-heads-0": "0 KV heads",
    "kv-heads-huge": "declares dim 1 = 4611686018427387904",
    "kv-heads-negative": "declares dim 1 = -5",
    "head-dim-huge": "declares dim 3",
    "init-dim-minus1": "dims [-1, 64] (a dim below 0)",
    "init-dim-huge": "dims [1099511627776, 64]",
    "embed-0-rows": "embedding table has 0 rows",
    "raw-data-short": "holds 54012 bytes of data",
    "raw-data-long": "holds 54020 bytes of data",
    "dtype-changed": "dtype DOUBLE need 108032",
    "truncated-constant": "holds 3 bytes of data",
    "dup-graph-input": "graph input 'input_ids' is declared twice",
    "unknown-domain-op": "domain 'com.example.hostile'",
    "cycle": "the graph has a cycle",
    "undefined-input": "reads 'no_such_tensor', which no node",
    "dup-node-outputs": "is produced twice",
    "softmax-axis-99": "model.onnx is not a valid ONNX model: it fails shape inference",
    "constant-as-softmax": "is not a valid ONNX model: it fails onnx.checker: Node(/model/Constant) with schema",
    "opset-1": "source opset 1 is older than 13",
    "opset-7": "source opset 7 is older than 13",
    "opset-99": "opset 99 is newer than this onnx",
    "ir-99": "IR version 99 is newer",
    "no-opset": "no opset for the ONNX domain",
    "non-utf8-name": "is not valid UTF-8 text",
    "config-list": "config.json: expected a JSON object, got list",
    "config-model-type-dict": "model_type is",
    "config-deep": "config.json: cannot read the export's config.json: nested too deeply",
    "gen-config-deep": "nested too deeply",
    "eos-negative": "eos_token_id -1 is not a token id of the model (0 to 210, vocabulary 211)",
    "eos-huge": "eos_token_id 100000000000000000000000000000 is not a token id",
    "eos-outside-vocab": "eos_token_id 999999 is not a token id",
}


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_broken_model_is_refused_in_one_line(name, fixture_path, tmp_path, capsys):
    src = build(fixture_path("llama_gqa"), name, tmp_path / "in")
    out = tmp_path / "out"
    refused([src, "--role", "tlm", "--k", "3", "--target", "ort", "-o", out], capsys, REFUSED[name], out=out)


def test_model_with_an_if_node_compiles_and_verifies(fixture_path, tmp_path, capsys):
    """A checker-clean model with an If node: onnx-graphsurgeon's full toposort recursed without end."""
    src = build(fixture_path("llama_gqa"), "if-node", tmp_path / "in")
    out = tmp_path / "out"
    with deadline(300):
        assert cli.main([str(src), "--role", "tlm", "--k", "3", "--ctx-len", "64", "--prefill-len", "8",
                         "-o", str(out)]) == 0
        capsys.readouterr()
        assert cli.main(["verify", str(src), str(out), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["ok"]


def test_diff_passes_of_an_if_model(fixture_path, tmp_path, capsys):
    src = build(fixture_path("llama_gqa"), "if-node", tmp_path / "in")
    with deadline(300):
        assert cli.main(["diff", "--passes", str(src), "--role", "tlm", "--k", "3", "--json"]) in (0, 1)
    assert "internal error" not in capsys.readouterr().err


# --------------------------------------------------------------------------- the Python API


def _traversal(fixture_path, tmp_path) -> Path:
    """model.onnx in tmp/m whose weights sit in tmp/secret.bin, named '../secret.bin'."""
    p = save_external(onnx.load(str(fixture_path("llama_gqa"))), tmp_path / "m", location="w.bin")
    (tmp_path / "m" / "w.bin").rename(tmp_path / "secret.bin")
    m = onnx.load(str(p), load_external_data=False)
    for t in m.graph.initializer:
        for e in t.external_data:
            if e.key == "location":
                e.value = "../secret.bin"
    p.write_bytes(m.SerializeToString())
    return p


def test_rewrite_of_a_model_proto_checks_its_external_data(fixture_path, tmp_path):
    from specdec_compile import pipeline
    p = _traversal(fixture_path, tmp_path)
    proto = onnx.load(str(p), load_external_data=False)
    with pytest.raises(SpecdecError, match=r"unsafe external data location '\.\./secret\.bin'"):
        pipeline.rewrite(proto, Options(role="tlm", k=3, target="ort"), source=p)
    with pytest.raises(SpecdecError, match="unsafe external data location"):
        pipeline.rewrite(proto, Options(role="tlm", k=3, target="ort"))   # no source: still refused


def test_save_model_never_writes_outside_its_directory(fixture_path, tmp_path):
    from specdec_compile.model_io import save_model
    p = _traversal(fixture_path, tmp_path)
    proto = onnx.load(str(p), load_external_data=False)
    victim = tmp_path / "art" / ".." / "secret.bin"
    before = (tmp_path / "secret.bin").read_bytes()
    with pytest.raises(SpecdecError, match="unsafe external data location"):
        save_model(proto, tmp_path / "art" / "model.onnx", tmp_path / "m")
    assert victim.resolve().read_bytes() == before and not (tmp_path / "art" / "model.onnx").exists()


def test_options_of_the_wrong_type_are_refused():
    from specdec_compile.options import Options
    for bad, needle in ((dict(role="dlm", num_cores="16"), "--num-cores"),
                        (dict(role="tlm", k=3, k_list=("2",)), "--k-list"),
                        (dict(role="dlm", qaic_flags=(5,)), "--qaic-flag")):
        with pytest.raises(SpecdecError, match=needle):
            Options(**bad)


# --------------------------------------------------------------------------- FIFOs and devices


def _fifo(path: Path) -> Path:
    os.mkfifo(path)
    return path


def _export_copy(fixture_path, tmp_path) -> Path:
    d = tmp_path / "export"
    d.mkdir()
    src = fixture_path("llama_gqa")
    for f in src.parent.iterdir():
        (d / f.name).write_bytes(f.read_bytes())
    return d / "model.onnx"


@pytest.mark.parametrize("name", ["config.json", "generation_config.json"])
def test_a_fifo_config_is_refused_not_read(name, fixture_path, tmp_path, capsys):
    model = _export_copy(fixture_path, tmp_path)
    (model.parent / name).unlink()
    _fifo(model.parent / name)
    out = tmp_path / "out"
    refused([model, "--role", "tlm", "--k", "3", "-o", out], capsys, "not a regular file", name, out=out)


def test_dev_zero_as_generation_config_and_supported_ops(fixture_path, tmp_path, capsys):
    model = _export_copy(fixture_path, tmp_path)
    (model.parent / "generation_config.json").unlink()
    os.symlink("/dev/zero", model.parent / "generation_config.json")
    out = tmp_path / "out"
    refused([model, "--role", "tlm", "--k", "3", "-o", out], capsys, "not a regular file", out=out)
    refused([fixture_path("llama_gqa"), "--role", "tlm", "--k", "3", "--supported-ops", "/dev/zero", "-o", out],
            capsys, "--supported-ops", "not a regular file", out=out)
    fifo = _fifo(tmp_path / "ops.fifo")
    refused([fixture_path("llama_gqa"), "--role", "tlm", "--k", "3", "--supported-ops", fifo, "-o", out],
            capsys, "not a regular file", out=out)


def test_fifo_and_device_models_for_verify_diff_and_the_api(fixture_path, tmp_path, capsys):
    fifo = _fifo(tmp_path / "model.onnx")
    real = fixture_path("llama_gqa")
    refused(["verify", fifo, real], capsys, "not a regular file")
    refused(["verify", real, "/dev/zero"], capsys, "not a regular file")
    refused(["diff", real, fifo], capsys, "not a regular file")
    refused(["diff", "--passes", fifo, "--role", "tlm"], capsys, "not a regular file")
    from specdec_compile import pipeline
    with deadline(), pytest.raises(SpecdecError, match="not a regular file"):
        pipeline.rewrite(fifo, Options(role="tlm", k=3))


def test_an_oversized_json_is_refused_with_its_bound(fixture_path, tmp_path, capsys):
    from specdec_compile.model_io import MAX_TEXT_BYTES
    model = _export_copy(fixture_path, tmp_path)
    with open(model.parent / "config.json", "r+b") as f:
        f.truncate(MAX_TEXT_BYTES + 1)
    refused([model, "--role", "tlm", "--k", "3", "-o", tmp_path / "o"], capsys, f"{MAX_TEXT_BYTES}-byte limit")


# --------------------------------------------------------------------------- bounds


@pytest.mark.parametrize("argv,needle", [
    (["--ctx-len", str(2 ** 31)], "--ctx-len 2147483648 is over the limit of 262144"),
    (["--ctx-len", "10000000"], "over the limit of 262144"),
    (["--num-devices", "1000000"], "--num-devices 1000000 is over the limit of 64"),
    (["--batch-size", "100000"], "--batch-size 100000 is over the limit of 1024"),
])
def test_sizes_from_the_command_line_are_bounded(argv, needle, fixture_path, tmp_path, capsys):
    out = tmp_path / "out"
    refused([fixture_path("llama_gqa"), "--role", "tlm", "--k", "3", *argv, "-o", out], capsys, needle, out=out)


@pytest.mark.parametrize("flag", [["--precision", "mx6"], ["--num-cores", "8"], ["--num-cores", "16"],
                                  ["--num-devices", "2"], ["--hw-version", "2.0"], ["--kv-dtype", "float32"],
                                  ["--logits-dtype", "float16"]])
def test_qaic_only_options_are_refused_with_target_ort(flag, fixture_path, tmp_path, capsys):
    out = tmp_path / "out"
    refused([fixture_path("llama_gqa"), "--role", "tlm", "--k", "3", "--target", "ort", *flag, "-o", out], capsys,
            flag[0], "needs --target qaic", out=out)


def test_qaic_only_options_in_options_with_target_ort():
    from specdec_compile.options import Options
    with pytest.raises(SpecdecError, match="--precision mx6 .*needs --target qaic"):
        Options(role="dlm", target="ort", precision="mx6")
    Options(role="dlm", target="ort")


def test_ort_summary_shows_the_graphs_cache_dtype(fixture_path, tmp_path, capsys):
    assert cli.main([str(fixture_path("llama_gqa")), "--role", "dlm", "--target", "ort", "--ctx-len", "64",
                     "--prefill-len", "8", "-o", str(tmp_path / "o")]) == 0
    out = capsys.readouterr().out
    assert "KV float32" in out and "KV float16" not in out


def test_qaic_flag_with_a_trailing_newline_is_refused(fixture_path, tmp_path, capsys):
    refused([fixture_path("llama_gqa"), "--role", "dlm", "--qaic-flag", "-mos=1\n", "-o", tmp_path / "o"], capsys,
            "expected one compiler flag")


def test_the_printed_compile_line_quotes_out(fixture_path, tmp_path, capsys):
    out = tmp_path / "my out;x"
    assert cli.main([str(fixture_path("llama_gqa")), "--role", "dlm", "--ctx-len", "64", "--prefill-len", "8",
                     "-o", str(out)]) == 0
    printed = capsys.readouterr().out
    assert f"cd '{out}' && " in printed


# --------------------------------------------------------------------------- verify


@pytest.fixture(scope="module")
def llama_tlm(fixture_path, tmp_path_factory):
    out = tmp_path_factory.mktemp("hostile") / "tlm"
    assert cli.main([str(fixture_path("llama_gqa")), "--role", "tlm", "--k", "3", "--target", "ort",
                     "--ctx-len", "64", "--prefill-len", "8", "-q", "-o", str(out)]) == 0
    return out


@pytest.mark.parametrize("argv,needle", [
    (["--k", "0"], "k must be an integer >= 1, got 0"),
    (["--seed", "-1"], "--seed must be an integer >= 0"),
    (["--tol", "nan"], "--tol must be a finite number"),
    (["--ctx-len", "100000000"], "--ctx-len 100000000 is over the limit"),
    (["--batch-size", "100000"], "--batch-size 100000 is over the limit of 1024"),
    (["--ctx-len", "0"], "--ctx-len must be at least 1"),
    (["--ctx-len", "262144", "--batch-size", "1024"], "GiB of cache (batch 1024, ctx_len 262144), over its limit"),
])
def test_verify_option_values(argv, needle, llama_tlm, fixture_path, capsys):
    refused(["verify", fixture_path("llama_gqa"), llama_tlm / "model.onnx", *argv], capsys, needle)


def test_verify_batch_too_large_for_the_context_names_the_batch(llama_tlm, fixture_path, capsys):
    refused(["verify", fixture_path("llama_gqa"), llama_tlm, "--batch-size", "40"], capsys,
            "ctx_len 64 too small", "batch 40")


def test_verify_takes_an_artifact_directory_and_names_a_swapped_pair(llama_tlm, fixture_path, capsys):
    with deadline(300):
        assert cli.main(["verify", str(fixture_path("llama_gqa")), str(llama_tlm), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["ok"]
    refused(["verify", llama_tlm, fixture_path("llama_gqa")], capsys, "look swapped")


def test_verify_of_a_mismatched_pair(llama_tlm, fixture_path, capsys):
    refused(["verify", fixture_path("gpt2"), llama_tlm], capsys, "is not a rewrite of this export")


@pytest.mark.parametrize("edit,needle", [
    ({"specializations": [0, -5, 1000000]}, "specializations lists seq_len 0, outside 1 to ctx_len 64"),
    ({"ctx_len": 1000000000}, "--ctx-len 1000000000 is over the limit"),
])
def test_verify_bounds_the_manifests_shapes(edit, needle, llama_tlm, fixture_path, tmp_path, capsys):
    art = tmp_path / "art"
    art.mkdir()
    for f in llama_tlm.iterdir():
        (art / f.name).write_bytes(f.read_bytes())
    m = json.loads((art / "manifest.json").read_text())
    m.update(edit)
    (art / "manifest.json").write_text(json.dumps(m))
    refused(["verify", fixture_path("llama_gqa"), art], capsys, "manifest.json", needle)


def test_verify_deep_manifest(llama_tlm, fixture_path, tmp_path, capsys):
    art = tmp_path / "art"
    art.mkdir()
    (art / "model.onnx").write_bytes((llama_tlm / "model.onnx").read_bytes())
    (art / "manifest.json").write_text("[" * 100000 + "]" * 100000)
    refused(["verify", fixture_path("llama_gqa"), art], capsys, "nested too deeply")


def test_verify_help_and_description(capsys):
    with pytest.raises(SystemExit):
        cli.main(["verify", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert ".." not in text.replace("...", "")
    assert "--tol TOL the largest absolute difference" in text and "--seed SEED seed of the random" in text


# --------------------------------------------------------------------------- SIGTERM


def test_sigterm_while_writing_leaves_no_temporary_directory(fixture_path, tmp_path):
    """SIGTERM arrives while the artifact is being filled: the temporary directory goes too."""
    out = tmp_path / "out"
    code = ("import os, signal, sys\n"
            "import specdec_compile.artifact.writer as a\n"
            "real = a.render\n"
            "def render(*args, **kw):\n"
            "    os.kill(os.getpid(), signal.SIGTERM)\n"
            "    return real(*args, **kw)\n"
            "a.render = render\n"
            "from specdec_compile import cli\n"
            f"sys.exit(cli.main([{str(fixture_path('llama_gqa'))!r}, '--role', 'dlm', '-o', {str(out)!r}]))\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         env=dict(os.environ))
    assert res.returncode == 143, res.stderr
    assert "terminated" in res.stderr and "Traceback" not in res.stderr
    assert list(tmp_path.iterdir()) == []
