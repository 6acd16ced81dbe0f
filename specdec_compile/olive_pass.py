"""An Olive pass: ``SpecdecCompile`` rewrites an ONNX decoder LM into the
speculative-decoding artifact, as a step of an Olive workflow (``pip install
specdec-compile[olive]``; Olive is microsoft/Olive, ``olive-ai`` on PyPI).

Its parameters are the compile's options (``Options``: ``role``, ``target``,
``k``, ``k_list``, ``prefill_len``, ``ctx_len``, ``batch_size``, ``kv_dtype``,
``logits_dtype``, ``precision``, ``num_cores``, ``num_devices``, ``hw_version``,
``hidden_states``, ``feature_layers``), checked by the same validator as the CLI.
It hands Olive an ``ONNXModelHandler`` for ``OUT/model.onnx`` whose model
directory is the whole artifact; the other artifact files (specializations,
custom IO, manifest, compile script) are listed as the model's
``additional_files``, which Olive carries to later outputs.

Olive finds passes through its package configuration; ``package_config()`` is
Olive's own with this pass added, for ``olive.workflows.run(config,
package_config=package_config())``. The pass class is built when first asked for
(``specdec_compile.olive_pass.SpecdecCompile``), so this module imports without
Olive installed; asking for the class without Olive is a one-line error.

Its parameters are strict: Olive's pydantic would turn ``k: true`` into 1, ``"64"`` into 64 and
``3.7`` into 3 before any check saw them, so each parameter has a validator that runs before
pydantic's conversion (``pydantic_validators``) and refuses, in one line (``check_raw``), a value
that is not already of the parameter's type. A model validator refuses an unknown name (Olive's
configuration class would drop it with a warning) and, before any pass of the workflow runs, options
no artifact can have.

Olive logs most exceptions of a workflow as a warning and returns no model, without an error; it
re-raises ``TypeError`` and ``ValueError`` (a user's error). So every error of the pass is a
``PassError``: a ``SpecdecError`` and a ``TypeError`` (which pydantic passes on as it is: one line).

Put it after Olive's export and optimization passes: a graph-changing pass after
it (onnxscript's optimizer inlines the qaic ``CtxScatter``) is refused by
``specdec-compile verify`` and the runtime (``cache_writes.py``).
"""
from __future__ import annotations

import json
import logging
from pathlib import Path

from .contract import MODEL_FILE
from .errors import SpecdecError
from .options import Options, is_int

_log = logging.getLogger(__name__)

#: pass parameter -> (type, default, description); ``None``: not given (the option's own default)
PARAMS = {
    "role": (str, None, "tlm (target) or dlm (draft); required"),
    "target": (str, "qaic", "qaic (Cloud AI 100, CtxScatter, opset 17), ort (ONNX Runtime, TensorScatter) or openvino "
                         "(OpenVINO, ScatterElements)"),
    "k": (int, None, "TLM: drafted tokens per round (required for a TLM and a feature draft)"),
    "k_list": (list, None, "TLM: extra verification widths"),
    "prefill_len": (int, 32, "prompt chunk length"),
    "ctx_len": (int, 256, "context length / KV slots"),
    "batch_size": (int, 1, "rows per call"),
    "kv_dtype": (str, "float16", "KV cache precision in custom_io.yaml"),
    "logits_dtype": (str, None, "also list logits in custom_io.yaml at this precision"),
    "precision": (str, "fp16", "fp16 or mx6"),
    "num_cores": (int, 16, "AI 100 cores per device"),
    "num_devices": (int, 1, "devices to partition the model over"),
    "hw_version": (str, None, "ai100 or 2.0 (default: chosen by compile.sh)"),
    "hidden_states": (list, None, "TLM: layers whose outputs become hidden_states"),
    "feature_layers": (list, None, "DLM: a feature draft reading these target layers"),
}
PASS_NAME = "SpecdecCompile"
#: keys an Olive pass configuration may hold besides the pass's own parameters (Olive's own)
OLIVE_KEYS = ("user_script", "script_dir")


