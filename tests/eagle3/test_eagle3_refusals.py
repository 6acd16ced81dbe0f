"""``import-head`` refuses, in one line with exit 2 and nothing written, every checkpoint or target
that does not fit: not EAGLE-3, a missing file, a hidden size / vocabulary / layer count that
disagrees with the target, layer ids out of range, d2t and t2d that disagree or leave the target's
vocabulary, safetensors that fail to parse, tensors of the wrong shape."""
from __future__ import annotations

import json
import struct

import numpy as np
import pytest

from eagle3_models import DATA, compile_target, copy_case, edit_config, refused_import, target_export
from specdec_compile import cli
from specdec_compile.eagle3.checkpoint import Eagle3Checkpoint, expected_shapes
from specdec_compile.eagle3.safetensors import read_safetensors, write_safetensors






def _tensors(d, fn):
    t = {k: np.array(v) for k, v in read_safetensors(d / "model.safetensors").items()}
    fn(t)
    write_safetensors(d / "model.safetensors", t)


def _synth(d, **layer):
    """Rewrite the checkpoint consistently for another layer config (every tensor of the shape it implies)."""
    cfg = edit_config(d, layer=layer)
    tl = cfg["transformer_layer_config"]
    H, V = tl["hidden_size"], tl["vocab_size"]
    ck = Eagle3Checkpoint(path=d, family="llama", hidden_size=H, intermediate_size=tl["intermediate_size"],
                          num_heads=tl["num_attention_heads"], num_kv_heads=tl["num_key_value_heads"],
                          head_dim=tl["head_dim"], eps=1e-5, rope={}, attention_bias=False, mlp_bias=False,
                          target_vocab=V, draft_vocab=cfg["draft_vocab_size"],
                          aux_ids=tuple(cfg["eagle_aux_hidden_state_layer_ids"]),
                          flags={k: False for k in ("norm_before_residual", "norm_before_fc", "fc_norm",
                                                    "norm_output")}, verifier={}, max_positions=512)
    rng = np.random.default_rng(0)
    shapes, _ = expected_shapes(ck)
    t = {k: rng.standard_normal(s).astype(np.float32) for k, s in shapes.items() if k not in ("d2t", "t2d")}
    ids = np.arange(ck.draft_vocab)
    t["d2t"] = np.zeros(ck.draft_vocab, np.int64)
    t["t2d"] = np.isin(np.arange(V), ids)
    write_safetensors(d / "model.safetensors", t)




def _truncate(d):
    f = d / "model.safetensors"
    f.write_bytes(f.read_bytes()[:-100])


def _garbage_header(d):
    f = d / "model.safetensors"
    data = f.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    f.write_bytes(data[:8] + b"{" * n + data[8 + n:])


def _huge_header(d):
    f = d / "model.safetensors"
    f.write_bytes(struct.pack("<Q", 1 << 40) + f.read_bytes()[8:])


def _set(name, fn):
    return lambda d: _tensors(d, lambda t: t.__setitem__(name, fn(t[name])))


def _flip_t2d(d):
    def fn(t):
        t2d = t["t2d"].copy()
        i = int(np.flatnonzero(t2d)[0])
        t2d[i], t2d[i + 1 if not t2d[i + 1] else int(np.flatnonzero(~t2d)[0])] = False, True
        t["t2d"] = t2d
    _tensors(d, fn)


