#!/usr/bin/env python3
"""A draft for SmolLM2-135M-Instruct, distilled from SmolLM2's own greedy answers, on CPU.

    python -m workshop.distill                     # after workshop.smollm2; build/demo/{hf,export}/dlm
    python -m workshop.distill --set draft.head_rows=4096 --out build/demo-x

The draft is a layer-truncated SmolLM2 with a truncated head:

* SmolLM2's token embedding (49152 x 576, frozen: the draft reads every id
  the target can emit), the decoder layers listed in ``draft.layers`` (by
  default only layer 0) and the final norm, all copied from SmolLM2 and then
  trained;
* an LM head over the first ``draft.head_rows`` token ids only (initialised
  from those rows of the tied embedding). The full 49152-row head is the cost
  floor of a full-vocabulary draft (a 1-layer draft with it costs ~0.18 of a
  target step on ONNX Runtime; with 8192 rows ~0.06); the ids past N are
  never proposed (``draft_head.py``).

Data (``teacher``): instructions built from the standard library's
docstrings and language reference (``prompts.py``; the demo's own prompts
are held out), put through SmolLM2's chat template; SmolLM2 answers each
greedily (up to ``data.gen_len`` tokens) and its top-k distribution at every
answer position is kept. The draft learns, on the answer positions, the
target's greedy token (cross-entropy) plus its top-k distribution (soft
cross-entropy, ``train.soft_weight``), which is what sampling acceptance
needs.

Evaluation, on answers to held-out instructions: greedy agreement (the
draft's argmax equals the target's next token: exactly the per-draft
acceptance of greedy speculative decoding), tokens per TLM call replayed
from it for k = 1..8, an estimate of sampling acceptance
sum_x min(p(x), q(x)) at temperature/top-p of ``eval``, and the share of
answer tokens the truncated head can propose at all.

Deterministic (seeds, fixed data order, ``torch.set_num_threads``) and
cached by a key over the configuration, like ``train_pair.py``.
"""
from __future__ import annotations

import argparse
import copy
import json
import math
import os
import random
import sys
import time
from pathlib import Path

from . import cache, draft_head, smollm2, train_pair
from . import prompts as prompt_sets
from .cache import h
from .progress import Reporter

ROOT = Path(__file__).resolve().parents[1]

SCRIPT_VERSION = "1"

CONFIG: dict = {
    "seed": 20261123,
    # SmolLM2 decodes about 27 tokens/s at batch 64-256 on 2 shared cores (~10 GFLOP/s, compute
    # bound: 270 MFLOP a token), so the teacher's answers are the budget: 160 x 64 tokens ~ 6 min
    "data": {"train_prompts": 160, "eval_prompts": 16, "gen_len": 64, "batch": 80},
    "draft": {"layers": [0], "head_rows": 8192, "head": "frequent"},
    "train": {"epochs": 4, "batch": 16, "lr": 1e-3, "min_lr_ratio": 0.1, "warmup": 10,
              "weight_decay": 0.0, "soft_weight": 1.0},
    "eval": {"k_max": 8, "temperature": 0.7, "top_p": 0.95},
}


# --------------------------------------------------------------------------- teacher data

def instruction_split(cfg: dict) -> tuple[list[str], list[str]]:
    """(train, eval) instructions: the standard library's, shuffled with the seed."""
    xs = prompt_sets.training_instructions()
    random.Random(cfg["seed"]).shuffle(xs)
    d = cfg["data"]
    ev = xs[: d["eval_prompts"]]
    tr = xs[d["eval_prompts"]: d["eval_prompts"] + d["train_prompts"]]
    return tr, ev


