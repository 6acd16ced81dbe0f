"""The artifact directory of the contract (sections 3-5), written atomically.

``write_artifact(result, options, out)`` takes a rewrite result (anything with
the fields of ``pipeline.CompileResult``) and writes::

    OUT/model.onnx            the rewritten graph (+ its external data files)
    OUT/specializations.json  from templates/specializations.json.j2
    OUT/custom_io.yaml        from templates/custom_io.yaml.j2  (target qaic)
    OUT/compile.sh            from templates/compile.sh.j2   (target qaic)
    OUT/mdp_partition.json    from templates/mdp_partition.json.j2 (qaic, --num-devices > 1)
    OUT/manifest.json         what was built from what, and how

This module only gathers values; every line of text in those files comes from
a template in ``templates/``. Everything goes into a temporary directory next
to OUT and is renamed into place at the end, so a failure at any step leaves
OUT as it was (absent, or the previous artifact). Same input and options give
byte-identical files: no timestamps, no absolute paths, sorted JSON keys.
"""
from __future__ import annotations

import json
import logging
import os
import re
import shutil
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

import onnx

from .. import __version__
from . import qaic_flags, qeff
from ..errors import SpecdecError
from ..contract import (COMPILE_SCRIPT, CUSTOM_IO_FILE, MANIFEST_FILE, MODEL_FILE, PARTITION_FILE,  # noqa: F401
                       DRAFT_HIDDEN_STATES, HIDDEN_STATES, LOGITS, QPC_DIR, ROLES, SPECIALIZATIONS_FILE,
                       TARGETS)
from ..hidden_features import manifest_fields
from .graph_facts import check_graph_agrees
from ..model_io import read_json, save_model, sha256_file
from ..value_types import dims, dtype_name
from .manifest import Manifest
from ..options import DTYPES, HW_VERSIONS, MAX_CORES, PRECISIONS, Options  # noqa: F401 (re-exported)
from .qaic_ops import op_set
from ..resources import templates_dir

_log = logging.getLogger(__name__)

COMPILERS = ("qaic-compile", "qaic-exec")
SDK_EXEC_DIR = Path("/opt/qti-aic/exec")
DEFAULT_HW_VERSION = {"qaic-compile": "ai100", "qaic-exec": "2.0"}



@dataclass
class WrittenArtifact:
    """What ``write_artifact`` wrote, for the summary and --json (the runtime reads
    an artifact directory with ``runtime.artifact.load_artifact`` instead).

    ``record`` is the ``Manifest`` written to ``manifest.json``; ``manifest`` its JSON."""

    out: Path
    files: list[str]                 # in the order they were written
    record: Manifest
    io_changes: list[dict] = field(default_factory=list)
    compile_flags: list[str] = field(default_factory=list)

    @property
    def manifest(self) -> dict:
        return self.record.to_json()


# --------------------------------------------------------------------------- templates

def _env():
    import jinja2

    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(templates_dir())),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,
    )


def render(template: str, **values) -> str:
    """Render ``templates/<template>`` with ``values`` (StrictUndefined)."""
    return _env().get_template(template).render(**values)


# --------------------------------------------------------------------------- the graph's interface

def io_signature(model: onnx.ModelProto) -> dict:
    """{"inputs": [...], "outputs": [...]}, each {"name", "dtype", "shape"}, graph order."""
    inits = {t.name for t in model.graph.initializer}

    def sig(vi):
        return {"name": vi.name,
                "dtype": dtype_name(vi.type.tensor_type.elem_type, "undefined"),
                "shape": dims(vi, no_shape=[])}

    return {"inputs": [sig(v) for v in model.graph.input if v.name not in inits],
            "outputs": [sig(v) for v in model.graph.output]}


_LAYER = re.compile(r"(?<=[._])(\d+)(?=[._]|$)")


def _pattern(name: str) -> tuple[str, int | None]:
    """'past_key.3_RetainedState' -> ('past_key.{i}_RetainedState', 3)."""
    m = list(_LAYER.finditer(name))
    if len(m) != 1:
        return name, None
    m = m[0]
    return name[:m.start()] + "{i}" + name[m.end():], int(m.group(1))


