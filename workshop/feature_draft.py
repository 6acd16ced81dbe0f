#!/usr/bin/env python3
"""A feature draft (EAGLE-style head) for SmolLM2-135M-Instruct, trained on CPU from SmolLM2's
own features; exported by torch.onnx (dynamo) for ``specdec-compile --role dlm --feature-layers -1``.

    python -m workshop.feature_draft              # after workshop.distill; build/demo/{hf,export}/fdraft
    SPECDEC_FDRAFT_HEAD=DIR python -m workshop.feature_draft   # a head trained elsewhere (see below)

The head (``FeatureHead``), EAGLE-1's design:

* SmolLM2's token embedding (frozen), ``fc``: a linear layer reducing
  ``concat[embed(x_p) ; f_{p-1}]`` (1152 -> 576), one Llama decoder layer
  initialised from SmolLM2's last, SmolLM2's final norm (frozen) and its tied
  LM head (frozen) cut to the distilled draft's 8192 most used ids (padded back
  to the full vocabulary with a large negative logit, as ``draft_head`` does).
* ``f_p`` is the target's last-layer residual stream *before* the final norm,
  what a TLM compiled with ``--hidden-states -1`` outputs. Row p of a call
  carries the token x_p and the target's feature of p-1 (zeros at p = 0); the
  decoder layer's output at p (before the norm, ``draft_hidden_states`` once
  compiled) predicts f_p, and the frozen norm + head turn it into the logits
  for x_{p+1}: a perfect feature prediction gives exactly the target's logits.

Data: SmolLM2's own greedy answers to standard-library instructions, with its
features at every position captured while it answered (``teacher.greedy_batch``):
the distilled draft's teacher answers (``distill``) plus ``extra_prompts`` more
instructions and ``prose_prompts`` prose ones (``prompts.prose_instructions``)
answered here in batches, in bfloat16 (``teacher_dtype``; cached). No other
text is needed: the labels are the target's own next-token distributions.

Training (``feature_train``; deterministic, cached by a key over the data and
this config): loss = smooth L1 of the feature (scaled by the features' RMS) +
``ce_weight`` x the cross-entropy between the target's next-token distribution
(its true feature through the frozen norm and head) and the head's, EAGLE-1
style, summed over ``unroll`` passes: pass j trains draft j of every round at
once, with exactly the context the loop gives draft j (the target's features
up to the round's start, the head's own predictions after it; the training-time
test of EAGLE-3, ``feature_train``'s module doc).

Evaluation on held-out answers (``feature_eval``): the agreement of draft j
with the target's greedy token (unconditional and given drafts 1..j-1 were
right, which is draft j's acceptance in the loop), and the exact greedy loop
replayed with a KV cache: tokens per TLM call and the acceptance of draft j.
The replay equals the runtime's loop on the compiled pair (same tokens per call
on held-out answers).

A head trained elsewhere: ``scripts/feature_scaling.py --save-head DIR`` trains
the same head on more of SmolLM2's answers than 2 CPU cores can produce in the
demo's budget (on a GPU, minutes); ``python -m demo.run_demo --fdraft-head DIR``
(or ``run(..., head_from=DIR)``) evaluates, exports and compiles that head in
place of training one here.
"""
from __future__ import annotations

import copy
import json
import os
import sys
import time
from pathlib import Path

from . import cache, distill, smollm2, train_pair
from .cache import h
from .draft_head import PAD_LOGIT
from .feature_eval import chain_agreement, evaluate
from .feature_train import FeatureSet, trainable, train
from .progress import Reporter

ROOT = Path(__file__).resolve().parents[1]

SCRIPT_VERSION = "3"      # 2: training matched to the loop (feature_train); 3: bfloat16 teacher, prose
EVAL_VERSION = "3"       # what the evaluation reports (re-evaluates a cached head when it changes)

