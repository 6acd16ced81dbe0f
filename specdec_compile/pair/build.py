"""``build_pair``: the six steps of the quick start as one, all or nothing.

Order of work: the options (checked where they are built), the inputs (what each argument
is, optimum there when a Hugging Face folder needs it), their hashes and the cache key; a
pair already built under that key is reported cached and nothing else is done. Then OUT is
checked, the draft's tokenizer compared with the target's, and everything is built in a
scratch directory beside OUT: the exports, the TLM (with the hidden-state layers a head
reads), the draft, ``verify`` of each against its export, the tokenizer's files, pair.json;
the finished directory is renamed into place. Any refusal leaves OUT as it was.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ..contract import MANIFEST_FILE, MODEL_FILE
from ..errors import SpecdecError
from ..options import Options, check_num_cores
from ..verify.artifact_check import verify_artifact
from .inputs import SIDE_FILES, ModelInput, digest, known_inputs, resolve, resolve_head
from .manifest import DRAFT_KINDS, FORMAT, FORMAT_VERSION, PAIR_FILE, TARGETS, cache_key, dumps, read_pair

_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PairRequest:
    tlm: str
    draft: str = "model"            # model (dlm) | head | ngram | suffix
    dlm: str | None = None          # the draft model (draft "model") or the head's checkpoint ("head")
    k: int = 4
    target: str = "qaic"
    prefill_len: int = 32
    ctx_len: int = 256
    batch_size: int = 1
    #: both models: "default" or "qeff" (QEfficient's SpD TLM and its DLM); with continuous_batching
    #: QEfficient's continuous batching over batch_size rows (--full-batch-size)
    interface: str = "default"
    continuous_batching: bool = False
    #: the Cloud AI 100 compiler's options (qaic only; None / False: not given). Both models get
    #: them, as QEfficient's SpD example compiles both, except: num_devices (the TLM's; the draft is
    #: compiled for one device) and dlm_num_cores (the draft's cores; default num_cores)
    num_cores: int | None = None
    dlm_num_cores: int | None = None
    num_devices: int | None = None
    mxfp6_matmul: bool = False
    mxint8_kv_cache: bool = False
    mos: int | None = None
    aic_enable_depth_first: bool = False
    hw_version: str | None = None
    #: QEfficient's --device-group: the TLM's devices (num_devices = their count; specdec-run --pair
    #: opens the TLM on them unless told otherwise)
    device_group: tuple[int, ...] | None = None
    #: the head's MatMul weights (draft "head" only): float, or int8/int4 weight-only (ort; import-head's --weights)
    head_weights: str = "float"


#: PairRequest's qaic-only fields, as the flags that set them
QAIC_FIELDS = (("num_cores", "--num-cores"), ("dlm_num_cores", "--dlm-num-cores"), ("num_devices", "--num-devices"),
               ("mxfp6_matmul", "--mxfp6-matmul"), ("mxint8_kv_cache", "--mxint8-kv-cache"), ("mos", "--mos"),
               ("aic_enable_depth_first", "--aic-enable-depth-first"), ("hw_version", "--hw-version"),
               ("device_group", "--device-group"))


def qaic_settings(req: PairRequest) -> dict:
    """The qaic options given (a field at its 'not given' value is left out), as JSON values."""
    # ``is``, not ``in (None, False)``: 0 == False, and --mos 0 is given (-mos=0), not absent
    q = {name: getattr(req, name) for name, _ in QAIC_FIELDS
         if getattr(req, name) is not None and getattr(req, name) is not False}
    if isinstance(q.get("device_group"), tuple):
        q["device_group"] = list(q["device_group"])
    return q


def _compile_kw(req: PairRequest, role: str) -> dict:
    """Options' keyword arguments for the qaic options of one model (role tlm or dlm)."""
    q = qaic_settings(req)
    if req.target != "qaic" and q:
        name = next(iter(q))
        flag = dict(QAIC_FIELDS)[name]
        value = "" if isinstance(q[name], bool) else f" {q[name]}"
        raise SpecdecError(f"{flag}{value} is an option of the Cloud AI 100 compiler: it needs --target qaic "
                           f"(the {req.target} graphs would not be what pair.json says)")
    kw = {"precision": "mx6"} if req.mxfp6_matmul else {}
    cores = req.dlm_num_cores if role == "dlm" and req.dlm_num_cores is not None else req.num_cores
    if cores is not None:
        kw["num_cores"] = cores
    devices = req.num_devices
    if req.device_group is not None:
        g = req.device_group
        if (not isinstance(g, (tuple, list)) or not g or len(set(g)) != len(g)
                or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in g)):
            raise SpecdecError(f"--device-group: expected distinct device ids >= 0 like [0,1], got {g!r}")
        if devices not in (None, len(g)):
            raise SpecdecError(f"--device-group {list(req.device_group)} is {len(req.device_group)} devices, "
                               f"--num-devices {devices} contradicts it: give one of them")
        devices = len(req.device_group)
    if role == "tlm" and devices is not None:
        kw["num_devices"] = devices
    kw.update({k: q[k] for k in ("mxint8_kv_cache", "mos", "aic_enable_depth_first", "hw_version") if k in q})
    return kw


