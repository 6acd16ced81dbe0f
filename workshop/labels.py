"""The toy pair's distillation data: the TLM labels what the DLM learns from (its greedy
continuations of corpus prompts and its argmax on corpus windows), and the batches the
DLM trains on. Used by ``train_pair``."""
from __future__ import annotations

import math
import time

from .progress import Reporter


def topk_of(logits, k: int):
    """(top-k ids int32, their probabilities float16) of ``logits`` [..., V]."""
    import torch
    p, i = torch.softmax(logits.float(), -1).topk(k, dim=-1)
    return i.to(torch.int32), p.to(torch.float16)


def greedy_generate(model, prompts, gen_len: int, topk: int = 0):
    """Batched greedy decoding with a static cache. Returns (tokens [B, P+G], argmax [B, P+G],
    top-k ids, top-k probs or None): position t holds the model's prediction after token t."""
    import torch
    from transformers import StaticCache
    B, P = prompts.shape
    total = P + gen_len
    tops = []
    with torch.inference_mode():
        cache = StaticCache(config=model.config, max_batch_size=B, max_cache_len=total)
        out = model(input_ids=prompts, past_key_values=cache, use_cache=True,
                    cache_position=torch.arange(P))
        am = [out.logits.argmax(-1)]
        if topk:
            tops.append(topk_of(out.logits, topk))
        nxt = am[0][:, -1:]
        toks = [prompts]
        for i in range(gen_len):
            toks.append(nxt)
            out = model(input_ids=nxt, past_key_values=cache, use_cache=True,
                        cache_position=torch.tensor([P + i]))
            a = out.logits.argmax(-1)
            am.append(a)
            if topk:
                tops.append(topk_of(out.logits, topk))
            nxt = a
    ids, amax = torch.cat(toks, 1), torch.cat(am, 1)
    if not topk:
        return ids, amax, None, None
    return ids, amax, torch.cat([t[0] for t in tops], 1), torch.cat([t[1] for t in tops], 1)


def build_labels(tlm, stream, cfg: dict, seed: int, rep: Reporter) -> dict:
    """What the draft learns from, labelled by the TLM: per position its argmax and
    (``distill.topk`` > 0) its top-k probabilities."""
    import numpy as np
    import torch
    dc = cfg["distill"]
    K = dc.get("topk", 0)
    seq = cfg["dlm"]["seq"]
    rng = np.random.default_rng(seed)
    t0 = time.time()
    ids, labels, tids, tps = [], [], [], []
    n_gen_batches = math.ceil(dc["gen_prompts"] / dc["gen_batch"])
    n_tf_batches = math.ceil(dc["tf_windows"] / dc["label_batch"])
    P, G = dc["prompt_len"], dc["gen_len"]
    with rep.progress() as prog:
        task = prog.add_task("label gen", total=n_gen_batches, info="")
        for b in range(n_gen_batches):
            n = min(dc["gen_batch"], dc["gen_prompts"] - b * dc["gen_batch"])
            starts = rng.integers(0, len(stream) - P - 1, size=n)
            prompts = torch.from_numpy(np.stack([stream[s: s + P] for s in starts]))
            toks, am, ti, tp = greedy_generate(tlm, prompts, G, K)
            ids.append(toks)
            labels.append(am)
            tids.append(ti)
            tps.append(tp)
            info = f"{(b + 1) * n * G:,} generated tokens"
            prog.update(task, advance=1, info=info)
            rep.tick("label gen", b + 1, n_gen_batches, info)
        t_gen = time.time() - t0
        task2 = prog.add_task("label corpus", total=n_tf_batches, info="")
        with torch.inference_mode():
            for b in range(n_tf_batches):
                n = min(dc["label_batch"], dc["tf_windows"] - b * dc["label_batch"])
                starts = rng.integers(0, len(stream) - seq - 1, size=n)
                x = torch.from_numpy(np.stack([stream[s: s + seq] for s in starts]))
                logits = tlm(input_ids=x).logits
                ids.append(x)
                labels.append(logits.argmax(-1))
                if K:
                    ti, tp = topk_of(logits, K)
                    tids.append(ti)
                    tps.append(tp)
                prog.update(task2, advance=1, info="")
                rep.tick("label corpus", b + 1, n_tf_batches, "")
    # Sequences of the two sources may differ in length: pad to the longest with -100 labels.
    L = max(t.shape[1] for t in ids)

    def pad(t, v):
        return torch.nn.functional.pad(t, (0, L - t.shape[1]), value=v)

    def pad3(t, v):
        return torch.nn.functional.pad(t, (0, 0, 0, L - t.shape[1]), value=v)
    data = {"ids": torch.cat([pad(t, 0) for t in ids]), "labels": torch.cat([pad(t, -100) for t in labels]),
            "stats": {"generated_tokens": dc["gen_prompts"] * G,
                      "teacher_forced_tokens": dc["tf_windows"] * seq, "topk": K,
                      "gen_wall_s": round(t_gen, 1), "wall_s": round(time.time() - t0, 1)}}
    if K:
        data["top_ids"] = torch.cat([pad3(t, 0) for t in tids])
        data["top_p"] = torch.cat([pad3(t, 0) for t in tps])
    return data


def label_batches(data: dict, mcfg: dict, seed: int):
    import torch
    g = torch.Generator().manual_seed(seed)
    ids, lab = data["ids"], data["labels"]
    seq, bsz = mcfg["seq"], mcfg["batch"]
    state = {"perm": torch.randperm(len(ids), generator=g), "i": 0}

    def get(step):
        if state["i"] + bsz > len(ids):
            state["perm"] = torch.randperm(len(ids), generator=g)
            state["i"] = 0
        sel = state["perm"][state["i"]: state["i"] + bsz]
        state["i"] += bsz
        if "top_ids" in data:
            return ids[sel, :seq], (lab[sel, :seq], data["top_ids"][sel, :seq].long(),
                                    data["top_p"][sel, :seq].float())
        return ids[sel, :seq], lab[sel, :seq]
    return get
