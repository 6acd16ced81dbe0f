"""A tiny EAGLE-style feature draft, exported by torch.onnx (dynamo), cached.

The head: a token embedding (in EAGLE, the target's, frozen), a linear layer
reducing ``concat[embedding ; target features]`` to the hidden size, one
Llama decoder layer with a KV cache, the final norm and an LM head. Its
inputs: ``input_ids``, ``hidden_states`` ``[batch, seq, F]`` (F = n layers x
the target's hidden size), ``attention_mask``, ``position_ids`` and the past
K/V, the form ``tests/models.py`` exports decoders in, so the compiler sees a
stock dynamo export with one extra float input. Random weights, fixed seed:
the tests check the rewrite against the export, not what the head predicts.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil

from models import CACHE, VOCAB, _versions

HIDDEN = 64

#: a model whose layer outputs are refused: OPT with its norms after the residual Adds (post-norm),
#: so the stream is normalized between layers (exported with tests/models.py's export_spec)
POST_NORM = dict(kind="opt", exporter="optimum",
                 config=dict(vocab_size=VOCAB, hidden_size=64, ffn_dim=96, num_hidden_layers=2,
                             num_attention_heads=4, word_embed_proj_dim=64, max_position_embeddings=512,
                             do_layer_norm_before=False, pad_token_id=1, bos_token_id=2, eos_token_id=2))


def _head(n_features: int, seed: int = 0):
    import torch
    from transformers import LlamaConfig, LlamaModel

    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=96, num_hidden_layers=1,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                      rms_norm_eps=1e-5, tie_word_embeddings=False, attn_implementation="eager")
    torch.manual_seed(seed)

    class EagleHead(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(VOCAB, HIDDEN)
            self.fc = torch.nn.Linear(HIDDEN + n_features * HIDDEN, HIDDEN)
            self.model = LlamaModel(cfg)
            self.lm_head = torch.nn.Linear(HIDDEN, VOCAB, bias=False)

        def forward(self, input_ids, attention_mask, position_ids, hidden_states, *flat_past):
            from transformers.cache_utils import DynamicCache
            cache = DynamicCache()
            cache.update(flat_past[0], flat_past[1], 0)
            x = self.fc(torch.cat([self.embed(input_ids), hidden_states], dim=-1))
            o = self.model(inputs_embeds=x, attention_mask=attention_mask, position_ids=position_ids,
                           past_key_values=cache, use_cache=True)
            layer = o.past_key_values.layers[0]
            return self.lm_head(o.last_hidden_state), layer.keys, layer.values

    head = EagleHead()
    head.eval()
    return head


def export_feature_draft(n_features: int = 1) -> "os.PathLike":
    """Path of the cached ``model.onnx`` of a feature draft reading ``n_features``
    target layers (feature width ``n_features * 64``)."""
    from pathlib import Path

    import torch

    key = hashlib.sha256((json.dumps({"n": n_features, "h": HIDDEN}) + _versions() + "eagle-v2").encode()).hexdigest()[:12]
    final = Path(CACHE) / f"feature-draft-{n_features}-{key}"
    if (final / "model.onnx").exists():
        return final / "model.onnx"
    work = Path(CACHE) / f".tmp-feature-draft-{os.getpid()}"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    b, s, p = 2, 3, 5
    args = (torch.randint(0, VOCAB, (b, s)), torch.ones(b, p + s, dtype=torch.int64),
            torch.arange(p, p + s).unsqueeze(0).expand(b, s).contiguous(), torch.randn(b, s, n_features * HIDDEN),
            torch.randn(b, 2, p, HIDDEN // 4), torch.randn(b, 2, p, HIDDEN // 4))
    B = torch.export.Dim("batch", min=1, max=64)
    S = torch.export.Dim("seq", min=1, max=256)
    P = torch.export.Dim("past", min=1, max=1024)
    dyn = {"input_ids": {0: B, 1: S}, "attention_mask": {0: B, 1: torch.export.Dim.AUTO},
           "position_ids": {0: B, 1: S}, "hidden_states": {0: B, 1: S}, "flat_past": ({0: B, 2: P}, {0: B, 2: P})}
    torch.onnx.export(_head(n_features), args, str(work / "model.onnx"), dynamo=True,
                      input_names=["input_ids", "attention_mask", "position_ids", "hidden_states", "past_k_0",
                                   "past_v_0"],
                      output_names=["logits", "new_k_0", "new_v_0"], dynamic_shapes=dyn, external_data=False,
                      optimize=True)
    try:
        work.rename(final)
    except OSError:  # another process won the race
        shutil.rmtree(work, ignore_errors=True)
    return final / "model.onnx"


if __name__ == "__main__":
    import sys
    for n in sys.argv[1:] or ["1"]:
        print(export_feature_draft(int(n)))
