"""``import_head``: a speculators EAGLE-3 checkpoint -> a compiled feature-draft artifact for one target.

Order of work (every refusal before anything is written): read and check the
checkpoint alone; read the target (export or compiled TLM); check the pair
(vocabulary, hidden size, layer ids, d2t/t2d against the target's vocabulary,
a compiled TLM's exposed layers); export the head with torch.onnx into a
scratch directory; compile it with our passes as a feature draft (``--role dlm
--feature-layers``, the target's layer indices); write the artifact next to
OUT, add the ``eagle3`` record to its manifest, and move it into place.

The layer convention (contract section 2): aux id i is the hidden state that
*enters* the target's decoder layer i (transformers' ``hidden_states[i]``,
vLLM's aux hidden state i), which is the output of layer i - 1: our
``--hidden-states i-1``. Aux id 0 (the embedding output) is not a layer output
and is refused.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np

from ..errors import SpecdecError
from ..layer_lists import format_layers
from .checkpoint import CONFIG, WEIGHTS, Eagle3Checkpoint, draft_to_target, read_checkpoint
from .target import Target, check_exposed, read_target, target_embedding

_log = logging.getLogger(__name__)


def target_layers(ck: Eagle3Checkpoint, t: Target) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(the aux ids, resolved, ascending; the target layers whose outputs they are: --hidden-states).

    Ascending whatever the config's order: vLLM (and speculators' data generator, which trains the head)
    appends each aux hidden state as its layer runs, so fc's input blocks are the layers in ascending
    order; ids listed [4, 1, 2] are read as [1, 2, 4], never as fc reading layer 4 in its first block."""
    L = t.num_layers
    ids = ck.aux_ids if ck.aux_ids is not None else (2, L // 2, L - 3)
    where = ck.path / CONFIG
    for i in ids:
        if i == 0:
            raise SpecdecError(f"{where}: aux layer id 0 is the target's embedding output, which a compiled target "
                               f"cannot output (--hidden-states exposes layer outputs): not supported")
        if not 0 < i <= L:
            raise SpecdecError(f"{where}: eagle_aux_hidden_state_layer_ids {list(ids)}: id {i} is out of range for "
                               f"a target of {L} layers (valid: 1..{L})")
    if len(set(ids)) != len(ids):
        raise SpecdecError(f"{where}: eagle_aux_hidden_state_layer_ids {list(ids)} names a layer twice")
    ids = sorted(ids)
    return tuple(ids), tuple(i - 1 for i in ids)


def _arch_family(name: str) -> str:
    """``Qwen2ForCausalLM`` -> ``qwen2``: an architecture's class name without its task suffix, in the
    spelling of ``_plain(model_type)``."""
    for suffix in ("ForCausalLM", "ForConditionalGeneration", "LMHeadModel", "Model"):
        if name.endswith(suffix) and len(name) > len(suffix):
            name = name[:-len(suffix)]
            break
    return _plain(name)


def _plain(text: str) -> str:
    return "".join(c for c in text.lower() if c.isalnum())


def _same_family(arch: str, family: str) -> bool:
    """Equal, or one a prefix of the other followed by a word (gemma3 / gemma3_text, qwen2 / qwen2_moe),
    never by a digit (llama / llama4, phi / phi3, qwen2 / qwen3 are other models)."""
    short, long_ = sorted((arch, family), key=len)
    return long_.startswith(short) and (len(long_) == len(short) or long_[len(short)].isalpha())


def check_verifier(ck: Eagle3Checkpoint, family: str | None, target) -> None:
    """The verifier the checkpoint records (``speculators_config.verifier.architectures``) against the
    target's model family (its config.json ``model_type``): a head trained for another family of model
    is refused in one line, even when the shapes happen to fit. ``name_or_path`` is not compared (a hub
    id and a local folder name the same model); nothing is compared when either side is not recorded."""
    archs = [a for a in (ck.verifier or {}).get("architectures") or [] if isinstance(a, str) and a]
    if not archs or not family:
        return
    if any(_same_family(_arch_family(a), _plain(family)) for a in archs):
        return
    raise SpecdecError(f"{ck.path / CONFIG}: the head was trained for a {', '.join(archs)} verifier "
                       f"(speculators_config.verifier.architectures), but the target {target} is a {family} model "
                       f"(config.json model_type): a head for another model")


def check_pair(ck: Eagle3Checkpoint, t: Target) -> tuple[tuple[int, ...], tuple[int, ...]]:
    where = ck.path / CONFIG
    check_verifier(ck, t.family, t.path)
    if ck.target_vocab != t.vocab_size:
        raise SpecdecError(f"{where}: the head is for a vocabulary of {ck.target_vocab} (transformer_layer_config."
                           f"vocab_size), the target {t.path} has {t.vocab_size}")
    if t.hidden_size is not None and t.hidden_size != ck.hidden_size:
        raise SpecdecError(f"{where}: the head's hidden size is {ck.hidden_size}, the target {t.path}'s is "
                           f"{t.hidden_size}")
    ids, layers = target_layers(ck, t)
    if len(ids) != ck.n_aux:
        raise SpecdecError(f"{where}: {len(ids)} aux layers, but fc reads {ck.n_aux}")
    check_exposed(t, layers)
    return ids, layers


def _sha256(path: Path) -> str:
    from ..model_io import sha256_file
    return sha256_file(path)


def eagle3_record(ck: Eagle3Checkpoint, t: Target, ids, layers, target_ids, spread: str,
                  weights: dict | None) -> dict:
    """The manifest's ``feature_draft.eagle3`` object: the checkpoint and the target it was paired with,
    how the graph spreads the draft's logits (``spread``, when the vocabularies differ) and its
    quantized ``weights`` (``quantize.quantize_head``'s record; None: float32)."""
    spreads = not np.array_equal(target_ids, np.arange(ck.target_vocab))
    return {
        "checkpoint": {"path": str(ck.path.resolve()), "sha256": _sha256(ck.path / WEIGHTS),
                       "config_sha256": _sha256(ck.path / CONFIG), "verifier": ck.verifier},
        "paired_target": {"path": str(Path(t.path).resolve()), "file": t.file, "sha256": t.sha256},
        "aux_hidden_state_layer_ids": list(ids), "target_layers": list(layers),
        "family": ck.family, "hidden_size": ck.hidden_size, "draft_vocab_size": ck.draft_vocab,
        "target_vocab_size": ck.target_vocab, "flags": dict(ck.flags),
        "draft_ids_spread": spreads, "logits_spread": spread if spreads else None, "weights": weights,
    }


def _amend(manifest_path: Path, ck: Eagle3Checkpoint, record: dict) -> dict:
    from ..artifact.manifest import Manifest
    m = json.loads(manifest_path.read_text(encoding="utf-8"))
    fd = m["feature_draft"]
    n = ck.n_aux * ck.hidden_size
    if fd["width"] != n + ck.hidden_size or fd["draft_width"] != ck.hidden_size:
        raise AssertionError(f"the compiled head's widths {fd['width']}/{fd['draft_width']} are not {n}+H/H")
    fd.update(target_width=n, own_offset=n, eagle3=record,
              pairing=fd["pairing"] + "; the input is [target features (target_width) ; own slot]: a row fed "
                                      "with the target's features has zeros in the own slot, a drafted row "
                                      "zeros in the features and the draft's own draft_hidden_states in the slot")
    Manifest.from_json(m, where=manifest_path)
    manifest_path.write_text(json.dumps(m, indent=2, sort_keys=True) + "\n", encoding="utf-8", newline="\n")
    return m


def check_out_spares(out: Path, ckpt: Path) -> None:
    """OUT is not the checkpoint's folder nor one that holds it: replacing OUT (--force) would delete it."""
    o, src = Path(os.path.abspath(out)).resolve(), Path(ckpt).resolve()
    if o == src or o in src.parents:
        raise SpecdecError(f"output directory {out} holds the checkpoint {ckpt} (replacing it would delete the "
                           f"checkpoint); choose another -o")


def move_into_place(staged: Path, out: Path) -> None:
    """Rename the finished directory ``staged`` to ``out`` (a previous ``out`` set aside, then removed)."""
    out = Path(os.path.abspath(out))
    if out.exists() and any(out.iterdir()):
        old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.parent))
        os.rename(out, old / "prev")
        try:
            os.rename(staged, out)
        except BaseException:
            os.rename(old / "prev", out)
            raise
        shutil.rmtree(old, ignore_errors=True)
    else:
        if out.exists():
            out.rmdir()
        os.rename(staged, out)


