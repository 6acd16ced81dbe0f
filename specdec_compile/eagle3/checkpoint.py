"""A ``speculators`` EAGLE-3 checkpoint directory, read and checked without torch or transformers.

The directory holds ``config.json`` (``speculators_model_type: "eagle3"``) and
``model.safetensors``. What is read (docs/import-head.md):

* ``transformer_layer_config``: the head's one decoder layer, a ``llama`` or
  ``qwen3`` layer (hidden size H, heads, KV heads, head_dim, intermediate
  size, RMSNorm eps, rope, biases); its ``vocab_size`` is the target's;
* ``draft_vocab_size``, ``eagle_aux_hidden_state_layer_ids`` (null: speculators'
  default ``[2, L//2, L-3]`` for an L-layer target), ``target_hidden_size``,
  the norm flags ``norm_before_residual``, ``norm_before_fc``, ``fc_norm``,
  ``norm_output``; ``speculators_config.verifier`` (recorded);
* the tensors, each of the shape the config implies; ``d2t``/``t2d`` when the
  draft vocabulary is smaller; ``embed_tokens.weight`` optional (else the
  target's). A tensor that is missing, of another shape, or not expected is
  refused, and so is a NaN or infinity in a weight: nothing is guessed.

A layer-config field that changes what speculators 0.9 (transformers 5) computes
is read as transformers reads it or refused, never dropped: ``rope_scaling``
beside ``rope_parameters``, a partial rotary inside the rope's parameters, a
top-level ``original_max_position_embeddings``, ``layer_types``, an absent
``num_hidden_layers`` (32 layers, not 1); fields it ignores (qwen3's
``mlp_bias``) are not read.

Pairing checks against the target (``check_target``): hidden size, vocabulary,
layer ids in range, ``d2t`` ids inside the target's vocabulary and ``t2d``
marking exactly them.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..errors import SpecdecError
from .safetensors import read_safetensors

CONFIG, WEIGHTS = "config.json", "model.safetensors"
FAMILIES = ("llama", "qwen3")
FLAGS = ("norm_before_residual", "norm_before_fc", "fc_norm", "norm_output")
ROPE_TYPES = ("default", "linear", "llama3")
#: what each rope type needs besides rope_theta
_ROPE_KEYS = {"default": (), "linear": ("factor",),
              "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")}
#: tensors speculators may save that the head does not use
IGNORED = ("verifier_norm.weight", "verifier_lm_head.weight")


@dataclass
class Eagle3Checkpoint:
    path: Path
    family: str                  # the decoder layer's model_type: llama or qwen3
    hidden_size: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    eps: float
    rope: dict                   # {"type", "theta", and the scaling's own keys}
    attention_bias: bool
    mlp_bias: bool
    target_vocab: int
    draft_vocab: int
    aux_ids: tuple[int, ...] | None   # None: speculators' default for the target's layer count
    flags: dict[str, bool]
    verifier: dict
    max_positions: int
    tensors: dict[str, np.ndarray] = field(repr=False, default_factory=dict)

    @property
    def n_aux(self) -> int:
        return len(self.aux_ids) if self.aux_ids is not None else 3


def _positive(v) -> bool:
    """A JSON number > 0 and finite as a float (not a boolean; NaN and Infinity, which Python's json reads,
    are not, nor an integer past float's range such as 10**400, which float() cannot convert)."""
    if not isinstance(v, (int, float)) or isinstance(v, bool):
        return False
    try:
        return 0 < float(v) < math.inf
    except OverflowError:
        return False


def _need(cfg: dict, key: str, kind, where: str):
    v = cfg.get(key)
    if kind is int and (not isinstance(v, int) or isinstance(v, bool) or v < 1):
        raise SpecdecError(f"{where}: {key} is {v!r}, expected a positive integer")
    if kind is float and not _positive(v):
        raise SpecdecError(f"{where}: {key} is {v!r}, expected a positive number")
    return v


def _rope_params(tl: dict, where: str) -> dict:
    """The rope's parameters as transformers 5 reads them: ``rope_scaling`` (transformers 4's key), when
    given, wins over ``rope_parameters`` (``convert_rope_params_to_dict``), so the two given and
    disagreeing are refused, never read from the one the library ignores."""
    params, legacy = tl.get("rope_parameters"), tl.get("rope_scaling")
    if params is None or legacy:
        if legacy and not isinstance(legacy, dict):
            raise SpecdecError(f"{where}: rope parameters {legacy!r} are not an object")
        if params is not None and _rope_key(legacy, tl) != _rope_key(params, tl):
            raise SpecdecError(f"{where}: transformer_layer_config has both rope_parameters {params!r} and "
                               f"rope_scaling {legacy!r}, which disagree (transformers reads rope_scaling): "
                               f"give one")
        params = {"rope_theta": tl.get("rope_theta", 10000.0), **(legacy or {})}
    if not isinstance(params, dict):
        raise SpecdecError(f"{where}: rope parameters {params!r} are not an object")
    nested = sorted(k for k, v in params.items() if isinstance(v, dict))
    if nested:
        raise SpecdecError(f"{where}: rope parameters per layer type ({', '.join(nested)}) are not supported "
                           f"(one flat rope_parameters object)")
    return params


def _rope_key(params, tl: dict):
    """A rope's parameters compared as transformers reads them (``type`` spelled ``rope_type``; rope_theta
    the top-level one or 10000 when the object has none)."""
    if not isinstance(params, dict):
        return params
    out = {k: v for k, v in params.items() if k != "type"}
    out["rope_type"] = params.get("rope_type", params.get("type", "default"))
    out.setdefault("rope_theta", tl.get("rope_theta", 10000.0))
    return out


def _rope(tl: dict, where: str) -> dict:
    """The rope of the layer config, as transformers 4 (rope_theta, rope_scaling) or 5 (rope_parameters) writes it."""
    params = _rope_params(tl, where)
    kind = params.get("rope_type", params.get("type", "default"))
    if kind not in ROPE_TYPES:
        raise SpecdecError(f"{where}: rope type {kind!r} is not supported (supported: {', '.join(ROPE_TYPES)})")
    theta = params.get("rope_theta", tl.get("rope_theta", 10000.0))
    if not _positive(theta):
        raise SpecdecError(f"{where}: rope_theta {theta!r} is not a positive number")
    # transformers 5 moves a top-level partial_rotary_factor into the rope's parameters (theirs wins); the
    # library then rotates part of each head (or fails), so anything but 1 is refused wherever it is given
    for partial in (tl.get("partial_rotary_factor"), params.get("partial_rotary_factor")):
        if partial not in (None, 1) or isinstance(partial, bool):
            raise SpecdecError(f"{where}: partial_rotary_factor {partial!r} is not supported (only 1)")
    out = {k: v for k, v in params.items() if k not in ("rope_type", "type", "rope_theta", "partial_rotary_factor")}
    for key in _ROPE_KEYS[kind]:
        v = out.get(key)
        if not _positive(v):
            raise SpecdecError(f"{where}: rope type {kind!r} needs a positive {key}, got {v!r}")
    top = tl.get("original_max_position_embeddings")
    if kind == "llama3" and top is not None and top != out["original_max_position_embeddings"]:
        # transformers 5 (standardize_rope_params) takes the top-level value over the rope's own
        raise SpecdecError(f"{where}: original_max_position_embeddings {top!r} disagrees with the rope's "
                           f"{out['original_max_position_embeddings']!r} (transformers reads the top-level one): "
                           f"give one")
    return {"type": kind, "theta": float(theta), **out}


def _layer_types(tl: dict, where: str) -> None:
    """``layer_types``: null, or the one layer's full attention. speculators reads a ``sliding_attention``
    entry (with ``sliding_window``) as a sliding-window mask even for a llama layer, and transformers 5
    refuses a list of another length than the layers."""
    kinds = tl.get("layer_types")
    if kinds is None:
        return
    if not isinstance(kinds, list) or len(kinds) != 1:
        raise SpecdecError(f"{where}: transformer_layer_config.layer_types {kinds!r} is not a list of the head's "
                           f"1 layer")
    if kinds[0] not in ("full_attention", "attention"):
        raise SpecdecError(f"{where}: transformer_layer_config.layer_types {kinds!r}: only full attention is "
                           f"supported (a sliding-window head is not)")


def _layer_config(tl, where: str) -> dict:
    if not isinstance(tl, dict):
        raise SpecdecError(f"{where}: transformer_layer_config is {type(tl).__name__}, expected an object")
    fam = tl.get("model_type")
    if fam not in FAMILIES:
        raise SpecdecError(f"{where}: transformer_layer_config.model_type {fam!r} is not supported "
                           f"(supported: {', '.join(FAMILIES)})")
    if "num_hidden_layers" not in tl:      # transformers' default for either family is 32 layers, not 1
        raise SpecdecError(f"{where}: transformer_layer_config has no num_hidden_layers (transformers would "
                           f"build its default of 32 layers); a 1-layer head says 1")
    layers = _need(tl, "num_hidden_layers", int, where)
    if layers != 1:
        raise SpecdecError(f"{where}: the head has {layers} decoder layers; only 1-layer EAGLE-3 heads are supported")
    if tl.get("hidden_act", "silu") != "silu":
        raise SpecdecError(f"{where}: hidden_act {tl.get('hidden_act')!r} is not supported (silu)")
    for key in ("attention_bias", "mlp_bias", "use_sliding_window"):   # a string ("false") is no boolean
        if tl.get(key) is not None and not isinstance(tl[key], bool):
            raise SpecdecError(f"{where}: transformer_layer_config.{key} is {tl[key]!r}, expected true or false")
    if fam == "qwen3" and tl.get("use_sliding_window"):
        raise SpecdecError(f"{where}: a sliding-window head is not supported")
    _layer_types(tl, where)
    H, heads = _need(tl, "hidden_size", int, where), _need(tl, "num_attention_heads", int, where)
    kv, hd = tl.get("num_key_value_heads"), tl.get("head_dim")    # null: transformers' defaults
    kv, hd = heads if kv is None else kv, H // heads if hd is None else hd
    if (not isinstance(kv, int) or isinstance(kv, bool) or kv < 1 or heads % kv
            or not isinstance(hd, int) or isinstance(hd, bool) or hd < 1):
        raise SpecdecError(f"{where}: num_key_value_heads {kv!r} / head_dim {hd!r} do not fit {heads} heads")
    if tl.get("max_position_embeddings") is not None:
        _need(tl, "max_position_embeddings", int, where)
    return dict(family=fam, hidden_size=H, intermediate_size=_need(tl, "intermediate_size", int, where),
                num_heads=heads, num_kv_heads=kv, head_dim=hd, eps=float(_need(tl, "rms_norm_eps", float, where)),
                rope=_rope(tl, where), attention_bias=bool(tl.get("attention_bias")),
                mlp_bias=fam == "llama" and bool(tl.get("mlp_bias")),    # qwen3's MLP has no bias: not read
                target_vocab=_need(tl, "vocab_size", int, where),
                max_positions=int(tl.get("max_position_embeddings") or 4096))


def _read_config(path: Path) -> dict:
    f = path / CONFIG
    if path.exists() and not path.is_dir():
        raise SpecdecError(f"{path}: is not a directory (a speculators checkpoint is a directory holding "
                           f"{CONFIG} and {WEIGHTS})")
    if not path.is_dir():
        raise SpecdecError(f"{path}: no such checkpoint directory")
    if not f.is_file():
        raise SpecdecError(f"{path}: no {CONFIG} (a speculators checkpoint holds config.json and model.safetensors)")
    try:
        cfg = json.loads(f.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as e:
        # ValueError: JSONDecodeError, UnicodeDecodeError, and an integer of more than 4300 digits;
        # RecursionError: arrays or objects nested thousands deep
        raise SpecdecError(f"{f}: not readable JSON ({type(e).__name__}: {str(e)[:200]})") from None
    if not isinstance(cfg, dict):
        raise SpecdecError(f"{f}: not a JSON object")
    kind = cfg.get("speculators_model_type")
    if kind != "eagle3":
        raise SpecdecError(f"{path}: not an EAGLE-3 checkpoint (speculators_model_type is {kind!r}, "
                           f"expected 'eagle3')")
    return cfg


def _aux_ids(cfg: dict, where: Path):
    ids = cfg.get("eagle_aux_hidden_state_layer_ids")
    if ids is None:
        return None
    if (not isinstance(ids, list) or not ids
            or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids)):
        raise SpecdecError(f"{where}: eagle_aux_hidden_state_layer_ids {ids!r} is not a list of integers")
    return tuple(ids)


def _verifier(cfg: dict, where: Path) -> dict:
    """``speculators_config.verifier``'s name_or_path and architectures (null or absent: not recorded); a value
    of another JSON type is refused, never read as something else (a string's letters as architectures)."""
    spec = cfg.get("speculators_config")
    if spec is not None and not isinstance(spec, dict):
        raise SpecdecError(f"{where}: speculators_config is {spec!r}, expected an object")
    verifier = (spec or {}).get("verifier")
    if verifier is not None and not isinstance(verifier, dict):
        raise SpecdecError(f"{where}: speculators_config.verifier is {verifier!r}, expected an object")
    rec = {k: (verifier or {}).get(k) for k in ("name_or_path", "architectures")}
    archs = rec["architectures"]
    if archs is not None and (not isinstance(archs, list) or not all(isinstance(a, str) for a in archs)):
        raise SpecdecError(f"{where}: speculators_config.verifier.architectures is {archs!r}, expected a list "
                           f"of class names like [\"LlamaForCausalLM\"]")
    if rec["name_or_path"] is not None and not isinstance(rec["name_or_path"], str):
        raise SpecdecError(f"{where}: speculators_config.verifier.name_or_path is {rec['name_or_path']!r}, "
                           f"expected a string")
    return rec


def read_checkpoint(path: str | Path) -> Eagle3Checkpoint:
    """The checkpoint at ``path``, its config and tensors checked against each other (not yet the target)."""
    path = Path(path)
    cfg = _read_config(path)
    where = path / CONFIG
    layer = _layer_config(cfg.get("transformer_layer_config"), str(where))
    flags = {}
    for k in FLAGS:
        v = cfg.get(k, False)
        if not isinstance(v, bool):
            raise SpecdecError(f"{where}: {k} is {v!r}, expected true or false")
        flags[k] = v
    if flags["norm_before_fc"] and flags["fc_norm"]:
        raise SpecdecError(f"{where}: norm_before_fc and fc_norm are both set (they exclude each other)")
    th = cfg.get("target_hidden_size")
    if th is not None and (not isinstance(th, int) or isinstance(th, bool)):
        raise SpecdecError(f"{where}: target_hidden_size is {th!r}, expected null or an integer")
    if th is not None and th != layer["hidden_size"]:
        raise SpecdecError(f"{where}: target_hidden_size {th} differs from the head's hidden size "
                           f"{layer['hidden_size']}: not supported")
    dv = _need(cfg, "draft_vocab_size", int, str(where))
    if dv > layer["target_vocab"]:
        raise SpecdecError(f"{where}: draft_vocab_size {dv} is larger than the target vocabulary "
                           f"{layer['target_vocab']}")
    ck = Eagle3Checkpoint(path=path, draft_vocab=dv, aux_ids=_aux_ids(cfg, where), flags=flags,
                          verifier=_verifier(cfg, where), **layer)
    f = path / WEIGHTS
    if not f.is_file():
        raise SpecdecError(f"{path}: no {WEIGHTS} (sharded checkpoints are not supported)")
    ck.tensors = read_safetensors(f)
    check_tensors(ck, f)
    return ck


def expected_shapes(ck: Eagle3Checkpoint) -> tuple[dict[str, tuple], set[str]]:
    """(every tensor the head needs -> its shape, the optional ones)."""
    H, I, hd, n = ck.hidden_size, ck.intermediate_size, ck.head_dim, ck.n_aux
    q, kv = ck.num_heads * hd, ck.num_kv_heads * hd
    a = "layers.0.self_attn."
    shapes = {"fc.weight": (H, n * H), "norm.weight": (H,), "lm_head.weight": (ck.draft_vocab, H),
              "embed_tokens.weight": (ck.target_vocab, H),
              a + "q_proj.weight": (q, 2 * H), a + "k_proj.weight": (kv, 2 * H), a + "v_proj.weight": (kv, 2 * H),
              a + "o_proj.weight": (H, q), "layers.0.mlp.gate_proj.weight": (I, H),
              "layers.0.mlp.up_proj.weight": (I, H), "layers.0.mlp.down_proj.weight": (H, I)}
    for norm in ("input_layernorm", "hidden_norm", "post_attention_layernorm"):
        shapes[f"layers.0.{norm}.weight"] = (H,)
    if ck.attention_bias:
        shapes.update({a + "q_proj.bias": (q,), a + "k_proj.bias": (kv,), a + "v_proj.bias": (kv,),
                       a + "o_proj.bias": (H,)})
    if ck.mlp_bias:
        shapes.update({f"layers.0.mlp.{p}.bias": (H if p == "down_proj" else I,)
                       for p in ("gate_proj", "up_proj", "down_proj")})
    if ck.family == "qwen3":
        shapes.update({a + "q_norm.weight": (hd,), a + "k_norm.weight": (hd,)})
    if ck.flags["norm_before_fc"]:
        shapes["input_norm.weight"] = (n * H,)
    if ck.flags["fc_norm"]:
        shapes.update({f"fc_norm.{i}.weight": (H,) for i in range(n)})
    optional = {"embed_tokens.weight"}
    shapes.update({"d2t": (ck.draft_vocab,), "t2d": (ck.target_vocab,)})
    if ck.draft_vocab == ck.target_vocab:
        optional |= {"d2t", "t2d"}
    return shapes, optional


def check_tensors(ck: Eagle3Checkpoint, f: Path) -> None:
    shapes, optional = expected_shapes(ck)
    t = ck.tensors
    for name in sorted(set(t) - set(shapes) - set(IGNORED)):
        raise SpecdecError(f"{f}: unexpected tensor {name!r} {list(t[name].shape)} for this EAGLE-3 config")
    for name, shape in shapes.items():
        if name not in t:
            if name in optional:
                continue
            raise SpecdecError(f"{f}: tensor {name!r} is missing")
        if tuple(t[name].shape) != shape:
            raise SpecdecError(f"{f}: tensor {name!r} is {list(t[name].shape)}, expected {list(shape)} "
                               f"from {CONFIG}")
        want = {"d2t": "i", "t2d": "b"}.get(name, "f")
        if t[name].dtype.kind not in (want + ("u" if want != "f" else "")):
            raise SpecdecError(f"{f}: tensor {name!r} has dtype {t[name].dtype}, expected "
                               f"{ {'i': 'integer', 'b': 'bool', 'f': 'floating point'}[want] }")
        if want == "f" and not _finite(t[name]):
            raise SpecdecError(f"{f}: tensor {name!r} holds NaN or infinite values, or values past float32's "
                               f"range that the float32 head would hold as infinite (a damaged checkpoint)")
    if ("d2t" in t) != ("t2d" in t):
        raise SpecdecError(f"{f}: has {'d2t' if 'd2t' in t else 't2d'} without "
                           f"{'t2d' if 'd2t' in t else 'd2t'} (they map the vocabularies together)")


def _finite(a: np.ndarray, chunk: int = 1 << 22) -> bool:
    """No NaN or infinity in ``a`` as float32, the head's type: a float64 of 1e300 is finite, but infinite
    once cast (checked in chunks: no temporary the size of an embedding table)."""
    flat = a.reshape(-1)
    with np.errstate(over="ignore", invalid="ignore"):
        return all(np.isfinite(flat[i:i + chunk].astype(np.float32)).all() for i in range(0, flat.size, chunk))


def draft_to_target(ck: Eagle3Checkpoint, target_vocab: int) -> np.ndarray:
    """The target id of each draft index (i + d2t[i]), checked against ``t2d`` and the target's vocabulary."""
    f = ck.path / WEIGHTS
    if "d2t" not in ck.tensors:
        return np.arange(ck.draft_vocab, dtype=np.int64)
    ids = np.arange(ck.draft_vocab, dtype=np.int64) + ck.tensors["d2t"].astype(np.int64)
    if ck.draft_vocab == ck.target_vocab and ck.tensors["d2t"].any():
        # speculators ignores d2t/t2d when the vocabularies are equal (draft index i is target id i); a
        # server that applies them would permute the ids: which one the head was trained for is unknown
        i = int(np.flatnonzero(ck.tensors["d2t"])[0])
        raise SpecdecError(f"{f}: draft_vocab_size is the target's {ck.target_vocab}, but d2t maps draft index "
                           f"{i} to target id {int(ids[i])} (speculators ignores d2t then): not supported")
    bad = np.flatnonzero((ids < 0) | (ids >= target_vocab))
    if bad.size:
        raise SpecdecError(f"{f}: d2t maps draft index {int(bad[0])} to target id {int(ids[bad[0]])}, outside the "
                           f"target's vocabulary of {target_vocab}")
    if np.unique(ids).size != ids.size:
        raise SpecdecError(f"{f}: d2t maps two draft indices to one target id")
    t2d = ck.tensors["t2d"].astype(bool)
    marked = np.flatnonzero(t2d)
    if marked.size != ids.size or not np.array_equal(marked, np.sort(ids)):
        miss = sorted(set(ids.tolist()) ^ set(marked.tolist()))
        raise SpecdecError(f"{f}: d2t and t2d disagree (t2d marks {marked.size} target ids, d2t maps to "
                           f"{ids.size}; first difference at target id {miss[0]})")
    return ids