def _fmt(sig: dict) -> str:
    return f"{sig['dtype']}[{', '.join(str(d) for d in sig['shape'])}]"


def io_changes(before: dict | None, after: dict) -> list[dict]:
    """The interface changes between two ``io_signature``s, per-layer names folded.

    Each entry: {"kind": "input"|"output", "change": "removed"|"added"|"changed",
    "name": pattern (with {i} for a layer index), "layers": "0..L-1" or None,
    "before": "dtype[shape]" or None, "after": ... }.
    """
    if before is None:
        return []
    changes: list[dict] = []
    for kind in ("inputs", "outputs"):
        old = {s["name"]: s for s in before[kind]}
        new = {s["name"]: s for s in after[kind]}
        rows: list[tuple[str, str, dict | None, dict | None]] = []
        for s in before[kind]:
            if s["name"] not in new:
                rows.append(("removed", s["name"], s, None))
            elif _fmt(s) != _fmt(new[s["name"]]):
                rows.append(("changed", s["name"], s, new[s["name"]]))
        for s in after[kind]:
            if s["name"] not in old:
                rows.append(("added", s["name"], None, s))
        folded: dict[tuple, dict] = {}
        for change, name, b, a in rows:
            pat, idx = _pattern(name)
            key = (change, pat, _fmt(b) if b else None, _fmt(a) if a else None)
            entry = folded.get(key)
            if entry is None:
                entry = folded[key] = {"kind": kind[:-1], "change": change, "name": pat,
                                       "indices": [], "before": key[2], "after": key[3]}
            if idx is not None:
                entry["indices"].append(idx)
        for entry in folded.values():
            idx = sorted(entry.pop("indices"))
            if len(idx) <= 1:  # not a per-layer family: show the real name
                if idx:
                    entry["name"] = entry["name"].replace("{i}", str(idx[0]))
                entry["layers"] = None
            elif idx == list(range(idx[0], idx[-1] + 1)):
                entry["layers"] = f"{idx[0]}..{idx[-1]}"
            else:
                entry["layers"] = ",".join(str(i) for i in idx)
            changes.append(entry)
    return changes


# --------------------------------------------------------------------------- output directory

def check_out(out: Path, force: bool, model_path: Path | None = None) -> None:
    """Fail (one line) unless an artifact can be written to ``out``. Writes nothing."""
    shown = out
    out = Path(os.path.abspath(out))
    if out.exists() or out.is_symlink():
        if out.is_symlink() or not out.is_dir():
            raise SpecdecError(f"output {shown} exists and is not a directory")
        if any(out.iterdir()):
            if not force:
                raise SpecdecError(f"output directory {shown} is not empty (use --force to replace it)")
            if not (out / MANIFEST_FILE).is_file():
                raise SpecdecError(f"output directory {shown} is not empty and holds no {MANIFEST_FILE}: "
                                   f"--force only replaces a previous specdec-compile artifact")
        if model_path is not None:
            src = Path(model_path).resolve()
            o = out.resolve()
            if o == src.parent or o in src.parents:
                raise SpecdecError(f"output directory {shown} holds the input model {model_path}; "
                                   f"choose another -o")
    parent = _existing_ancestor(out.parent)
    if not os.access(parent, os.W_OK | os.X_OK):
        raise SpecdecError(f"cannot write the output {shown}: {parent} is not writable")


def _existing_ancestor(p: Path) -> Path:
    p = Path(os.path.abspath(p))
    while not p.exists():
        p = p.parent
    if not p.is_dir():
        raise SpecdecError(f"cannot write the output: {p} is not a directory")
    return p


# --------------------------------------------------------------------------- writing

