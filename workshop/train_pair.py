#!/usr/bin/env python3
"""Train the demo draft/target pair from scratch, on CPU, deterministically.

    python -m workshop.train_pair                 # train (or reuse) build/demo/{tokenizer,hf,export}
    python -m workshop.train_pair --micro --out build/demo-micro --no-export   # seconds, for tests
    python -m workshop.train_pair --set tlm.steps=300 --force

What it builds (every stage cached under a key that hashes the configuration
of that stage and of every stage before it, the corpus and the library
versions; a second run with the same configuration reuses everything):

1. corpus      the Python standard library's own top-level ``*.py`` source,
               sorted; a fixed list of modules is held out (prompts, evaluation).
2. tokenizer   byte-level BPE (``tokenizers``), vocab 4096, ``<|endoftext|>``
               as EOS/BOS, saved as a ``PreTrainedTokenizerFast`` directory.
3. TLM         LlamaForCausalLM, 8 layers x 128 hidden, 2 heads of 64 (2.75M
               parameters), next-token cross-entropy on ~1.2M corpus tokens.
               Deep and narrow on purpose: on ONNX Runtime CPU at batch 1 a
               call's cost is mostly per-operator overhead, so depth sets the
               DLM/TLM cost ratio c; and 2 cores train only ~4K tokens/s of this
               model (a 9M model of width 256 trains at ~1.5K tokens/s and, in
               the same 5 minutes, ends at a worse loss).
4. labels      the TLM labels the data the draft learns from: its own greedy
               continuations of corpus prompts (the contexts the draft sees
               while drafting) and its argmax on corpus windows (teacher forced).
5. DLM         LlamaForCausalLM, 1 layer x 128 hidden (1.26M parameters, most
               of them embedding and LM head), distilled: cross-entropy against
               the TLM's argmax (``distill.topk`` > 0 trains on the TLM's top-k
               probabilities instead: better calibrated, lower greedy agreement).
6. evaluation  held-out loss of both, DLM/TLM argmax agreement on held-out text
               and on the TLM's greedy continuations of held-out prompts, and
               the tokens per TLM call greedy speculative decoding would reach.
7. export      ``optimum-cli export onnx --task text-generation-with-past`` of both.

Outputs: ``OUT/tokenizer``, ``OUT/hf/{tlm,dlm}``, ``OUT/export/{tlm,dlm}/model.onnx``
and ``OUT/pair.json`` (keys, metrics, wall times). Float32 throughout; seeds
fixed; ``torch.set_num_threads(2)`` unless ``--threads`` says otherwise.
"""
from __future__ import annotations

import argparse
import copy
import json
import math
import os
import sys
import sysconfig
import time
from pathlib import Path

from .cache import STAMP, export_onnx, fingerprint, fresh_tmp, h, publish, stamp_ok, torch_cached
from .labels import build_labels, greedy_generate, label_batches
from .progress import Reporter

ROOT = Path(__file__).resolve().parents[1]
SCRIPT_VERSION = "1"

# The default configuration. Everything that changes a result is in here and
# therefore in the cache keys.
CONFIG: dict = {
    "seed": 20261122,
    "corpus": {
        "glob": "*.py",
        "max_files": None,          # None: every top-level module of the stdlib
        "held_out": ["textwrap.py", "shlex.py", "fnmatch.py", "colorsys.py",
                     "heapq.py", "bisect.py", "glob.py", "sched.py",
                     "graphlib.py", "queue.py"],
    },
    "tokenizer": {"vocab_size": 4096, "min_frequency": 2,
                  "special_tokens": ["<|endoftext|>", "<|pad|>"]},
    "tlm": {"hidden": 128, "intermediate": 384, "layers": 8, "heads": 2, "kv_heads": 2,
            "max_positions": 4096, "seq": 256, "batch": 4, "steps": 1200,
            "lr": 2e-3, "min_lr_ratio": 0.1, "warmup": 40, "weight_decay": 0.1},
    "distill": {"gen_prompts": 384, "prompt_len": 32, "gen_len": 224, "gen_batch": 128,
                "tf_windows": 1024, "label_batch": 32, "topk": 0},
    "dlm": {"hidden": 128, "intermediate": 384, "layers": 1, "heads": 2, "kv_heads": 2,
            "max_positions": 4096, "seq": 256, "batch": 8, "steps": 800,
            "lr": 4e-3, "min_lr_ratio": 0.1, "warmup": 30, "weight_decay": 0.1},
    "eval": {"windows": 24, "prompts": 12, "prompt_len": 64, "gen_len": 128, "k_max": 8},
}

