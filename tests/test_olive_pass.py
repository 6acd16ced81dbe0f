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


# --------------------------------------------------------------------------- strict parameters


@pytest.mark.parametrize("name, value", [
    ("k", True), ("k", 3.0), ("k", 3.7), ("ctx_len", "64"), ("num_cores", False), ("role", 1),
    ("k_list", [True]), ("k_list", "12"), ("hidden_states", [1.0]),
])
def test_a_value_olive_would_convert_is_refused_before_it_is(name, value):
    """Olive's pydantic turned ``k: true`` into 1 and ``"64"`` into 64 before options_of saw them."""
    with pytest.raises(SpecdecError, match=rf"SpecdecCompile: {name} must be (an integer|a string|a list of "
                                           rf"integers), got .*it is not converted") as e:
        olive_pass.check_raw(name, value)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("name, value", [
    ("k", 3), ("k", None), ("ctx_len", 64), ("role", "tlm"), ("k_list", [1, 5]), ("k_list", (2,)),
    ("k", "DEFAULT_VALUE"), ("ctx_len", "SEARCHABLE_VALUES"),
    ("k", {"olive_parameter_type": "SearchParameter", "type": "Categorical", "support": [3, 5]}),
])
def test_values_of_the_parameters_type_and_olives_own_pass(name, value):
    assert olive_pass.check_raw(name, value) is value


def _config_class(validators: dict):
    """The configuration class Olive builds from the pass's parameters (olive.passes.pass_config.
    create_config_class, its search types left out), with ``validators``."""
    import pydantic
    from typing import Optional
    fields = {n: ((t, ...) if n == "role" else (Optional[t], d)) for n, (t, d, _) in olive_pass.PARAMS.items()}
    return pydantic.create_model("SpecdecCompileConfig", **fields, __validators__=validators)


def test_pydantic_converts_and_the_validators_refuse():
    pytest.importorskip("pydantic")
    assert _config_class({})(role="tlm", k=True).k == 1         # what Olive's class did with k: true
    strict = _config_class(olive_pass.pydantic_validators())
    for bad in ({"k": True}, {"ctx_len": "64"}, {"k_list": [1.0]}):
        with pytest.raises(SpecdecError, match="it is not converted"):    # out of pydantic as it is: one line
            strict(**{"role": "tlm", "k": 3, **bad})
    assert strict(role="tlm", k=3, ctx_len=64, k_list=[1]).ctx_len == 64


def test_olives_configuration_refuses_values_it_would_convert():
    pytest.importorskip("olive")
    config_class, _ = olive_pass.SpecdecCompile.get_config_class(None, True)
    for bad in ({"k": True}, {"ctx_len": "64"}):
        with pytest.raises(SpecdecError, match="it is not converted"):
            config_class(**{**PARAMS, **bad})
    assert config_class(**PARAMS).k == 3


# --------------------------------------------------------------------------- a real Olive run's errors and output


def _workflow(src, out, cache, params) -> dict:
    """An Olive workflow with SpecdecCompile alone (on the CPU, Olive's log quiet)."""
    return {
        "input_model": {"type": "ONNXModel", "model_path": str(src)},
        "systems": {"local": {"type": "LocalSystem", "accelerators": [
            {"device": "cpu", "execution_providers": ["CPUExecutionProvider"]}]}},
        "passes": {"specdec": {"type": "SpecdecCompile", **params}},
        "host": "local", "target": "local", "output_dir": str(out), "cache_dir": str(cache),
        "log_severity_level": 3,
    }


def test_an_error_of_the_pass_is_one_olive_reraises():
    """Olive logs any other exception as a warning and returns no model: the user's error must be
    one Olive re-raises (a TypeError, which pydantic does not wrap either)."""
    with pytest.raises(TypeError, match="k must be an integer"):
        olive_pass.check_raw("k", True)


def test_pydantic_refuses_an_unknown_parameter():
    """Olive's configuration class ignores an unknown key (with a warning); the validators refuse it."""
    pytest.importorskip("pydantic")
    strict = _config_class(olive_pass.pydantic_validators())
    with pytest.raises(SpecdecError, match="unknown parameter 'ctxlen'"):
        strict(role="tlm", k=3, ctxlen=64)
    with pytest.raises(SpecdecError, match="'role' is required"):
        strict(k=3)


@pytest.mark.parametrize("params, message", [
    ({"k": True}, "k must be an integer, got True"),               # was: a warning, no model, no error
    ({"ctxlen": 128}, "unknown parameter 'ctxlen'"),               # was: ignored, the artifact built for 64
    ({"role": None}, "'role' is required"),                        # was: pydantic's four lines
    ({"k": -1}, "k must be an integer >= 1"),                      # was: a warning, no model, no error
    ({"target": "cuda"}, "unknown target 'cuda'"),
    ({"role": "dlm"}, "--k is for the target model only"),
])
def test_a_bad_parameter_stops_the_workflow(fixture_path, tmp_path, params, message):
    pytest.importorskip("olive")
    from olive.workflows import run as olive_run
    config = _workflow(fixture_path("llama_gqa"), tmp_path / "out", tmp_path / "cache",
                       {k: v for k, v in {**PARAMS, **params}.items() if v is not None})
    with pytest.raises(SpecdecError, match=message) as e:
        olive_run(config, package_config=olive_pass.package_config())
    assert "\n" not in str(e.value) and str(e.value).startswith("SpecdecCompile: ")
    assert not (tmp_path / "out" / "model.onnx").exists()


def test_a_model_that_is_not_a_decoder_stops_the_workflow(tmp_path):
    pytest.importorskip("olive")
    import onnx
    from models import mlp_model
    from olive.workflows import run as olive_run
    onnx.save(mlp_model(), tmp_path / "mlp.onnx")
    with pytest.raises(SpecdecError, match="SpecdecCompile: ") as e:   # was: a warning, no model, no error
        olive_run(_workflow(tmp_path / "mlp.onnx", tmp_path / "out", tmp_path / "cache", PARAMS),
                  package_config=olive_pass.package_config())
    assert "\n" not in str(e.value)


def test_the_outputs_attributes_name_only_the_output(fixture_path, tmp_path, recwarn):
    """The output's model_attributes name files of the output folder, not of Olive's cache; the
    pass reads its configuration without pydantic's deprecated ``dict()``."""
    pytest.importorskip("olive")
    from olive.workflows import run as olive_run
    out = tmp_path / "out"
    olive_run(_workflow(fixture_path("llama_gqa"), out, tmp_path / "cache", PARAMS),
              package_config=olive_pass.package_config())
    attrs = json.loads((out / "model_config.json").read_text())["config"]["model_attributes"]
    paths = [v for vals in attrs.values() for v in (vals if isinstance(vals, list) else [vals])]
    assert paths and all(str(p).startswith(str(out)) for p in paths), attrs
    assert not [w for w in recwarn if "`dict` method is deprecated" in str(w.message)]
