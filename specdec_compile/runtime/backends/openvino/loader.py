"""Loading for OpenVINO: read a ``--target openvino`` graph, check it, make its cache state.

``load_openvino`` reads the artifact's ``model.onnx`` with OpenVINO's ONNX
frontend, checks the contract's interface (``ort.loader.check_interface``, the
ONNX Runtime loader's checks), fixes the batch and the cache shape ``[batch, kv_heads, ctx_len,
head_dim]``, and keeps the cache in state variables inside the engine, one of two ways
(``cache=``):

* ``"fused"``: every layer's attention rebuilt as OpenVINO's own stateful SDPA
  pattern (``fused.fuse_cache``); the CPU plugin then holds a growing cache in
  place, attention in one kernel per layer; a rollback masks or trims the rejected slots;
* ``"copy"``: OpenVINO's ``MakeStateful`` on every ``past_*.{i}`` /
  ``past_*.{i}_RetainedState`` pair: the contract's fixed ``ctx_len`` cache, which
  the plugin copies whole per call (``Assign``).

``None`` (the default) takes ``"fused"`` where the graph's attention is the
form it rebuilds, else ``"copy"`` and records why. Either way the compiled model's
inputs are only ``input_ids``, ``position_ids`` (and a feature draft's
features; the fused cache adds OpenVINO's ``beam_idx`` and the slots' positions).
Nothing here runs the model.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace

import numpy as np

from ....contract import INPUT_IDS, LOGITS, POSITION_IDS
from ....errors import SpecdecError
from ....artifact.reader import Artifact
from ..base import resolve_artifact, with_vocab
from ....ort_session import check_threads, threads_from_env
from ..ort.loader import check_interface

INSTALL_HINT = "pip install 'specdec-compile[openvino]' (or pip install openvino)"
#: --ov-precision values -> OpenVINO's INFERENCE_PRECISION_HINT, and the CPU capability each needs
PRECISIONS = {"f32": ("f32", "FP32"), "bf16": ("bf16", "BF16"), "f16": ("f16", "FP16")}
#: environment variable giving the inference thread count when none is asked for
THREADS_ENV = "SPECDEC_OV_THREADS"
_SHORT = {"float32": "f32", "bfloat16": "bf16", "float16": "f16"}
_OV_TYPES = {"f32": "tensor(float)", "f16": "tensor(float16)", "f64": "tensor(double)", "i64": "tensor(int64)",
             "i32": "tensor(int32)", "bf16": "tensor(bfloat16)"}


def import_openvino():
    """The ``openvino`` module, or a one-line SpecdecError saying how to install it."""
    try:
        import openvino
    except ImportError:
        raise SpecdecError(f"the openvino backend needs OpenVINO, which is not installed: {INSTALL_HINT}") from None
    return openvino


@dataclass
class OpenVinoModel:
    """A loaded, checked, compiled artifact: what the runner needs to run it."""

    artifact: Artifact
    compiled: object                    # openvino.CompiledModel, the cache made state variables
    kv_names: list[str]
    kv_shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    kv_dtypes: dict[str, np.dtype] = field(default_factory=dict)
    precision: str = "f32"              # the inference precision the plugin runs at
    threads: int | None = None
    state_names: dict[str, str] = field(default_factory=dict)     # cache input -> its state variable
    cache: str = "copy"                 # "fused" (growing, in place) or "copy" (MakeStateful, fixed ctx_len)
    cache_note: str | None = None       # why the fused cache was not used, when it was not


def _port(p) -> SimpleNamespace:
    """An OpenVINO port as the ONNX Runtime loader's checks read a node arg: shape and type."""
    shape = [d.get_length() if d.is_static else None for d in p.get_partial_shape()]
    return SimpleNamespace(shape=shape, type=_OV_TYPES.get(p.get_element_type().get_type_name(), "?"))


def _check_target(art: Artifact) -> None:
    if art.target != "openvino":
        raise SpecdecError(f"{art.path}: compiled for --target {art.target}; the openvino backend runs artifacts "
                           f"compiled with --target openvino (compile again with it)")
    if art.qeff:
        raise SpecdecError(f"{art.path}: an --interface qeff artifact; the openvino backend runs the default interface")
    from ....artifact.cache_writes import check_cache_writes
    from ....model_io import load_model
    check_cache_writes(load_model(art.model_path), art.target, str(art.model_path))