#: values Olive itself puts in a pass configuration ("use the default", "search"), of any parameter
OLIVE_SPECIAL = ("DEFAULT_VALUE", "SEARCHABLE_VALUES")
#: what a parameter's value must be, by its declared type
_KINDS = {int: "an integer", str: "a string", list: "a list of integers"}


class PassError(SpecdecError, TypeError):
    """An error of the pass that Olive re-raises (a ``TypeError``: Olive logs a plain exception as a
    warning and returns no model) and pydantic does not wrap; one line, ``SpecdecCompile: ...``."""

    def __init__(self, message: str):
        message = str(message)
        super().__init__(message if message.startswith(f"{PASS_NAME}: ") else f"{PASS_NAME}: {message}")


def _olive_value(value) -> bool:
    """A value Olive puts there itself: its special strings and enums, a search parameter (or one
    written as JSON)."""
    if isinstance(value, str) and value in OLIVE_SPECIAL:
        return True
    if isinstance(value, dict) and value.get("olive_parameter_type") == "SearchParameter":
        return True
    return type(value).__module__.split(".")[0] == "olive"


def check_raw(name: str, value):
    """``value`` as given for parameter ``name`` (before Olive's pydantic converts it), when it is of
    the parameter's type (None: not given; Olive's own special values pass); else a one-line
    ``PassError``: a bool, a float or a numeric string for an integer is refused, not converted."""
    if name not in PARAMS or value is None or _olive_value(value):
        return value
    typ = PARAMS[name][0]
    ok = {int: is_int, str: lambda v: isinstance(v, str),
          list: lambda v: isinstance(v, (list, tuple)) and all(is_int(x) for x in v)}[typ](value)
    if not ok:
        raise PassError(f"{name} must be {_KINDS[typ]}, got {value!r} ({type(value).__name__}; it is not converted)")
    return value


def check_names(params: dict) -> None:
    """A one-line ``PassError`` when ``params`` has a name that is neither a parameter nor Olive's
    own (``OLIVE_KEYS``), or no ``role``."""
    unknown = sorted(str(k) for k in params if k not in PARAMS and k not in OLIVE_KEYS)
    if unknown:
        raise PassError(f"unknown parameter {unknown[0]!r} (parameters: {', '.join(PARAMS)})")
    if params.get("role") is None:
        raise PassError("'role' is required (tlm or dlm)")


def check_config(data):
    """The pass configuration as given (before pydantic converts it): names (``check_names``), types
    (``check_raw``) and, when no value is Olive's own (a default, a search), the options themselves
    (``options_of``), so that a bad one stops the workflow before its first pass. Olive's own
    configuration objects pass."""
    if not isinstance(data, dict):
        return data
    check_names(data)
    for name, value in data.items():
        check_raw(name, value)
    if not any(_olive_value(v) for v in data.values()):
        try:
            options_of(data)
        except SpecdecError as e:
            raise PassError(str(e)) from None
    return data


def pydantic_validators() -> dict:
    """One validator per parameter, run before pydantic converts the value (``check_raw``), for the
    configuration class Olive builds (``Pass._validators``), and one of the whole configuration
    (``check_config``). A ``PassError`` is not one of the errors pydantic collects, so it leaves
    Olive's validation as it is: one line."""
    try:   # the pydantic Olive builds its classes with (2, or 1 through its pydantic_v1 shim)
        from olive.passes import pass_config as source
    except ImportError:
        import pydantic as source

    def strict(name: str):
        def check(cls, v):
            return check_raw(name, v)
        check.__name__ = f"strict_{name}"
        return check

    def whole(cls, data):
        return check_config(data)

    if hasattr(source, "field_validator"):   # pydantic 2
        found = {f"strict_{n}": source.field_validator(n, mode="before")(strict(n)) for n in PARAMS}
        from pydantic import model_validator   # not among the names olive.passes.pass_config imports
        return {**found, "strict_config": model_validator(mode="before")(whole)}
    found = {f"strict_{n}": source.validator(n, pre=True, allow_reuse=True)(strict(n)) for n in PARAMS}
    root = getattr(source, "root_validator", None)   # pydantic 1 (untried: Olive >= 0.13 builds with pydantic 2)
    return {**found, "strict_config": root(pre=True, allow_reuse=True)(whole)} if root else found


