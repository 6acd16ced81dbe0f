"""``backends`` section: one model on ONNX Runtime f32, OpenVINO f32 and OpenVINO bf16, side by side.

    python -m bench.backends --export build/demo/export/tlm/model.onnx --tokenizer build/demo/tokenizer

SmolLM2-135M-Instruct's export (``make demo``'s) compiled twice, ``--target ort`` and ``--target
openvino`` (k 4, widths 1/2/3/5 with the K=0 fallback, prefill 64, ctx 256), run on the demo's
prompts (chat template, greedy, 128 new tokens), one thread per model:

* per backend and precision: target-only and n-gram (prompt lookup) decoding, tokens/s (wall, all
  prompts), the speedup over that backend's own target-only, and whether the speculative text
  equals target-only's on every prompt (``greedy_equal``);
* per OpenVINO precision, the width check over the same texts (OpenVINO f32's target-only answers):
  each prompt and answer re-scored in calls of k+1 tokens against calls of one; ``width_flips``:
  positions whose top token differs, of ``positions``; ``vs_f32_flips``: positions whose top token
  (width 1) differs from f32's on the same text; ``texts_equal_f32``: target-only text equal to f32's;
* OpenVINO GenAI's own pipeline beside them when ``openvino_genai`` is installed (not measured
  otherwise: the row says so).
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

K, K_LIST, PL, CTX, NEW = 4, "0,1,2,4", 64, 256, 128


def compile_both(export: Path, out: Path, log=print) -> dict[str, Path]:
    from specdec_compile import cli
    dirs = {}
    for target in ("ort", "openvino"):
        d = out / f"tlm-{target}"
        if not (d / "manifest.json").is_file():
            log(f"compiling {export} for --target {target} -> {d}")
            code = cli.main([str(export), "--role", "tlm", "--target", target, "--k", str(K), "--k-list", K_LIST,
                             "--prefill-len", str(PL), "--ctx-len", str(CTX), "-o", str(d), "--force"])
            if code != 0:
                raise SystemExit(f"compile for {target} failed ({code})")
        dirs[target] = d
    return dirs


def _decode(backend, prompts, draft: str | None):
    from specdec_compile.runtime import SpecDecoder, TargetOnlyDecoder
    dec = TargetOnlyDecoder(backend) if draft is None else SpecDecoder(backend, None, draft=draft)
    t0 = time.perf_counter()
    outs = [dec.generate(p, max_new_tokens=NEW).generated_ids for p in prompts]
    wall = time.perf_counter() - t0
    return outs, sum(map(len, outs)) / wall


def width_flips(backend, prompts, answers, width: int) -> tuple[int, int, list]:
    """Each prompt + answer re-scored: calls of ``width`` tokens against calls of one. Returns
    (positions whose argmax differs, positions, the width-1 argmaxes per prompt)."""
    flips = total = 0
    ones = []
    for p, ans in zip(prompts, answers):
        seq = list(p) + list(ans)
        n0 = len(p)

        def prefill():
            backend.reset()
            for s in range(0, n0, PL):
                chunk = seq[s:min(s + PL, n0)]
                ids = np.zeros((1, PL), np.int64)
                pos = np.full((1, PL), -1, np.int64)
                ids[0, :len(chunk)] = chunk
                pos[0, :len(chunk)] = np.arange(s, s + len(chunk))
                backend.run(ids, pos)
        prefill()
        wide = []
        for s in range(n0, len(seq) - width + 1, width):
            wide += list(backend.run(np.array([seq[s:s + width]]), np.arange(s, s + width)[None])[0].argmax(-1))
        prefill()
        one = [int(backend.run(np.array([[seq[s]]]), np.array([[s]]))[0, 0].argmax()) for s in range(n0, len(seq))]
        ones.append(one)
        flips += int(np.sum(np.array(wide) != np.array(one[:len(wide)])))
        total += len(wide)
    return flips, total, ones


def run(export: Path, tokenizer: Path, out: Path, threads: int = 1, n_prompts: int = 4, log=print) -> dict:
    from workshop import prompts as prompt_sets
    from workshop.smollm2 import chat_ids
    from specdec_compile.runtime import OpenVinoBackend, OrtBackend
    from specdec_compile.runtime.tokenizer import load_tokenizer

    dirs = compile_both(export, out, log)
    tok = load_tokenizer(str(tokenizer))
    prompts = [chat_ids(tok, t) for t in prompt_sets.DEMO_PROMPTS[:n_prompts]]
    res = {"model": str(export), "threads": threads, "k": K, "ctx_len": CTX, "max_new_tokens": NEW,
           "prompts": len(prompts), "rows": []}
    backends = [("ort", "f32", lambda: OrtBackend(dirs["ort"], intra_op_threads=threads))]
    for prec in ("f32", "bf16"):
        backends.append(("openvino", prec, lambda prec=prec: OpenVinoBackend(dirs["openvino"], precision=prec,
                                                                              threads=threads)))
    ref = None            # OpenVINO f32's target-only texts and their width-1 top tokens: what bf16 re-scores
    for kind, prec, make in backends:
        b = make()
        b.warmup()
        base, base_rate = _decode(b, prompts, None)
        row = {"backend": kind, "precision": prec, "target_only_tok_s": base_rate}
        for draft in ("ngram", "suffix"):
            got, rate = _decode(b, prompts, draft)
            row[f"{draft}_tok_s"] = rate
            row[f"{draft}_speedup"] = rate / base_rate
            row[f"{draft}_greedy_equal"] = [g == t for g, t in zip(got, base)]
        if kind == "openvino":
            texts = base if ref is None else ref[0]
            flips, total, ones = width_flips(b, prompts, texts, K + 1)
            row.update(width_flips=flips, positions=total)
            if ref is None:
                ref = (base, ones)
            else:
                row["vs_f32_flips"] = int(sum(np.sum(np.array(a) != np.array(o)) for a, o in zip(ones, ref[1])))
                row["vs_f32_positions"] = int(sum(len(o) for o in ones))
                row["texts_equal_f32"] = [g == t for g, t in zip(base, ref[0])]
        log(json.dumps(row))
        res["rows"].append(row)
        b.close()
    res["genai"] = _genai(export, prompts, threads)
    return res


def run_section(real_out: Path, out: Path, threads: int, n_prompts: int, log=print):
    """``make bench``'s section: the results, or a line saying why it was skipped."""
    try:
        import openvino  # noqa: F401
    except ImportError:
        return "skipped: openvino is not installed (pip install 'specdec-compile[openvino]')"
    export, tokenizer = real_out / "export" / "tlm" / "model.onnx", real_out / "tokenizer"
    if not export.is_file() or not tokenizer.is_dir():
        return f"skipped: no SmolLM2 export in {real_out} (make demo builds it)"
    return run(export, tokenizer, out, threads, n_prompts, log)