CACHES = ("fused", "copy")


def compile_config(core, precision: str | None, threads: int | None) -> dict:
    """The CPU plugin's properties for ``precision`` (None: OpenVINO's pick) and ``threads``."""
    cfg = {"PERFORMANCE_HINT": "LATENCY", "NUM_STREAMS": 1}
    if precision is not None:
        if not isinstance(precision, str) or precision not in PRECISIONS:
            raise SpecdecError(f"unknown OpenVINO precision {precision!r} (choose from {', '.join(PRECISIONS)})")
        hint, cap = PRECISIONS[precision]
        caps = set(core.get_property("CPU", "OPTIMIZATION_CAPABILITIES"))
        if cap not in caps and precision != "f32":
            raise SpecdecError(f"this CPU cannot run OpenVINO at {precision} (its capabilities: {', '.join(sorted(caps))})")
        cfg["INFERENCE_PRECISION_HINT"] = hint
    threads = asked_threads(threads)
    if threads is not None:
        cfg["INFERENCE_NUM_THREADS"] = threads
    return cfg


def asked_threads(threads: int | None) -> int | None:
    """The thread count asked for: ``threads`` (checked, ort_session.check_threads), else
    ``SPECDEC_OV_THREADS``, else None (OpenVINO's own choice)."""
    return threads_from_env(THREADS_ENV) if threads is None else check_threads(threads, "OpenVINO threads")


def check_threads_kept(asked: int | None, got: int, where, source: str = "threads") -> None:
    """OpenVINO's CPU plugin lowers a thread count above what it can run (the host's cores) to that,
    without a word: a count it did not keep is refused in one line, so that what runs (and what
    ``--json`` records as ``threads``) is what was asked for. ``source``: where the count came from."""
    if asked is not None and got != asked:
        raise SpecdecError(f"{where}: {asked} OpenVINO threads asked for ({source}), but OpenVINO's CPU plugin "
                           f"runs at most {got} on this host and would lower the count; ask for {got} or fewer")


def make_stateful(model, batch: int, shapes: dict, extra_inputs: dict, where) -> None:
    """Fix the batch and the cache ``shapes`` (name -> [batch, kv_heads, ctx_len, head_dim]) of an
    OpenVINO model read from a rewritten graph, then make every cache pair a state variable
    (MakeStateful); anything but the ids, positions and ``extra_inputs`` left as an input is refused."""
    import_openvino()
    from openvino import passes as ovp
    fix_shapes(model, batch, shapes, extra_inputs)
    manager = ovp.Manager()
    manager.register_pass(ovp.MakeStateful({n: f"{n}_RetainedState" for n in shapes}))
    manager.run_passes(model)
    left = sorted({p.get_any_name() for p in model.inputs} - {INPUT_IDS, POSITION_IDS} - set(extra_inputs))
    if left:
        raise SpecdecError(f"{where}: OpenVINO's MakeStateful left the inputs {left}; the cache is not "
                           f"kept inside the engine")


def read_and_compile(path, precision: str | None, threads: int | None, prepare=None):
    """(compiled model, its inference precision "f32"/"bf16"/"f16", its thread count): ``path`` read
    by OpenVINO's ONNX frontend, ``prepare(model)`` applied (checks, the cache made state; it may
    return extra CPU properties), compiled for the CPU."""
    ov = import_openvino()
    core = ov.Core()
    cfg = compile_config(core, precision, threads)
    try:
        model = core.read_model(str(path))
    except Exception as e:
        raise SpecdecError(f"{path}: OpenVINO cannot read it: {' '.join(str(e).split())[:300]}") from None
    if prepare is not None:
        cfg.update(prepare(model) or {})
    try:
        compiled = core.compile_model(model, "CPU", cfg)
    except Exception as e:
        raise SpecdecError(f"{path}: OpenVINO cannot compile it: {' '.join(str(e).split())[:300]}") from None
    got = compiled.get_property("INFERENCE_PRECISION_HINT")
    got = got.get_type_name() if hasattr(got, "get_type_name") else str(got)
    return compiled, _SHORT.get(got, got), int(compiled.get_property("INFERENCE_NUM_THREADS"))


