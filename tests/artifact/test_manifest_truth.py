"""A manifest says only what its artifact is: an ort or openvino artifact records no Cloud AI
100 compile option and its graph's own cache dtype (and has no custom IO file), the cache
claims agree with the recorded interface, and the sha256 of every file (``digests``) lets
``verify`` refuse a file changed after the compile wrote it."""
from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from specdec_compile import cli
from specdec_compile.artifact.manifest import Manifest
from specdec_compile.artifact.reader import load_artifact
from specdec_compile.artifact.records import check_digests
from specdec_compile.artifact.writer import write_artifact
from specdec_compile.errors import SpecdecError
from specdec_compile.model_io import sha256_file
from test_writer import dlm, fake_result, tlm


def _one_line(e) -> str:
    assert "\n" not in str(e.value)
    return str(e.value)


@pytest.mark.parametrize("target", ["ort", "openvino"])
def test_a_cpu_artifact_records_no_compile_options_and_its_graphs_cache_dtype(tmp_path, target):
    a = write_artifact(fake_result(tmp_path, target=target), tlm(target=target), tmp_path / "o")
    m = a.record
    assert (m.precision, m.num_cores, m.num_devices, m.hw_version, m.logits_dtype) == (None,) * 5
    past = {s["dtype"] for s in m.interface["inputs"] if s["name"].startswith("past_")}
    assert past == {"float32"} and m.kv_dtype == "float32"     # not the qaic default float16
    assert not (a.out / "custom_io.yaml").exists() and "custom_io.yaml" not in m.files


def test_a_qaic_artifact_records_the_compile(tmp_path):
    opts = tlm(precision="mx6", num_cores=8, num_devices=2, kv_dtype="float16", logits_dtype="float16")
    m = write_artifact(fake_result(tmp_path), opts, tmp_path / "o").record
    assert (m.precision, m.num_cores, m.num_devices, m.kv_dtype, m.logits_dtype) == ("mx6", 8, 2, "float16", "float16")
    assert (tmp_path / "o" / "custom_io.yaml").is_file()


@pytest.mark.parametrize("target", ["qaic", "ort"])
def test_digests_cover_every_file_but_the_manifest(tmp_path, target):
    opts = dlm(target=target)
    a = write_artifact(fake_result(tmp_path, "dlm", target=target), opts, tmp_path / "o")
    d = a.record.digests
    assert set(d) == set(a.files) - {"manifest.json"} and "weights.bin" in d
    assert all(d[name] == sha256_file(a.out / name) for name in d)
    check_digests(a.out, Manifest.read(a.out))


@pytest.mark.parametrize("damage, needle", [
    (lambda o: (o / "weights.bin").write_bytes(b"\0" * 16), "weights.bin: sha256"),      # same size, other bytes
    (lambda o: (o / "specializations.json").unlink(), "specializations.json: missing"),
])
def test_a_file_changed_after_the_compile_is_refused(tmp_path, damage, needle):
    a = write_artifact(fake_result(tmp_path), tlm(), tmp_path / "o")
    damage(a.out)
    with pytest.raises(SpecdecError) as e:
        check_digests(a.out, Manifest.read(a.out))
    assert needle in _one_line(e)


@pytest.mark.parametrize("name", ["../src/model.onnx", "/etc/hostname"])
def test_a_digest_naming_a_file_outside_the_artifact_is_refused(tmp_path, name):
    a = write_artifact(fake_result(tmp_path), tlm(), tmp_path / "o")
    rec = json.loads((a.out / "manifest.json").read_text())
    rec["files"] = sorted(rec["files"] + [name])
    rec["digests"][name] = "0" * 64
    (a.out / "manifest.json").write_text(json.dumps(rec))
    with pytest.raises(SpecdecError) as e:
        check_digests(a.out, Manifest.read(a.out))
    assert "a file outside the artifact" in _one_line(e)


@pytest.mark.parametrize("change, needle", [
    (dict(num_layers=3), "num_layers is 3, but the interface has 2 past_key inputs"),
    (dict(kv_dtype="float16"), "kv_dtype is 'float16', but the ort graph's cache inputs are float32"),
    (dict(interface={"inputs": "x"}), "interface.inputs is not a list"),
])
def test_the_runtime_refuses_cache_claims_the_interface_contradicts(tmp_path, change, needle):
    a = write_artifact(fake_result(tmp_path, target="ort"), tlm(target="ort"), tmp_path / "o")
    rec = json.loads((a.out / "manifest.json").read_text())
    rec.update(change)
    (a.out / "manifest.json").write_text(json.dumps(rec))
    with pytest.raises(SpecdecError) as e:
        load_artifact(a.out)
    assert needle in _one_line(e)


def _compile(src, out, capsys):
    code = cli.main([str(src), "--role", "tlm", "--k", "3", "--target", "ort", "--prefill-len", "8",
                     "--ctx-len", "64", "-o", str(out)])
    capsys.readouterr()
    assert code == 0
    return out / "model.onnx"


def test_verify_refuses_a_graph_swapped_for_one_of_the_same_shapes(fixture_path, tmp_path, capsys):
    """Another rewrite with the same inputs, outputs and metadata but other weights: only the
    manifest's digests can tell, and verify refuses it before replaying anything."""
    src = fixture_path("llama_gqa")
    model_path = _compile(src, tmp_path / "t", capsys)
    assert cli.main(["verify", str(src), str(model_path)]) == 0
    capsys.readouterr()
    model = onnx.load(str(model_path))
    big = max(model.graph.initializer, key=lambda t: int(np.prod(t.dims)))
    big.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(big) * 1.5, big.name))
    onnx.save(model, str(model_path))
    assert cli.main(["verify", str(src), str(model_path)]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and "model.onnx: sha256" in err[0] and "compile the artifact again" in err[0]


def test_verify_refuses_a_manifest_whose_interface_is_not_the_graphs(fixture_path, tmp_path, capsys):
    src = fixture_path("llama_gqa")
    model_path = _compile(src, tmp_path / "t", capsys)
    manifest = tmp_path / "t" / "manifest.json"
    rec = json.loads(manifest.read_text())
    rec["interface"]["outputs"] = rec["interface"]["outputs"][:-1]
    manifest.write_text(json.dumps(rec))
    assert cli.main(["verify", str(src), str(model_path)]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and "interface (inputs and outputs) is not" in err[0]


def test_the_summary_names_an_ort_artifacts_own_cache_dtype(fixture_path, tmp_path, capsys):
    src = fixture_path("llama_gqa")
    assert cli.main([str(src), "--role", "tlm", "--k", "3", "--target", "ort", "--ctx-len", "64",
                     "--prefill-len", "8", "-o", str(tmp_path / "t")]) == 0
    out = capsys.readouterr().out
    shapes = next(line for line in out.splitlines() if line.strip().startswith("shapes"))
    assert shapes.endswith("KV float32") and "custom_io" not in out
