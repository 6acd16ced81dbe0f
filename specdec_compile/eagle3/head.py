"""The EAGLE-3 head as a torch module, exported by torch.onnx (dynamo) into a feature draft.

The module computes what ``speculators``' ``Eagle3DraftModel`` computes for one
drafting step, with a KV cache instead of its training-time masks
(docs/import-head.md):

    feats, own = x[..., :n*H], x[..., n*H:]          the input: [n target layers ; own slot]
    feats      = input_norm(feats)                    norm_before_fc (one RMSNorm over n*H)
               | concat(fc_norm_i(feats_i))           fc_norm (one RMSNorm per layer)
    g          = fc(feats) + (norm(own) if norm_output else own)
    e          = embed_tokens(token)                  the target's table
    a          = attention(concat(input_layernorm(e), hidden_norm(g)))    q/k/v read 2H
    h          = (hidden_norm(g) if norm_before_residual else g) + a
    h          = h + mlp(post_attention_layernorm(h))
    logits     = lm_head(norm(h))                     draft vocabulary, spread over the target's

A row fed with the target's features carries zeros in the own slot, a drafted
row zeros in the feature part: RMSNorm(0) = 0 and fc has no bias, so
``g`` is exactly fc(features) or exactly the head's own state (``norm(h)``
when ``norm_output``, as speculators feeds it back; else ``h``). The graph's
``draft_hidden_states`` (added by the compiler: the residual stream after the
layer) is ``h``. The draft's logits are spread over the target's vocabulary by
one Gather: draft index i lands on target id i + d2t[i], every other id gets
``PAD_LOGIT`` (softmax gives it exactly 0), the output of one extra LM-head row
of zero weights and bias ``PAD_LOGIT`` (the real rows' bias is 0: exact).

torch and transformers (the ``test`` extra) are imported only when exporting.
"""
from __future__ import annotations

import contextlib
import io
import logging
import os
import types
import warnings
from pathlib import Path

import numpy as np

from ..errors import SpecdecError
from .checkpoint import Eagle3Checkpoint

PAD_LOGIT = -1.0e4    # finite (no inf - inf), below any real logit; exp() of it underflows to 0
#: how the draft's logits are spread over the target's vocabulary (``_build``)
SPREADS = ("gather", "scatter")
INPUT_NAMES = ["input_ids", "attention_mask", "position_ids", "hidden_states", "past_k_0", "past_v_0"]
OUTPUT_NAMES = ["logits", "new_k_0", "new_v_0"]


def _torch():
    try:
        import torch
        import transformers  # noqa: F401
    except ImportError as e:
        raise SpecdecError(f"import-head exports the head with torch and transformers ({e.name} is not installed): "
                           f"pip install 'specdec-compile[test]'") from None
    return torch


def _layer_config(ck: Eagle3Checkpoint):
    from transformers import LlamaConfig, Qwen3Config
    rope = dict(ck.rope)
    kind, theta = rope.pop("type"), rope.pop("theta")
    scaling = None if kind == "default" else {"rope_type": kind, **rope}
    common = dict(vocab_size=ck.target_vocab, hidden_size=ck.hidden_size, intermediate_size=ck.intermediate_size,
                  num_hidden_layers=1, num_attention_heads=ck.num_heads, num_key_value_heads=ck.num_kv_heads,
                  head_dim=ck.head_dim, rms_norm_eps=ck.eps, max_position_embeddings=ck.max_positions,
                  rope_theta=theta, rope_scaling=scaling, attention_bias=ck.attention_bias,
                  tie_word_embeddings=False, attn_implementation="eager")
    if ck.family == "llama":
        return LlamaConfig(mlp_bias=ck.mlp_bias, **common)
    return Qwen3Config(use_sliding_window=False, **common)