def teacher_data(model, tok, instructions: list[str], cfg: dict, rep, label: str) -> list[dict]:
    """SmolLM2's greedy answers (and top-k distributions) to ``instructions``, in batches of
    similar prompt length. ``cfg["data"]["dtype"]`` ("bfloat16"): the teacher computes in that
    dtype (``teacher.LeanLlama``); float32 when absent."""
    import torch

    from . import teacher
    d = cfg["data"]
    lean = teacher.LeanLlama(model, getattr(torch, d.get("dtype", "float32")))
    eos = {int(tok.eos_token_id)}
    ps = [smollm2.chat_ids(tok, q) for q in instructions]
    order = sorted(range(len(ps)), key=lambda i: (len(ps[i]), i))
    out: list[dict | None] = [None] * len(ps)
    t0 = time.time()
    n_tok = 0
    batches = [order[s: s + d["batch"]] for s in range(0, len(order), d["batch"])]
    with rep.progress() as prog:
        task = prog.add_task(label, total=len(batches), info="")
        for bi, idx in enumerate(batches):
            rows, _, hidden, feats = teacher.greedy_batch(lean, [ps[i] for i in idx], d["gen_len"], eos=eos, topk=1,
                                                          features=True)
            for i, r, hid, f in zip(idx, rows, hidden, feats):
                # "feat": SmolLM2's last-layer features (before the final norm) at prompt + answer
                # positions, for the feature draft (feature_draft.py); captured here for free
                out[i] = {"prompt": ps[i], "gen": r, "hid": hid, "feat": f}
                n_tok += len(r)
            info = f"{n_tok:,} tokens, {n_tok / (time.time() - t0):.0f} tok/s"
            prog.update(task, advance=1, info=info)
            rep.tick(label, bi + 1, len(batches), info)
    return out  # type: ignore[return-value]


# --------------------------------------------------------------------------- the draft

def head_ids(data: list[dict], cfg: dict, vocab: int, eos: list[int]) -> list[int]:
    """The token ids the draft's head covers, ascending. ``first``: ids 0..N-1. ``frequent``: the
    N ids the target used most in its training answers (ties by id), EOS always included."""
    dc = cfg["draft"]
    N = min(dc["head_rows"], vocab)
    if dc["head"] == "first":
        return list(range(N))
    if dc["head"] != "frequent":
        raise SystemExit(f"draft.head must be 'first' or 'frequent' (got {dc['head']!r})")
    counts: dict[int, int] = {}
    for d in data:
        for t in d["gen"]:
            counts[t] = counts.get(t, 0) + 1
    ranked = sorted(counts, key=lambda t: (-counts[t], t))
    chosen = set(eos) | set(ranked[: N - len(eos)])
    rest = (t for t in range(vocab) if t not in chosen)       # fill with the lowest ids not yet in
    while len(chosen) < N:
        chosen.add(next(rest))
    return sorted(chosen)


def make_draft(teacher_model, cfg: dict, ids: list[int]):
    """(LlamaModel with the chosen layers of the teacher, head [N, H] parameter over ``ids``)."""
    import torch
    from transformers import LlamaConfig, LlamaModel
    dc = cfg["draft"]
    conf = LlamaConfig(**{**teacher_model.config.to_dict(), "num_hidden_layers": len(dc["layers"]),
                          "tie_word_embeddings": False})
    torch.manual_seed(cfg["seed"])
    body = LlamaModel._from_config(conf, attn_implementation="sdpa")
    src = teacher_model.model
    body.embed_tokens.weight.data.copy_(src.embed_tokens.weight.data)
    body.norm.weight.data.copy_(src.norm.weight.data)
    for j, i in enumerate(dc["layers"]):
        body.layers[j].load_state_dict(src.layers[i].state_dict())
    body.embed_tokens.weight.requires_grad_(False)
    head = torch.nn.Parameter(teacher_model.lm_head.weight.data[torch.tensor(ids)].clone())
    return body, head