# A configuration small enough for a smoke test (seconds).
MICRO: dict = {
    "corpus": {"max_files": 12},
    "tokenizer": {"vocab_size": 384},
    "tlm": {"hidden": 64, "intermediate": 128, "layers": 2, "heads": 2, "kv_heads": 2,
            "seq": 64, "batch": 4, "steps": 12, "warmup": 2},
    "distill": {"gen_prompts": 8, "prompt_len": 8, "gen_len": 24, "gen_batch": 8,
                "tf_windows": 8, "label_batch": 8},
    "dlm": {"hidden": 32, "intermediate": 64, "layers": 1, "heads": 2, "kv_heads": 2,
            "seq": 64, "batch": 4, "steps": 12, "warmup": 2},
    "eval": {"windows": 2, "prompts": 2, "prompt_len": 8, "gen_len": 16, "k_max": 4},
}


# --------------------------------------------------------------------------- config

def deep_update(base: dict, upd: dict) -> dict:
    out = copy.deepcopy(base)
    for k, v in upd.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = deep_update(out[k], v)
        else:
            out[k] = v
    return out


def apply_sets(cfg: dict, sets: list[str]) -> dict:
    cfg = copy.deepcopy(cfg)
    for s in sets:
        key, _, val = s.partition("=")
        parts = key.split(".")
        node = cfg
        for p in parts[:-1]:
            node = node[p]
        if parts[-1] not in node:
            raise SystemExit(f"--set: unknown key {key}")
        node[parts[-1]] = json.loads(val) if val not in ("", None) else None
    return cfg


def versions() -> dict:
    import tokenizers
    import torch
    import transformers
    from importlib.metadata import PackageNotFoundError, version
    try:
        opt = version("optimum-onnx")
    except PackageNotFoundError:  # pragma: no cover
        opt = None
    return {"python": sys.version.split()[0], "torch": torch.__version__,
            "transformers": transformers.__version__, "tokenizers": tokenizers.__version__,
            "optimum-onnx": opt, "script": SCRIPT_VERSION}


# --------------------------------------------------------------------------- corpus

def corpus_files(cfg: dict) -> tuple[list[Path], list[Path]]:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in stdlib.glob(cfg["glob"]) if p.is_file())
    held = [stdlib / n for n in cfg["held_out"] if (stdlib / n).is_file()]
    held_names = {p.name for p in held}
    train = [p for p in files if p.name not in held_names]
    if cfg.get("max_files"):
        train = train[: cfg["max_files"]]
    return train, held


def read(p: Path) -> str:
    return p.read_text(encoding="utf-8", errors="replace")


# --------------------------------------------------------------------------- stages

def train_tokenizer(cfg: dict, train_files: list[Path], out: Path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tcfg = cfg["tokenizer"]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=tcfg["vocab_size"], min_frequency=tcfg["min_frequency"],
                                  special_tokens=tcfg["special_tokens"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator((read(p) for p in train_files), trainer=trainer)
    eos, pad = tcfg["special_tokens"][0], tcfg["special_tokens"][1]
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=eos, bos_token=eos,
                                   unk_token=eos, pad_token=pad, model_max_length=4096,
                                   clean_up_tokenization_spaces=False)
    fast.save_pretrained(out)
    return fast


def encode_files(tok, files: list[Path]):
    import numpy as np
    eos = tok.eos_token_id
    ids: list[int] = []
    for p in files:
        ids.extend(tok(read(p), add_special_tokens=False)["input_ids"])
        ids.append(eos)
    return np.asarray(ids, dtype=np.int64)


def llama(mcfg: dict, tok, seed: int):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    conf = LlamaConfig(vocab_size=len(tok), hidden_size=mcfg["hidden"],
                       intermediate_size=mcfg["intermediate"], num_hidden_layers=mcfg["layers"],
                       num_attention_heads=mcfg["heads"], num_key_value_heads=mcfg["kv_heads"],
                       max_position_embeddings=mcfg["max_positions"], rms_norm_eps=1e-5,
                       tie_word_embeddings=False, bos_token_id=tok.eos_token_id,
                       eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                       rope_theta=10000.0, initializer_range=0.02)
    torch.manual_seed(seed)
    # Trained with SDPA (faster on CPU); saved and exported with eager attention.
    return LlamaForCausalLM._from_config(conf, attn_implementation="sdpa")


def n_params(model) -> int:
    return sum(p.numel() for p in model.parameters())


def make_optimizer(model, mcfg: dict):
    import torch
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": mcfg["weight_decay"]},
                              {"params": no_decay, "weight_decay": 0.0}],
                             lr=mcfg["lr"], betas=(0.9, 0.95), eps=1e-8)


