#!/usr/bin/env python3
"""A feature draft (EAGLE-style head) for SmolLM2-135M-Instruct, trained on CPU from SmolLM2's
own features; exported by torch.onnx (dynamo) for ``specdec-compile --role dlm --feature-layers -1``.

    python -m demo.feature_draft              # after demo.distill; build/demo/{hf,export}/fdraft

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

Data: the distilled draft's teacher answers (``distill``: SmolLM2's greedy
answers to standard-library instructions, cached), prompt + answer, put
through SmolLM2 once more teacher-forced in batches (``teacher.features``) for
the features at every position. No text is generated here.

Training (deterministic, cached by a key over the data and this config):
loss = smooth L1 of the feature (scaled by the features' RMS) + ``ce_weight``
x the cross-entropy between the target's next-token distribution (its true
feature through the frozen norm and head) and the head's, EAGLE-1 style. So
multi-step drafts do not collapse, each batch is unrolled ``unroll`` times
(training-time test): pass 1 reads the target's features plus noise, pass j
reads the head's own (detached) feature predictions of pass j-1 in place of
the target's, exactly what draft j reads in the loop; every pass is trained
to predict the target's features and tokens.

Evaluation on held-out answers: per draft position j = 1..k_max, the
agreement of draft j with the target's greedy token given drafts 1..j-1
were right, teacher-forced on the head's own features in parallel (every
earlier row of pass j reads predicted features too, as in training), and
the exact greedy loop replayed with a KV cache (draft k tokens from the
head's own features, verify against the target's answer, ingest the
accepted tokens with the target's features): tokens per TLM call and the
acceptance of draft j given drafts 1..j-1 accepted. The replay equals the
runtime's loop on the compiled pair (same tokens per call on held-out
answers). The two differ for j >= 2: in the loop the earlier rows hold the
target's features, in the parallel passes (and in training) they hold the
head's own, so the unrolled training does not yet match what drafts 2+ see.
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
from .progress import Reporter

ROOT = Path(__file__).resolve().parents[1]

SCRIPT_VERSION = "1"
EVAL_VERSION = "2"       # what the evaluation reports (re-evaluates a cached head when it changes)

CONFIG: dict = {
    "seed": 20261124,
    "head": {"init_layer": -1, "head_rows": 8192},
    "data": {"feature_batch": 16},
    "train": {"epochs": 12, "batch": 4, "lr": 1e-3, "min_lr_ratio": 0.1, "warmup": 10, "weight_decay": 0.0,
              "ce_weight": 0.5, "ce_rows": "answer", "noise": 0.05, "mix": 1.0, "unroll": 3, "unroll_weights": [1.0, 0.8, 0.6]},
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


def trainable(head) -> list:
    return [p for p in head.parameters() if p.requires_grad]


# --------------------------------------------------------------------------- data

class FeatureSet(distill.Examples):
    """Sequences (prompt + answer), the target's features at every position, and where the
    answer is: CE rows are the positions n-1 .. n+g-2 (each predicts the next answer token).
    Batches as the distilled draft's (length-sorted within chunks)."""

    def __init__(self, data: list[dict], feats: list, ids: list[int], vocab: int):
        import torch
        self.items = []
        inv = torch.full((vocab,), -1, dtype=torch.long)
        inv[torch.tensor(ids)] = torch.arange(len(ids))
        self.inv = inv
        for d, f in zip(data, feats):
            if not d["gen"]:
                continue
            seq = list(d["prompt"]) + list(d["gen"])
            self.items.append({"seq": seq, "n": len(d["prompt"]), "g": len(d["gen"]), "feat": f})

    def collate(self, which: list[int]):
        """x [B, T], f [B, T, H] (target features), valid [B, T], rows/cols of the CE positions,
        their labels (the target's next token) as head indices (-1 outside the head)."""
        import torch
        items = [self.items[i] for i in which]
        T = max(len(it["seq"]) for it in items)
        H = items[0]["feat"].shape[1]
        x = torch.zeros(len(items), T, dtype=torch.long)
        f = torch.zeros(len(items), T, H)
        valid = torch.zeros(len(items), T, dtype=torch.bool)
        rows, cols, labels = [], [], []
        for r, it in enumerate(items):
            L = len(it["seq"])
            x[r, :L] = torch.tensor(it["seq"])
            f[r, :L] = it["feat"].float()
            valid[r, :L - 1] = True                       # f_p is a target for p < L-1 (any p really)
            rows += [r] * it["g"]
            cols += list(range(it["n"] - 1, it["n"] - 1 + it["g"]))
            labels += it["seq"][it["n"]: it["n"] + it["g"]]
        lab = torch.tensor(labels)
        vr, vc = torch.nonzero(valid, as_tuple=True)
        return {"x": x, "f": f, "valid": valid, "rows": torch.tensor(rows), "cols": torch.tensor(cols),
                "labels": lab, "sub": self.inv[lab], "all_rows": vr, "all_cols": vc}