def template_values(result, options: Options) -> dict:
    """All the values the templates need, gathered from the result and options."""
    sig = io_signature(result.model)
    kv_inputs = [s["name"] for s in sig["inputs"] if s["name"].startswith("past_")]
    kv_outputs = [s["name"] for s in sig["outputs"] if s["name"].endswith("_RetainedState")]
    if not kv_inputs or not kv_outputs:
        raise SpecdecError("the rewritten graph has no past_* inputs or *_RetainedState outputs; "
                           "it is not a retained-state graph")
    logits = [s["name"] for s in sig["outputs"] if s["name"] == LOGITS]
    features = (HIDDEN_STATES, DRAFT_HIDDEN_STATES)  # custom IO at the cache's float precision (section 4)
    seq_lens = options.seq_lens()
    qaic = options.target == "qaic"
    return dict(
        role=options.role,
        k=options.k,
        seq_lens=seq_lens,
        ctx_len=options.ctx_len,
        specializations=[{"batch_size": options.batch_size, "seq_len": s, "ctx_len": options.ctx_len}
                         for s in seq_lens],
        kv_inputs=kv_inputs,
        kv_outputs=kv_outputs,
        kv_dtype="mxint8" if options.mxint8_kv_cache else options.kv_dtype,
        # MXINT8 is the retained cache's compressed storage, not a precision for features
        feature_dtype=options.kv_dtype,
        feature_inputs=[s["name"] for s in sig["inputs"] if s["name"] in features],
        feature_outputs=[s["name"] for s in sig["outputs"] if s["name"] in features],
        logits_dtype=options.logits_dtype,
        logits_name=logits[0] if logits else LOGITS,
        model_file=MODEL_FILE,
        specializations_file=SPECIALIZATIONS_FILE,
        custom_io_file=CUSTOM_IO_FILE,
        partition_file=PARTITION_FILE if qaic and options.num_devices > 1 else None,
        qpc_dir=QPC_DIR,
        num_cores=options.num_cores,
        device_ids=list(range(options.num_devices)),
        precision=options.precision,
        hw_version=options.hw_version,
        tool_version=__version__,
        extra_flags=qaic_flags.option_flags(options) + list(options.qaic_flags),
        qeff_specializations=qeff.specializations(options) if options.interface == "qeff" else None,
    )


def compile_flags(values: dict) -> list[str]:
    """The compiler flags after ``-aic-hw -aic-hw-version=V``, from templates/qaic_flags.j2."""
    return [line.strip() for line in render("qaic_flags.j2", **values).splitlines() if line.strip()]


def _info(result) -> dict:
    info = result.info
    keys = ("num_layers", "num_heads", "num_kv_heads", "head_dim", "vocab_size", "dtype", "family", "exporter")
    if isinstance(info, dict):
        return {k: info.get(k) for k in keys}
    return {k: getattr(info, k, None) for k in keys}


def _token_ids(source_dir, vocab: int | None = None) -> dict:
    """Special token ids from the export's config.json / generation_config.json (the latter wins).

    Each ``*_token_id`` is one integer (the first, where the config lists several);
    ``eos_token_ids`` keeps every end-of-sequence id. A value that is not null, an integer
    or a list of integers, or an id outside the vocabulary (0 to ``vocab``-1), is refused:
    the manifest must not hand the runtime a token the model cannot produce.
    """
    found: dict = {}
    if source_dir is not None:
        for name in ("config.json", "generation_config.json"):
            path = Path(source_dir) / name
            if not path.exists():
                continue
            cfg = read_json(path, f"the export's {name}")
            if not isinstance(cfg, dict):
                raise SpecdecError(f"{path}: expected a JSON object, got {type(cfg).__name__}")
            for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
                v = _ids(cfg.get(key), path, key, vocab)
                if v:
                    found[key] = v
    ids = {key: found[key][0] if key in found else None for key in ("bos_token_id", "eos_token_id", "pad_token_id")}
    ids["eos_token_ids"] = found.get("eos_token_id")
    return ids


def _ids(v, path: Path, key: str, vocab: int | None) -> list[int] | None:
    """``v`` (null, an id or a list of ids) as a list of ids, each checked against the vocabulary."""
    if v is None:
        return None
    v = [v] if isinstance(v, int) else v
    if not isinstance(v, list) or not all(isinstance(x, int) and not isinstance(x, bool) for x in v):
        raise SpecdecError(f"{path}: {key} is {str(v)[:80]}, expected a token id or a list of token ids")
    for x in v:
        if x < 0 or (vocab is not None and x >= vocab):
            within = f"0 to {vocab - 1}, vocabulary {vocab}" if vocab is not None else "at least 0"
            raise SpecdecError(f"{path}: {key} {str(x)[:40]} is not a token id of the model ({within})")
    return v