def lr_at(step: int, mcfg: dict) -> float:
    if step < mcfg["warmup"]:
        return mcfg["lr"] * (step + 1) / mcfg["warmup"]
    t = (step - mcfg["warmup"]) / max(1, mcfg["steps"] - mcfg["warmup"])
    lo = mcfg["lr"] * mcfg["min_lr_ratio"]
    return lo + (mcfg["lr"] - lo) * 0.5 * (1 + math.cos(math.pi * min(1.0, t)))


def train_loop(model, mcfg: dict, batches, rep: Reporter, name: str) -> dict:
    """``batches(step) -> (input_ids, labels)``; labels aligned with positions (no shift)."""
    import torch
    import torch.nn.functional as F
    model.train()
    opt = make_optimizer(model, mcfg)
    ema = None
    t0 = time.time()
    tokens = 0
    with rep.progress() as prog:
        task = prog.add_task(f"train {name}", total=mcfg["steps"], info="")
        for step in range(mcfg["steps"]):
            for g in opt.param_groups:
                g["lr"] = lr_at(step, mcfg)
            x, y = batches(step)
            logits = model(input_ids=x).logits
            if isinstance(y, tuple):
                # distillation on the teacher's top-k distribution (renormalized over its top k)
                y, top_ids, top_p = y
                logp = torch.log_softmax(logits, -1).gather(-1, top_ids)
                per_tok = -(top_p * logp).sum(-1) / top_p.sum(-1).clamp_min(1e-6)
                valid = y != -100
                loss = per_tok[valid].mean()
            else:
                loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1), ignore_index=-100)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            tokens += int((y != -100).sum())
            ema = loss.item() if ema is None else 0.95 * ema + 0.05 * loss.item()
            info = f"loss {ema:.3f}  {tokens / (time.time() - t0):,.0f} tok/s"
            prog.update(task, advance=1, info=info)
            rep.tick(name, step + 1, mcfg["steps"], info)
    model.eval()
    return {"final_loss_ema": round(ema, 4), "tokens": tokens, "wall_s": round(time.time() - t0, 1)}


def corpus_batches(stream, mcfg: dict, seed: int):
    import numpy as np
    import torch
    rng = np.random.default_rng(seed)
    seq, bsz = mcfg["seq"], mcfg["batch"]

    def get(step):
        starts = rng.integers(0, len(stream) - seq - 1, size=bsz)
        w = np.stack([stream[s: s + seq + 1] for s in starts])
        return torch.from_numpy(w[:, :-1].copy()), torch.from_numpy(w[:, 1:].copy())
    return get


def save_hf(model, tok, out: Path) -> None:
    model.config._attn_implementation = "eager"
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)


def load_hf(path: Path, attn: str = "sdpa"):
    from transformers import LlamaForCausalLM
    m = LlamaForCausalLM.from_pretrained(path, attn_implementation=attn, torch_dtype="float32")
    m.eval()
    return m


def tokens_per_call(match_rows: list[list[bool]], k: int) -> float:
    """Greedy speculative decoding replayed on per-position agreement: tokens per TLM call."""
    calls = produced = 0
    for row in match_rows:
        i = 0
        while i < len(row):
            a = 0
            while a < k and i + a < len(row) and row[i + a]:
                a += 1
            produced += a + 1
            calls += 1
            i += a + 1
    return produced / calls if calls else 0.0