CASES = {
    "not eagle3": (lambda d: edit_config(d, speculators_model_type="eagle"), ["not an EAGLE-3 checkpoint", "'eagle'"]),
    "no config": (lambda d: (d / "config.json").unlink(), ["no config.json"]),
    "no weights": (lambda d: (d / "model.safetensors").unlink(), ["no model.safetensors"]),
    "config not json": (lambda d: (d / "config.json").write_text("{"), ["not readable JSON"]),
    "vocabulary": (lambda d: _synth(d, vocab_size=300), ["vocabulary of 300", "has 211"]),
    "hidden size": (lambda d: _synth(d, hidden_size=32, head_dim=8), ["hidden size is 32", "64"]),
    "id past the layers": (lambda d: edit_config(d, eagle_aux_hidden_state_layer_ids=[1, 2, 5]),
                           ["id 5 is out of range", "4 layers"]),
    "negative id": (lambda d: edit_config(d, eagle_aux_hidden_state_layer_ids=[-1, 2, 3]), ["id -1 is out of range"]),
    "id 0": (lambda d: edit_config(d, eagle_aux_hidden_state_layer_ids=[0, 2, 3]), ["embedding output"]),
    "default ids repeat": (lambda d: edit_config(d, eagle_aux_hidden_state_layer_ids=None), ["names a layer twice"]),
    "d2t past the vocabulary": (_set("d2t", lambda a: a + 100), ["outside the target's vocabulary"]),
    "d2t and t2d disagree": (_flip_t2d, ["d2t and t2d disagree"]),
    "d2t without t2d": (lambda d: _tensors(d, lambda t: t.pop("t2d")), ["tensor 't2d' is missing"]),
    "truncated safetensors": (_truncate, ["not a valid safetensors file"]),
    "garbage header": (_garbage_header, ["not a valid safetensors file", "not JSON"]),
    "header past the end": (_huge_header, ["not a valid safetensors file", "past the end"]),
    "fc transposed": (_set("fc.weight", lambda a: a.T), ["'fc.weight' is [192, 64], expected [64, 192]"]),
    "fewer aux ids than fc reads": (lambda d: edit_config(d, eagle_aux_hidden_state_layer_ids=[1, 2]),
                                    ["'fc.weight' is [64, 192], expected [64, 128]"]),
    "unexpected tensor": (lambda d: _tensors(d, lambda t: t.__setitem__("layers.1.mlp.up_proj.weight",
                                                                          np.zeros((2, 2), np.float32))),
                          ["unexpected tensor 'layers.1.mlp.up_proj.weight'"]),
    "d2t of floats": (_set("d2t", lambda a: a.astype(np.float32)), ["'d2t' has dtype float32"]),
    "two decoder layers": (lambda d: edit_config(d, layer={"num_hidden_layers": 2}), ["only 1-layer"]),
    "both fc norms": (lambda d: edit_config(d, norm_before_fc=True, fc_norm=True), ["exclude each other"]),
    "unknown rope": (lambda d: edit_config(d, layer={"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4}}),
                     ["rope type 'yarn' is not supported"]),
    "other family": (lambda d: edit_config(d, layer={"model_type": "mistral"}), ["'mistral' is not supported"]),
    "llama3 rope without its factors": (
        lambda d: edit_config(d, layer={"rope_parameters": {"rope_type": "llama3", "rope_theta": 1e4, "factor": 8.0}}),
        ["rope type 'llama3' needs a positive low_freq_factor"]),
    "zero KV heads": (lambda d: edit_config(d, layer={"num_key_value_heads": -2}), ["do not fit 4 heads"]),
    "positions not a number": (lambda d: edit_config(d, layer={"max_position_embeddings": "many"}),
                               ["max_position_embeddings is 'many'"]),
    "verifier not an object": (lambda d: edit_config(d, speculators_config={"verifier": "llama"}),
                               ["speculators_config.verifier is 'llama'"]),
    "draft vocabulary past the target's": (lambda d: edit_config(d, draft_vocab_size=400),
                                           ["draft_vocab_size 400 is larger than the target vocabulary 211"]),
    # config values of the wrong JSON type: one line, never a traceback, never read as something else
    "rope_scaling a string": (lambda d: edit_config(d, layer={"rope_parameters": None, "rope_scaling": "linear"}),
                              ["rope parameters 'linear' are not an object"]),
    "partial rotary a string": (lambda d: edit_config(d, layer={"partial_rotary_factor": "half"}),
                                ["partial_rotary_factor 'half' is not supported"]),
    "eps NaN": (lambda d: edit_config(d, layer={"rms_norm_eps": float("nan")}), ["rms_norm_eps is nan"]),
    "rope_theta infinite": (lambda d: edit_config(d, layer={"rope_parameters": {"rope_type": "default",
                                                                            "rope_theta": float("inf")}}),
                            ["rope_theta inf is not a positive number"]),
    "attention_bias a string": (lambda d: edit_config(d, layer={"attention_bias": "false"}),
                                ["attention_bias is 'false', expected true or false"]),
    "head_dim 0": (lambda d: edit_config(d, layer={"head_dim": 0}), ["head_dim 0 do not fit"]),
    # a string's letters were read as architectures: 'l' matched the llama target, so a qwen2 head passed
    "architectures a string": (lambda d: edit_config(d, speculators_config={"verifier": {
                                   "architectures": "Qwen2ForCausalLM"}}),
                               ["verifier.architectures is 'Qwen2ForCausalLM', expected a list"]),
    "speculators_config a list": (lambda d: edit_config(d, speculators_config=["eagle3"]),
                                  ["speculators_config is ['eagle3'], expected an object"]),
    "NaN in a weight": (_set("fc.weight", lambda a: np.where(np.arange(a.size).reshape(a.shape) == 5, np.nan, a)
                             .astype(np.float32)), ["'fc.weight' holds NaN or infinite values"]),
}


def _replace_in_config(d, old: str, new: str):
    text = (d / "config.json").read_text()
    assert old in text
    (d / "config.json").write_text(text.replace(old, new, 1))


# found by a hostile-input hunt: each crashed (exit 3), was read wrongly, or was refused untruly
CASES.update({
    # OverflowError (exit 3): float() of an integer past float's range
    "eps 10**400": (lambda d: edit_config(d, layer={"rms_norm_eps": 10 ** 400}), ["rms_norm_eps", "positive number"]),
    "rope_theta 10**400": (lambda d: edit_config(d, layer={"rope_parameters": {"rope_type": "default",
                                                                           "rope_theta": 10 ** 400}}),
                           ["rope_theta", "not a positive number"]),
    "linear factor 10**400": (lambda d: edit_config(d, layer={"rope_parameters": {"rope_type": "linear",
                                                                              "rope_theta": 1e4,
                                                                              "factor": 10 ** 400}}),
                              ["needs a positive factor"]),
    # ValueError (exit 3): Python refuses to read an integer of more than 4300 digits
    "a 5000-digit integer": (lambda d: _replace_in_config(d, '"intermediate_size": 96',
                                                          '"intermediate_size": 1' + "0" * 5000),
                             ["config.json: not readable JSON"]),
    # RecursionError (exit 3)
    "deeply nested JSON": (lambda d: (d / "config.json").write_text("[" * 100000 + "]" * 100000),
                           ["config.json: not readable JSON"]),
    # a boolean or a float where an integer belongs was read as 1 / 64
    "num_hidden_layers true": (lambda d: edit_config(d, layer={"num_hidden_layers": True}),
                               ["num_hidden_layers is True, expected a positive integer"]),
    "num_hidden_layers 1.0": (lambda d: edit_config(d, layer={"num_hidden_layers": 1.0}),
                              ["num_hidden_layers is 1.0, expected a positive integer"]),
    "target_hidden_size 64.0": (lambda d: edit_config(d, target_hidden_size=64.0),
                                ["target_hidden_size is 64.0, expected null or an integer"]),
    # refused, but with an untrue line: "target_hidden_size 64 differs from the head's hidden size 64"
    "target_hidden_size a string": (lambda d: edit_config(d, target_hidden_size="64"),
                                    ["target_hidden_size is '64', expected null or an integer"]),
    "use_sliding_window a string": (lambda d: edit_config(d, layer={"use_sliding_window": "false"}),
                                    ["use_sliding_window is 'false', expected true or false"]),
})


@pytest.mark.parametrize("name", sorted(CASES))
def test_bad_checkpoint_is_refused_in_one_line(tmp_path, capsys, name):
    d = copy_case(tmp_path)
    mutate, needles = CASES[name]
    mutate(d)
    refused_import(tmp_path, capsys, d, *needles)


def test_an_output_that_holds_the_checkpoint_is_refused_even_with_force(tmp_path, capsys):
    """-o naming a previous artifact that holds the checkpoint: --force would replace the directory and
    delete the checkpoint with it (it did); refused in one line, both kept."""
    art = tmp_path / "art"
    argv = ["--tlm", str(target_export("eagle3_llama")), "--target", "ort", "-o", str(art), "--quiet"]
    assert cli.main(["import-head", str(DATA / "llama"), *argv]) == 0
    ckpt = copy_case(art)
    capsys.readouterr()
    assert cli.main(["import-head", str(ckpt), *argv, "--force"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "holds the checkpoint" in err[0], err
    assert (ckpt / "model.safetensors").is_file() and (art / "manifest.json").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["art"]


def test_missing_checkpoint_and_target(tmp_path, capsys):
    refused_import(tmp_path, capsys, tmp_path / "nope", "no such checkpoint directory")
    refused_import(tmp_path, capsys, DATA / "llama", "--tlm", "no such file", tlm=tmp_path / "none.onnx")


def test_a_compiled_target_must_expose_exactly_the_heads_layers(tmp_path, capsys):
    from specdec_compile import cli as c
    other = tmp_path / "tlm-other"
    assert c.main([str(target_export("eagle3_llama")), "--role", "tlm", "--k", "3", "--hidden-states", "0,1,2",
                   "--target", "ort", "-o", str(other), "--quiet"]) == 0
    refused_import(tmp_path, capsys, DATA / "llama", "--hidden-states 0,1,2", "recompile the target with "
             "--hidden-states 0,1,3", tlm=other)
    plain = tmp_path / "tlm-plain"
    assert c.main([str(target_export("eagle3_llama")), "--role", "tlm", "--k", "3", "--target", "ort",
                   "-o", str(plain), "--quiet"]) == 0
    refused_import(tmp_path, capsys, DATA / "llama", "no --hidden-states", tlm=plain)
    # the llama head against the qwen2 target compiled for the qwen head: with no verifier recorded (so
    # that the family check has nothing to compare), the exposed layers still do not fit
    anon = copy_case(tmp_path / "anon")
    edit_config(anon, speculators_config={"verifier": {}})
    refused_import(tmp_path, capsys, anon, "--hidden-states 1,2,3", tlm=compile_target("qwen", tmp_path / "q"))


def test_an_artifact_of_the_right_target_is_accepted_and_recorded(tmp_path):
    tlm = compile_target("llama", tmp_path / "tlm")
    out = tmp_path / "head"
    assert cli.main(["import-head", str(DATA / "llama"), "--tlm", str(tlm), "--target", "ort", "--k", "3",
                     "--prefill-len", "8", "--ctx-len", "64", "-o", str(out), "--quiet"]) == 0
    rec = json.loads((out / "manifest.json").read_text())["feature_draft"]["eagle3"]
    src = json.loads((tlm / "manifest.json").read_text())["source"]
    assert rec["paired_target"]["sha256"] == src["sha256"] and rec["paired_target"]["path"] == str(tlm.resolve())


def test_an_existing_output_needs_force_and_json_reports_the_record(tmp_path, capsys):
    out = tmp_path / "head"
    argv = ["import-head", str(DATA / "qwen"), "--tlm", str(target_export("eagle3_qwen2")), "--target", "qaic",
            "-o", str(out), "--quiet"]
    assert cli.main(argv) == 0
    capsys.readouterr()
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "not empty (use --force" in err and len(err.strip().splitlines()) == 1
    assert cli.main(argv + ["--force", "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["hidden_states"] == "1,2,3" and rep["eagle3"]["aux_hidden_state_layer_ids"] == [2, 3, 4]
    assert rep["target"] == "qaic" and (out / "compile.sh").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["head"]


def test_without_torch_the_export_is_refused_with_the_install_line(tmp_path, capsys, monkeypatch):
    """Reading and checking need neither torch nor transformers; exporting the head does: one line
    naming what to install, nothing written."""
    import sys
    tlm = target_export("eagle3_llama")
    monkeypatch.setitem(sys.modules, "torch", None)      # `import torch` now fails
    refused_import(tmp_path, capsys, DATA / "llama", "torch", "pip install 'specdec-compile[test]'", tlm=tlm)


# --------------------------------------------------------------------------- the verifier against the target

def test_a_head_for_another_model_family_is_refused_although_the_shapes_fit(tmp_path, capsys):
    """The qwen head (verifier Qwen2ForCausalLM) reads layers 1,2,3 of a 64-wide, 211-token target: the
    4-layer llama target has them all, so only the recorded verifier tells them apart."""
    refused_import(tmp_path, capsys, DATA / "qwen", "Qwen2ForCausalLM verifier", "is a llama model",
             tlm=target_export("eagle3_llama"))
    refused_import(tmp_path, capsys, DATA / "llama", "LlamaForCausalLM verifier", "is a qwen2 model",
             tlm=target_export("eagle3_qwen2"))
    # a compiled TLM: the family its manifest records
    refused_import(tmp_path, capsys, DATA / "llama", "LlamaForCausalLM verifier", "is a qwen2 model",
             tlm=compile_target("qwen", tmp_path / "tlm-q"))


def test_the_verifiers_name_or_path_is_not_compared(tmp_path):
    """A hub id where the target is a local folder (or no architectures at all) is no mismatch."""
    for i, verifier in enumerate(({"name_or_path": "meta-llama/Llama-3.1-8B-Instruct",
                                   "architectures": ["LlamaForCausalLM"]}, {"name_or_path": "somewhere/else"})):
        d = copy_case(tmp_path / f"v{i}")
        edit_config(d, speculators_config={"verifier": verifier})
        assert cli.main(["import-head", str(d), "--tlm", str(target_export("eagle3_llama")), "--target", "ort",
                         "-o", str(tmp_path / f"out{i}"), "--quiet"]) == 0


@pytest.mark.parametrize("arch, family, same", [
    ("LlamaForCausalLM", "llama", True), ("Qwen2ForCausalLM", "qwen2", True), ("Qwen3ForCausalLM", "qwen3", True),
    ("Gemma3ForCausalLM", "gemma3_text", True), ("Qwen3MoeForCausalLM", "qwen3_moe", True),
    ("DeepseekV3ForCausalLM", "deepseek_v3", True), ("GptOssForCausalLM", "gpt_oss", True),
    ("Qwen2ForCausalLM", "llama", False), ("Qwen2ForCausalLM", "qwen3", False), ("LlamaForCausalLM", "llama4", False),
    ("PhiForCausalLM", "phi3", False), ("MistralForCausalLM", "mixtral", False)])
def test_architecture_against_model_type(arch, family, same):
    from specdec_compile.eagle3.importer import _arch_family, _plain, _same_family
    assert _same_family(_arch_family(arch), _plain(family)) is same


def test_quantized_weights_are_refused_for_the_device(tmp_path, capsys):
    """``--weights int8`` makes MatMulNBits, which Cloud AI 100 has no precedent for: refused for
    --target qaic in one line, nothing written; an unknown format is refused by the parser."""
    out = tmp_path / "out"
    for extra, needle in ((["--target", "qaic", "--weights", "int8"], "no precedent"),
                          (["--target", "ort", "--weights", "int3"], "invalid choice")):
        capsys.readouterr()
        code = cli.main(["import-head", str(DATA / "llama"), "--tlm", str(target_export("eagle3_llama")),
                         *extra, "-o", str(out), "--quiet"])
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 2 and len(err) == 1 and needle in err[0], err
        assert not out.exists()
