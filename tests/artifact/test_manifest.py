"""The manifest record (``specdec_compile.artifact.manifest.Manifest``): what the writer
writes reads back equal, the reader is strict (no other spellings of a key), and
``write_artifact`` refuses options that disagree with the graph it is given."""
from __future__ import annotations

import json

import pytest

from specdec_compile.artifact.writer import write_artifact
from specdec_compile.contract import CTX_LEN_KEY
from specdec_compile.errors import SpecdecError
from specdec_compile.artifact.manifest import FIELDS, OPTIONAL, SCHEMA, Manifest
from test_writer import dlm, fake_result, tlm


def _one_line(e) -> str:
    msg = str(e.value)
    assert "\n" not in msg
    return msg


# --------------------------------------------------------------------------- round trip

def test_optional_keys_round_trip_and_belong_to_their_role(tmp_path):
    res = fake_result(tmp_path, "tlm", target="ort")
    rec = write_artifact(res, tlm(target="ort"), tmp_path / "o").record
    assert "hidden_states" not in rec.to_json() and "feature_draft" not in rec.to_json()   # absent unless set
    hs = {"layers": [-1], "layer_indices": [1], "hidden_size": 8, "width": 8, "output": "hidden_states"}
    d = dict(rec.to_json(), hidden_states=hs)
    back = Manifest.from_json(json.loads(json.dumps(d)))
    assert back.hidden_states == hs and back.to_json() == d
    with pytest.raises(SpecdecError, match="feature_draft belongs to a DLM") as e:
        Manifest.from_json(dict(rec.to_json(), feature_draft={"target_layers": [-1]}))
    _one_line(e)
    with pytest.raises(SpecdecError, match="hidden_states is"):
        Manifest.from_json(dict(rec.to_json(), hidden_states=[1]))



@pytest.mark.parametrize("role,target", [("tlm", "qaic"), ("dlm", "qaic"), ("tlm", "ort")])
def test_write_read_round_trip(tmp_path, role, target):
    res = fake_result(tmp_path, role, target=target)
    (res.source_dir / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 9]}))
    opts = tlm(k_list=(0, 3), target=target) if role == "tlm" else dlm(target=target)
    written = write_artifact(res, opts, tmp_path / "o")
    rec = written.record
    assert isinstance(rec, Manifest) and rec.role == role and rec.target == target
    assert Manifest.read(tmp_path / "o") == rec                                  # write -> read
    text = (tmp_path / "o" / "manifest.json").read_text()
    assert rec.dumps() == text and json.loads(text) == rec.to_json() == written.manifest
    assert Manifest.from_json(json.loads(json.dumps(rec.to_json()))) == rec     # to_json -> from json
    assert rec.eos_token_ids == (2, 9) and rec.files == tuple(sorted(written.files))
    assert (rec.k, rec.k_list) == ((7, (0, 3, 7)) if role == "tlm" else (None, None))


def test_record_has_a_field_per_key():
    assert set(FIELDS) == (set(SCHEMA) - {"source"}) | {"source_file", "source_sha256"} | set(OPTIONAL)


def test_runtime_artifact_carries_the_record(tmp_path):
    from specdec_compile.artifact.reader import load_artifact

    written = write_artifact(fake_result(tmp_path, target="ort"), tlm(target="ort"), tmp_path / "o")
    art = load_artifact(tmp_path / "o")
    assert art.record == written.record and art.manifest == written.manifest
    assert (art.k, art.k_list, art.prefill_len) == (written.record.k, written.record.k_list, 32)


# --------------------------------------------------------------------------- strict reading

def _written(tmp_path) -> dict:
    write_artifact(fake_result(tmp_path), tlm(), tmp_path / "o")
    return json.loads((tmp_path / "o" / "manifest.json").read_text())


def _edit(data: dict, **change) -> dict:
    d = dict(data)
    for key, value in change.items():
        if value is ...:
            d.pop(key)
        else:
            d[key] = value
    return d


@pytest.mark.parametrize("change,needle", [
    (dict(prefill_len=...), "lacks prefill_len"),
    (dict(prefill_len=..., PL=32), "lacks prefill_len"),              # an alias spelling is not read
    (dict(spec_len=7), "unknown key(s) spec_len"),
    (dict(k="7"), "k is '7', expected an integer or null"),
    (dict(ctx_len=None), "ctx_len is None, expected an integer"),
    (dict(k_list=[3, "x"]), "expected a list of integers"),
    (dict(role="draft"), "role is 'draft', expected tlm or dlm"),
    (dict(target="cuda"), "target is 'cuda', expected one of qaic, ort, openvino"),
    (dict(k=None), "k=None, expected k >= 1"),
    (dict(k_list=[3]), "does not hold k=7"),
    (dict(role="dlm"), "a DLM manifest has k=7"),
    (dict(batch_size=0), "batch_size=0, expected at least 1"),
    (dict(source="model.onnx"), "source is 'model.onnx', expected an object"),
    (dict(source={"file": "m.onnx"}), "expected {\"file\": name, \"sha256\": hex}"),
    (dict(precision=None), "precision is null, expected the compile's"),
    (dict(num_cores=None), "num_cores=None, expected at least 1"),
    (dict(num_devices=0), "num_devices=0, expected at least 1"),
    (dict(target="ort"), "precision is 'fp16', an option of the Cloud AI 100 compiler, on an ort artifact"),
    (dict(digests={"model.onnx": "0" * 64}), "expected the files"),
    (dict(digests=[]), "digests is [], expected an object"),
])
def test_strict_reader_refuses_in_one_line(tmp_path, change, needle):
    data = _edit(_written(tmp_path), **change)
    (tmp_path / "o" / "manifest.json").write_text(json.dumps(data))
    with pytest.raises(SpecdecError) as e:
        Manifest.read(tmp_path / "o")
    msg = _one_line(e)
    assert needle in msg and "manifest.json" in msg