def _check_types(req: PairRequest) -> None:
    """From Python: the paths are paths and the switches bools ("no" is not False: it would compile MX6)."""
    for name, flag, value in (("tlm", "--tlm", req.tlm), ("dlm", "--dlm / --head", req.dlm)):
        if not isinstance(value, (str, os.PathLike)) and (name == "tlm" or value is not None):
            raise SpecdecError(f"{name} must be a path ({flag}), got {value!r}")
    for name in ("mxfp6_matmul", "mxint8_kv_cache", "aic_enable_depth_first", "continuous_batching"):
        if not isinstance(getattr(req, name), bool):
            raise SpecdecError(f"{name} must be True or False, got {getattr(req, name)!r}")


def _options(req: PairRequest) -> tuple[Options, Options | None]:
    """Both models' Options, checked, and checked as a pair (``check_compile_pair``): before any work."""
    _check_types(req)
    if req.draft not in DRAFT_KINDS:
        raise SpecdecError(f"draft {req.draft!r} is not one of {', '.join(DRAFT_KINDS)}")
    if req.target not in TARGETS:
        raise SpecdecError(f"target {req.target!r}: a pair is for {' or '.join(TARGETS)}")
    if req.draft in ("model", "head") and not req.dlm:
        raise SpecdecError(f"draft {req.draft!r} needs its model (--dlm or --head)")
    if req.draft == "head" and req.interface != "default":
        raise SpecdecError("an EAGLE-3 head (--head) reads the target's hidden states, which QEfficient's "
                           "interface (--interface qeff, --full-batch-size) has no outputs for: use the default "
                           "interface with --head")
    if req.head_weights != "float" and req.draft != "head":
        raise SpecdecError(f"--head-weights {req.head_weights}: the weights of an EAGLE-3 head, which only "
                           f"--head gives (draft {req.draft!r})")
    if req.draft == "head":
        from ..eagle3.quantize import check_weights
        check_weights(req.head_weights, req.target, "--head-weights", targets=("ort",))
    if req.dlm_num_cores is not None:      # the draft's or the head's cores, named as given, before any work
        check_num_cores(req.dlm_num_cores, "--dlm-num-cores")
    shapes = dict(prefill_len=req.prefill_len, ctx_len=req.ctx_len, batch_size=req.batch_size, target=req.target,
                  interface=req.interface, continuous_batching=req.continuous_batching)
    tlm = Options(role="tlm", k=req.k, **shapes, **_compile_kw(req, "tlm"))
    if req.draft != "model":
        if req.draft != "head" and req.dlm_num_cores is not None:
            raise SpecdecError(f"--dlm-num-cores: draft {req.draft!r} has no draft model to compile")
        return tlm, None
    dlm = Options(role="dlm", **shapes, **_compile_kw(req, "dlm"))
    from ..runtime.pairing import check_compile_pair
    check_compile_pair(tlm, dlm)
    return tlm, dlm