def torch_log_softmax(x):
    import torch
    return torch.log_softmax(x, -1)


def shift(f):
    """Row p gets the feature of p-1 (zeros at p = 0): EAGLE's pairing."""
    import torch
    return torch.cat([torch.zeros_like(f[:, :1]), f[:, :-1]], dim=1)


def unrolled(head, b: dict, passes: int, noise: float = 0.0, scale: float = 1.0, gen=None, mix: float = 1.0):
    """Pass j's predicted features [B, T, H], j = 1..passes: pass 1 reads the target's features
    (plus Gaussian noise of ``noise`` x ``scale``), pass j > 1 the head's own predictions of
    pass j-1 (detached), as draft j does in the loop; with ``mix`` < 1 only that share of the
    rows (drawn per row) reads them and the rest the target's, so the context a drafted row
    attends to holds mostly target features, as in the loop."""
    import torch
    pos = torch.arange(b["x"].shape[1])[None].expand_as(b["x"])
    inp = shift(b["f"])
    if noise:
        inp = inp + torch.randn(inp.shape, generator=gen) * (noise * scale)
    outs = []
    true = shift(b["f"])
    for j in range(passes):
        pre = head.pre_norm(b["x"], inp, position_ids=pos)
        outs.append(pre)
        inp = shift(pre.detach())
        if mix < 1.0:
            pick = torch.rand(inp.shape[:2] + (1,), generator=gen) < mix
            inp = torch.where(pick, inp, true)
    return outs


def _ce_at(b: dict, where: str):
    return (b["rows"], b["cols"]) if where == "answer" else (b["all_rows"], b["all_cols"])


def target_probs(head, b: dict, where: str = "answer"):
    """The target's next-token distribution over the head's ids (from its true features through
    the frozen norm and head) on the answer rows, or (``all``) every position of the sequences:
    the target's distribution is the label wherever it ran, prompt included."""
    import torch
    with torch.no_grad():
        return torch.softmax(head.sub_logits(b["f"][_ce_at(b, where)]), -1)


def losses(head, pre, b: dict, scale: float, ce_weight: float, target=None, where: str = "answer"):
    """(total, feature loss, ce) of one pass: smooth L1 on features / scale over valid positions,
    soft cross-entropy against the target's distribution over the head's ids (``where``)."""
    import torch.nn.functional as F
    v = b["valid"]
    reg = F.smooth_l1_loss(pre[v] / scale, b["f"][v] / scale)
    if target is None:
        target = target_probs(head, b, where)
    logq = torch_log_softmax(head.sub_logits(pre[_ce_at(b, where)]))
    ce = -(target * logq).sum(-1).mean()
    return reg + ce_weight * ce, reg, ce


