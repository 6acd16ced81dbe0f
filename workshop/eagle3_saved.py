"""Saved EAGLE-3 heads (speculators' format, as ``workshop/eagle3_train.py`` writes them) read
back for the trainer: to evaluate (``--evaluate``) or to train on (``--init``), through the
importer's own checks (``specdec_compile.eagle3.checkpoint``)."""
from __future__ import annotations

import json
from pathlib import Path

from . import eagle3_data as store


def load_head(d: Path, tc: dict, embedding, default_aux: list[int]):
    """(Eagle3Head in float32 with the saved weights, the draft vocabulary's target ids, the aux
    layer ids) of a head saved in speculators' format, read through the importer's checks."""
    from safetensors.torch import load_file

    from specdec_compile.eagle3.checkpoint import draft_to_target, read_checkpoint

    from .eagle3_head import Eagle3Head
    ck = read_checkpoint(d)
    aux = list(ck.aux_ids or default_aux)
    head = Eagle3Head(tc, len(aux), ck.draft_vocab, embedding, ck.flags["norm_before_residual"])
    sd = {k: v for k, v in load_file(str(d / "model.safetensors")).items() if k not in ("d2t", "t2d")}
    head.load_state_dict(sd, strict=True)
    return head.float(), draft_to_target(ck, tc["vocab_size"]), aux


def init_vocab(init: Path, vocab: int):
    """The draft vocabulary (target ids) of the head training continues from: kept, so that its
    trained rows keep their meaning."""
    from specdec_compile.eagle3.checkpoint import draft_to_target, read_checkpoint
    return draft_to_target(read_checkpoint(init), vocab)


def bad_init(init: Path | None, cfg: dict) -> str | None:
    """Why training cannot continue from ``init`` with ``cfg`` (None: it can): its files, aux
    layers, draft vocabulary size and norm flag must be the recipe's."""
    if init is None:
        return None
    why = bad_heads([init])
    if why:
        return why
    from specdec_compile.eagle3.checkpoint import read_checkpoint
    ck = read_checkpoint(init)
    if list(ck.aux_ids or []) != list(cfg["aux_ids"]) or ck.draft_vocab != cfg["draft_vocab"] \
            or ck.flags["norm_before_residual"] != cfg["norm_before_residual"]:
        return (f"{init}: reads layers {list(ck.aux_ids or [])} with {ck.draft_vocab} draft tokens, not the recipe's "
                f"{cfg['aux_ids']} and {cfg['draft_vocab']} (or another norm_before_residual)")
    return None


def init_record(init: Path) -> dict:
    """What the recipe says of the head training continued from: its weights' sha256 and its own
    recipe (so the chain from scratch is on record)."""
    rec = {"path": str(init), "model_sha256": store.sha256_file(init / "model.safetensors")}
    if (init / "recipe.json").is_file():
        rec["recipe"] = json.loads((init / "recipe.json").read_text())
    return rec


def bad_heads(heads: list[Path]) -> str | None:
    """What is wrong with the first head --evaluate cannot read (the importer's checks), or None."""
    from specdec_compile.errors import SpecdecError
    from specdec_compile.eagle3.checkpoint import read_checkpoint
    for d in heads:
        if not (d / "model.safetensors").is_file():
            return f"{d}: no model.safetensors there"
        try:
            read_checkpoint(d)
        except (SpecdecError, OSError, ValueError) as e:
            return f"{d}: {str(e).splitlines()[0]}"
    return None
