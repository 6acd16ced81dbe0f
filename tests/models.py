"""Tiny random-weight decoder LMs, exported by stock exporters, cached on disk.

Nothing is downloaded: every model is built from a ``transformers`` config
with a fixed seed, then exported with ``optimum-cli export onnx --task
text-generation-with-past`` or ``torch.onnx.export(dynamo=True)``. Exports are
cached under ``build/fixtures/<name>-<key>/`` so a test session (and the next
one) builds each model once; the key changes with the config and the library
versions.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CACHE = Path(os.environ.get("SPECDEC_FIXTURE_CACHE", ROOT / "build" / "fixtures"))

VOCAB = 211  # small and odd, so no dim is accidentally equal to another

CONFIGS = {
    # Llama with grouped-query attention (4 query heads share 2 KV heads)
    "llama_gqa": dict(
        kind="llama", exporter="optimum",
        config=dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                    rms_norm_eps=1e-5, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2),
    ),
    "gpt2": dict(
        kind="gpt2", exporter="optimum",
        config=dict(vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4, n_positions=512,
                    bos_token_id=1, eos_token_id=2),
    ),
    "codegen": dict(
        kind="codegen", exporter="optimum",
        config=dict(vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4, rotary_dim=8,
                    n_positions=512, n_ctx=512, bos_token_id=1, eos_token_id=2),
    ),
    # a decoder exported *without* a KV cache (--task text-generation): must be refused
    "llama_nocache": dict(
        kind="llama", exporter="optimum-nocache",
        config=dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                    num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=128,
                    tie_word_embeddings=False),
    ),
    "llama_dynamo": dict(
        kind="llama", exporter="dynamo",
        config=dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                    rms_norm_eps=1e-5, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2),
    ),
}


#: rotary and positional variants for the qaic lowering (issue 13): every family
#: whose qaic artifact must use only ops with device precedent. Entries another
#: change already defines under the same name are kept as they are.
_QAIC_FAMILIES = {
    "qwen2": dict(kind="qwen2", exporter="optimum",
                  config=dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                              tie_word_embeddings=False, bos_token_id=1, eos_token_id=2)),
    "mistral": dict(kind="mistral", exporter="optimum",
                    config=dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                                sliding_window=4096, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2)),
    # partial rotary: 4 of 16 head dims
    "gpt_neox": dict(kind="gpt_neox", exporter="optimum",
                     config=dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                 num_attention_heads=4, rotary_pct=0.25, max_position_embeddings=4096,
                                 bos_token_id=1, eos_token_id=2)),
    # interleaved rotary over 8 of 16 head dims, sin/cos from a position table
    "gptj": dict(kind="gptj", exporter="optimum",
                 config=dict(vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4, rotary_dim=8, n_positions=4096,
                             bos_token_id=1, eos_token_id=2)),
    "phi3": dict(kind="phi3", exporter="optimum",
                 config=dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=4096,
                             original_max_position_embeddings=4096, pad_token_id=0, bos_token_id=1,
                             eos_token_id=2, tie_word_embeddings=False)),
    # learned positions
    "opt": dict(kind="opt", exporter="optimum",
                config=dict(vocab_size=VOCAB, hidden_size=64, ffn_dim=96, num_hidden_layers=2,
                            num_attention_heads=4, word_embed_proj_dim=64, max_position_embeddings=4096,
                            pad_token_id=1, bos_token_id=2, eos_token_id=2)),
    # scaled ropes: llama3 (inv_freq rescaled) and yarn (inv_freq blended, cos/sin scaled)
    "llama3_rope": dict(kind="llama", exporter="optimum",
                        config=dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                                    rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0,
                                                      high_freq_factor=4.0, original_max_position_embeddings=64),
                                    tie_word_embeddings=False, bos_token_id=1, eos_token_id=2)),
    "qwen2_yarn": dict(kind="qwen2", exporter="optimum",
                       config=dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                                   rope_scaling=dict(rope_type="yarn", factor=4.0,
                                                     original_max_position_embeddings=1024),
                                   tie_word_embeddings=False, bos_token_id=1, eos_token_id=2)),
}
CONFIGS.update({name: spec for name, spec in _QAIC_FAMILIES.items() if name not in CONFIGS})


def _versions() -> str:
    import torch
    import transformers
    try:
        import optimum.onnx as oo  # noqa: F401
        from importlib.metadata import version
        opt = version("optimum-onnx")
    except Exception:  # pragma: no cover
        opt = "none"
    return f"torch={torch.__version__};transformers={transformers.__version__};optimum-onnx={opt}"


def _key(spec: dict) -> str:
    text = json.dumps(spec, sort_keys=True) + _versions() + "v2"
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def build_hf_model(name_or_spec, seed: int = 0):
    """The random-weight torch model of fixture ``name`` (or of a spec like
    the values of ``CONFIGS``), float32 unless the spec says ``dtype``, eval mode."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    spec = CONFIGS[name_or_spec] if isinstance(name_or_spec, str) else name_or_spec
    config = AutoConfig.for_model(spec["kind"], **spec["config"])
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    model.eval()
    return model