def head_compile_options(req: PairRequest) -> dict:
    """import_head's compile options for the head (the draft's qaic options)."""
    return _compile_kw(req, "dlm")


def _settings(req: PairRequest, tlm: Options, dlm: Options | None) -> dict:
    from ..artifact.writer import options_dict
    head = {"head_weights": req.head_weights} if req.draft == "head" else {}
    return {**head, "draft": req.draft, "k": req.k, "target": req.target, "prefill_len": req.prefill_len,
            "ctx_len": req.ctx_len, "batch_size": req.batch_size, "interface": tlm.interface,
            "continuous_batching": tlm.continuous_batching, "qaic": qaic_settings(req),
            "tlm_options": options_dict(tlm), "dlm_options": options_dict(dlm) if dlm else None}


def _previous(out: Path) -> dict | None:
    """OUT's pair.json when it is a readable one (a damaged one is simply not a cache hit)."""
    try:
        return read_pair(out, missing_ok=True) if out.is_dir() else None
    except SpecdecError:
        return None


def build_pair(req: PairRequest, out, *, force: bool = False) -> tuple[dict, bool]:
    """Build (or find) the pair directory ``out``; returns (its pair.json, whether it was cached)."""
    if not isinstance(out, (str, os.PathLike)):
        raise SpecdecError(f"output must be a path (-o), got {out!r}")
    out = Path(out)
    tlm_opts, dlm_opts = _options(req)
    old = _previous(out)
    known = known_inputs(old)
    inputs_ = {"tlm": resolve(req.tlm, "--tlm", known.get("tlm"))}
    if req.draft == "model":
        inputs_["dlm"] = resolve(req.dlm, "--dlm", known.get("dlm"))
    elif req.draft == "head":
        inputs_["head"] = resolve_head(req.dlm)
    records = {name: digest(inp, known.get(name)) for name, inp in inputs_.items()}
    settings = _settings(req, tlm_opts, dlm_opts)
    key = cache_key(settings, records)
    if old is not None and old.get("key") == key and not force and _complete(out, old, settings):
        return old, True
    _check_out(out, force, old, key, inputs_.values())
    from .export import check_optimum
    for inp in inputs_.values():
        if inp.needs_export:     # not needed for a cache hit (importing optimum takes seconds)
            check_optimum(inp.flag, inp.path)
    if "dlm" in inputs_:
        from .vocab import check_same_tokenizer
        check_same_tokenizer(inputs_["tlm"], inputs_["dlm"])
    if "head" in inputs_:   # a bad checkpoint, or one for another model: refused before any export
        from ..eagle3.checkpoint import read_checkpoint
        from ..eagle3.importer import check_verifier
        from ..pipeline import config_family
        tlm = inputs_["tlm"]
        check_verifier(read_checkpoint(inputs_["head"].path), config_family(tlm.folder, None), tlm.path)
    manifest = {"format": FORMAT, "format_version": FORMAT_VERSION, "key": key, "draft": req.draft, "k": req.k,
                "target": req.target, "settings": settings, "inputs": records}
    _in_scratch(out, lambda work: _build(work, req, inputs_, tlm_opts, dlm_opts, manifest))
    return read_pair(out), False


def _complete(out: Path, m: dict, settings: dict) -> bool:
    """OUT's pair.json says what the key stands for (an edited one is no hit) and its artifacts are there."""
    want = json.loads(dumps(settings))
    if settings["draft"] == "head":   # the layers the head reads (head and export, both in the key): the TLM's
        want["tlm_options"]["hidden_states"] = _artifact_layers(m)
    same = want == m.get("settings") and all(
        m.get(k) == settings[k] for k in ("draft", "k", "target"))
    return same and all((Path(m[k]) / MANIFEST_FILE).is_file() for k in ("tlm", "dlm") if m.get(k))


