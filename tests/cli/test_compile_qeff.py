"""QEfficient's compile options as options of ``specdec-compile`` (docs/qefficient.md, compile side):
each flows into compile.sh (run with a FAKE compiler that records its argv) and the manifest as
QEfficient's ``_compile`` writes the flag, and each qaic-only one is refused with the ort and
openvino targets in one line (exit 2, nothing written)."""
from __future__ import annotations

import json
import subprocess

import pytest
from test_compile import fake, run  # noqa: F401  (fixture)
from test_writer import _fake_compiler

from specdec_compile import cli
from specdec_compile.artifact.manifest import Manifest


def _compile_sh_argv(out, tmp_path) -> list[str]:
    """The argv compile.sh hands the compiler (a FAKE qaic-compile that records it)."""
    _fake_compiler(tmp_path / "bin", "qaic-compile")
    log = tmp_path / "argv.txt"
    env = {"PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin", "FAKE_QAIC_LOG": str(log)}
    done = subprocess.run(["bash", str(out / "compile.sh")], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return log.read_text().splitlines()[1:]


@pytest.mark.parametrize("ours,theirs,flag,manifest", [
    (["--mxfp6-matmul"], ["--precision", "mx6"], "-mxfp6-matmul", {"precision": "mx6"}),
    (["--num-cores", "8"], None, "-aic-num-cores=8", {"num_cores": 8}),
    (["--hw-version", "ai200"], None, "-aic-hw-version=ai200", {"hw_version": "ai200"}),
    (["--mos", "1"], None, "-mos=1", {"compile_options": {"mxint8_kv_cache": False, "qaic_flags": [], "mos": 1}}),
    (["--aic-enable-depth-first"], None, "-aic-enable-depth-first",
     {"compile_options": {"mxint8_kv_cache": False, "qaic_flags": [], "aic_enable_depth_first": True}}),
    (["--mxint8-kv-cache"], None, None, {"compile_options": {"mxint8_kv_cache": True, "qaic_flags": []}}),
])
def test_qeff_compile_option_reaches_compile_sh_and_manifest(fake, capsys, tmp_path, ours, theirs, flag, manifest):
    out = tmp_path / "a"
    rc, so, se = run([fake.model, "--role", "dlm", *ours, "-o", out, "--json"], capsys)
    assert rc == 0, se
    if flag is not None:
        assert flag in json.loads(so)["compile_command"]
        assert flag in _compile_sh_argv(out, tmp_path)
    data = json.loads((out / "manifest.json").read_text())
    for key, value in manifest.items():
        assert data[key] == value, key
    if theirs is not None:      # QEfficient's name gives the same artifact as ours
        rc, _, se = run([fake.model, "--role", "dlm", *theirs, "-o", tmp_path / "b"], capsys)
        assert rc == 0, se
        for name in ("compile.sh", "manifest.json", "specializations.json", "custom_io.yaml"):
            assert (out / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name


def test_all_together_in_qefficients_order_of_meaning(fake, capsys, tmp_path):
    out = tmp_path / "a"
    rc, _, se = run([fake.model, "--role", "dlm", "--mxfp6-matmul", "--num-cores", "14", "--mos", "2",
                     "--aic-enable-depth-first", "--mxint8-kv-cache", "--hw-version", "ai200",
                     "--qaic-flag", "-allow-mxint8-mdp-io", "-o", out], capsys)
    assert rc == 0, se
    argv = _compile_sh_argv(out, tmp_path)
    assert argv[:2] == ["-aic-hw", "-aic-hw-version=ai200"]
    for f in ("-mxfp6-matmul", "-aic-num-cores=14", "-mos=2", "-aic-enable-depth-first", "-retained-state",
              "-convert-to-fp16"):
        assert argv.count(f) == 1, f
    assert argv[-3:] == ["-mos=2", "-aic-enable-depth-first", "-allow-mxint8-mdp-io"]
    m = Manifest.read(out)
    assert m.compile_options == {"mxint8_kv_cache": True, "qaic_flags": ["-allow-mxint8-mdp-io"], "mos": 2,
                                 "aic_enable_depth_first": True}


QAIC_ONLY = [(["--mxfp6-matmul"], "--mxfp6-matmul is an option of the Cloud AI 100 compiler"),
             (["--mos", "1"], "--mos 1 is an option of the Cloud AI 100 compiler"),
             (["--aic-enable-depth-first"], "--aic-enable-depth-first is an option of the Cloud AI 100 compiler"),
             (["--hw-version", "ai200"], "--hw-version ai200 is an option of the Cloud AI 100 compiler"),
             (["--num-cores", "8"], "--num-cores 8 is an option of the Cloud AI 100 compiler"),
             (["--mxint8-kv-cache"], "--mxint8-kv-cache is an option of the Cloud AI 100 compiler")]

BAD = [(args + ["--target", target], msg) for args, msg in QAIC_ONLY for target in ("ort", "openvino")] + [
    (["--mxfp6-matmul", "--precision", "fp16"], "--mxfp6-matmul is --precision mx6: drop --precision fp16"),
    (["--mos", "-1"], "--mos must be an integer >= 0"),
    (["--mos", "1", "--qaic-flag", "-mos=2"], "-mos=2: mos is set by --mos too"),
    (["--aic-enable-depth-first", "--qaic-flag", "-aic-enable-depth-first"], "set by --aic-enable-depth-first too"),
    (["--hw-version", "ai300"], "invalid choice: 'ai300'"),
    (["--full-batch-size", "4", "--interface", "default"], "drop --interface default"),
    (["--full-batch-size", "4", "--batch-size", "2"], "--batch-size 2 contradicts it"),
    (["--full-batch-size", "0"], "--full-batch-size must be >= 1"),
    (["--full-batch-size", "4", "--target", "openvino"], "the openvino target has the default interface only"),
]


@pytest.mark.parametrize("args,msg", BAD, ids=[f"{' '.join(a)}" for a, _ in BAD])
def test_bad_qeff_compile_option_is_one_line_exit_2(fake, capsys, args, msg):
    out = fake.tmp / "out"
    rc, so, se = run([fake.model, "--role", "dlm", *args, "-o", out], capsys)
    assert rc == 2
    assert se.count("\n") == 1 and msg in se, se
    assert not out.exists() and fake.calls == []


def test_full_batch_size_is_qeff_continuous_batching(fixture_path, tmp_path, capsys):
    """--full-batch-size N = --interface qeff with QEfficient's continuous batching at N rows (real rewrite)."""
    src = str(fixture_path("llama_gqa"))
    shape = ["--role", "tlm", "--k", "3", "--prefill-len", "8", "--ctx-len", "32", "--target", "ort"]
    assert cli.main([src, *shape, "--full-batch-size", "4", "-o", str(tmp_path / "cb")]) == 0
    assert cli.main([src, *shape, "--interface", "qeff", "--batch-size", "2", "-o", str(tmp_path / "plain")]) == 0
    capsys.readouterr()
    cb, plain = Manifest.read(tmp_path / "cb"), Manifest.read(tmp_path / "plain")
    assert cb.batch_size == 4 and cb.qeff["full_batch_size"] == 4 and cb.qeff["batch_index"] == "batch_index"
    assert [i["name"] for i in cb.interface["inputs"]][-2:] == ["batch_index", "num_logits_to_keep"]
    assert plain.batch_size == 2 and plain.qeff["batch_size"] == 2 and "batch_index" not in plain.qeff
    assert [i["name"] for i in plain.interface["inputs"]][-1] == "num_logits_to_keep"
    assert "batch_index" not in [i["name"] for i in plain.interface["inputs"]]
    specs = json.loads((tmp_path / "cb" / "specializations.json").read_text())["specializations"]
    assert specs[0] == {"batch_size": "1", "seq_len": "8", "ctx_len": "32", "num_logits_to_keep": "1",
                        "full_batch_size": "4", "full_batch_exec_size": "1"}
    specs = json.loads((tmp_path / "plain" / "specializations.json").read_text())["specializations"]
    assert specs == [{"batch_size": "2", "seq_len": "8", "ctx_len": "32", "num_logits_to_keep": "1"},
                     {"batch_size": "2", "seq_len": "4", "ctx_len": "32", "num_logits_to_keep": "4"}]


@pytest.mark.parametrize("cb, seq_lens", [(False, [1]), (True, [1, 1])])
def test_qeff_dlm_at_prefill_1_has_no_duplicate_decode(cb, seq_lens, fixture_path, tmp_path, capsys):
    """QEfficient's plain interface drops a decode whose seq_len is the prefill's (its DLM at
    --prefill-len 1 has the one specialization); continuous batching keeps both (other batches)."""
    qeff = ["--full-batch-size", "2"] if cb else ["--interface", "qeff"]
    out = tmp_path / "dlm"
    assert cli.main([str(fixture_path("llama_gqa")), "--role", "dlm", "--prefill-len", "1", "--ctx-len", "32",
                     "--target", "ort", *qeff, "-o", str(out)]) == 0
    capsys.readouterr()
    specs = json.loads((out / "specializations.json").read_text())["specializations"]
    record = Manifest.read(out)
    assert [int(s["seq_len"]) for s in specs] == seq_lens == list(record.specializations)
    assert len(record.qeff["specializations"]) == len(specs)
    assert len({json.dumps(s, sort_keys=True) for s in specs}) == len(specs)