def build_manifest(result, options: Options, values: dict, files: list[str], source_sha: str | None,
                   digests: dict | None = None) -> Manifest:
    """The manifest record of the artifact ``_fill`` writes (``digests``: file name -> sha256)."""
    source = getattr(result, "source", None)
    return Manifest(
        role=options.role, k=options.k, k_list=_tuple(options.widths()), prefill_len=options.prefill_len,
        ctx_len=options.ctx_len, batch_size=options.batch_size, **_info(result),
        target=options.target, **_compile_fields(result.model, options), specializations=tuple(values["seq_lens"]),
        **{k: _tuple(v) for k, v in _token_ids(getattr(result, "source_dir", None),
                                               _info(result)["vocab_size"]).items()},
        source_file=Path(source).name if source else None, source_sha256=source_sha,
        passes=tuple(getattr(result, "passes", []) or []), ops=op_set(result.model),
        tool_version=__version__, interface=io_signature(result.model), files=tuple(sorted(files)),
        **_feature_fields(result, options), **_optional_records(options), digests=digests,
    )


def _compile_fields(model: onnx.ModelProto, options: Options) -> dict:
    """kv_dtype and the Cloud AI 100 compile's options (``manifest.QAIC_KEYS``): a qaic artifact's
    as given (the custom IO's cache precision); an ort or openvino artifact's cache dtype is its
    graph's own, and it records no precision, cores, devices or hardware (contract section 5)."""
    if options.target == "qaic":
        return dict(kv_dtype=options.kv_dtype, logits_dtype=options.logits_dtype, precision=options.precision,
                    num_cores=options.num_cores, num_devices=options.num_devices, hw_version=options.hw_version)
    past = [s["dtype"] for s in io_signature(model)["inputs"] if s["name"].startswith("past_")]
    return dict(kv_dtype=past[0] if past else "undefined", logits_dtype=None, precision=None,
                num_cores=None, num_devices=None, hw_version=None)


def _feature_fields(result, options: Options) -> dict:
    """``hidden_states`` / ``feature_draft``; a feature draft's target (``--feature-target``) too."""
    fields = manifest_fields(result)
    if options.feature_target is not None and "feature_draft" in fields:
        name, sha = options.feature_target
        fields["feature_draft"]["target"] = {"file": name, "sha256": sha}
    return fields


def _optional_records(options: Options) -> dict:
    """The manifest's optional ``qeff`` and ``compile_options`` objects, where the options ask for them."""
    found = {"qeff": qeff.manifest_record(options), "compile_options": qaic_flags.manifest_record(options)}
    return {k: v for k, v in found.items() if v is not None}


def _tuple(v):
    return tuple(v) if isinstance(v, list) else v


def _fill(tmp: Path, result, options: Options, values: dict,
          source_sha: str | None) -> tuple[list[str], Manifest]:
    """Write every file of the artifact into ``tmp``; return their names (in writing order) and the manifest."""
    source_dir = getattr(result, "source_dir", None)
    data = save_model(result.model, tmp / MODEL_FILE, source_dir, link=options.link_weights)
    files = [MODEL_FILE] + [str(p.relative_to(tmp)) for p in data]
    specs = "specializations_qeff.json.j2" if options.interface == "qeff" else f"{SPECIALIZATIONS_FILE}.j2"
    texts = {SPECIALIZATIONS_FILE: render(specs, **values)}
    if options.target == "qaic":
        texts[CUSTOM_IO_FILE] = render(f"{CUSTOM_IO_FILE}.j2", **values)
        texts[COMPILE_SCRIPT] = render(f"{COMPILE_SCRIPT}.j2", **values)
        if values["partition_file"]:
            texts[PARTITION_FILE] = render(f"{PARTITION_FILE}.j2", **values)
    for name, text in texts.items():
        (tmp / name).write_text(text, encoding="utf-8", newline="\n")
    if COMPILE_SCRIPT in texts:
        os.chmod(tmp / COMPILE_SCRIPT, 0o755)
    files += list(texts)
    digests = {name: sha256_file(tmp / name) for name in files}
    files.append(MANIFEST_FILE)
    manifest = build_manifest(result, options, values, files, source_sha, digests)
    (tmp / MANIFEST_FILE).write_text(manifest.dumps(), encoding="utf-8", newline="\n")
    return files, manifest