def options_of(params: dict) -> Options:
    """The ``Options`` of a pass configuration: ``PARAMS``' names (None: not given) and Olive's own
    ``OLIVE_KEYS``; any other name is refused (a misspelt parameter would be a default in silence)."""
    if not isinstance(params, dict):
        raise SpecdecError(f"{PASS_NAME}: the pass configuration must be a dict of parameters, "
                           f"got {type(params).__name__}")
    check_names(params)
    kw = {k: v for k, v in params.items() if k in PARAMS and v is not None}
    for key in ("k_list", "hidden_states", "feature_layers"):
        if key in kw:
            if not isinstance(kw[key], (list, tuple)):
                raise SpecdecError(f"{PASS_NAME}: {key} must be a list of integers, got {kw[key]!r}")
            kw[key] = tuple(kw[key])
    return Options(**kw)


def compile_artifact(model_path, params: dict, out_dir) -> tuple[Path, list[Path]]:
    """Rewrite ``model_path`` with the pass's options and write the artifact to ``out_dir``
    (replaced when there). Returns (the model file, the artifact's other files)."""
    from .artifact.writer import write_artifact
    from .pipeline import rewrite
    opts = options_of(params)
    res = rewrite(model_path, opts)
    out = Path(out_dir)
    written = write_artifact(res, opts, out, force=True)
    model = out / MODEL_FILE
    data = {out / f for f in _data_files(res)}
    others = sorted(f for f in (out / Path(x).name for x in _names(written.files)) if f != model and f not in data)
    _log.info("%s: wrote %s (%d more files)", PASS_NAME, out, len(others))
    return model, others


def _names(files) -> list[str]:
    return [str(f) for f in files]


def _data_files(res) -> list[str]:
    from .model_io import external_data_files
    return external_data_files(res.model)


def package_config() -> dict:
    """Olive's default package configuration with ``SpecdecCompile`` added."""
    from olive.package_config import OlivePackageConfig
    data = json.loads(Path(OlivePackageConfig.get_default_config_path()).read_text())
    data["passes"][PASS_NAME] = {"module_path": f"{__name__}.{PASS_NAME}", "supported_providers": ["*"],
                                 "supported_accelerators": ["*"], "supported_precisions": ["*"],
                                 "extra_dependencies": []}
    return data


def _build_pass_class():
    try:
        from olive.model import ONNXModelHandler
        from olive.passes import Pass
        from olive.passes.pass_config import PassConfigParam
    except ImportError:
        raise SpecdecError("the Olive pass needs Olive: pip install specdec-compile[olive]") from None

    class SpecdecCompile(Pass):
        """Rewrite the ONNX model into a specdec-compile artifact (role, target, k, shapes)."""

        @classmethod
        def _default_config(cls, accelerator_spec) -> dict:
            return {name: PassConfigParam(type_=typ, default_value=default, required=name == "role",
                                          description=desc)
                    for name, (typ, default, desc) in PARAMS.items()}

        @classmethod
        def _validators(cls) -> dict:
            return {**super()._validators(), **pydantic_validators()}

        def _run_for_config(self, model, config, output_model_path: str):
            dump = getattr(config, "model_dump", None) or getattr(config, "dict", None)
            params = dump() if dump else dict(config)
            out = Path(output_model_path).with_suffix("")
            try:
                model_file, others = compile_artifact(model.model_path, params, out)
            except SpecdecError as e:   # Olive would log it as a warning and return no model
                raise PassError(str(e)) from None
            # the artifact is the model's directory (model_path): a path of it here would name Olive's cache
            attrs = dict(model.model_attributes or {})
            attrs["additional_files"] = sorted(set(attrs.get("additional_files") or []) | {str(f) for f in others})
            return ONNXModelHandler(model_path=str(out), onnx_file_name=model_file.name, model_attributes=attrs)

    SpecdecCompile.__module__ = __name__
    return SpecdecCompile


_built: dict = {}


def __getattr__(name: str):
    """``SpecdecCompile``: the Olive Pass class, built on first use (Olive imported then)."""
    if name != PASS_NAME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if name not in _built:
        _built[name] = _build_pass_class()
    return _built[name]
