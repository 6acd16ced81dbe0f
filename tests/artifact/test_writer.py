"""The artifact writer (contract sections 3-5), on a small hand-made result.

The rewrite itself is tested elsewhere; here a tiny graph with the contract's
interface stands in for a rewrite result, so every property of the writer
(goldens, determinism, atomicity, compile.sh) is checked in milliseconds.
End-to-end runs on real exports are in tests/cli/test_compile.py.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace

import onnx
import pytest
from onnx import TensorProto, helper

from specdec_compile import __version__
from specdec_compile.artifact import writer as artifacts
from specdec_compile.artifact.writer import Options, write_artifact
from specdec_compile.contract import TARGET_OPSET
from specdec_compile.errors import SpecdecError
from specdec_compile.model_io import sha256_file

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "artifacts"

# The Cloud AI 100 SDK CodeGen speculative-decoding example
# (quic/cloud-ai-sdk, network-specializations/): PL=32, CL=256, k=7.
SDK_DLM = {"specializations": [{"batch_size": "1", "seq_len": s, "ctx_len": "256"} for s in ("32", "2", "1")]}
SDK_TLM7 = {"specializations": [{"batch_size": "1", "seq_len": s, "ctx_len": "256"} for s in ("32", "7", "8")]}


# --------------------------------------------------------------------------- a stand-in rewrite result

def _vi(name, dtype, shape):
    return helper.make_tensor_value_info(name, dtype, shape)


def original_model(layers=2, kv_heads=2, head_dim=16, vocab=211) -> onnx.ModelProto:
    """The interface of an optimum export (graph body irrelevant here)."""
    ins = [_vi("input_ids", TensorProto.INT64, ["batch_size", "sequence_length"]),
           _vi("attention_mask", TensorProto.INT64, ["batch_size", "past_sequence_length + sequence_length"]),
           _vi("position_ids", TensorProto.INT64, ["batch_size", "sequence_length"])]
    outs = [_vi("logits", TensorProto.FLOAT, ["batch_size", "sequence_length", vocab])]
    nodes = [helper.make_node("Cast", ["input_ids"], ["logits"], to=TensorProto.FLOAT)]
    for i in range(layers):
        for kv in ("key", "value"):
            ins.append(_vi(f"past_key_values.{i}.{kv}", TensorProto.FLOAT,
                           ["batch_size", kv_heads, "past_sequence_length", head_dim]))
            outs.append(_vi(f"present.{i}.{kv}", TensorProto.FLOAT,
                            ["batch_size", kv_heads, "past_sequence_length + sequence_length", head_dim]))
            nodes.append(helper.make_node("Identity", [f"past_key_values.{i}.{kv}"], [f"present.{i}.{kv}"]))
    g = helper.make_graph(nodes, "orig", ins, outs)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])


def rewritten_model(layers=2, kv_heads=2, head_dim=16, vocab=211, role="tlm", target="qaic") -> onnx.ModelProto:
    """The contract interface (section 2), plus one initializer with external data."""
    ins = [_vi("input_ids", TensorProto.INT64, ["batch_size", "seq_len"]),
           _vi("position_ids", TensorProto.INT64, ["batch_size", "seq_len"])]
    outs = [_vi("logits", TensorProto.FLOAT, ["batch_size", "seq_len" if role == "tlm" else 1, vocab])]
    nodes = [helper.make_node("Cast", ["input_ids"], ["logits"], to=TensorProto.FLOAT)]
    for i in range(layers):
        for kv in ("key", "value"):
            n = f"past_{kv}.{i}"
            ins.append(_vi(n, TensorProto.FLOAT, ["batch_size", kv_heads, "ctx_len", head_dim]))
            outs.append(_vi(f"{n}_RetainedState", TensorProto.FLOAT, ["batch_size", kv_heads, "ctx_len", head_dim]))
            nodes.append(helper.make_node("Identity", [n], [f"{n}_RetainedState"]))
    w = helper.make_tensor("w", TensorProto.FLOAT, [4], [0.0] * 4)
    w.ClearField("float_data")
    w.data_location = TensorProto.EXTERNAL
    for k, v in (("location", "weights.bin"), ("offset", "0"), ("length", "16")):
        e = w.external_data.add()
        e.key, e.value = k, v
    g = helper.make_graph(nodes, "rewritten", ins, outs, initializer=[w])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", TARGET_OPSET[target])])


def fake_result(tmp_path: Path, role="tlm", layers=2, target="qaic"):
    """A CompileResult-like object whose source lives in ``tmp_path/src``."""
    src = tmp_path / "src"
    src.mkdir(exist_ok=True)
    if not (src / "model.onnx").exists():  # written once: artifacts hard-link weights.bin
        onnx.save(original_model(layers), src / "model.onnx")
        (src / "weights.bin").write_bytes(bytes(range(16)))
    info = SimpleNamespace(num_layers=layers, num_heads=4, num_kv_heads=2, head_dim=16, vocab_size=211,
                           dtype="float32", family="llama", exporter="optimum")
    return SimpleNamespace(model=rewritten_model(layers, role=role, target=target), info=info, role=role, target=target,
                           passes=["detect", "retain_kv", "position_mask", "role_logits"],
                           source=src / "model.onnx", source_dir=src, snapshots=[])


def tlm(**kw):
    return Options(role="tlm", k=7, **kw)


def dlm(**kw):
    return Options(role="dlm", **kw)


def listing(d: Path) -> dict[str, bytes]:
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


# --------------------------------------------------------------------------- goldens

def test_specializations_reproduce_sdk_codegen_example(tmp_path):
    d = write_artifact(fake_result(tmp_path, "dlm"), dlm(), tmp_path / "dlm").out
    t = write_artifact(fake_result(tmp_path, "tlm"), tlm(), tmp_path / "tlm").out
    assert json.loads((d / "specializations.json").read_text()) == SDK_DLM
    assert json.loads((t / "specializations.json").read_text()) == SDK_TLM7
    assert (d / "specializations.json").read_bytes() == (GOLDEN / "dlm_specializations.json").read_bytes()
    assert (t / "specializations.json").read_bytes() == (GOLDEN / "tlm_specializations_7.json").read_bytes()


def test_k_list_adds_one_width_each_and_batch_ctx_everywhere(tmp_path):
    o = Options(role="tlm", k=7, k_list=(5, 3, 7, 3), prefill_len=16, ctx_len=128, batch_size=4)
    assert o.seq_lens() == [16, 7, 8, 4, 6]
    assert o.widths() == [3, 5, 7]
    a = write_artifact(fake_result(tmp_path), o, tmp_path / "o")
    spec = json.loads((a.out / "specializations.json").read_text())["specializations"]
    assert [s["seq_len"] for s in spec] == ["16", "7", "8", "4", "6"]
    assert {s["batch_size"] for s in spec} == {"4"} and {s["ctx_len"] for s in spec} == {"128"}
    assert a.manifest["specializations"] == [16, 7, 8, 4, 6] and a.manifest["k_list"] == [3, 5, 7]
    # a width that coincides with an earlier one is the same specialization
    assert Options(role="tlm", k=1, prefill_len=2).seq_lens() == [2, 1]
    assert Options(role="dlm", prefill_len=1).seq_lens() == [1, 2]


def test_custom_io_lists_kv_and_logits_when_asked(tmp_path):
    a = write_artifact(fake_result(tmp_path), tlm(), tmp_path / "a").out
    assert (a / "custom_io.yaml").read_bytes() == (GOLDEN / "custom_io_2layers.yaml").read_bytes()
    b = write_artifact(fake_result(tmp_path), tlm(logits_dtype="float16"), tmp_path / "b").out
    assert (b / "custom_io.yaml").read_bytes() == (GOLDEN / "custom_io_2layers_logits.yaml").read_bytes()
    c = write_artifact(fake_result(tmp_path), tlm(kv_dtype="float32"), tmp_path / "c").out
    text = (c / "custom_io.yaml").read_text()
    assert text.count("Precision: float32") == 8 and "float16" not in text and "logits" not in text


# --------------------------------------------------------------------------- compile.sh

CONTRACT_FLAGS = ["-m=model.onnx", "-aic-hw", "-network-specialization-config=specializations.json",
                  "-retained-state", "-convert-to-fp16", "-custom-IO-list-file=custom_io.yaml", "-compile-only",
                  "-aic-binary-dir=qpc", "-aic-num-cores=16"]


def bash_n(script: Path):
    r = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_compile_sh_holds_contract_flags(tmp_path):
    a = write_artifact(fake_result(tmp_path), tlm(), tmp_path / "o")
    sh = (a.out / "compile.sh").read_text()
    bash_n(a.out / "compile.sh")
    assert os.access(a.out / "compile.sh", os.X_OK)
    assert 'cd "$(dirname "$0")"' in sh
    for f in CONTRACT_FLAGS:
        assert f in sh, f
    assert "-mxfp6-matmul" not in sh and "-mdp-load-partition-config" not in sh
    assert not (a.out / "mdp_partition.json").exists()
    assert a.compile_flags[0] == "-m=model.onnx" and "-retained-state" in a.compile_flags


def test_compile_sh_mx6_and_partition_config(tmp_path):
    o = tlm(precision="mx6", num_devices=4, num_cores=16)
    a = write_artifact(fake_result(tmp_path), o, tmp_path / "o")
    sh = (a.out / "compile.sh").read_text()
    bash_n(a.out / "compile.sh")
    assert "-mxfp6-matmul" in sh and "-mdp-load-partition-config=mdp_partition.json" in sh
    part = a.out / "mdp_partition.json"
    assert part.read_bytes() == (GOLDEN / "mdp_partition_4x16.json").read_bytes()
    cfg = json.loads(part.read_text())
    assert cfg["connections"] == [{"devices": [0, 1, 2, 3], "type": "p2p"}]
    assert [d["deviceId"] for d in cfg["partitions"][0]["devices"]] == [0, 1, 2, 3]
    assert "mdp_partition.json" in a.files and a.manifest["num_devices"] == 4


def _fake_compiler(bindir: Path, name: str, rc: int = 0) -> Path:
    """A FAKE compiler (test double, not the SDK): records its argv and cwd, exits ``rc``."""
    bindir.mkdir(parents=True, exist_ok=True)
    exe = bindir / name
    exe.write_text("#!/usr/bin/env bash\n# FAKE qaic compiler for tests: records argv, compiles nothing\n"
                   'printf "%s\\n" "$PWD" "$@" > "$FAKE_QAIC_LOG"\n'
                   f"echo fake-{name} ran\nexit {rc}\n")
    exe.chmod(0o755)
    return exe


@pytest.mark.parametrize("name,hw_default", [("qaic-compile", "ai100"), ("qaic-exec", "2.0")])
def test_compile_sh_picks_compiler_and_hw_version(tmp_path, name, hw_default):
    a = write_artifact(fake_result(tmp_path), tlm(), tmp_path / "o")
    _fake_compiler(tmp_path / "bin", name)
    log = tmp_path / "argv.txt"
    env = {"PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin", "FAKE_QAIC_LOG": str(log)}
    r = subprocess.run(["bash", str(a.out / "compile.sh"), "-extra-flag"], cwd=tmp_path, env=env,
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    cwd, *argv = log.read_text().splitlines()
    assert Path(cwd).resolve() == a.out.resolve()  # paths in the command are relative to the artifact
    assert argv[:2] == ["-aic-hw", f"-aic-hw-version={hw_default}"]
    assert argv[2:] == a.compile_flags + ["-extra-flag"]
    # an explicit --hw-version wins over the compiler's default
    b = write_artifact(fake_result(tmp_path), tlm(hw_version="2.0" if hw_default == "ai100" else "ai100"),
                       tmp_path / "b")
    subprocess.run(["bash", str(b.out / "compile.sh")], env=env, check=True, capture_output=True)
    assert log.read_text().splitlines()[2] != f"-aic-hw-version={hw_default}"


def test_compile_sh_without_compiler_says_so(tmp_path):
    a = write_artifact(fake_result(tmp_path), tlm(), tmp_path / "o")
    if any(Path("/opt/qti-aic/exec", c).exists() for c in ("qaic-compile", "qaic-exec")):
        pytest.skip("a real Cloud AI 100 SDK is installed here")
    r = subprocess.run(["bash", str(a.out / "compile.sh")], env={"PATH": "/usr/bin:/bin"},
                       capture_output=True, text=True)
    assert r.returncode == 127 and "no Cloud AI 100 compiler" in r.stderr


def test_ort_target_has_no_compile_script(tmp_path):
    a = write_artifact(fake_result(tmp_path, target="ort"), tlm(target="ort"), tmp_path / "o")
    assert not (a.out / "compile.sh").exists() and a.compile_flags == []
    assert sorted(a.files) == ["manifest.json", "model.onnx", "specializations.json", "weights.bin"]


# --------------------------------------------------------------------------- manifest, determinism

def test_manifest_fields_and_no_absolute_paths(tmp_path):
    res = fake_result(tmp_path)
    a = write_artifact(res, tlm(k_list=(3,)), tmp_path / "o")
    m = json.loads((a.out / "manifest.json").read_text())
    for key in ("role", "k", "k_list", "prefill_len", "ctx_len", "batch_size", "num_layers", "num_heads",
                "num_kv_heads", "head_dim", "vocab_size", "dtype", "target", "kv_dtype", "logits_dtype",
                "precision", "num_cores", "num_devices", "specializations", "source", "passes", "tool_version"):
        assert key in m, key
    assert m["role"] == "tlm" and m["k"] == 7 and m["k_list"] == [3, 7]
    assert (m["num_layers"], m["num_kv_heads"], m["head_dim"], m["vocab_size"]) == (2, 2, 16, 211)
    assert m["specializations"] == [32, 7, 8, 4]
    assert m["source"] == {"file": "model.onnx", "sha256": sha256_file(res.source)}
    assert m["passes"] == res.passes and m["tool_version"] == __version__
    assert m["files"] == sorted(a.files)
    assert [s["name"] for s in m["interface"]["inputs"]][:3] == ["input_ids", "position_ids", "past_key.0"]
    for name, data in listing(a.out).items():
        assert str(tmp_path).encode() not in data, name
        assert b"/work/" not in data and b"/tmp/" not in data, name


def test_token_ids_from_export_config_and_runtime_reads_artifact(tmp_path):
    res = fake_result(tmp_path)
    (res.source_dir / "config.json").write_text(json.dumps({"eos_token_id": 2, "bos_token_id": 1}))
    (res.source_dir / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 9]}))
    t = write_artifact(res, tlm(k_list=(3,)), tmp_path / "t")
    d = write_artifact(fake_result(tmp_path, "dlm"), dlm(), tmp_path / "d")
    assert t.manifest["eos_token_id"] == 2 and t.manifest["eos_token_ids"] == [2, 9] and t.manifest["bos_token_id"] == 1
    assert t.manifest["pad_token_id"] is None
    try:
        from specdec_compile.artifact.reader import load_artifact
        from specdec_compile.runtime.pairing import check_pair
    except ImportError:
        pytest.skip("runtime artifact reader not available")
    ta, da = load_artifact(t.out, expect_role="tlm"), load_artifact(d.out, expect_role="dlm")
    assert (ta.k, tuple(ta.k_list), ta.prefill_len, ta.ctx_len) == (7, (3, 7), 32, 256)
    check_pair(ta, da)


def test_external_data_is_copied_not_rewritten(tmp_path):
    res = fake_result(tmp_path)
    a = write_artifact(res, tlm(), tmp_path / "o")
    assert (a.out / "weights.bin").read_bytes() == bytes(range(16))
    assert os.stat(a.out / "weights.bin").st_ino != os.stat(res.source_dir / "weights.bin").st_ino
    m = onnx.load(a.out / "model.onnx", load_external_data=False)
    assert {e.key: e.value for e in m.graph.initializer[0].external_data}["location"] == "weights.bin"
    b = write_artifact(res, tlm(link_weights=True), tmp_path / "l")        # --link-weights
    assert os.stat(b.out / "weights.bin").st_ino == os.stat(res.source_dir / "weights.bin").st_ino


def test_deterministic_bytes(tmp_path):
    o = tlm(k_list=(3, 5), num_devices=2, precision="mx6", logits_dtype="float16")
    a = write_artifact(fake_result(tmp_path), o, tmp_path / "a")
    b = write_artifact(fake_result(tmp_path), o, tmp_path / "b")
    la, lb = listing(a.out), listing(b.out)
    assert sorted(la) == sorted(lb) and len(la) == 7
    for name in la:
        assert la[name] == lb[name], name


# --------------------------------------------------------------------------- atomicity

def _leftovers(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if p.name.startswith("."))


def _boom_on(monkeypatch, template):
    real = artifacts.render

    def render(name, **values):
        if name == template:
            raise RuntimeError("injected failure")
        return real(name, **values)

    monkeypatch.setattr(artifacts, "render", render)


@pytest.mark.parametrize("template", ["specializations.json.j2", "compile.sh.j2", "mdp_partition.json.j2"])
def test_failure_leaves_no_output(tmp_path, monkeypatch, template):
    _boom_on(monkeypatch, template)
    out = tmp_path / "new" / "deeper" / "o"
    with pytest.raises(RuntimeError, match="injected"):
        write_artifact(fake_result(tmp_path), tlm(num_devices=2), out)
    assert not (tmp_path / "new").exists()  # nor the parents it made
    assert _leftovers(tmp_path) == []


def test_failure_keeps_existing_output(tmp_path, monkeypatch):
    out = tmp_path / "o"
    write_artifact(fake_result(tmp_path, "dlm"), dlm(), out)
    before = listing(out)
    _boom_on(monkeypatch, "custom_io.yaml.j2")
    with pytest.raises(RuntimeError, match="injected"):
        write_artifact(fake_result(tmp_path), tlm(), out, force=True)
    assert listing(out) == before and _leftovers(tmp_path) == []


def test_failure_in_final_rename_restores_previous(tmp_path, monkeypatch):
    out = tmp_path / "o"
    write_artifact(fake_result(tmp_path, "dlm"), dlm(), out)
    before = listing(out)
    real = os.rename

    def rename(src, dst):
        if Path(src).name.startswith(".o.tmp-"):
            raise OSError(5, "injected rename failure")
        return real(src, dst)

    monkeypatch.setattr(artifacts.os, "rename", rename)
    with pytest.raises(SpecdecError, match="cannot write the output .*injected rename failure"):
        write_artifact(fake_result(tmp_path), tlm(), out, force=True)
    assert listing(out) == before and _leftovers(tmp_path) == []


def test_force_replaces_previous_artifact(tmp_path):
    out = tmp_path / "o"
    write_artifact(fake_result(tmp_path, "dlm"), dlm(), out)
    with pytest.raises(SpecdecError, match="--force"):
        write_artifact(fake_result(tmp_path), tlm(), out)
    a = write_artifact(fake_result(tmp_path), tlm(), out, force=True)
    assert a.manifest["role"] == "tlm" and _leftovers(tmp_path) == []
    # an empty directory is fine without --force
    empty = tmp_path / "empty"
    empty.mkdir()
    write_artifact(fake_result(tmp_path), tlm(), empty)
    assert (empty / "manifest.json").is_file()


def test_force_refuses_a_directory_that_is_not_an_artifact(tmp_path):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    with pytest.raises(SpecdecError, match="previous specdec-compile artifact"):
        write_artifact(fake_result(tmp_path), tlm(), out, force=True)
    assert (out / "notes.txt").read_text() == "keep me"


def test_refuses_to_replace_the_directory_of_the_input(tmp_path):
    res = fake_result(tmp_path)
    (res.source_dir / "manifest.json").write_text("{}")
    with pytest.raises(SpecdecError, match="holds the input model"):
        write_artifact(res, tlm(), res.source_dir, force=True)
    assert (res.source_dir / "model.onnx").is_file()


# --------------------------------------------------------------------------- option checks

@pytest.mark.parametrize("fields,msg", [
    (dict(role="tlm"), "--k is required"),
    (dict(role="tlm", k=0), "at least 1"),
    (dict(role="tlm", k=256, ctx_len=256), "larger than --ctx-len"),
    (dict(role="tlm", k=3, k_list=(300,)), "larger than --ctx-len"),
    (dict(role="dlm", k=7), "--k is for the target model only"),
    (dict(role="dlm", k_list=(3,)), "--k-list is for the target"),
    (dict(role="dlm", prefill_len=512, ctx_len=256), "larger than --ctx-len"),
    (dict(role="dlm", batch_size=0), "--batch-size"),
    (dict(role="dlm", num_cores=17), "--num-cores"),
    (dict(role="dlm", num_devices=0), "--num-devices"),
    (dict(role="xlm"), "unknown role"),
    (dict(role="dlm", target="cuda"), "unknown target"),
])
def test_bad_options_are_one_line_errors(fields, msg):
    with pytest.raises(SpecdecError, match=msg) as e:
        Options(**fields)   # checked where it is built
    assert "\n" not in str(e.value)


def test_io_changes_fold_layers():
    from specdec_compile.artifact.writer import io_changes, io_signature

    ch = io_changes(io_signature(original_model(3)), io_signature(rewritten_model(3)))
    by = {(c["change"], c["name"]): c for c in ch}
    assert by[("removed", "attention_mask")]["layers"] is None
    assert by[("removed", "past_key_values.{i}.key")]["layers"] == "0..2"
    assert by[("added", "past_key.{i}_RetainedState")]["after"] == "float32[batch_size, 2, ctx_len, 16]"
    assert ("changed", "logits") in by and ("changed", "input_ids") in by


def test_templates_dir_has_every_template():
    from specdec_compile.resources import templates_dir

    names = {p.name for p in templates_dir().iterdir()}
    assert {"specializations.json.j2", "custom_io.yaml.j2", "compile.sh.j2", "qaic_flags.j2",
            "mdp_partition.json.j2"} <= names
    assert shutil.which("bash")