@pytest.mark.parametrize("text,needle", [("[1, 2]", "expected a JSON object"), ("{", "corrupt JSON")])
def test_strict_reader_refuses_what_is_no_manifest(tmp_path, text, needle):
    _written(tmp_path)
    (tmp_path / "o" / "manifest.json").write_text(text)
    with pytest.raises(SpecdecError) as e:
        Manifest.read(tmp_path / "o")
    assert needle in _one_line(e)
    with pytest.raises(SpecdecError, match="missing"):
        Manifest.read(tmp_path / "nowhere")


def test_runtime_reads_no_alias_spelling(tmp_path):
    from specdec_compile.artifact.reader import load_artifact

    data = _written(tmp_path)
    data["PL"] = data.pop("prefill_len")
    (tmp_path / "o" / "manifest.json").write_text(json.dumps({"model": data}))     # nor a nested one
    with pytest.raises(SpecdecError) as e:
        load_artifact(tmp_path / "o", need_model=False)
    assert "lacks role" in _one_line(e)


# --------------------------------------------------------------------------- the graph decides

def _with_meta(res, **meta):
    for key, value in meta.items():
        res.model.metadata_props.add(key=key, value=value)
    return res


def _fix_dim(res, name: str, axis: int, value: int):
    for vi in res.model.graph.input:
        if vi.name == name:
            vi.type.tensor_type.shape.dim[axis].dim_value = value
    return res


@pytest.mark.parametrize("make,opts,needle", [
    (lambda t: fake_result(t, "tlm"), dlm(), "role tlm (the rewrite's role), the artifact asks for --role dlm"),
    (lambda t: fake_result(t, "dlm"), tlm(), "role dlm (the rewrite's role)"),
    (lambda t: fake_result(t, "tlm", target="ort"), tlm(), "target ort (the rewrite's target)"),
    (lambda t: fake_result(t, "tlm", target="ort"), tlm(target="qaic"), "--target qaic"),
    (lambda t: _with_meta(fake_result(t), **{"specdec.target": "ort"}), tlm(), "specdec.target metadata"),
    (lambda t: _with_meta(fake_result(t), **{CTX_LEN_KEY: "128"}), tlm(), "ctx_len 128"),
    (lambda t: _fix_dim(fake_result(t), "past_key.0", 2, 64), tlm(), "fixed dim 2 of past_key.0"),
    (lambda t: _fix_dim(fake_result(t), "input_ids", 0, 4), tlm(), "batch_size 4"),
    (lambda t: _fix_dim(fake_result(t), "input_ids", 1, 8), tlm(), "only seq_len 8"),
])
def test_write_refuses_options_the_graph_contradicts(tmp_path, make, opts, needle):
    res = make(tmp_path)
    with pytest.raises(SpecdecError) as e:
        write_artifact(res, opts, tmp_path / "o")
    assert needle in _one_line(e)
    assert not (tmp_path / "o").exists()


def test_role_read_from_the_logits_when_the_result_does_not_say(tmp_path):
    res = fake_result(tmp_path, "dlm")
    res.role = None                              # a result without the field: the logits decide
    with pytest.raises(SpecdecError, match=r"role dlm \(its logits have seq dim 1\)"):
        write_artifact(res, tlm(), tmp_path / "o")
    assert write_artifact(res, dlm(), tmp_path / "o").record.role == "dlm"


def test_opset_names_the_target(tmp_path):
    res = fake_result(tmp_path)
    res.target = None
    res.model.opset_import[0].version = 24
    with pytest.raises(SpecdecError, match="target ort \\(its opset 24\\)"):
        write_artifact(res, tlm(), tmp_path / "o")


def test_opset_17_names_qaic_only_with_its_domain(tmp_path):
    """opset 17 is the qaic and the openvino lowering's: it names qaic where the graph imports the
    com.qualcomm.cloud domain (CtxScatter), and names nothing otherwise (its metadata decides)."""
    from onnx import helper
    from specdec_compile.artifact.graph_facts import graph_claims
    from specdec_compile.contract import QAIC_DOMAIN
    res = fake_result(tmp_path)
    res.target = None
    res.model.opset_import[0].version = 17
    assert "its opset 17" not in str(graph_claims(res)["target"])
    res.model.opset_import.append(helper.make_opsetid(QAIC_DOMAIN, 1))
    assert ("qaic", "its opset 17") in graph_claims(res)["target"]
