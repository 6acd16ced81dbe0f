"""Training data and training of the demo's feature draft (``feature_draft.FeatureHead``).

Row p of a sequence carries the token x_p and the target's feature f_{p-1} (zeros at p = 0); the
head's output at p predicts f_p, whose logits (frozen norm + head) give x_{p+1}.

**Training-time test, matched to the loop.** Draft j of a round that starts after the target
verified rows 0..m runs at row m+j-1; it attends rows 0..m, which the loop filled with the
target's features, and rows m+1..m+j-1, which it filled with the head's own predicted features
(row m+i-1 from draft i). ``unrolled`` computes every draft j of every possible round start in
one pass per j over the whole sequence: pass j's row p (round start m = p-j+1) reads pass j-1's
prediction at p-1 and attends

* pass 1's keys and values at rows <= p-j+1 (the target-feature rows), and
* pass i's key and value at row p-j+i for i = 2..j (the earlier drafts of the same round),

exactly what draft j sees in the loop, so the teacher-forced chain agreement equals the replay's
acceptance (``feature_eval``) and training sees what the loop will show it. Pass 1 is the plain
causal pass over the target's features (optionally with Gaussian noise). The decoder layer is run
by hand from the layer's own modules (norms, projections, rotary, MLP) so the attention pattern is
explicit; ``tests/workshop/test_workshop_feature_draft.py`` checks it against the KV-cache loop.
"""
from __future__ import annotations

from . import distill


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
            f[r, :L] = it["feat"][:L].float()
            valid[r, :L - 1] = True                       # f_p is a target for p < L-1
            rows += [r] * it["g"]
            cols += list(range(it["n"] - 1, it["n"] - 1 + it["g"]))
            labels += it["seq"][it["n"]: it["n"] + it["g"]]
        lab = torch.tensor(labels)
        vr, vc = torch.nonzero(valid, as_tuple=True)
        return {"x": x, "f": f, "valid": valid, "rows": torch.tensor(rows), "cols": torch.tensor(cols),
                "labels": lab, "sub": self.inv[lab], "all_rows": vr, "all_cols": vc}


def shift(f, d: int = 1):
    """Row p gets row p-d (zeros for p < d); d = 1 is EAGLE's pairing of x_p with f_{p-1}."""
    import torch
    if d == 0:
        return f
    return torch.cat([torch.zeros_like(f[:, :d]), f[:, :-d]], dim=1)


# --------------------------------------------------------------------------- the matched passes

def _qkv(head, inp, x, pos):
    """The decoder layer's attention inputs for one pass: (layer input h0, q, k, v) with rotary
    applied; q [B, heads, T, D], k/v [B, kv_heads, T, D]."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb
    lay = head.model.layers[0]
    att = lay.self_attn
    h0 = head.inputs(x, inp)
    B, T, _ = h0.shape
    n = lay.input_layernorm(h0)
    q = att.q_proj(n).view(B, T, -1, att.head_dim).transpose(1, 2)
    k = att.k_proj(n).view(B, T, -1, att.head_dim).transpose(1, 2)
    v = att.v_proj(n).view(B, T, -1, att.head_dim).transpose(1, 2)
    cos, sin = head.model.rotary_emb(h0, pos)
    q, k = apply_rotary_pos_emb(q, k, cos, sin)
    return h0, q, k, v


def _finish(head, h0, attn):
    """attn [B, heads, T, D] -> the layer's output before the final norm [B, T, H]."""
    lay = head.model.layers[0]
    B, _, T, _ = attn.shape
    x = h0 + lay.self_attn.o_proj(attn.transpose(1, 2).reshape(B, T, -1))
    return x + lay.mlp(lay.post_attention_layernorm(x))


def _attend(q, ks: list, vs: list, scaling: float):
    """Pass j = len(ks) attention (module doc): q [B, h, T, D]; ks/vs[i] pass i+1's keys/values
    [B, kv, T, D]. Pass 1's at rows <= p-j+1, pass i's (i >= 2) at row p-j+i."""
    import torch
    j = len(ks)
    g = q.shape[1] // ks[0].shape[1]
    rep = (lambda t: t.repeat_interleave(g, dim=1)) if g > 1 else (lambda t: t)
    T = q.shape[2]
    k1, v1 = rep(ks[0]), rep(vs[0])
    s_main = (q @ k1.transpose(-1, -2)) * scaling                       # [B, h, T, T]
    p = torch.arange(T, device=q.device)
    allowed = p[None, :] <= (p[:, None] - (j - 1))
    s_main = s_main.masked_fill(~allowed, float("-inf"))
    extra_s, extra_v = [], []
    for i in range(2, j + 1):
        d = j - i                                                      # pass i's row p-d
        ki, vi = shift(rep(ks[i - 1]).transpose(1, 2), d).transpose(1, 2), shift(rep(vs[i - 1]).transpose(1, 2), d).transpose(1, 2)
        s = (q * ki).sum(-1, keepdim=True) * scaling                    # [B, h, T, 1]
        s = s.masked_fill((p < d)[None, None, :, None], float("-inf"))
        extra_s.append(s)
        extra_v.append(vi)
    probs = torch.softmax(torch.cat([s_main] + extra_s, dim=-1), dim=-1)
    out = probs[..., :T] @ v1
    for i, vi in enumerate(extra_v):
        out = out + probs[..., T + i: T + i + 1] * vi
    return out