def state_name(cache_input: str) -> str:
    """The id MakeStateful gives the state variable of a cache pair."""
    return f"{cache_input}{cache_input}_RetainedState"


def fix_shapes(model, batch: int, shapes: dict, extra_inputs: dict) -> None:
    """Fix the batch and the cache ``shapes``; ids, positions and features keep a dynamic width."""
    ov = import_openvino()
    new = {}
    for p in model.inputs:
        n = p.get_any_name()
        if n in shapes:
            new[n] = ov.PartialShape(list(shapes[n]))
        elif n in extra_inputs:
            new[n] = ov.PartialShape([batch, -1, extra_inputs[n]])
        else:
            new[n] = ov.PartialShape([batch, -1])
    model.reshape(new)


def keep_cache(model, batch: int, kv: list[str], shapes: dict, extra_inputs: dict, cache: str | None,
               precision: str | None, where) -> tuple[str, str | None, dict]:
    """Make the cache of ``model`` state inside the engine: (``"fused"`` or ``"copy"``, why not fused
    (None when fused or asked for copy), the CPU properties it needs). ``cache``: "fused" (refused
    in one line where the attention is not the form fused.py rebuilds), "copy", or None: fused
    where it can be, else copy."""
    from .fused import NotFusable, fuse_cache, kv_cache_precision
    note = None
    if cache not in (None, *CACHES):
        raise SpecdecError(f"unknown OpenVINO cache {cache!r} (choose from {', '.join(CACHES)})")
    if cache != "copy":
        fix_shapes(model, batch, shapes, extra_inputs)
        held = kv_cache_precision(precision)
        try:
            fuse_cache(model, kv, shapes, batch, held)
            return "fused", None, {"KV_CACHE_PRECISION": held}
        except NotFusable as e:
            if cache == "fused":
                raise SpecdecError(f"{where}: no fused OpenVINO cache: {e}") from None
            note = f"the cache is copied per call (no fused cache: {e})"
    make_stateful(model, batch, shapes, extra_inputs, where)
    return "copy", note, {}


def load_openvino(artifact, *, precision: str | None = None, threads: int | None = None,
                  expect_role: str | None = None, cache: str | None = None) -> OpenVinoModel:
    """Open a ``--target openvino`` artifact (directory or ``Artifact``) on OpenVINO's CPU plugin.
    ``cache``: "fused", "copy" or None (fused where the attention allows it, see the module)."""
    import_openvino()
    art = resolve_artifact(artifact, expect_role, need_model=True)
    _check_target(art)
    source = THREADS_ENV if threads is None else "threads"
    threads = asked_threads(threads)    # before anything compiles
    facts = {"cache": "copy", "note": None}

    def prepare(model, want=cache):
        ins = {p.get_any_name(): _port(p) for p in model.inputs}
        outs = {p.get_any_name(): _port(p) for p in model.outputs}
        kv, shapes, dtypes = check_interface(art, ins, outs)
        facts.update(kv=kv, shapes=shapes, dtypes=dtypes, vocab=outs[LOGITS].shape[-1] if outs[LOGITS].shape else None)
        facts["cache"], facts["note"], cfg = keep_cache(model, art.batch_size, kv, shapes, art.extra_inputs,
                                                        want, precision, art.model_path)
        return cfg

    try:
        compiled, got, n_threads = read_and_compile(art.model_path, precision, threads, prepare)
    except SpecdecError as e:
        if cache is not None or facts["cache"] != "fused":
            raise
        # the rebuilt graph did not compile: the copy path runs the graph as it is
        compiled, got, n_threads = read_and_compile(art.model_path, precision, threads,
                                                    lambda m: prepare(m, "copy"))
        facts["note"] = f"the cache is copied per call (the fused cache did not compile: {str(e)[-200:]})"
    check_threads_kept(threads, n_threads, art.name, source)
    kv = facts["kv"]
    names = {n: n for n in kv} if facts["cache"] == "fused" else {n: state_name(n) for n in kv}
    return OpenVinoModel(artifact=with_vocab(art, facts["vocab"], "graph's logits"), compiled=compiled, kv_names=kv,
                         kv_shapes=facts["shapes"], kv_dtypes=facts["dtypes"], precision=got, threads=n_threads,
                         state_names=names, cache=facts["cache"], cache_note=facts["note"])