def train(head, ds: FeatureSet, scale: float, cfg: dict, rep) -> dict:
    """The unrolled EAGLE-1 training (module doc) through ``distill.fit``'s loop."""
    import torch
    tc = cfg["train"]
    gen = torch.Generator().manual_seed(cfg["seed"] + 2)
    w = tc["unroll_weights"]

    def batch_loss(b):
        outs = unrolled(head, b, tc["unroll"], tc["noise"], scale, gen, tc["mix"])
        tp = target_probs(head, b, tc["ce_rows"])
        loss = sum(w[j] * losses(head, pre, b, scale, tc["ce_weight"], tp, tc["ce_rows"])[0]
                   for j, pre in enumerate(outs))
        return loss, int(b["valid"].sum())
    head.train()
    res = distill.fit(trainable(head), ds, tc, cfg["seed"], rep, "train fdraft", batch_loss)
    head.eval()
    res["positions"] = res.pop("tokens")
    return res


# --------------------------------------------------------------------------- evaluation

def chain_agreement(head, ds: FeatureSet, k_max: int) -> dict:
    """Draft j at answer position q reads pass j-1's predicted feature of q-1 (teacher-forced
    on the head's own features): its agreement with the target's greedy token, unconditional
    and given drafts 1..j-1 of the same chain were right (the acceptance of draft j)."""
    import torch
    hits = [0] * k_max
    tot = [0] * k_max
    cond_hit = [0] * k_max
    cond_tot = [0] * k_max
    with torch.inference_mode():
        for which in ds.batches(8, None):
            b = ds.collate(which)
            outs = unrolled(head, b, k_max)
            # match[j][r, q]: draft j+1's argmax at position q equals the target's token at q+1
            B, T = b["x"].shape
            m = torch.zeros(k_max, B, T, dtype=torch.bool)
            ok = torch.zeros(B, T, dtype=torch.bool)
            ok[b["rows"], b["cols"]] = True
            nxt = torch.zeros(B, T, dtype=torch.long)
            nxt[b["rows"], b["cols"]] = b["labels"]
            ids = torch.nonzero(ds.inv >= 0).squeeze(1)
            for j, pre in enumerate(outs):
                arg = ids[head.sub_logits(pre).argmax(-1)]
                m[j] = (arg == nxt) & ok
            for j in range(k_max):
                # draft j+1 of the chain starting at s = q - j: positions s..q all answer rows
                if j:
                    okc = ok[:, j:] & ok[:, :-j]
                    prev = torch.ones_like(okc)
                    for i in range(j):
                        prev &= m[i][:, i: T - j + i]
                else:
                    okc, prev = ok, torch.ones_like(ok)
                cur = m[j][:, j:] if j else m[0]
                hits[j] += int((cur & okc).sum())
                tot[j] += int(okc.sum())
                cond_hit[j] += int((cur & okc & prev).sum())
                cond_tot[j] += int((okc & prev).sum())
    return {"agreement": [round(hits[j] / max(1, tot[j]), 4) for j in range(k_max)],
            "acceptance_given_previous": [round(cond_hit[j] / max(1, cond_tot[j]), 4) for j in range(k_max)]}


