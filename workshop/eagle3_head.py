"""The EAGLE-3 head as a trainable torch module, with the training-time test (TTT) of EAGLE-3 and
``speculators``: the module's parameter names are the checkpoint's tensor names.

The arithmetic is ``specdec_compile/eagle3/head.py``'s (what speculators' ``Eagle3DraftModel``
computes), written out for training over whole sequences at once:

    g_0    = fc(target features at row r)                       step 0
    g_s    = the head's own output at row r, step s - 1          steps 1..
    x      = concat(input_layernorm(embed(token)), hidden_norm(g))
    h      = (hidden_norm(g) if norm_before_residual else g) + attention(x)
    h      = h + mlp(post_attention_layernorm(h))
    logits = lm_head(norm(h))                                   draft vocabulary

Row r of a sequence x_0..x_{n-1} holds, at step s, token x_{r+1+s} at position r+1+s and predicts
the target's distribution at that position (the next token). Its attention reads the step-0 keys
of rows 0..r (the rows whose target features are known) and, from each step 1..s, its own key
at row r: what the draft's cache holds when it drafts s tokens past a verified prefix
(speculators' ``extend_dense_mask_for_draft_tokens``).
"""
from __future__ import annotations

import math

import torch


class Rms(torch.nn.Module):
    def __init__(self, n: int, eps: float):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(n))
        self.eps = eps

    def forward(self, x):
        y = x.float()
        y = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * y.to(x.dtype)


class Attention(torch.nn.Module):
    def __init__(self, c: dict):
        nn = torch.nn
        super().__init__()
        H, D = c["hidden_size"], c["head_dim"]
        self.h, self.kv, self.D = c["num_attention_heads"], c["num_key_value_heads"], D
        self.q_proj = nn.Linear(2 * H, self.h * D, bias=False)
        self.k_proj = nn.Linear(2 * H, self.kv * D, bias=False)
        self.v_proj = nn.Linear(2 * H, self.kv * D, bias=False)
        self.o_proj = nn.Linear(self.h * D, H, bias=False)

    def forward(self, x, cos, sin, step_kv: list, mask0):
        """x [B, T, 2H]; step_kv: (k, v) of earlier steps (index 0: step 0); appended to."""
        B, T, _ = x.shape
        q = _rope(self.q_proj(x).view(B, T, self.h, self.D).transpose(1, 2), cos, sin)
        k = _rope(self.k_proj(x).view(B, T, self.kv, self.D).transpose(1, 2), cos, sin)
        v = self.v_proj(x).view(B, T, self.kv, self.D).transpose(1, 2)
        rep = self.h // self.kv
        step_kv.append((k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)))
        scale = 1.0 / math.sqrt(self.D)
        k0, v0 = step_kv[0]
        scores = [(q @ k0.transpose(-1, -2)).float() * scale + mask0]                  # [B, h, T, T]
        scores += [(q * kj).sum(-1, keepdim=True).float() * scale for kj, _ in step_kv[1:]]
        p = torch.softmax(torch.cat(scores, -1), -1).to(q.dtype)
        out = p[..., :T] @ v0
        for j, (_, vj) in enumerate(step_kv[1:]):
            out = out + p[..., T + j: T + j + 1] * vj
        return self.o_proj(out.transpose(1, 2).reshape(B, T, self.h * self.D))


def _rope(x, cos, sin):
    d = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., d:], x[..., :d]], -1) * sin


class Mlp(torch.nn.Module):
    def __init__(self, c: dict):
        nn = torch.nn
        super().__init__()
        H, I = c["hidden_size"], c["intermediate_size"]
        self.gate_proj, self.up_proj = nn.Linear(H, I, bias=False), nn.Linear(H, I, bias=False)
        self.down_proj = nn.Linear(I, H, bias=False)

    def forward(self, x):
        F = torch.nn.functional
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Layer(torch.nn.Module):
    def __init__(self, c: dict):
        super().__init__()
        H, eps = c["hidden_size"], c["rms_norm_eps"]
        self.input_layernorm, self.hidden_norm = Rms(H, eps), Rms(H, eps)
        self.post_attention_layernorm = Rms(H, eps)
        self.self_attn, self.mlp = Attention(c), Mlp(c)


class Eagle3Head(torch.nn.Module):
    """fc, one decoder layer reading 2H, norm, lm_head over the draft vocabulary; the target's
    embedding table is a frozen buffer (not saved: the checkpoint reads the target's)."""

    def __init__(self, c: dict, n_aux: int, draft_vocab: int, embedding, norm_before_residual: bool = False):
        nn = torch.nn
        super().__init__()
        H = c["hidden_size"]
        self.c, self.n_aux, self.norm_before_residual = c, n_aux, norm_before_residual
        self.fc = nn.Linear(n_aux * H, H, bias=False)
        self.layers = nn.ModuleList([Layer(c)])
        self.norm = Rms(H, c["rms_norm_eps"])
        self.lm_head = nn.Linear(H, draft_vocab, bias=False)
        self.register_buffer("embed", embedding, persistent=False)
        D = c["head_dim"]
        self.register_buffer("inv_freq", 1.0 / (c["rope_theta"] ** (torch.arange(0, D, 2).float() / D)),
                             persistent=False)

    def rotary(self, pos, dtype):
        ang = pos[..., None].float() * self.inv_freq
        ang = torch.cat([ang, ang], -1)[:, None]                       # [B, 1, T, D]
        return ang.cos().to(dtype), ang.sin().to(dtype)

    def step(self, tokens, g, pos, step_kv, mask0):
        """One TTT step: (logits over the draft vocabulary, h) for every row."""
        lay = self.layers[0]
        e = self.embed[tokens].to(g.dtype)
        normed = lay.hidden_norm(g)
        residual = normed if self.norm_before_residual else g
        cos, sin = self.rotary(pos, g.dtype)
        x = torch.cat([lay.input_layernorm(e), normed], -1)
        h = residual + lay.self_attn(x, cos, sin, step_kv, mask0)
        h = h + lay.mlp(lay.post_attention_layernorm(h))
        return self.lm_head(self.norm(h)), h

    def forward(self, feats, tokens_at, pos0, steps: int, mask0):
        """Logits per step. ``tokens_at(s)``: the tokens rows hold at step s; positions pos0 + s."""
        g = self.fc(feats.to(self.fc.weight.dtype))      # float16 features; autocast takes it from here
        step_kv: list = []
        out = []
        for s in range(steps):
            logits, g = self.step(tokens_at(s), g, pos0 + s, step_kv, mask0)
            out.append(logits)
        return out


def causal_mask(T: int, device):
    """Additive [1, 1, T, T]: row r reads step-0 rows 0..r."""
    m = torch.full((T, T), -1e9, device=device).triu(1)
    return m[None, None]


def init_from_target(head: Eagle3Head, lm_rows, final_norm, seed: int) -> None:
    """Seeded normal(0, 0.02) weights, norms at 1; lm_head and norm from the target's head rows
    of the draft vocabulary and its final norm (speculators initializes them from the verifier)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in head.named_parameters():
            if name.endswith("norm.weight") or name.endswith("layernorm.weight"):
                p.fill_(1.0)
            else:
                p.copy_(torch.randn(p.shape, generator=g) * 0.02)
        head.lm_head.weight.copy_(lm_rows)
        head.norm.weight.copy_(final_norm)