def _artifact_layers(m: dict):
    """The hidden-state layers OUT's TLM artifact outputs (its manifest), None when it cannot say."""
    try:
        layers = json.loads((Path(m["tlm"]) / MANIFEST_FILE).read_text(encoding="utf-8"))["hidden_states"]["layers"]
    except (OSError, ValueError, UnicodeDecodeError, KeyError, TypeError):
        return None
    return layers if isinstance(layers, list) else None


def _check_out(out: Path, force: bool, old: dict | None, key: str, inputs) -> None:
    _check_not_cwd(out)
    if out.exists() or out.is_symlink():
        if out.is_symlink() or not out.is_dir():
            raise SpecdecError(f"output {out} exists and is not a directory")
        if any(out.iterdir()) and not force:
            if old is not None and old.get("key") == key:
                raise SpecdecError(f"output directory {out} holds this pair (key {key}), but its {PAIR_FILE} or "
                                   f"artifacts are not what the key stands for (edited or incomplete): --force "
                                   f"rebuilds it")
            if old is not None:
                raise SpecdecError(f"output directory {out} holds a pair built with other settings or inputs "
                                   f"(key {old.get('key')}, now {key}): --force rebuilds it, or choose another -o")
            raise SpecdecError(f"output directory {out} is not empty (use --force to replace a pair built there)")
        if any(out.iterdir()) and not _is_pair_manifest(out / PAIR_FILE):
            if (out / PAIR_FILE).exists():   # damaged, or another program's: never removed on a guess
                raise SpecdecError(f"output directory {out} holds a {PAIR_FILE} that is not a readable one of "
                                   f"specdec-compile pair (damaged, or another program's): --force only replaces a "
                                   f"pair it can read; remove {out} yourself if it is a damaged pair")
            raise SpecdecError(f"output directory {out} is not empty and holds no {PAIR_FILE} of specdec-compile "
                               f"pair: --force only replaces a pair that specdec-compile pair built")
    o = out.resolve()
    for inp in inputs:
        src = inp.path.resolve()
        if o == src or o in src.parents:
            raise SpecdecError(f"output directory {out} holds the input {inp.path} ({inp.flag}); choose another -o")
    p = Path(os.path.abspath(out)).parent
    while not p.exists():
        p = p.parent
    if not os.access(p, os.W_OK | os.X_OK):
        raise SpecdecError(f"cannot write the output {out}: {p} is not writable")


def _check_not_cwd(out: Path) -> None:
    """OUT is replaced by a rename: never the directory this process (and the shell) stands in, or one above it."""
    try:
        here = Path.cwd().resolve()
    except OSError:      # the current directory is gone: nothing to protect
        return
    o = out.resolve()
    if o == here or o in here.parents:
        raise SpecdecError(f"output directory {out} is the current directory or holds it ({here}): it would be "
                           f"replaced under it; choose another -o")


def _is_pair_manifest(path: Path) -> bool:
    """``path`` is a pair.json that specdec-compile pair wrote (its format), damaged or not otherwise:
    another program's pair.json is not, and --force does not replace the folder that holds it."""
    try:
        m = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, UnicodeDecodeError, RecursionError):
        return False
    return isinstance(m, dict) and m.get("format") == FORMAT


def _in_scratch(out: Path, fill) -> None:
    """``fill(work)`` builds ``work``/pair; then it becomes ``out``. Nothing is left on failure."""
    from ..eagle3.importer import move_into_place
    parent = Path(os.path.abspath(out)).parent
    made = None          # the outermost folder this call makes (removed again on failure)
    if not parent.exists():
        made = parent
        while not made.parent.exists():
            made = made.parent
    work = None
    try:
        parent.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(prefix=f".{out.name}.pair-", dir=parent))
        fill(work)
        move_into_place(work / "pair", out)
    except BaseException as e:
        if made is not None:   # the scratch directory is inside it
            shutil.rmtree(made, ignore_errors=True)
        if isinstance(e, OSError):
            raise SpecdecError(f"cannot build the pair {out}: {e.strerror or e}"
                               + (f" ({e.filename})" if e.filename else "")) from None
        raise
    finally:
        if work is not None:
            shutil.rmtree(work, ignore_errors=True)