def _export_optimum(model, out: Path, work: Path, task: str = "text-generation-with-past",
                    dtype: str | None = None) -> None:
    hf_dir = work / "hf"
    model.save_pretrained(hf_dir)
    cmd = [sys.executable, "-m", "optimum.commands.optimum_cli", "export", "onnx",
           "--model", str(hf_dir), "--task", task, str(out)]
    if dtype:
        cmd += ["--dtype", dtype]
    exe = shutil.which("optimum-cli", path=str(Path(sys.executable).parent))
    if exe:
        cmd = [exe] + cmd[3:]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0 or not (out / "model.onnx").exists():
        raise RuntimeError(f"optimum export failed:\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}")


def _export_dynamo(model, out: Path) -> None:
    import torch
    from transformers.cache_utils import DynamicCache

    cfg = model.config
    n_layers = cfg.num_hidden_layers
    kv = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
    hd = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads

    class Wrapper(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, input_ids, attention_mask, position_ids, *flat_past):
            cache = DynamicCache()
            for i in range(n_layers):
                cache.update(flat_past[2 * i], flat_past[2 * i + 1], i)
            o = self.m(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                       past_key_values=cache, use_cache=True)
            pkv = o.past_key_values
            flat = []
            for i in range(n_layers):
                layer = pkv.layers[i] if hasattr(pkv, "layers") else None
                k = layer.keys if layer is not None else pkv.key_cache[i]
                v = layer.values if layer is not None else pkv.value_cache[i]
                flat += [k, v]
            return (o.logits, *flat)

    b, s, p = 2, 3, 5
    ids = torch.randint(0, cfg.vocab_size, (b, s))
    am = torch.ones(b, p + s, dtype=torch.int64)
    pos = torch.arange(p, p + s).unsqueeze(0).expand(b, s).contiguous()
    past = [torch.randn(b, kv, p, hd) for _ in range(2 * n_layers)]
    names_in = ["input_ids", "attention_mask", "position_ids"]
    names_out = ["logits"]
    for i in range(n_layers):
        names_in += [f"past_k_{i}", f"past_v_{i}"]
        names_out += [f"new_k_{i}", f"new_v_{i}"]
    B = torch.export.Dim("batch", min=1, max=64)
    S = torch.export.Dim("seq", min=1, max=256)
    P = torch.export.Dim("past", min=1, max=1024)
    T = torch.export.Dim.AUTO
    dyn = {"input_ids": {0: B, 1: S}, "attention_mask": {0: B, 1: T}, "position_ids": {0: B, 1: S},
           "flat_past": tuple({0: B, 2: P} for _ in range(2 * n_layers))}
    torch.onnx.export(Wrapper(model), (ids, am, pos, *past), str(out / "model.onnx"), dynamo=True,
                      input_names=names_in, output_names=names_out, dynamic_shapes=dyn,
                      external_data=False, optimize=True)


def export_fixture(name: str) -> Path:
    """Path to the cached ``model.onnx`` of fixture ``name``, exporting it if needed."""
    return export_spec(name, CONFIGS[name])


def export_spec(name: str, spec: dict) -> Path:
    """Path to the cached ``model.onnx`` of ``spec`` (``kind``: model_type,
    ``exporter``: optimum | optimum-nocache | dynamo, ``config``: overrides,
    optional ``dtype``: fp16 | bf16 for optimum), exporting it if needed."""
    final = CACHE / f"{name}-{_key(spec)}"
    if (final / "model.onnx").exists():
        return final / "model.onnx"
    CACHE.mkdir(parents=True, exist_ok=True)
    work = CACHE / f".tmp-{name}-{os.getpid()}"
    shutil.rmtree(work, ignore_errors=True)
    out = work / "onnx"
    out.mkdir(parents=True)
    model = build_hf_model(spec)
    if spec["exporter"] == "optimum":
        _export_optimum(model, out, work, dtype=spec.get("dtype"))
    elif spec["exporter"] == "optimum-nocache":
        _export_optimum(model, out, work, task="text-generation")
    else:
        _export_dynamo(model, out)
    shutil.rmtree(work / "hf", ignore_errors=True)
    try:
        out.rename(final)
    except OSError:  # another process won the race
        pass
    shutil.rmtree(work, ignore_errors=True)
    return final / "model.onnx"


def mlp_model():
    """A two-layer MLP: an ONNX model that is not a decoder LM at all."""
    import numpy as np
    import onnx
    from onnx import helper as h, numpy_helper as nh

    rng = np.random.default_rng(0)
    w1 = nh.from_array(rng.standard_normal((16, 32)).astype(np.float32), "w1")
    w2 = nh.from_array(rng.standard_normal((32, 4)).astype(np.float32), "w2")
    nodes = [h.make_node("MatMul", ["x", "w1"], ["h"]), h.make_node("Relu", ["h"], ["r"]),
             h.make_node("MatMul", ["r", "w2"], ["y"])]
    g = h.make_graph(nodes, "mlp", [h.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["n", 16])],
                     [h.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["n", 4])], [w1, w2])
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17)])


if __name__ == "__main__":
    for n in sys.argv[1:] or [c for c in CONFIGS if c != "llama_nocache"]:
        print(n, export_fixture(n))