CONFIG: dict = {
    "seed": 20261124,
    "head": {"init_layer": -1, "head_rows": 8192},
    # extra_prompts: stdlib instructions SmolLM2 answers here on top of the distilled draft's 160,
    # prose_prompts: prose ones (prompts.prose_instructions); 128 new tokens as the demo decodes, so
    # late answer positions are covered too. The teacher runs in bfloat16 (about 800 tok/s at batch
    # 160 on 2 quiet cores with AMX, 2x float32): 1,440 x 128 tokens in about 3.5 min
    "data": {"feature_batch": 16, "extra_prompts": 960, "prose_prompts": 480, "gen_len": 128,
             "teacher_batch": 160, "teacher_dtype": "bfloat16"},
    "train": {"epochs": 3, "amp": "bfloat16", "batch": 4, "lr": 1e-3, "min_lr_ratio": 0.1, "warmup": 10,
              "weight_decay": 0.0,
              "ce_weight": 0.5, "ce_rows": "answer", "noise": 0.05, "unroll": 3, "unroll_weights": [1.0, 0.8, 0.6]},
    "eval": {"k_max": 4, "replay_k": [4]},
    "export": {"batch": 2, "seq": 3, "past": 5},
}


# --------------------------------------------------------------------------- the head

def _llama_config(tconf, attn: str):
    from transformers import LlamaConfig
    d = {**tconf.to_dict(), "num_hidden_layers": 1, "vocab_size": 1, "tie_word_embeddings": False,
         "pad_token_id": 0, "bos_token_id": 0, "eos_token_id": 0}
    return LlamaConfig(**d, attn_implementation=attn)