def _genai(export, prompts, threads):
    try:
        import openvino_genai  # noqa: F401
    except ImportError:
        return "not measured: openvino-genai is not installed"
    return "not measured: the GenAI pipeline needs an OpenVINO IR of the model (optimum-intel export), not built here"


def markdown(res: dict) -> str:
    lines = [f"backends: {res['model']}, {res['prompts']} prompts x {res['max_new_tokens']} new tokens, greedy, "
             f"{res['threads']} thread(s), k {res['k']}, ctx {res['ctx_len']}", "",
             "| backend | precision | target-only tok/s | n-gram tok/s (x) | suffix tok/s (x) | spec == target-only "
             "| width flips | flips vs f32 |", "|---|---|---|---|---|---|---|---|"]
    for r in res["rows"]:
        eq = all(r["ngram_greedy_equal"]) and all(r["suffix_greedy_equal"])
        wf = f"{r['width_flips']}/{r['positions']}" if "width_flips" in r else "-"
        vf = f"{r['vs_f32_flips']}/{r['vs_f32_positions']}" if "vs_f32_flips" in r else "-"
        lines.append(f"| {r['backend']} | {r['precision']} | {r['target_only_tok_s']:.1f} | {r['ngram_tok_s']:.1f} "
                     f"({r['ngram_speedup']:.2f}) | {r['suffix_tok_s']:.1f} ({r['suffix_speedup']:.2f}) | "
                     f"{'yes' if eq else 'NO'} | {wf} | {vf} |")
    lines += ["", f"OpenVINO GenAI: {res['genai']}"]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--export", type=Path, default=Path("build/demo/export/tlm/model.onnx"))
    ap.add_argument("--tokenizer", type=Path, default=Path("build/demo/tokenizer"))
    ap.add_argument("--out", type=Path, default=Path("build/bench/backends"))
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--json", type=Path, default=None, help="also write the results here")
    a = ap.parse_args(argv)
    res = run(a.export, a.tokenizer, a.out, a.threads, a.prompts)
    print(markdown(res))
    if a.json:
        a.json.write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
