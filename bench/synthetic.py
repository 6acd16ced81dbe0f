"""A synthetic Llama-shaped optimum export with multi-GB external weights, built by streaming.

Instantiating a 1B-parameter model in torch and exporting it would need several
times its size in memory and minutes of tracing. Instead:

1. export a *template* with ``optimum-cli export onnx --task
   text-generation-with-past``: a real Llama with the target's depth (24
   layers) and head_dim (64) but 2 heads, hidden 128, intermediate 96 and
   vocab 211 (distinct small numbers, so every dim of every weight says what it
   is). The graph optimum emits for Llama reshapes by ``(-1, head_dim)`` and
   carries no other width, so it is valid for any hidden size with the same
   head_dim and no grouped-query attention (kv heads == heads);
2. copy the graph, give every weight the big shape (128 -> hidden, 96 ->
   intermediate, 211 -> vocab) and the KV inputs/outputs the big head count, and
   write the weights as external data one tensor at a time from a fixed 4 MiB
   block of pseudo-random float32 values: memory stays at a few MiB whatever the
   model size.

``check`` runs a scaled model in ONNX Runtime: with a wrong shape anywhere the
session fails.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

SMALL = {"hidden": 128, "intermediate": 96, "vocab": 211, "heads": 2}
HEAD_DIM = 64
BLOCK = 4 << 20


def template(cache: Path, layers: int = 24) -> Path:
    """The small optimum export (cached)."""
    out = cache / f"template-l{layers}"
    if (out / "model.onnx").exists():
        return out / "model.onnx"
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    conf = LlamaConfig(vocab_size=SMALL["vocab"], hidden_size=SMALL["hidden"],
                       intermediate_size=SMALL["intermediate"], num_hidden_layers=layers,
                       num_attention_heads=SMALL["heads"], num_key_value_heads=SMALL["heads"],
                       max_position_embeddings=4096, rms_norm_eps=1e-5, tie_word_embeddings=False)
    torch.manual_seed(0)
    model = LlamaForCausalLM._from_config(conf, attn_implementation="eager")
    with torch.no_grad():  # distinct norm weights, so no initializer is deduplicated away
        for n, p in model.named_parameters():
            if p.dim() == 1:
                p.copy_(1.0 + 0.01 * torch.randn_like(p))
    tmp = cache / f".template-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp / "hf")
    exe = shutil.which("optimum-cli", path=str(Path(sys.executable).parent)) or "optimum-cli"
    res = subprocess.run([exe, "export", "onnx", "--model", str(tmp / "hf"), "--task",
                          "text-generation-with-past", str(tmp / "onnx")], capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"template export failed: {res.stderr[-2000:]}")
    shutil.rmtree(out, ignore_errors=True)
    (tmp / "onnx").rename(out)
    shutil.rmtree(tmp, ignore_errors=True)
    return out / "model.onnx"


def _block(seed: int = 0):
    import numpy as np
    return (np.random.default_rng(seed).standard_normal(BLOCK // 4).astype("float32") * 0.02).tobytes()


def _write_weights(g, data_path: Path, dim_map: dict) -> tuple[int, int]:
    """Every float initializer with a dimension in ``dim_map`` scaled to the new sizes and
    streamed to ``data_path`` as external data (filled with one repeated random block).
    Returns (bytes written, tensors written)."""
    from onnx import TensorProto
    data_name = data_path.name
    block = _block()
    offset = 0
    n_big = 0
    with open(data_path, "wb") as f:
        for t in g.initializer:
            if t.data_type != TensorProto.FLOAT or len(t.dims) == 0 or not any(d in dim_map for d in t.dims):
                continue
            new_dims = [dim_map.get(d, d) for d in t.dims]
            nbytes = 4
            for d in new_dims:
                nbytes *= d
            # align every tensor to 4 KiB, like onnx's external-data writer does for mmap
            pad = (-offset) % 4096
            if pad:
                f.write(b"\0" * pad)
                offset += pad
            left = nbytes
            while left:
                n = min(left, len(block))
                f.write(block[:n])
                left -= n
            t.ClearField("raw_data")
            t.ClearField("float_data")
            del t.dims[:]
            t.dims.extend(new_dims)
            t.data_location = TensorProto.EXTERNAL
            del t.external_data[:]
            for k, v in (("location", data_name), ("offset", str(offset)), ("length", str(nbytes))):
                e = t.external_data.add()
                e.key, e.value = k, v
            offset += nbytes
            n_big += 1
    return offset, n_big


def scale(template_path: Path, out_dir: Path, *, hidden: int = 2048, intermediate: int = 5632,
          vocab: int = 32000) -> dict:
    """Write ``out_dir/model.onnx`` + ``model.onnx.data``; returns a description (cached by key)."""
    import onnx

    if hidden % HEAD_DIM:
        raise ValueError("hidden must be a multiple of 64")
    heads = hidden // HEAD_DIM
    dim_map = {SMALL["hidden"]: hidden, SMALL["intermediate"]: intermediate, SMALL["vocab"]: vocab}
    key = hashlib.sha256(json.dumps([hashlib.sha256(template_path.read_bytes()).hexdigest(), hidden, intermediate, vocab,
                                     "v2"]).encode()).hexdigest()[:12]
    desc_path = out_dir / "synthetic.json"
    if desc_path.exists():
        try:
            desc = json.loads(desc_path.read_text())
            if desc.get("key") == key and (out_dir / desc["data_file"]).stat().st_size == desc["weight_bytes"]:
                return desc
        except (OSError, ValueError, KeyError):
            pass
    shutil.rmtree(out_dir, ignore_errors=True)
    out_dir.mkdir(parents=True)

    m = onnx.load(str(template_path), load_external_data=True)
    g = m.graph
    data_name = "model.onnx.data"
    offset, n_big = _write_weights(g, out_dir / data_name, dim_map)
    # interface: KV heads and vocab are the only static dims that change
    for vi in list(g.input) + list(g.output):
        dims = vi.type.tensor_type.shape.dim
        name = vi.name
        if ("past_key_values" in name or name.startswith("present")) and len(dims) == 4:
            if dims[1].HasField("dim_value"):
                dims[1].dim_value = heads
        if name == "logits" and len(dims) == 3 and dims[2].HasField("dim_value"):
            dims[2].dim_value = vocab
    del g.value_info[:]
    onnx.save(m, str(out_dir / "model.onnx"))
    # the exporter's config.json, scaled too (optimum writes one next to the model)
    conf_path = template_path.parent / "config.json"
    if conf_path.exists():
        conf = json.loads(conf_path.read_text())
        conf.update(hidden_size=hidden, intermediate_size=intermediate, vocab_size=vocab,
                    num_attention_heads=heads, num_key_value_heads=heads, head_dim=HEAD_DIM)
        (out_dir / "config.json").write_text(json.dumps(conf, indent=2, sort_keys=True) + "\n")
    layers = sum(1 for i in g.input if i.name.endswith(".key") and i.name.startswith("past_key_values"))
    desc = {"key": key, "layers": layers, "hidden": hidden, "heads": heads, "kv_heads": heads,
            "head_dim": HEAD_DIM, "intermediate": intermediate, "vocab": vocab, "dtype": "float32",
            "weight_tensors": n_big, "weight_bytes": offset, "data_file": data_name,
            "graph_bytes": (out_dir / "model.onnx").stat().st_size}
    desc_path.write_text(json.dumps(desc, indent=1))
    return desc


def check(model_path: Path) -> None:
    """Run one decode step of a (small!) scaled model in ONNX Runtime."""
    import numpy as np
    import onnxruntime as ort
    s = ort.InferenceSession(str(model_path), providers=["CPUExecutionProvider"])
    feeds = {}
    past = 3
    for i in s.get_inputs():
        if i.name == "input_ids":
            feeds[i.name] = np.array([[1, 2]], dtype=np.int64)
        elif i.name == "attention_mask":
            feeds[i.name] = np.ones((1, past + 2), dtype=np.int64)
        elif i.name == "position_ids":
            feeds[i.name] = np.array([[past, past + 1]], dtype=np.int64)
        else:
            feeds[i.name] = np.zeros((1, i.shape[1], past, i.shape[3]), dtype=np.float32)
    out = s.run(None, feeds)
    assert np.isfinite(out[0]).all(), "non-finite logits"


if __name__ == "__main__":
    import argparse
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    ap.add_argument("--cache", type=Path, default=Path("build/bench"))
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--intermediate", type=int, default=5632)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--check", action="store_true")
    a = ap.parse_args()
    t = template(a.cache, a.layers)
    d = scale(t, a.out, hidden=a.hidden, intermediate=a.intermediate, vocab=a.vocab)
    print(json.dumps(d))
    if a.check:
        check(a.out / "model.onnx")
        print("ort: ok")
