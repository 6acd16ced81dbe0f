"""The demo's EAGLE-3 head: a ``speculators`` checkpoint directory (config.json, model.safetensors,
and the trainer's recipe.json), by default the committed ``workshop/heads/smollm2-eagle3``.

Before anything is compiled, ``check`` holds the head to the demo's target: recipe.json must name
the sha256 of the converted checkpoint the demo decodes with (``build/demo/hf/tlm/model.safetensors``,
``workshop.smollm2``'s conversion) as its ``target_sha256``, and the sha256 of the files beside it
(``files_sha256``); otherwise the head is refused in one line (``HeadRefused``; the demo exits 2).
A missing default head skips the eagle3 rows in one line that says how to make one
(``make eagle3-head``); a missing ``--eagle3-head DIR`` is refused.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

from workshop.eagle3_train import HEAD_DIR
from workshop.smollm2 import sha256

MAKE_TARGET = "make eagle3-head"
FILES = ("config.json", "model.safetensors")
_SHA = re.compile(r"[0-9a-f]{64}")


class HeadRefused(Exception):
    """The head does not belong to the demo's target (or is not a head): one line, exit 2."""


def resolve(head: Path | None, *, disabled: bool, log=print) -> Path | None:
    """The head directory to use: ``head`` (None: the committed default), or None when the rows are
    skipped (``disabled``, or the default head is missing: said in one line)."""
    if disabled:
        log("[eagle3] --no-eagle3: the eagle3 rows are skipped")
        return None
    if head is None:
        if not HEAD_DIR.is_dir():
            log(f"[eagle3] no EAGLE-3 head at {_rel(HEAD_DIR)}: the eagle3 rows are skipped (`{MAKE_TARGET}` "
                f"trains one into build/eagle3-head; then `make demo EAGLE3_HEAD=build/eagle3-head`)")
            return None
        return HEAD_DIR
    if not head.is_dir():
        raise HeadRefused(f"--eagle3-head {head}: no such directory (`{MAKE_TARGET}` trains one into "
                          f"build/eagle3-head)")
    return head


def check(head: Path, checkpoint: Path) -> dict:
    """``head``'s recipe against the target ``checkpoint`` (its model.safetensors): the recipe's
    summary, or HeadRefused (one line) when a file is missing, the recipe does not describe these
    files, or it names another target's sha256."""
    for f in FILES + ("recipe.json",):
        if not (head / f).is_file():
            raise HeadRefused(f"EAGLE-3 head {head}: {f} is missing (a head for the demo is a speculators "
                              f"checkpoint with the trainer's recipe.json; `{MAKE_TARGET}` makes one)")
    try:
        recipe = json.loads((head / "recipe.json").read_text())
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise HeadRefused(f"EAGLE-3 head {head}: recipe.json does not parse ({' '.join(str(e).split())})") from None
    want = recipe.get("target_sha256") if isinstance(recipe, dict) else None
    files = recipe.get("files_sha256") if isinstance(recipe, dict) else None
    if not (isinstance(want, str) and _SHA.fullmatch(want)) or not isinstance(files, dict):
        raise HeadRefused(f"EAGLE-3 head {head}: recipe.json names no target_sha256 and files_sha256 "
                          f"(written by workshop/eagle3_train.py)")
    for f in FILES:
        got = sha256(head / f)
        if files.get(f) != got:
            raise HeadRefused(f"EAGLE-3 head {head}: {f} has sha256 {got}, but recipe.json says {files.get(f)}")
    if not checkpoint.is_file():
        raise HeadRefused(f"EAGLE-3 head {head}: the target checkpoint {checkpoint} is missing")
    have = sha256(checkpoint)
    if have != want:
        raise HeadRefused(f"EAGLE-3 head {head} was trained for target sha256 {want}, but the demo's target "
                          f"{checkpoint} has sha256 {have}: refused (`{MAKE_TARGET}` trains one for this target)")
    run = recipe.get("run") or {}
    return {"dir": str(head), "target_sha256": want, "dataset_sha256": recipe.get("dataset_sha256"),
            "seed": recipe.get("seed"), "answer_tokens": recipe.get("answer_tokens"), "device": recipe.get("device"),
            "seconds_total": recipe.get("seconds_total"), "aux_ids": run.get("aux_ids"),
            "ttt_steps": run.get("ttt_steps"), "eval": run.get("eval")}


def describe(info: dict) -> str:
    """One log line: the head, its data and its held-out numbers."""
    ev = info.get("eval") or {}
    tpc = ev.get("tokens_per_call_greedy") or {}
    top = ", ".join(f"k={k} {v}" for k, v in tpc.items() if v is not None)
    return (f"[eagle3] EAGLE-3 head {_rel(Path(info['dir']))} (speculators format, aux layers {info.get('aux_ids')}, "
            f"sha256 {info['sha256'][:12]}...), trained for this target ({info['target_sha256'][:12]}...) on "
            f"{info.get('answer_tokens') or 0:,} answer tokens (dataset {str(info.get('dataset_sha256'))[:12]}...), "
            f"{info.get('device')}; imported with --hidden-states {info['hidden_states']}"
            f"{'' if info.get('weights', 'float') == 'float' else ', weights ' + info['weights']}"
            + (f"; held-out greedy tokens per target call {top}" if top else ""))


def _rel(p: Path) -> str:
    try:
        return str(p.resolve().relative_to(HEAD_DIR.parents[2]))
    except ValueError:
        return str(p)