def replay(head, ds: FeatureSet, k: int) -> dict:
    """The greedy feature-draft loop (docs/CONTRACT.md section 6) replayed exactly with a KV
    cache against the target's own greedy answers: tokens per TLM call and accepted drafts."""
    import torch
    from transformers.cache_utils import DynamicCache
    ids = torch.nonzero(ds.inv >= 0).squeeze(1)
    produced = calls = drafted = accepted = 0
    at = [0] * k                  # drafts at index j proposed with drafts 0..j-1 accepted ...
    hit = [0] * k                 # ... and accepted themselves
    with torch.inference_mode():
        for it in ds.items:
            seq, n, g = it["seq"], it["n"], it["g"]
            F = it["feat"].float()[None]
            x = torch.tensor(seq)[None]
            L = n + g
            past = DynamicCache()
            # prefill: rows 0..n with (x_p, f_{p-1}); the target's prefill gave x_n
            pos = torch.arange(n + 1)[None]
            pre = head.pre_norm(x[:, : n + 1], torch.cat([torch.zeros_like(F[:, :1]), F[:, :n]], 1), pos, past)
            m = n
            while m < L - 1:
                last = pre[:, -1:]
                drafts = []
                for i in range(min(k, L - 1 - m)):
                    d = int(ids[head.sub_logits(last)[0, -1].argmax()])
                    drafts.append(d)
                    if i + 1 < min(k, L - 1 - m):
                        last = head.pre_norm(torch.tensor([[d]]), last, torch.tensor([[m + 1 + i]]), past)
                a = 0
                while a < len(drafts) and drafts[a] == seq[m + 1 + a]:
                    a += 1
                for j in range(min(a + 1, len(drafts))):
                    at[j] += 1
                    hit[j] += j < a
                step = min(a + 1, L - 1 - m)
                produced += step
                calls += 1
                drafted += len(drafts)
                accepted += a
                past.crop(m + 1)
                pre = head.pre_norm(x[:, m + 1: m + 1 + step], F[:, m: m + step],
                                    torch.arange(m + 1, m + 1 + step)[None], past)
                m += step
    return {"k": k, "tokens_per_tlm_call": round(produced / max(1, calls), 3),
            "alpha": round(accepted / max(1, drafted), 4), "calls": calls, "tokens": produced,
            "acceptance_given_previous": [round(hit[j] / at[j], 4) if at[j] else None for j in range(k)]}


def evaluate(head, ds: FeatureSet, cfg: dict) -> dict:
    ec = cfg["eval"]
    res = chain_agreement(head, ds, ec["k_max"])
    res["replay"] = {str(k): replay(head, ds, k) for k in ec["replay_k"]}
    res["eval_answers"] = len(ds.items)
    res["eval_tokens"] = sum(it["g"] for it in ds.items)
    return res


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


def _parts(tmodel, ids: list[int]):
    import torch
    sd = tmodel.model.layers[-1].state_dict()
    return (tmodel.model.embed_tokens.weight.data, tmodel.model.norm.weight.data,
            tmodel.lm_head.weight.data[torch.tensor(ids)], sd)


def _head_stage(tmodel, parts: tuple, ids: list[int], sets: tuple, scale: float, cfg: dict, hf_dir: Path,
                key: str, force: bool, rep):
    """Train (or reuse, by key) the head in ``hf_dir``; returns (head, training stats)."""
    import torch
    emb, norm_w, head_w, layer_sd = parts
    tr, ev = sets
    if force or not cache.stamp_ok(hf_dir, key):
        head = build_head(tmodel.config, emb, norm_w, head_w, ids, tmodel.config.vocab_size, layer_sd, cfg["seed"])
        n_par = sum(p.numel() for p in trainable(head))
        rep.line(f"[fdraft] EAGLE-style head: fc {2 * emb.shape[1]}->{emb.shape[1]} + SmolLM2's last layer, "
                 f"frozen embedding/norm/head over {len(ids)} ids; {n_par / 1e6:.2f}M trained parameters; "
                 f"{sum(it['g'] for it in tr.items):,} answer tokens, "
                 f"{sum(len(it['seq']) for it in tr.items):,} positions; feature RMS {scale:.3f}")
        pre = chain_agreement(head, ev, cfg["eval"]["k_max"])
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