def _export(inp: ModelInput, work: Path, name: str) -> Path:
    if not inp.needs_export:
        return inp.onnx
    from .export import export_hf
    return export_hf(inp.flag, inp.path, work / "export" / name)


def _build(work: Path, req: PairRequest, inputs_: dict, tlm_opts: Options, dlm_opts, manifest: dict) -> None:
    from ..artifact.writer import write_artifact
    from .. import pipeline
    pair = work / "pair"
    pair.mkdir()
    tlm_onnx = _export(inputs_["tlm"], work, "tlm")
    if req.draft == "head":
        tlm_opts = _with_head_layers(tlm_opts, inputs_["head"], tlm_onnx)
        st = manifest["settings"]     # what the TLM is compiled with (the key stands for the head and export)
        manifest["settings"] = {**st, "tlm_options": {**st["tlm_options"],
                                                      "hidden_states": list(tlm_opts.hidden_states)}}
    _log.info("compiling the TLM (k %d, %s)", req.k, req.target)
    write_artifact(pipeline.rewrite(tlm_onnx, tlm_opts, source=tlm_onnx), tlm_opts, pair / "tlm")
    checks = {"tlm": verify_artifact(tlm_onnx, pair / "tlm", "TLM")}
    if req.draft == "model":
        dlm_onnx = _export(inputs_["dlm"], work, "dlm")
        _log.info("compiling the DLM (%s)", req.target)
        write_artifact(pipeline.rewrite(dlm_onnx, dlm_opts, source=dlm_onnx), dlm_opts, pair / "dlm")
        checks["dlm"] = verify_artifact(dlm_onnx, pair / "dlm", "DLM")
    elif req.draft == "head":
        from ..eagle3.importer import import_head
        _log.info("importing the EAGLE-3 head %s", inputs_["head"].path)
        import_head(inputs_["head"].path, pair / "tlm", pair / "dlm", target=req.target, k=req.k,
                    prefill_len=req.prefill_len, ctx_len=req.ctx_len, batch_size=req.batch_size,
                    export_dir=work / "export" / "head", weights=req.head_weights, **head_compile_options(req))
        checks["dlm"] = verify_artifact(work / "export" / "head" / MODEL_FILE, pair / "dlm", "draft head")
    tok = _copy_tokenizer(inputs_["tlm"], tlm_onnx.parent, pair / "tokenizer")
    manifest.update(tlm="tlm", dlm="dlm" if req.draft in ("model", "head") else None,
                    tokenizer="tokenizer" if tok else None, verify=checks)
    if req.target == "qaic":
        manifest["compile_scripts"] = [f"{d}/compile.sh" for d in ("tlm", "dlm") if manifest.get(d)]
    (pair / PAIR_FILE).write_text(dumps(manifest), encoding="utf-8", newline="\n")


def _with_head_layers(opts: Options, head: ModelInput, tlm_onnx: Path) -> Options:
    """The TLM's options with --hidden-states of the layers the head reads (aux id i: layer i-1)."""
    import dataclasses

    from ..eagle3.checkpoint import read_checkpoint
    from ..eagle3.importer import check_pair
    from ..eagle3.target import read_target
    _, layers = check_pair(read_checkpoint(head.path), read_target(tlm_onnx))
    return dataclasses.replace(opts, hidden_states=tuple(layers))


def _copy_tokenizer(tlm: ModelInput, export_dir: Path, dest: Path) -> bool:
    """The target's tokenizer files (and generation_config.json) into ``dest``; False when it has none
    (optimum copies them into its export, so they are looked for there too)."""
    files = tlm.tokenizer_files()
    src = tlm.folder
    if not files and export_dir != tlm.folder:
        probe = ModelInput(tlm.flag, export_dir, "optimum", export_dir)
        files, src = probe.tokenizer_files(), export_dir
    if not files:
        return False
    dest.mkdir()
    for f in [*files, *(src / n for n in SIDE_FILES[1:] if (src / n).is_file())]:
        shutil.copyfile(f, dest / f.name)
    return True
