"""The Olive pass (specdec_compile/olive_pass.py): a real Olive workflow (Olive's own
optimizer pass, then SpecdecCompile) writes an artifact that verifies and loads;
skipped where Olive is not installed (pip install specdec-compile[olive]). The parts
that need no Olive (options, the artifact, the lazy class) are tested everywhere."""
from __future__ import annotations

import json

import pytest

from specdec_compile import olive_pass
from specdec_compile.errors import SpecdecError
from specdec_compile.runtime import load_artifact
from specdec_compile.verify import verify

PARAMS = {"role": "tlm", "k": 3, "target": "qaic", "ctx_len": 64, "prefill_len": 8}


def test_options_are_the_clis(tmp_path, fixture_path):
    assert olive_pass.options_of({**PARAMS, "k_list": [1], "user_script": None}).k_list == (1,)
    with pytest.raises(SpecdecError, match="'role' is required"):
        olive_pass.options_of({"k": 3})
    with pytest.raises(SpecdecError, match="--k is required"):
        olive_pass.options_of({"role": "tlm"})
    model, others = olive_pass.compile_artifact(fixture_path("llama_gqa"), PARAMS, tmp_path / "art")
    assert model == tmp_path / "art" / "model.onnx" and model.is_file()
    assert {f.name for f in others} == {"specializations.json", "custom_io.yaml", "manifest.json", "compile.sh"}


@pytest.mark.parametrize("params, message", [
    ({"ctxlen": 64}, "unknown parameter 'ctxlen'"),           # was: ignored, the artifact built for 256
    ({"interface": "qeff"}, "unknown parameter 'interface'"),
    ({"k_list": "12"}, "k_list must be a list of integers, got '12'"),   # was: (1, 2)
    ({"k_list": [1.9]}, "--k-list must be a list of integers"),          # was: (1,)
    ({"k_list": 5}, "k_list must be a list of integers, got 5"),
    ({"hidden_states": "-1"}, "hidden_states must be a list of integers"),
    ({"hidden_states": [True]}, "--hidden-states must be a list of integers"),
])
def test_parameters_of_the_wrong_name_or_type(params, message):
    with pytest.raises(SpecdecError, match=message):
        olive_pass.options_of({**PARAMS, **params})


def test_a_configuration_that_is_not_a_dict():
    for bad in (None, [("role", "tlm")]):
        with pytest.raises(SpecdecError, match="the pass configuration must be a dict"):
            olive_pass.options_of(bad)


def test_the_class_is_built_on_demand():
    with pytest.raises(AttributeError):
        olive_pass.NoSuchThing  # noqa: B018
    try:
        import olive  # noqa: F401
    except ImportError:
        with pytest.raises(SpecdecError, match=r"pip install specdec-compile\[olive\]"):
            olive_pass.SpecdecCompile  # noqa: B018
    else:
        from olive.passes import Pass
        assert issubclass(olive_pass.SpecdecCompile, Pass)


def test_a_real_olive_workflow(fixture_path, tmp_path):
    pytest.importorskip("olive")
    from olive.workflows import run as olive_run
    src = fixture_path("llama_gqa")
    out = tmp_path / "olive_out"
    config = {
        "input_model": {"type": "ONNXModel", "model_path": str(src)},
        "systems": {"local": {"type": "LocalSystem", "accelerators": [
            {"device": "cpu", "execution_providers": ["CPUExecutionProvider"]}]}},
        "passes": {
            # Olive's own optimization first (onnxscript's optimizer inside), then the compile
            "peephole": {"type": "OnnxPeepholeOptimizer", "onnxoptimizer_optimize": False,
                         "fuse_reshape_operations": False},
            "specdec": {"type": "SpecdecCompile", **PARAMS},
        },
        "host": "local", "target": "local", "output_dir": str(out), "cache_dir": str(tmp_path / "cache"),
        "log_severity_level": 3,
    }
    olive_run(config, package_config=olive_pass.package_config())
    art = load_artifact(out)
    assert art.role == "tlm" and art.k == 3 and art.target == "qaic" and art.ctx_len == 64
    assert verify(src, out / "model.onnx", k=3, prefill_len=8, ctx_len=64).ok
    attrs = json.loads((out / "model_config.json").read_text())["config"]["model_attributes"]
    assert {p.rsplit("/", 1)[-1] for p in attrs["additional_files"]} == \
        {"specializations.json", "custom_io.yaml", "manifest.json", "compile.sh"}