def run(cfg: dict, out: Path, target: dict, draft: dict, *, threads: int = 2, force: bool = False,
        quiet: bool = False, do_export: bool = True) -> dict:
    """Features, training, evaluation, export; each stage cached by key. ``draft``: the distilled
    draft's result (its teacher data and head ids are reused)."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import torch
    from transformers import AutoTokenizer, LlamaForCausalLM
    from transformers.utils import logging as hf_logging
    hf_logging.set_verbosity_error()
    torch.set_num_threads(threads)
    rep = Reporter(quiet)
    times: dict = {}
    k_teacher = draft["keys"]["teacher"]
    k_feat = h("features", k_teacher, cfg["data"], SCRIPT_VERSION)
    k_head = h("fdraft", k_feat, cfg["head"], cfg["train"], cfg["seed"], torch.__version__, threads, SCRIPT_VERSION)
    k_exp = h("fdraft-export", k_head, cfg["export"], train_pair.versions())
    hf_dir, exp_dir = out / "hf" / "fdraft", out / "export" / "fdraft"
    res_path = out / "fdraft.json"
    k_all = h("fdraft-all", k_head, k_exp if do_export else None, cfg["eval"], EVAL_VERSION)
    prev = None if force else cache.reuse_result(
        res_path, k_all, [(hf_dir, k_head)] + ([(exp_dir, k_exp)] if do_export else []),
        lambda m: rep.line(f"[fdraft] {m}"))
    if prev is not None:
        return prev

    tok = AutoTokenizer.from_pretrained(target["paths"]["tokenizer"])
    tmodel = LlamaForCausalLM.from_pretrained(target["paths"]["hf"], dtype=torch.float32).eval()
    data = torch.load(out / "cache" / f"teacher-{k_teacher}.pt")
    feats = _features(tmodel, data, cfg, out, k_feat, force, rep, times)
    V = tmodel.config.vocab_size
    dcfg = copy.deepcopy(draft.get("config") or distill.CONFIG)
    dcfg["draft"]["head_rows"] = cfg["head"]["head_rows"]
    ids = distill.head_ids(data["train"], dcfg, V, [int(tok.eos_token_id)])
    emb, norm_w, head_w, layer_sd = _parts(tmodel, ids)
    tr, ev = FeatureSet(data["train"], feats["train"], ids, V), FeatureSet(data["eval"], feats["eval"], ids, V)
    scale = float(torch.cat([f.float() for f in feats["train"]]).pow(2).mean().sqrt())

    t0 = time.time()
    head, stats = _head_stage(tmodel, (emb, norm_w, head_w, layer_sd), ids, (tr, ev), scale, cfg, hf_dir, k_head,
                              force, rep)
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
    if do_export and (force or not cache.stamp_ok(exp_dir, k_exp)):
        tmp = cache.fresh_tmp(exp_dir)
        export(head, tmp, cfg)
        cache.publish(tmp, exp_dir, k_exp)
        rep.line(f"[fdraft] exported {exp_dir / 'model.onnx'} (torch.onnx dynamo)")
    times["export_s"] = round(time.time() - t0, 1)
    result = {"key": k_all, "keys": {"features": k_feat, "head": k_head, "export": k_exp}, "config": cfg,
              "kind": "feature", "trained_params": stats.get("trained_params"), "head_rows": len(ids),
              "init_layer": cfg["head"]["init_layer"], "feature_rms": scale,
              "train_answer_tokens": sum(it["g"] for it in tr.items),
              "train_positions": sum(len(it["seq"]) for it in tr.items), "train": stats, "metrics": metrics,
              "times": times, "paths": {"hf": str(hf_dir), **({"onnx": str(exp_dir / "model.onnx")} if do_export else {})},
              "reused": False}
    res_path.write_text(json.dumps(result, indent=1))
    return result


def main(argv: list[str] | None = None) -> int:
    a, cfg = distill.stage_args(argv, __doc__, CONFIG)
    target = smollm2.prepare(a.out, threads=a.threads)
    draft = distill.run(distill.CONFIG, a.out, target, threads=a.threads)
    res = run(cfg, a.out, target, draft, threads=a.threads, force=a.force, do_export=not a.no_export)
    print(json.dumps({k: res[k] for k in ("trained_params", "head_rows", "metrics", "times")}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