class Examples:
    """Sequences (prompt + answer) with, per answer position, the target's token (as an index
    into the head's ids, -1 when outside) and its final hidden state."""

    def __init__(self, data: list[dict], ids: list[int], vocab: int):
        import torch
        self.ids = torch.tensor(ids)
        inv = torch.full((vocab,), -1, dtype=torch.long)
        inv[self.ids] = torch.arange(len(ids))
        self.items = []
        for d in data:
            if not d["gen"]:
                continue
            self.items.append({"seq": d["prompt"] + d["gen"], "start": len(d["prompt"]) - 1, "n": len(d["gen"]),
                               "labels": torch.tensor(d["gen"]), "sub": inv[torch.tensor(d["gen"])],
                               "hid": d["hid"]})

    def batches(self, size: int, rng: random.Random | None):
        """Lists of item indices, length-sorted within chunks; shuffled when ``rng`` is given."""
        idx = list(range(len(self.items)))
        if rng is not None:
            rng.shuffle(idx)
        chunks = [sorted(idx[s: s + size * 8], key=lambda i: len(self.items[i]["seq"]))
                  for s in range(0, len(idx), size * 8)]
        out = [c[s: s + size] for c in chunks for s in range(0, len(c), size)]
        if rng is not None:
            rng.shuffle(out)
        return out

    def collate(self, which: list[int]):
        import torch
        items = [self.items[i] for i in which]
        T = max(len(it["seq"]) for it in items)
        x = torch.zeros(len(items), T, dtype=torch.long)
        mask = torch.zeros(len(items), T, dtype=torch.long)
        rows, cols = [], []
        for r, it in enumerate(items):
            x[r, : len(it["seq"])] = torch.tensor(it["seq"])
            mask[r, : len(it["seq"])] = 1
            rows += [r] * it["n"]
            cols += list(range(it["start"], it["start"] + it["n"]))
        return {"x": x, "mask": mask, "rows": torch.tensor(rows), "cols": torch.tensor(cols),
                "labels": torch.cat([it["labels"] for it in items]), "sub": torch.cat([it["sub"] for it in items]),
                "hid": torch.cat([it["hid"] for it in items]).float()}


def draft_logits(body, head, b: dict):
    hid = body(input_ids=b["x"], attention_mask=b["mask"]).last_hidden_state
    return hid[b["rows"], b["cols"]] @ head.t()                      # [M, N]


def loss_fn(logits, sub, teacher_logits, soft_weight: float):
    """Cross-entropy on the target's greedy token (where the head has it) plus soft cross-entropy
    against the target's whole distribution over the head's ids."""
    import torch
    import torch.nn.functional as F
    logq = torch.log_softmax(logits, -1)
    ok = sub >= 0
    hard = F.nll_loss(logq[ok], sub[ok]) if bool(ok.any()) else logits.sum() * 0
    if not soft_weight:
        return hard
    p = torch.softmax(teacher_logits, -1)
    return hard + soft_weight * -(p * logq).sum(-1).mean()


def train(body, head, ex: Examples, t_head, cfg: dict, rep) -> dict:
    """``t_head``: the target's own head rows for the draft's ids (fixed), for the soft targets."""
    tc = cfg["train"]
    params = [p for p in body.parameters() if p.requires_grad] + [head]

    def batch_loss(b):
        return loss_fn(draft_logits(body, head, b), b["sub"], b["hid"] @ t_head.t(), tc["soft_weight"]), len(b["sub"])
    body.train()
    res = fit(params, ex, tc, cfg["seed"], rep, "train draft", batch_loss)
    body.eval()
    res["answer_tokens"] = res.pop("tokens")
    return res


def fit(params: list, ex, tc: dict, seed: int, rep, label: str, batch_loss) -> dict:
    """The demo's training loop (the distilled draft, the feature draft): AdamW, warmup + cosine
    (``train_pair.lr_at``), gradient clipping at 1, ``tc["epochs"]`` passes over ``ex``'s batches
    (shuffled with ``seed`` + 1). ``batch_loss(collated batch) -> (loss, tokens counted)``."""
    import torch
    rng = random.Random(seed + 1)
    total = len(ex.batches(tc["batch"], None)) * tc["epochs"]
    opt = torch.optim.AdamW(params, lr=tc["lr"], betas=(0.9, 0.95), weight_decay=tc["weight_decay"])
    mc = {"lr": tc["lr"], "min_lr_ratio": tc["min_lr_ratio"], "warmup": tc["warmup"], "steps": total}
    t0, step, ema, tokens = time.time(), 0, None, 0
    with rep.progress() as prog:
        task = prog.add_task(label, total=total, info="")
        for _ in range(tc["epochs"]):
            for which in ex.batches(tc["batch"], rng):
                for g in opt.param_groups:
                    g["lr"] = train_pair.lr_at(step, mc)
                loss, n = batch_loss(ex.collate(which))
                opt.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(params, 1.0)
                opt.step()
                step += 1
                tokens += n
                ema = loss.item() if ema is None else 0.95 * ema + 0.05 * loss.item()
                info = f"loss {ema:.3f}  {tokens / (time.time() - t0):,.0f} tok/s"
                prog.update(task, advance=1, info=info)
                rep.tick(label, step, total, info)
    return {"steps": step, "tokens": tokens, "final_loss_ema": round(ema or 0.0, 4),
            "wall_s": round(time.time() - t0, 1)}