def write_artifact(result, options: Options, out: str | os.PathLike, *, force: bool = False,
                   original: onnx.ModelProto | None = None, check=None) -> WrittenArtifact:
    """Write the artifact directory for ``result`` to ``out``, all or nothing.

    ``original`` (the graph before the rewrite, weights not loaded) is only used
    to report which inputs and outputs changed. ``check(directory)``, when given, runs on the
    finished directory before it takes ``out``'s place; what it raises leaves ``out`` as it was.
    """
    check_graph_agrees(result, options)
    shown = Path(out)
    source = getattr(result, "source", None)
    check_out(shown, force, source)
    out = Path(os.path.abspath(shown))
    values = template_values(result, options)
    _log.info("writing the artifact %s (model, weights linked, specializations, manifest)", shown)
    source_sha = sha256_file(source) if source else None

    created = missing_dirs(out.parent)  # parent directories this call makes, removed again on failure
    tmp = old = None
    try:
        for d in reversed(created):
            d.mkdir()
        parent = out.parent
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=parent))
        os.chmod(tmp, 0o755)
        files, record = _fill(tmp, result, options, values, source_sha)
        if check is not None:
            check(tmp)
        if out.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=parent))
            os.rename(out, old / "prev")  # aside, so the new one can take its name
            try:
                os.rename(tmp, out)
            except BaseException:
                os.rename(old / "prev", out)
                raise
        else:
            os.rename(tmp, out)
        tmp = None
    except BaseException as e:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
        remove_empty(created)
        if isinstance(e, OSError):  # disk full, permissions, a racing writer: one line, exit 2
            raise SpecdecError(f"cannot write the output {shown}: {e.strerror or e}"
                               + (f" ({e.filename})" if e.filename else "")) from None
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    _log.info("wrote %s: %d files", shown, len(files))
    before = io_signature(original) if original is not None else None
    return WrittenArtifact(out=shown, files=files, record=record, io_changes=io_changes(before, record.interface),
                           compile_flags=compile_flags(values) if options.target == "qaic" else [])


# --------------------------------------------------------------------------- the compiler

def find_compiler(path: str | None = None, sdk_dir: Path | None = None) -> Path | None:
    """qaic-compile or qaic-exec: on PATH first, then in /opt/qti-aic/exec/."""
    sdk_dir = SDK_EXEC_DIR if sdk_dir is None else sdk_dir
    for name in COMPILERS:
        found = shutil.which(name, path=path)
        if found:
            return Path(found)
    for name in COMPILERS:
        cand = Path(sdk_dir) / name
        if cand.is_file() and os.access(cand, os.X_OK):
            return cand
    return None


def hw_version_for(compiler: Path | str | None, asked: str | None) -> str:
    if asked:
        return asked
    name = Path(compiler).name if compiler else "qaic-compile"
    return DEFAULT_HW_VERSION.get(name, "ai100")


def options_dict(options: Options) -> dict:
    d = asdict(options)
    d["k_list"] = list(options.k_list)
    d["hidden_states"] = list(options.hidden_states)
    d["feature_layers"] = list(options.feature_layers)
    d["qaic_flags"] = list(options.qaic_flags)
    return d


def missing_dirs(path: Path) -> list[Path]:
    """The folders of ``path`` (itself included) that do not exist yet, deepest first: what a writer
    creates and, on failure, takes back with ``remove_empty`` (nothing written on failure)."""
    out = []
    p = Path(path)
    while not p.exists():
        out.append(p)
        p = p.parent
    return out


def remove_empty(dirs: list[Path]) -> None:
    """Remove each of ``dirs`` (deepest first) that is empty; a folder that holds something stays."""
    for d in dirs:
        try:
            d.rmdir()
        except OSError:
            pass