def build_head(tconf, emb, norm_w, head_w, ids: list[int], vocab: int, layer_sd: dict | None, seed: int,
               attn: str = "sdpa"):
    """A ``FeatureHead`` over the target's embedding ``emb`` [V, H], final norm weight, head rows
    ``head_w`` [N, H] (the ids ``ids``), its decoder layer from ``layer_sd`` (None: random)."""
    import torch
    from transformers import LlamaModel

    H = emb.shape[1]
    torch.manual_seed(seed)

    class FeatureHead(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding.from_pretrained(emb.clone(), freeze=True)
            self.fc = torch.nn.Linear(2 * H, H)
            with torch.no_grad():                     # start as "the previous feature, plus a little token"
                self.fc.weight.zero_()
                self.fc.weight[:, H:] = torch.eye(H)
                self.fc.weight[:, :H].normal_(0, 0.02)
                self.fc.bias.zero_()
            self.model = LlamaModel._from_config(_llama_config(tconf, attn), attn_implementation=attn)
            self.model.embed_tokens.weight.requires_grad_(False)
            if layer_sd is not None:
                self.model.layers[0].load_state_dict(layer_sd)
            self.model.norm.weight.data.copy_(norm_w)
            self.model.norm.weight.requires_grad_(False)
            self.register_buffer("head_w", head_w.clone())
            where = torch.full((vocab,), len(ids), dtype=torch.long)
            where[torch.tensor(ids)] = torch.arange(len(ids))
            self.register_buffer("columns", where)

        def inputs(self, input_ids, hidden_states):
            return self.fc(torch.cat([self.embed(input_ids), hidden_states], dim=-1))

        def pre_norm(self, input_ids, hidden_states, position_ids=None, past=None, attention_mask=None):
            """The decoder layer's output before the final norm (the predicted features) [B, S, H]."""
            norm = self.model.norm
            self.model.norm = torch.nn.Identity()
            try:
                o = self.model(inputs_embeds=self.inputs(input_ids, hidden_states), position_ids=position_ids,
                               attention_mask=attention_mask, past_key_values=past, use_cache=past is not None)
            finally:
                self.model.norm = norm
            return o.last_hidden_state

        def sub_logits(self, pre):
            """Logits over the head's ids [.., N] from predicted (or true) features."""
            return self.model.norm(pre) @ self.head_w.t()

        def forward(self, input_ids, attention_mask, position_ids, hidden_states, past_k, past_v):
            """The exported interface: logits over the full vocabulary, the layer's new K/V."""
            from transformers.cache_utils import DynamicCache
            cache_ = DynamicCache()
            cache_.update(past_k, past_v, 0)
            o = self.model(inputs_embeds=self.inputs(input_ids, hidden_states), attention_mask=attention_mask,
                           position_ids=position_ids, past_key_values=cache_, use_cache=True)
            sub = o.last_hidden_state @ self.head_w.t()
            fill = torch.full_like(sub[..., :1], PAD_LOGIT)
            logits = torch.index_select(torch.cat([sub, fill], dim=-1), 2, self.columns)
            layer = o.past_key_values.layers[0]
            return logits, layer.keys, layer.values

    return FeatureHead()


# --------------------------------------------------------------------------- export

def export(head, out: Path, cfg: dict) -> Path:
    """torch.onnx (dynamo) export with the interface the compiler expects of a feature draft."""
    import torch
    ec = cfg["export"]
    head.eval()
    head.model.config._attn_implementation = "eager"
    for lay in head.model.layers:
        lay.self_attn.config._attn_implementation = "eager"
    c = head.model.config
    KV, D = c.num_key_value_heads, getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    b, s, p = ec["batch"], ec["seq"], ec["past"]
    H = c.hidden_size
    args = (torch.randint(0, 100, (b, s)), torch.ones(b, p + s, dtype=torch.int64),
            torch.arange(p, p + s).unsqueeze(0).expand(b, s).contiguous(), torch.randn(b, s, H),
            torch.randn(b, KV, p, D), torch.randn(b, KV, p, D))
    B = torch.export.Dim("batch", min=1, max=64)
    S = torch.export.Dim("seq", min=1, max=1024)
    P = torch.export.Dim("past", min=1, max=4096)
    dyn = {"input_ids": {0: B, 1: S}, "attention_mask": {0: B, 1: torch.export.Dim.AUTO},
           "position_ids": {0: B, 1: S}, "hidden_states": {0: B, 1: S}, "past_k": {0: B, 2: P},
           "past_v": {0: B, 2: P}}
    out.mkdir(parents=True, exist_ok=True)
    with torch.no_grad():
        torch.onnx.export(head, args, str(out / "model.onnx"), dynamo=True,
                          input_names=["input_ids", "attention_mask", "position_ids", "hidden_states",
                                       "past_key_values.0.key", "past_key_values.0.value"],
                          output_names=["logits", "present.0.key", "present.0.value"], dynamic_shapes=dyn,
                          external_data=False, optimize=True)
    head.model.config._attn_implementation = "sdpa"
    return out / "model.onnx"


# --------------------------------------------------------------------------- main

def _features(tmodel, data: dict, cfg: dict, out: Path, key: str, force: bool, rep, times: dict) -> dict:
    """The target's features over prompt + answer of every teacher example: captured by the
    teacher while it generated (``distill``), or else (an older teacher cache) computed here
    teacher-forced in one batched pass (cached)."""
    import torch

    from . import teacher
    t0 = time.time()
    if all("feat" in d for part in ("train", "eval") for d in data[part]):
        # the teacher's features stop before the last generated token: pad one (unused) row
        res = {part: [torch.cat([d["feat"], torch.zeros_like(d["feat"][:1])]) for d in data[part]]
               for part in ("train", "eval")}
        times["features_s"] = round(time.time() - t0, 1)
        rep.line("[fdraft] target features: captured by the teacher while it answered")
        return res

    def build():
        lean = teacher.LeanLlama(tmodel)
        res = {}
        for part in ("train", "eval"):
            seqs = [list(d["prompt"]) + list(d["gen"]) for d in data[part]]
            rep.line(f"[fdraft] target features, teacher-forced: {len(seqs)} {part} sequences, "
                     f"{sum(map(len, seqs)):,} positions")
            res[part] = teacher.features(lean, seqs, batch=cfg["data"]["feature_batch"])
        return res
    feats = cache.torch_cached(out / "cache" / f"features-{key}.pt", build, force=force)
    times["features_s"] = round(time.time() - t0, 1)
    return feats


def _extra_instructions(cfg: dict, dcfg: dict, target: dict) -> tuple[list[str], str]:
    """``extra_prompts`` instructions the distilled draft's teacher did not use (never the demo's
    held-out prompts, which ``training_instructions`` leaves out), and the key of their answers."""
    import random

    from . import prompts
    used = set().union(*distill.instruction_split(dcfg))
    xs = prompts.training_instructions()
    random.Random(cfg["seed"]).shuffle(xs)
    extra = [x for x in xs if x not in used][: cfg["data"]["extra_prompts"]]
    prose = prompts.prose_instructions()
    random.Random(cfg["seed"] + 1).shuffle(prose)
    extra += prose[: cfg["data"].get("prose_prompts", 0)]
    return extra, h("fteacher", target["keys"]["hf"], cfg["data"], cfg["seed"], extra, SCRIPT_VERSION)


def _extra_teacher(tmodel, tok, extra: list[str], key: str, cfg: dict, out: Path, force: bool, rep,
                   times: dict) -> tuple[list[dict], list]:
    """SmolLM2's greedy answers to ``extra`` with its features (data, features), cached in
    ``OUT/cache``."""
    import torch
    d = cfg["data"]
    t0 = time.time()

    def answer() -> list[dict]:
        rep.line(f"[fdraft] SmolLM2 answers {len(extra)} more instructions greedily (up to {d['gen_len']} "
                 f"tokens, batch {d['teacher_batch']}), its features captured")
        tcfg = {"data": {"batch": d["teacher_batch"], "gen_len": d["gen_len"],
                         "dtype": d.get("teacher_dtype", "float32")}}
        rows = distill.teacher_data(tmodel, tok, extra, tcfg, rep, "teacher fdraft") if extra else []
        return [{"prompt": r["prompt"], "gen": r["gen"], "feat": r["feat"]} for r in rows]
    data = cache.torch_cached(out / "cache" / f"fteacher-{key}.pt", answer, force=force)
    times["extra_teacher_s"] = round(time.time() - t0, 1)
    # the teacher's features stop before the last generated token: pad one (unused) row
    return data, [torch.cat([r["feat"], torch.zeros_like(r["feat"][:1])]) for r in data]


def _parts(tmodel, ids: list[int]):
    import torch
    sd = tmodel.model.layers[-1].state_dict()
    return (tmodel.model.embed_tokens.weight.data, tmodel.model.norm.weight.data,
            tmodel.lm_head.weight.data[torch.tensor(ids)], sd)


def _head_stage(tmodel, parts: tuple, ids: list[int], sets: tuple, scale: float, cfg: dict, hf_dir: Path,
                key: str, force: bool, rep, head_from: Path | None = None):
    """Train (or reuse, by key) the head in ``hf_dir``, or take the one trained elsewhere in
    ``head_from`` (``scripts/feature_scaling.py --save-head``); returns (head, training stats)."""
    import torch
    emb, norm_w, head_w, layer_sd = parts
    tr, ev = sets
    if force or not cache.stamp_ok(hf_dir, key):
        head = build_head(tmodel.config, emb, norm_w, head_w, ids, tmodel.config.vocab_size, layer_sd, cfg["seed"])
        n_par = sum(p.numel() for p in trainable(head))
        pre = chain_agreement(head, ev, cfg["eval"]["k_max"])
        if head_from is not None:
            sd = torch.load(head_from / "head.pt")
            head.load_state_dict({k: v.float() for k, v in sd.items()}, strict=False)
            meta = json.loads((head_from / "fdraft.json").read_text())
            stats = {"external": str(head_from), "trained_elsewhere": meta.get("trained")}
            rep.line(f"[fdraft] EAGLE-style head trained elsewhere: {head_from} ({n_par / 1e6:.2f}M parameters)")
        else:
            rep.line(f"[fdraft] EAGLE-style head: fc {2 * emb.shape[1]}->{emb.shape[1]} + SmolLM2's last layer, "
                     f"frozen embedding/norm/head over {len(ids)} ids; {n_par / 1e6:.2f}M trained parameters; "
                     f"{sum(it['g'] for it in tr.items):,} answer tokens, "
                     f"{sum(len(it['seq']) for it in tr.items):,} positions; feature RMS {scale:.3f}")
            stats = train(head, tr, scale, cfg, rep)
        stats["before_training"] = pre
        stats["trained_params"] = n_par
        tmp = cache.fresh_tmp(hf_dir)
        torch.save({k: v for k, v in head.state_dict().items() if k not in ("embed.weight", "head_w", "columns")},
                   tmp / "head.pt")
        (tmp / "fdraft.json").write_text(json.dumps({"head_ids": ids, "scale": scale}))
        cache.publish(tmp, hf_dir, key, {"train": stats})
    else:
        stats = json.loads((hf_dir / cache.STAMP).read_text())["train"]
    head = build_head(tmodel.config, emb, norm_w, head_w, ids, tmodel.config.vocab_size, None, cfg["seed"])
    head.load_state_dict(torch.load(hf_dir / "head.pt"), strict=False)
    head.eval()
    return head, stats


def _keys(cfg: dict, draft: dict, target: dict, threads: int, head_from: Path | None, do_export: bool) -> dict:
    """The cache keys of every stage (and the extra instructions): a head trained elsewhere is
    keyed by its file instead of the data and training configuration."""
    import torch
    k_teacher = draft["keys"]["teacher"]
    dcfg = copy.deepcopy(draft.get("config") or distill.CONFIG)
    extra_ins, k_extra = _extra_instructions(cfg, dcfg, target) if head_from is None else ([], None)
    k_feat = h("features", k_teacher, k_extra, cfg["data"], SCRIPT_VERSION)
    k_head = (h("fdraft", k_feat, cfg["head"], cfg["train"], cfg["seed"], torch.__version__, threads, SCRIPT_VERSION)
              if head_from is None else h("fdraft-from", smollm2.sha256(head_from / "head.pt"),
                                          (head_from / "fdraft.json").read_text(), k_teacher, SCRIPT_VERSION))
    k_exp = h("fdraft-export", k_head, cfg["export"], train_pair.versions())
    k_all = h("fdraft-all", k_head, k_exp if do_export else None, cfg["eval"], EVAL_VERSION)
    return {"teacher": k_teacher, "dcfg": dcfg, "extra_ins": extra_ins, "extra_teacher": k_extra,
            "features": k_feat, "head": k_head, "export": k_exp, "all": k_all}


def _data(tmodel, tok, target: dict, cfg: dict, out: Path, ks: dict, force: bool, rep, times: dict,
          head_from: Path | None):
    """(ids, scale, train set, eval set): the teacher's answers with their features, the extra
    answers (none for a head trained elsewhere, whose ids and scale are its own)."""
    import torch
    data = torch.load(out / "cache" / f"teacher-{ks['teacher']}.pt")
    feats = _features(tmodel, data, cfg, out, ks["features"], force, rep, times)
    V = tmodel.config.vocab_size
    if head_from is not None:
        meta = json.loads((head_from / "fdraft.json").read_text())
        ids, scale = [int(i) for i in meta["head_ids"]], float(meta["scale"])
    else:
        extra, extra_feats = _extra_teacher(tmodel, tok, ks["extra_ins"], ks["extra_teacher"], cfg, out, force, rep,
                                            times)
        data["train"], feats["train"] = list(data["train"]) + extra, list(feats["train"]) + extra_feats
        dcfg = ks["dcfg"]
        dcfg["draft"]["head_rows"] = cfg["head"]["head_rows"]
        ids = distill.head_ids(data["train"], dcfg, V, [int(tok.eos_token_id)])
        scale = float(sum(f.float().pow(2).sum() for f in feats["train"])
                      / sum(f.numel() for f in feats["train"])) ** 0.5
    return ids, scale, FeatureSet(data["train"], feats["train"], ids, V), FeatureSet(data["eval"], feats["eval"], ids, V)


def run(cfg: dict, out: Path, target: dict, draft: dict, *, threads: int = 2, force: bool = False,
        quiet: bool = False, do_export: bool = True, head_from: Path | None = None) -> dict:
    """Features, training, evaluation, export; each stage cached by key. ``draft``: the distilled
    draft's result (its teacher data is reused). ``head_from``: a head trained elsewhere
    (``scripts/feature_scaling.py --save-head DIR``) instead of training one here."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import torch
    from transformers import AutoTokenizer, LlamaForCausalLM
    from transformers.utils import logging as hf_logging
    hf_logging.set_verbosity_error()
    torch.set_num_threads(threads)
    rep = Reporter(quiet)
    times: dict = {}
    head_from = Path(head_from) if head_from is not None else None
    ks = _keys(cfg, draft, target, threads, head_from, do_export)
    hf_dir, exp_dir = out / "hf" / "fdraft", out / "export" / "fdraft"
    res_path = out / "fdraft.json"
    prev = None if force else cache.reuse_result(
        res_path, ks["all"], [(hf_dir, ks["head"])] + ([(exp_dir, ks["export"])] if do_export else []),
        lambda m: rep.line(f"[fdraft] {m}"))
    if prev is not None:
        return prev

    tok = AutoTokenizer.from_pretrained(target["paths"]["tokenizer"])
    tmodel = LlamaForCausalLM.from_pretrained(target["paths"]["hf"], dtype=torch.float32).eval()
    ids, scale, tr, ev = _data(tmodel, tok, target, cfg, out, ks, force, rep, times, head_from)
    emb, norm_w, head_w, layer_sd = _parts(tmodel, ids)
    t0 = time.time()
    head, stats = _head_stage(tmodel, (emb, norm_w, head_w, layer_sd), ids, (tr, ev), scale, cfg, hf_dir,
                              ks["head"], force, rep, head_from)
    times["train_s"] = round(time.time() - t0, 1)

    t0 = time.time()
    metrics = evaluate(head, ev, cfg)
    times["eval_s"] = round(time.time() - t0, 1)
    rep.line(f"[fdraft] held-out ({metrics['eval_answers']} answers, {metrics['eval_tokens']} tokens): agreement "
             f"per draft {metrics['agreement']}, given the previous drafts right "
             f"{metrics['acceptance_given_previous']}; replayed tokens per TLM call "
             + ", ".join(f"k={k} {r['tokens_per_tlm_call']}" for k, r in metrics["replay"].items())
             + f" (before training: {stats['before_training']['agreement']})")

    t0 = time.time()
    if do_export and (force or not cache.stamp_ok(exp_dir, ks["export"])):
        tmp = cache.fresh_tmp(exp_dir)
        export(head, tmp, cfg)
        cache.publish(tmp, exp_dir, ks["export"])
        rep.line(f"[fdraft] exported {exp_dir / 'model.onnx'} (torch.onnx dynamo)")
    times["export_s"] = round(time.time() - t0, 1)
    keys = {k: ks[k] for k in ("extra_teacher", "features", "head", "export")}
    trained_here = head_from is None
    result = {"key": ks["all"], "keys": keys, "config": cfg, "kind": "feature", "trained_params": stats.get("trained_params"),
              "head_rows": len(ids), "init_layer": cfg["head"]["init_layer"], "feature_rms": scale,
              "trained_elsewhere": None if trained_here else str(head_from),
              "train_answer_tokens": (sum(it["g"] for it in tr.items) if trained_here
                                      else (stats.get("trained_elsewhere") or {}).get("answer_tokens")),
              "train_positions": sum(len(it["seq"]) for it in tr.items) if trained_here else None,
              "train": stats, "metrics": metrics, "times": times,
              "paths": {"hf": str(hf_dir), **({"onnx": str(exp_dir / "model.onnx")} if do_export else {})},
              "reused": False}
    res_path.write_text(json.dumps(result, indent=1))
    return result


def main(argv: list[str] | None = None) -> int:
    a, cfg = distill.stage_args(argv, __doc__, CONFIG)
    target = smollm2.prepare(a.out, threads=a.threads)
    draft = distill.run(distill.CONFIG, a.out, target, threads=a.threads)
    head_from = os.environ.get("SPECDEC_FDRAFT_HEAD") or None
    res = run(cfg, a.out, target, draft, threads=a.threads, force=a.force, do_export=not a.no_export,
              head_from=head_from)
    print(json.dumps({k: res[k] for k in ("trained_params", "head_rows", "metrics", "times")}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