def evaluate(tlm, dlm, tok, held_stream, cfg: dict) -> dict:
    import numpy as np
    import torch
    import torch.nn.functional as F
    ec = cfg["eval"]
    seq = cfg["tlm"]["seq"]
    n_win = min(ec["windows"], (len(held_stream) - 1) // seq)
    res: dict = {}
    with torch.inference_mode():
        tl, dl, agree, tacc, dacc, n = 0.0, 0.0, 0, 0, 0, 0
        for i in range(n_win):
            w = torch.from_numpy(held_stream[i * seq: i * seq + seq + 1][None])
            x, y = w[:, :-1], w[:, 1:]
            lt, ld = tlm(input_ids=x).logits, dlm(input_ids=x).logits
            tl += F.cross_entropy(lt[0], y[0], reduction="sum").item()
            dl += F.cross_entropy(ld[0], y[0], reduction="sum").item()
            at, ad = lt.argmax(-1), ld.argmax(-1)
            agree += int((at == ad).sum()); tacc += int((at == y).sum()); dacc += int((ad == y).sum())
            n += y.numel()
        res["held_out_tokens"] = n
        res["tlm_loss"] = round(tl / n, 4)
        res["dlm_loss"] = round(dl / n, 4)
        res["tlm_top1"] = round(tacc / n, 4)
        res["dlm_top1"] = round(dacc / n, 4)
        res["agreement_held_out_text"] = round(agree / n, 4)

        # The TLM's greedy continuations of held-out prompts: the contexts the draft
        # sees during greedy speculative decoding.
        P, G = ec["prompt_len"], ec["gen_len"]
        stride = max(1, (len(held_stream) - P - 1) // max(1, ec["prompts"]))
        starts = [i * stride for i in range(ec["prompts"])]
        prompts = torch.from_numpy(np.stack([held_stream[s: s + P] for s in starts]))
        toks, _, _, _ = greedy_generate(tlm, prompts, G)
        dl_am = dlm(input_ids=toks).logits.argmax(-1)
        # the draft's prediction after position t vs the TLM's token at t+1
        match = (dl_am[:, P - 1: P + G - 1] == toks[:, P: P + G]).numpy()
        res["agreement_tlm_continuations"] = round(float(match.mean()), 4)
        # Greedy speculative decoding replayed on these continuations: per k, tokens per TLM call.
        per_k = {}
        for k in range(1, ec["k_max"] + 1):
            per_k[str(k)] = round(tokens_per_call(match, k), 3)
        res["tokens_per_tlm_call"] = per_k
        res["sample"] = tok.decode(toks[min(1, len(toks) - 1)].tolist())
    return res


# --------------------------------------------------------------------------- main

def train_stage(role, label, key, force, seed, rep, tok, out, cfg, batches):
    """Train (or reuse, by cache key) one model of the pair; returns (model, seconds, train stats)."""
    t0 = time.time()
    mc = cfg[role]
    model_dir = out / "hf" / role
    if force or not stamp_ok(model_dir, key):
        model = llama(mc, tok, seed)
        rep.line(f"[{role}] {n_params(model) / 1e6:.2f}M parameters, {mc['layers']} "
                 f"layer{'s' if mc['layers'] > 1 else ''} x {mc['hidden']}; "
                 f"{mc['steps']} steps x {mc['batch']} x {mc['seq']}")
        stats = train_loop(model, mc, batches(model), rep, label)
        tmp = fresh_tmp(model_dir)
        save_hf(model, tok, tmp)
        publish(tmp, model_dir, key, {"train": stats})
        trained = True
    else:
        trained = False
        stats = json.loads((model_dir / STAMP).read_text()).get("train")
    model = load_hf(model_dir)
    seconds = round(time.time() - t0, 1)
    rep.line(f"[{role}] {'trained' if trained else 'reused'}: {stats} ({seconds} s)")
    return model, seconds, stats


def _keys(cfg: dict, train_files: list[Path], held_files: list[Path], vers: dict) -> dict:
    """Each stage's cache key: its configuration and the keys of every stage before it."""
    seed = cfg["seed"]
    corpus_key = h(fingerprint(train_files), fingerprint(held_files))
    k_tok = h("tok", cfg["corpus"], cfg["tokenizer"], corpus_key, vers)
    k_tlm = h("tlm", k_tok, cfg["tlm"], seed)
    k_lab = h("lab", k_tlm, cfg["distill"], cfg["dlm"]["seq"], seed)
    k_dlm = h("dlm", k_lab, cfg["dlm"], seed)
    k_exp = h("exp", k_tlm, k_dlm)
    k_eval = h("eval", k_tlm, k_dlm, cfg["eval"])
    return {"tokenizer": k_tok, "tlm": k_tlm, "labels": k_lab, "dlm": k_dlm, "export": k_exp, "eval": k_eval}


def _reusable(out: Path, keys: dict, do_export: bool) -> dict | None:
    """The previous ``pair.json`` when every stage it names is still there under the same key."""
    pair_path = out / "pair.json"
    if not pair_path.exists():
        return None
    try:
        prev = json.loads(pair_path.read_text())
    except ValueError:
        prev = {}
    if prev.get("key") == keys["eval"] and all(stamp_ok(out / p, k) for p, k in [
            ("tokenizer", keys["tokenizer"]), ("hf/tlm", keys["tlm"]), ("hf/dlm", keys["dlm"])]) and (
            not do_export or all(stamp_ok(out / "export" / r, keys["export"]) for r in ("tlm", "dlm"))):
        return prev
    return None


def _tokenizer_stage(cfg: dict, out: Path, key: str, force: bool, files: tuple[list[Path], list[Path]],
                     rep: Reporter, times: dict):
    """Train (or reuse) the tokenizer; returns it and the encoded training and held-out streams."""
    from transformers import PreTrainedTokenizerFast
    train_files, held_files = files
    t0 = time.time()
    tok_dir = out / "tokenizer"
    if force or not stamp_ok(tok_dir, key):
        tmp = fresh_tmp(tok_dir)
        train_tokenizer(cfg, train_files, tmp)
        publish(tmp, tok_dir, key)
    tok = PreTrainedTokenizerFast.from_pretrained(tok_dir)
    train_stream = encode_files(tok, train_files)
    held_stream = encode_files(tok, held_files)
    times["tokenizer_s"] = round(time.time() - t0, 1)
    rep.line(f"[tokenizer] vocab {len(tok)}, {len(train_stream):,} training tokens, "
             f"{len(held_stream):,} held-out tokens ({times['tokenizer_s']} s)")
    return tok, train_stream, held_stream


def _labels_stage(tlm, train_stream, cfg: dict, seed: int, out: Path, key: str, force: bool, rep: Reporter,
                  times: dict) -> dict:
    """The TLM's labels for the DLM (``labels.build_labels``), cached in ``OUT/cache``."""
    t0 = time.time()
    data = torch_cached(out / "cache" / f"labels-{key}.pt",
                        lambda: build_labels(tlm, train_stream, cfg, seed, rep), force=force)
    times["labels_s"] = round(time.time() - t0, 1)
    rep.line(f"[labels] {data['stats']} ({times['labels_s']} s)")
    return data


def _export_stage(out: Path, key: str, force: bool, rep: Reporter) -> None:
    for role in ("tlm", "dlm"):
        src = out / "hf" / role
        final = out / "export" / role
        if force or not stamp_ok(final, key):
            tmp, dt = export_onnx(src, final)
            publish(tmp, final, key)
            rep.line(f"[export] {role}: {final / 'model.onnx'} ({dt:.1f} s)")
        else:
            rep.line(f"[export] {role}: reused {final / 'model.onnx'}")


def run(cfg: dict, out: Path, *, do_export: bool = True, threads: int = 2, force: bool = False,
        quiet: bool = False) -> dict:
    os.environ.setdefault("RAYON_NUM_THREADS", str(threads))
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import numpy as np  # noqa: F401
    import torch
    torch.set_num_threads(threads)
    try:
        from transformers.utils import logging as hf_logging
        hf_logging.set_verbosity_error()
    except Exception:  # pragma: no cover
        pass
    rep = Reporter(quiet)
    out.mkdir(parents=True, exist_ok=True)
    t_all = time.time()
    times: dict = {}
    seed = cfg["seed"]
    vers = versions()

    train_files, held_files = corpus_files(cfg["corpus"])
    keys = _keys(cfg, train_files, held_files, vers)
    prev = None if force else _reusable(out, keys, do_export)
    if prev is not None:
        rep.line(f"[pair] reusing {out} (key {keys['eval']})")
        prev["reused"] = True
        return prev

    rep.line(f"[corpus] {len(train_files)} training modules, {len(held_files)} held out "
             f"({', '.join(p.name for p in held_files)})")
    tok, train_stream, held_stream = _tokenizer_stage(cfg, out, keys["tokenizer"], force,
                                                      (train_files, held_files), rep, times)
    tlm, times["tlm_s"], tlm_stats = train_stage("tlm", "TLM", keys["tlm"], force, seed + 1, rep, tok, out, cfg,
                                                 lambda m: corpus_batches(train_stream, cfg["tlm"], seed + 2))
    data = _labels_stage(tlm, train_stream, cfg, seed + 3, out, keys["labels"], force, rep, times)
    dlm, times["dlm_s"], dlm_stats = train_stage("dlm", "DLM", keys["dlm"], force, seed + 4, rep, tok, out, cfg,
                                                 lambda m: label_batches(data, cfg["dlm"], seed + 5))

    t0 = time.time()
    metrics = evaluate(tlm, dlm, tok, held_stream, cfg)
    times["eval_s"] = round(time.time() - t0, 1)
    sample = metrics.pop("sample")
    rep.line(f"[eval] {json.dumps(metrics)} ({times['eval_s']} s)")

    t0 = time.time()
    if do_export:
        _export_stage(out, keys["export"], force, rep)
    times["export_s"] = round(time.time() - t0, 1)
    times["total_s"] = round(time.time() - t_all, 1)

    result = {
        "key": keys["eval"], "keys": {k: keys[k] for k in ("tokenizer", "tlm", "labels", "dlm", "export")},
        "config": cfg, "versions": vers, "threads": threads,
        "paths": {"tokenizer": str(out / "tokenizer"), "tlm": str(out / "hf" / "tlm"),
                  "dlm": str(out / "hf" / "dlm"),
                  **({"tlm_onnx": str(out / "export/tlm/model.onnx"),
                      "dlm_onnx": str(out / "export/dlm/model.onnx")} if do_export else {})},
        "params": {"tlm": n_params(tlm), "dlm": n_params(dlm)},
        "corpus": {"train_modules": len(train_files), "held_out": [p.name for p in held_files],
                   "train_tokens": int(len(train_stream)), "held_out_tokens": int(len(held_stream))},
        "train": {"tlm": tlm_stats, "dlm": dlm_stats, "labels": data["stats"]},
        "metrics": metrics, "times": times, "sample": sample, "reused": False,
    }
    (out / "pair.json").write_text(json.dumps(result, indent=1, sort_keys=True))
    rep.line(f"[pair] done in {times['total_s']} s; greedy agreement DLM vs TLM: "
             f"{metrics['agreement_held_out_text']:.3f} on held-out text, "
             f"{metrics['agreement_tlm_continuations']:.3f} on TLM continuations")
    return result
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / "build" / "demo")
    ap.add_argument("--micro", action="store_true", help="tiny configuration (smoke test)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=JSON",
                    help="override a config value, e.g. --set tlm.steps=300")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--force", action="store_true", help="ignore the cache")
    ap.add_argument("--no-export", action="store_true")
    ap.add_argument("--quiet", action="store_true")
    ap.add_argument("--print-config", action="store_true")
    a = ap.parse_args(argv)
    cfg = deep_update(CONFIG, MICRO) if a.micro else copy.deepcopy(CONFIG)
    cfg = apply_sets(cfg, a.set)
    if a.print_config:
        print(json.dumps(cfg, indent=1))
        return 0
    res = run(cfg, a.out, do_export=not a.no_export, threads=a.threads, force=a.force, quiet=a.quiet)
    if not a.quiet:
        print("\n--- sample: TLM greedy continuation of a held-out prompt ---")
        print(res.get("sample", ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