#: the import's shapes when the target is an export (a compiled TLM gives its own)
DEFAULTS = {"k": 4, "prefill_len": 32, "ctx_len": 256, "batch_size": 1, "target": "qaic"}


def resolve_shapes(t: Target, given: dict) -> dict:
    """``given`` (k, prefill_len, ctx_len, batch_size, target; None: not given) completed from a compiled
    TLM's manifest, else ``DEFAULTS``. A given batch, context or prefill length other than the compiled
    TLM's is refused: the draft could never run beside it (specdec-run refuses the pair)."""
    out = {}
    for key, default in DEFAULTS.items():
        value, have = given.get(key), (t.compiled or {}).get(key)
        if value is not None and have is not None and value != have and key in ("batch_size", "ctx_len",
                                                                                "prefill_len"):
            flag = "--" + key.replace("_", "-")
            raise SpecdecError(f"{flag} {value}: --tlm {t.path} was compiled with {flag} {have}, and a draft runs "
                               f"only beside a TLM of the same {key.replace('_', ' ')} (leave {flag} out to take "
                               f"the TLM's)")
        out[key] = value if value is not None else have if have is not None else default
    return out


def import_head(ckpt, tlm, out, *, target: str | None = None, k: int | None = None, k_list=(),
                prefill_len: int | None = None, ctx_len: int | None = None, force: bool = False, export_dir=None,
                weights: str = "float", **compile_options) -> dict:
    """Compile the checkpoint ``ckpt`` into the feature-draft artifact ``out`` for the target ``tlm``;
    returns the artifact's manifest (as JSON). ``target``, ``k``, ``prefill_len``, ``ctx_len`` and
    ``batch_size`` left None: a compiled TLM's (``resolve_shapes``), else ``DEFAULTS``.
    ``export_dir``: keep the head's ONNX export there (``export_dir``/model.onnx, what ``verify``
    compares the artifact with); default: discarded. ``weights``: "float" (the checkpoint's, in
    float32) or "int8"/"int4" (``quantize.quantize_head``: weight-only, ort and openvino targets)."""
    from .. import pipeline
    from ..artifact.writer import check_out, missing_dirs, remove_empty, write_artifact
    from ..options import Options
    from .quantize import check_weights, quantize_head
    ck = read_checkpoint(ckpt)
    t = read_target(tlm)
    shapes = resolve_shapes(t, {"k": k, "prefill_len": prefill_len, "ctx_len": ctx_len, "target": target,
                                "batch_size": compile_options.pop("batch_size", None)})
    target, k, prefill_len, ctx_len = shapes["target"], shapes["k"], shapes["prefill_len"], shapes["ctx_len"]
    compile_options["batch_size"] = shapes["batch_size"]
    check_weights(weights, target)
    ids, layers = check_pair(ck, t)
    target_ids = draft_to_target(ck, t.vocab_size)
    emb = ck.tensors.get("embed_tokens.weight")
    if emb is None:
        emb = target_embedding(t)
        if emb.shape != (ck.target_vocab, ck.hidden_size):
            raise SpecdecError(f"--tlm {t.path}: its token embedding is {list(emb.shape)}, the head needs "
                               f"[{ck.target_vocab}, {ck.hidden_size}]")
    opts = Options(role="dlm", k=k, k_list=tuple(k_list), prefill_len=prefill_len, ctx_len=ctx_len, target=target,
                   feature_layers=layers, feature_target=(t.file, t.sha256), **compile_options)
    out = Path(out)
    check_out(out, force, t.model)
    check_out_spares(out, ck.path)
    from .head import export_head
    parent = Path(os.path.abspath(out)).parent
    created = missing_dirs(parent)
    parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{out.name}.import-", dir=parent))
    try:
        _log.info("exporting the EAGLE-3 head (%s, %d aux layers, draft vocabulary %d) with torch.onnx",
                  ck.family, ck.n_aux, ck.draft_vocab)
        # the device's graph spreads the logits with a Gather (precedent); a CPU's with a ScatterElements
        spread = "gather" if target == "qaic" else "scatter"
        onnx_path = export_head(ck, emb, target_ids, Path(export_dir) if export_dir else scratch / "export", spread)
        quantized = quantize_head(onnx_path, weights)
        res = pipeline.rewrite(onnx_path, opts, source=onnx_path)
        write_artifact(res, opts, scratch / "artifact")
        m = _amend(scratch / "artifact" / "manifest.json", ck,
                   eagle3_record(ck, t, ids, layers, target_ids, spread, quantized))
        move_into_place(scratch / "artifact", out)
    except BaseException:
        shutil.rmtree(scratch, ignore_errors=True)
        remove_empty(created)     # a refusal (no torch, a failed export) leaves no folder behind
        raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return m


def hidden_states_hint(m: dict) -> str:
    """The --hidden-states a target must be compiled with for this draft."""
    return format_layers(m["feature_draft"]["target_layers"])