# --------------------------------------------------------------------------- evaluation

tokens_per_call = train_pair.tokens_per_call


def _tempered_top_p(logits, temperature: float, top_p: float):
    """logits [M, V] -> the sampling distribution after temperature and top-p (as the runtime)."""
    import torch
    p = torch.softmax(logits.double() / temperature, -1)
    sp, order = p.sort(-1, descending=True)
    sp = sp * ((sp.cumsum(-1) - sp) < top_p)
    out = torch.zeros_like(p).scatter(-1, order, sp)
    return out / out.sum(-1, keepdim=True)


def evaluate(body, head, ex: Examples, full_head, cfg: dict) -> dict:
    """Greedy agreement (replayed per k), head coverage and the expected sampling acceptance
    sum_x min(p(x), q(x)) with p the target's full distribution (from its hidden state) and q the
    draft's, both through temperature and top-p."""
    import torch
    ec = cfg["eval"]
    matches: list[list[bool]] = []
    acc_s, n_pos, covered = 0.0, 0, 0
    with torch.inference_mode():
        for which in ex.batches(16, None):
            b = ex.collate(which)
            lg = draft_logits(body, head, b)
            m = (ex.ids[lg.argmax(-1)] == b["labels"]).tolist()
            o = 0
            for i in which:
                n = ex.items[i]["n"]
                matches.append(m[o: o + n])
                o += n
            covered += int((b["sub"] >= 0).sum())
            p = _tempered_top_p(b["hid"] @ full_head.t(), ec["temperature"], ec["top_p"])[:, ex.ids]
            q = _tempered_top_p(lg, ec["temperature"], ec["top_p"])
            acc_s += float(torch.minimum(p, q).sum())
            n_pos += len(b["labels"])
    flat = [v for r in matches for v in r]
    return {"eval_answers": len(matches), "eval_tokens": n_pos,
            "greedy_agreement": round(sum(flat) / max(1, len(flat)), 4),
            "head_coverage": round(covered / max(1, n_pos), 4),
            "sampling_acceptance_est": round(acc_s / max(1, n_pos), 4),
            "tokens_per_tlm_call": {str(k): round(tokens_per_call(matches, k), 3)
                                    for k in range(1, ec["k_max"] + 1)}}


# --------------------------------------------------------------------------- export

def save_hf(body, head, ids: list[int], teacher_model, tok, out: Path, cfg: dict) -> None:
    """A plain LlamaForCausalLM (full-vocabulary head, zero outside ``ids``; cut at export)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    conf = LlamaConfig(**{**teacher_model.config.to_dict(), "num_hidden_layers": len(cfg["draft"]["layers"]),
                          "tie_word_embeddings": False})
    m = LlamaForCausalLM(conf)
    m.model.load_state_dict(body.state_dict())
    with torch.no_grad():
        m.lm_head.weight.zero_()
        m.lm_head.weight[torch.tensor(ids)] = head.detach()
    m.config._attn_implementation = "eager"
    m.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    (out / "draft.json").write_text(json.dumps({"head_ids": ids, "layers": cfg["draft"]["layers"]}))


def load_draft(path: Path):
    """(body, head, ids) of a saved draft."""
    import torch
    from safetensors.torch import load_file
    from transformers import AutoConfig, LlamaModel
    info = json.loads((path / "draft.json").read_text())
    sd = load_file(str(path / "model.safetensors"))
    body = LlamaModel._from_config(AutoConfig.from_pretrained(str(path)), attn_implementation="sdpa")
    body.load_state_dict({k[len("model."):]: v for k, v in sd.items() if k.startswith("model.")})
    ids = info["head_ids"]
    head = torch.nn.Parameter(sd["lm_head.weight"][torch.tensor(ids)].clone())
    body.eval()
    return body, head, ids


# --------------------------------------------------------------------------- main

def _teacher_stage(tmodel, tok, ins: tuple[list[str], list[str]], cfg: dict, out: Path, key: str, force: bool,
                   rep: Reporter, times: dict) -> dict:
    """SmolLM2's answers to the training and evaluation instructions, cached in ``OUT/cache``."""
    train_ins, eval_ins = ins
    t0 = time.time()

    def answer() -> dict:
        rep.line(f"[teacher] SmolLM2 answers {len(train_ins)} + {len(eval_ins)} instructions greedily "
                 f"(up to {cfg['data']['gen_len']} tokens, batch {cfg['data']['batch']})")
        return {"train": teacher_data(tmodel, tok, train_ins, cfg, rep, "teacher"),
                "eval": teacher_data(tmodel, tok, eval_ins, cfg, rep, "teacher eval")}
    data = cache.torch_cached(out / "cache" / f"teacher-{key}.pt", answer, force=force)
    times["teacher_s"] = round(time.time() - t0, 1)
    return data