def _first_layer_forward(self, hidden_states, attention_mask=None, position_ids=None, past_key_values=None,
                         use_cache=False, cache_position=None, position_embeddings=None, **kwargs):
    """The EAGLE-3 decoder layer: ``hidden_states`` is concat(embedding, g), 2H wide."""
    H = hidden_states.shape[-1] // 2      # static: slices, not a Split (lower.py sizes a Split from shape
    embeds, g = hidden_states[..., :H], hidden_states[..., H:]   # inference, which MatMulNBits stops)
    normed = self.hidden_norm(g)
    residual = normed if self.norm_before_residual else g
    import torch
    x = torch.cat([self.input_layernorm(embeds), normed], dim=-1)
    a, _ = self.self_attn(hidden_states=x, attention_mask=attention_mask, position_ids=position_ids,
                          past_key_values=past_key_values, use_cache=use_cache, cache_position=cache_position,
                          position_embeddings=position_embeddings, **kwargs)
    h = residual + a
    return h + self.mlp(self.post_attention_layernorm(h))


def _build(ck: Eagle3Checkpoint, embedding: np.ndarray, target_ids: np.ndarray, spread: str = "gather"):
    """The head as a torch module. ``spread`` (a draft vocabulary smaller than the target's): "gather"
    (one more LM-head row, then a Gather over the target's ids: ops with Cloud AI 100 precedent) or
    "scatter" (a ScatterElements into a row of PAD_LOGIT: the same values, cheaper on a CPU)."""
    if spread not in SPREADS:
        raise AssertionError(f"spread {spread!r} is not one of {SPREADS}")
    torch = _torch()
    from transformers import LlamaModel, Qwen3Model

    cfg = _layer_config(ck)
    H, n = ck.hidden_size, ck.n_aux
    t = {k: torch.from_numpy(np.array(v, dtype=np.float32)) for k, v in ck.tensors.items()
         if v.dtype.kind == "f"}

    class Eagle3Head(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = (LlamaModel if ck.family == "llama" else Qwen3Model)(cfg)
            layer = self.model.layers[0]
            att = layer.self_attn
            for p in ("q_proj", "k_proj", "v_proj"):
                old = getattr(att, p)
                setattr(att, p, torch.nn.Linear(2 * H, old.out_features, bias=old.bias is not None))
            norm_cls = type(layer.input_layernorm)
            layer.hidden_norm = norm_cls(H, eps=ck.eps)
            layer.norm_before_residual = ck.flags["norm_before_residual"]
            layer.forward = types.MethodType(_first_layer_forward, layer)
            self.model.norm = torch.nn.Identity()       # the stream after the layer is h; norm applied below
            self.fc = torch.nn.Linear(n * H, H, bias=False)
            self.norm = norm_cls(H, eps=ck.eps)
            self.lm_head = torch.nn.Linear(H, ck.draft_vocab, bias=False)
            self.input_norm = norm_cls(n * H, eps=ck.eps) if ck.flags["norm_before_fc"] else None
            self.fc_norm = (torch.nn.ModuleList([norm_cls(H, eps=ck.eps) for _ in range(n)])
                            if ck.flags["fc_norm"] else None)
            spreads = not np.array_equal(target_ids, np.arange(ck.target_vocab))
            cols = np.full(ck.target_vocab, ck.draft_vocab, np.int64)
            cols[target_ids] = np.arange(ck.draft_vocab)
            gather, scatter = spreads and spread == "gather", spreads and spread == "scatter"
            self.register_buffer("columns", torch.from_numpy(cols) if gather else None, persistent=False)
            self.register_buffer("target_ids", torch.from_numpy(np.asarray(target_ids, np.int64)) if scatter
                                 else None, persistent=False)

        def forward(self, input_ids, attention_mask, position_ids, hidden_states, past_k, past_v):
            from transformers.cache_utils import DynamicCache
            cache = DynamicCache()
            cache.update(past_k, past_v, 0)
            feats, own = hidden_states[..., : n * H], hidden_states[..., n * H:]
            if self.input_norm is not None:
                feats = self.input_norm(feats)
            if self.fc_norm is not None:
                feats = torch.cat([m(feats[..., i * H:(i + 1) * H]) for i, m in enumerate(self.fc_norm)], dim=-1)
            g = self.fc(feats) + (self.norm(own) if ck.flags["norm_output"] else own)
            x = torch.cat([self.model.embed_tokens(input_ids), g], dim=-1)
            o = self.model(inputs_embeds=x, attention_mask=attention_mask, position_ids=position_ids,
                           past_key_values=cache, use_cache=True)
            logits = self.lm_head(self.norm(o.last_hidden_state))
            if self.columns is not None:   # lm_head has one more row, all zeros with bias PAD_LOGIT (no Pad op)
                logits = logits.index_select(-1, self.columns)
            elif self.target_ids is not None:   # draft index i -> target id target_ids[i], PAD_LOGIT elsewhere
                rows = logits.shape[:-1]
                pad = torch.full((*rows, ck.target_vocab), PAD_LOGIT, dtype=logits.dtype)
                logits = pad.scatter(-1, self.target_ids.expand(*rows, -1), logits)
            kv = o.past_key_values.layers[0]
            return logits, kv.keys, kv.values

    head = Eagle3Head()
    state = {"model.embed_tokens.weight": torch.from_numpy(np.array(embedding, dtype=np.float32))}
    for k, v in t.items():
        if k.startswith("layers.0."):
            state["model." + k] = v
        elif k != "embed_tokens.weight":
            state[k] = v
    missing, unexpected = head.load_state_dict(state, strict=False)
    missing = [m for m in missing if not m.endswith("inv_freq")]
    if missing or unexpected:    # checkpoint.check_tensors made this impossible; a bug if it shows
        raise AssertionError(f"head weights do not fit: missing {missing}, unexpected {unexpected}")
    if head.columns is not None:
        _pad_row(torch, head)
    return head.eval()


def _pad_row(torch, head) -> None:
    """The LM head with one more row (weights 0, bias PAD_LOGIT; the real rows' bias 0, exact): the
    column a target id outside the draft vocabulary gathers. MatMul, Add, Gather: ops the device has."""
    old = head.lm_head
    new = torch.nn.Linear(old.in_features, old.out_features + 1, bias=True)
    with torch.no_grad():
        new.weight.zero_()
        new.weight[:-1] = old.weight
        new.bias.zero_()
        new.bias[-1] = PAD_LOGIT
    head.lm_head = new


@contextlib.contextmanager
def _quiet():
    """The exporter's progress lines and warnings kept off our stdout (SPECDEC_DEBUG=1 shows them)."""
    if os.environ.get("SPECDEC_DEBUG"):
        yield
        return
    with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        logging.getLogger("torch").setLevel(logging.ERROR)
        yield


def export_head(ck: Eagle3Checkpoint, embedding: np.ndarray, target_ids: np.ndarray, out: Path,
                spread: str = "gather") -> Path:
    """Write the head's ONNX export (one file, weights inside) to ``out``/model.onnx (``spread``: ``_build``'s)."""
    torch = _torch()
    head = _build(ck, embedding, target_ids, spread)
    H, n, kvh, hd = ck.hidden_size, ck.n_aux, ck.num_kv_heads, ck.head_dim
    b, s, past = 2, 3, 4
    args = (torch.zeros(b, s, dtype=torch.int64), torch.ones(b, past + s, dtype=torch.int64),
            torch.arange(past, past + s).repeat(b, 1), torch.zeros(b, s, (n + 1) * H),
            torch.zeros(b, kvh, past, hd), torch.zeros(b, kvh, past, hd))
    D = torch.export.Dim
    batch, seq, cache = D("batch", min=1, max=64), D("seq", min=1, max=1024), D("past", min=1, max=1 << 16)
    dyn = {"input_ids": {0: batch, 1: seq}, "attention_mask": {0: batch, 1: D.AUTO},
           "position_ids": {0: batch, 1: seq}, "hidden_states": {0: batch, 1: seq},
           "past_k": {0: batch, 2: cache}, "past_v": {0: batch, 2: cache}}
    out.mkdir(parents=True, exist_ok=True)
    path = out / "model.onnx"
    with torch.inference_mode(), _quiet():
        torch.onnx.export(head, args, str(path), dynamo=True, input_names=INPUT_NAMES, output_names=OUTPUT_NAMES,
                          dynamic_shapes=dyn, external_data=False, optimize=True, verbose=False)
    return path