def unrolled(head, b: dict, passes: int, noise: float = 0.0, scale: float = 1.0, gen=None):
    """Pass j's predicted features [B, T, H], j = 1..passes, each row p of pass j being draft j of
    the round that starts after row p-j+1 (module doc). Pass 1 reads the target's features (plus
    Gaussian noise of ``noise`` x ``scale``), pass j > 1 the head's own predictions of pass j-1
    (detached), at the previous row."""
    import torch
    pos = torch.arange(b["x"].shape[1], device=b["x"].device)[None].expand_as(b["x"])
    inp = shift(b["f"])
    if noise:
        inp = inp + torch.randn(inp.shape, generator=gen, device=inp.device) * (noise * scale)
    scaling = head.model.layers[0].self_attn.scaling
    ks, vs, outs = [], [], []
    for _ in range(passes):
        h0, q, k, v = _qkv(head, inp, b["x"], pos)
        ks.append(k)
        vs.append(v)
        pre = _finish(head, h0, _attend(q, ks, vs, scaling))
        outs.append(pre)
        inp = shift(pre.detach())
    return outs


# --------------------------------------------------------------------------- the loss

def _ce_at(b: dict, where: str):
    return (b["rows"], b["cols"]) if where == "answer" else (b["all_rows"], b["all_cols"])


def target_probs(head, b: dict, where: str = "answer"):
    """The target's next-token distribution over the head's ids (from its true features through
    the frozen norm and head) on the answer rows, or (``all``) every position of the sequences."""
    import torch
    with torch.no_grad():
        return torch.softmax(head.sub_logits(b["f"][_ce_at(b, where)]), -1)


def losses(head, pre, b: dict, scale: float, ce_weight: float, target=None, where: str = "answer"):
    """(total, feature loss, ce) of one pass: smooth L1 on features / scale over valid positions,
    soft cross-entropy against the target's distribution over the head's ids (``where``)."""
    import torch
    import torch.nn.functional as F
    v = b["valid"]
    reg = F.smooth_l1_loss(pre[v] / scale, b["f"][v] / scale)
    if target is None:
        target = target_probs(head, b, where)
    logq = torch.log_softmax(head.sub_logits(pre[_ce_at(b, where)]), -1)
    ce = -(target * logq).sum(-1).mean()
    return reg + ce_weight * ce, reg, ce


def trainable(head) -> list:
    return [p for p in head.parameters() if p.requires_grad]


def train(head, ds: FeatureSet, scale: float, cfg: dict, rep) -> dict:
    """The matched unrolled training (module doc) through ``distill.fit``'s loop. ``amp``
    "bfloat16": the passes run under bfloat16 autocast (the weights, the optimizer and the
    labels stay float32; about 1.6-1.9x the positions a second on a CPU with AMX)."""
    import torch
    tc = cfg["train"]
    dev = next(head.parameters()).device
    gen = torch.Generator(device=dev).manual_seed(cfg["seed"] + 2)
    w = tc["unroll_weights"]

    amp = tc.get("amp")
    if amp not in (None, "bfloat16"):
        raise SystemExit(f"train.amp must be absent or 'bfloat16' (got {amp!r})")

    def batch_loss(b):
        tp = target_probs(head, b, tc["ce_rows"])                      # float32 labels
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=amp is not None):
            outs = unrolled(head, b, tc["unroll"], tc["noise"], scale, gen)
            loss = sum(w[j] * losses(head, pre.float(), b, scale, tc["ce_weight"], tp, tc["ce_rows"])[0]
                       for j, pre in enumerate(outs))
        return loss, int(b["valid"].sum())
    head.train()
    res = distill.fit(trainable(head), ds, tc, cfg["seed"], rep, "train fdraft", batch_loss)
    head.eval()
    res["positions"] = res.pop("tokens")
    return res