def _draft_stage(tmodel, tok, data: dict, cfg: dict, dlm_dir: Path, key: str, force: bool, rep: Reporter) -> dict:
    """Train (or reuse, by key) the draft in ``dlm_dir``; returns its training stats."""
    import torch
    V = tmodel.config.vocab_size
    full_head = tmodel.lm_head.weight.data
    if force or not cache.stamp_ok(dlm_dir, key):
        ids = head_ids(data["train"], cfg, V, [int(tok.eos_token_id)])
        body, head = make_draft(tmodel, cfg, ids)
        n_par = sum(p.numel() for p in body.parameters()) + head.numel()
        rep.line(f"[draft] SmolLM2 layers {cfg['draft']['layers']} + final norm + a head over {len(ids)} ids "
                 f"({cfg['draft']['head']}; {n_par / 1e6:.1f}M parameters, "
                 f"{body.embed_tokens.weight.numel() / 1e6:.1f}M of them the frozen embedding)")
        pre = evaluate(body, head, Examples(data["eval"], ids, V), full_head, cfg)
        stats = train(body, head, Examples(data["train"], ids, V), full_head[torch.tensor(ids)], cfg, rep)
        stats["before_training"] = pre
        tmp = cache.fresh_tmp(dlm_dir)
        save_hf(body, head, ids, tmodel, tok, tmp, cfg)
        cache.publish(tmp, dlm_dir, key, {"train": stats})
    else:
        stats = json.loads((dlm_dir / cache.STAMP).read_text())["train"]
    return stats


def _export_stage(dlm_dir: Path, exp_full: Path, exp_dir: Path, ids: list[int], key: str, force: bool,
                  rep: Reporter) -> None:
    """The draft exported, then its head cut to the ``ids`` rows (``draft_head``)."""
    if force or not cache.stamp_ok(exp_dir, key):
        tmp_full, dt = cache.export_onnx(dlm_dir, exp_full)
        cache.publish(tmp_full, exp_full, key)
        tmp = cache.fresh_tmp(exp_dir)
        info = draft_head.truncate_head(exp_full / "model.onnx", tmp / "model.onnx", ids, pad=True)
        for f in ("config.json", "generation_config.json"):
            if (exp_full / f).exists():
                (tmp / f).write_bytes((exp_full / f).read_bytes())
        cache.publish(tmp, exp_dir, key, {"head": info})
        rep.line(f"[export] {exp_dir / 'model.onnx'}: head cut to {len(ids)} rows ({dt:.1f} s)")
    else:
        rep.line(f"[export] reusing {exp_dir / 'model.onnx'}")


def run(cfg: dict, out: Path, target: dict, *, threads: int = 2, force: bool = False, quiet: bool = False,
        do_export: bool = True) -> dict:
    """Teacher data, draft training, evaluation, export; each stage cached by key."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import torch
    from transformers import AutoTokenizer, LlamaForCausalLM
    from transformers.utils import logging as hf_logging
    hf_logging.set_verbosity_error()
    torch.set_num_threads(threads)
    rep = Reporter(quiet)
    times: dict = {}
    train_ins, eval_ins = instruction_split(cfg)
    k_data = h("teacher", target["keys"]["hf"], cfg["data"], cfg["seed"], train_ins, eval_ins, SCRIPT_VERSION)
    k_dlm = h("draft", k_data, cfg["draft"], cfg["train"], cfg["seed"], torch.__version__, threads)
    k_exp = h("draft-export", k_dlm, train_pair.versions())
    dlm_dir, exp_full, exp_dir = out / "hf" / "dlm", out / "export" / "dlm-full", out / "export" / "dlm"
    res_path = out / "draft.json"
    k_all = h("draft-all", k_dlm, k_exp if do_export else None, cfg["eval"])
    prev = None if force else cache.reuse_result(
        res_path, k_all, [(dlm_dir, k_dlm)] + ([(exp_dir, k_exp)] if do_export else []),
        lambda m: rep.line(f"[draft] {m}"))
    if prev is not None:
        return prev

    tok = AutoTokenizer.from_pretrained(target["paths"]["tokenizer"])
    tmodel = LlamaForCausalLM.from_pretrained(target["paths"]["hf"], dtype=torch.float32).eval()
    data = _teacher_stage(tmodel, tok, (train_ins, eval_ins), cfg, out, k_data, force, rep, times)
    n_train = sum(len(d["gen"]) for d in data["train"])
    rep.line(f"[teacher] {n_train:,} answer tokens for training, "
             f"{sum(len(d['gen']) for d in data['eval']):,} for evaluation ({times['teacher_s']} s)")

    t0 = time.time()
    stats = _draft_stage(tmodel, tok, data, cfg, dlm_dir, k_dlm, force, rep)
    body, head, ids = load_draft(dlm_dir)
    times["train_s"] = round(time.time() - t0, 1)
    t0 = time.time()
    V, full_head = tmodel.config.vocab_size, tmodel.lm_head.weight.data
    metrics = evaluate(body, head, Examples(data["eval"], ids, V), full_head, cfg)
    times["eval_s"] = round(time.time() - t0, 1)
    rep.line(f"[draft] trained: {json.dumps({k: v for k, v in stats.items() if k != 'before_training'})}; "
             f"held-out: {json.dumps(metrics)} (before training: greedy agreement "
             f"{stats['before_training']['greedy_agreement']})")

    t0 = time.time()
    if do_export:
        _export_stage(dlm_dir, exp_full, exp_dir, ids, k_exp, force, rep)
    times["export_s"] = round(time.time() - t0, 1)
    n_par = sum(p.numel() for p in body.parameters()) + head.numel()
    result = {"key": k_all, "keys": {"teacher": k_data, "draft": k_dlm, "export": k_exp}, "config": cfg,
              "kind": "distilled", "params": n_par, "head_rows": len(ids), "head": cfg["draft"]["head"],
              "layers": cfg["draft"]["layers"],
              "train_answer_tokens": n_train, "train": stats, "metrics": metrics, "times": times,
              "paths": {"hf": str(dlm_dir), **({"onnx": str(exp_dir / "model.onnx")} if do_export else {})},
              "reused": False}
    res_path.write_text(json.dumps(result, indent=1))
    return result


def stage_args(argv: list[str] | None, doc: str, config: dict):
    """The command line of a workshop stage run alone (``workshop.distill``, ``workshop.feature_draft``):
    (arguments, the configuration with ``--set KEY=JSON`` applied)."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / "build" / "demo")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=JSON")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--force", action="store_true")
    ap.add_argument("--no-export", action="store_true")
    a = ap.parse_args(argv)
    return a, train_pair.apply_sets(copy.deepcopy(config), a.set)


def main(argv: list[str] | None = None) -> int:
    a, cfg = stage_args(argv, __doc__, CONFIG)
    target = smollm2.prepare(a.out, threads=a.threads)
    res = run(cfg, a.out, target, threads=a.threads, force=a.force, do_export=not a.no_export)
    print(json.dumps({k: res[k] for k in ("params", "head_rows", "layers", "metrics", "times")}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
