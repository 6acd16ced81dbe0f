#!/usr/bin/env python3
"""The end-to-end demo: a target and a draft, compiled, decoded speculatively.

    python demo/run_demo.py            # what `make demo` runs: SmolLM2-135M-Instruct (demo/real_demo.py)
    python demo/run_demo.py --toy      # the toy pair trained here (below), build/demo-toy
    python demo/run_demo.py --micro    # the toy pair, micro configuration (seconds; the smoke test)

The real model's path is described in ``demo/real_demo.py``. The toy pair's:

1. ``demo/train_pair.py``: tokenizer, TLM and distilled DLM trained on the
   Python standard library, exported by ``optimum-cli`` (cached; minutes the
   first time, seconds after).
2. ``specdec-compile`` (target ``ort``): the DLM, the TLM with a few
   verification widths (``--k`` and ``--k-list``), and the TLM once more with
   ``--role dlm`` -- the plain seq_len-1 target-only baseline.
3. Speculative decoding on prompts taken from held-out standard-library modules
   (a function's signature and docstring): the code streams as it is accepted,
   accepted drafts in green; then the same prompts with the TLM alone. Greedy
   speculative decoding must give exactly the target's tokens; this is checked.
4. Metrics and the speedup over target-only decoding (decode phase, after the
   first token; the time spent printing is not counted in either).

Outputs (real model, and the toy pair in its own directory):
OUT/{tokenizer,export,hf,dlm,tlm,tlm-base} and OUT/demo.json with "model", "draft",
"prompts" (each with "prompt", "new_tokens", "speedup", "identical"), "speedup" and
"identical" (greedy speculative output equal to target-only output for every prompt).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

import train_pair  # noqa: E402


# --------------------------------------------------------------------------- compile

def compile_cmd() -> list[str]:
    exe = Path(sys.executable).parent / "specdec-compile"
    if exe.exists():
        return [str(exe)]
    return [sys.executable, "-c", "import sys; from specdec_compile.cli import main; sys.exit(main())"]


def tool_version() -> str:
    try:
        import specdec_compile
        return getattr(specdec_compile, "__version__", "?")
    except ImportError:  # pragma: no cover
        return "missing"


def compile_artifact(model: Path, out: Path, args: list[str], *, log=print) -> float:
    """``specdec-compile MODEL ARGS -o OUT``, skipped when OUT was written from the same model and
    options by the same tool (its stamp says so). Returns the wall time (0 when reused)."""
    sha = hashlib.sha256(model.read_bytes()).hexdigest()
    key = hashlib.sha256(json.dumps([sha, args, tool_version(), _src_digest()]).encode()).hexdigest()[:16]
    stamp = out.parent / f".{out.name}.stamp"
    if (out / "manifest.json").exists() and stamp.exists() and stamp.read_text().strip() == key:
        log(f"[compile] {out}: reused")
        return 0.0
    t0 = time.time()
    cmd = compile_cmd() + [str(model), *args, "-o", str(out), "--force"]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        raise SystemExit(f"specdec-compile failed ({' '.join(cmd)}):\n{res.stdout[-2000:]}{res.stderr[-2000:]}")
    dt = time.time() - t0
    stamp.write_text(key)
    log(f"[compile] {out}: {' '.join(args)} ({dt:.1f} s)")
    return dt


def _src_digest() -> str:
    """The compiler's own sources: a changed pass recompiles."""
    d = hashlib.sha256()
    pkg = ROOT / "specdec_compile"
    for p in sorted(pkg.rglob("*.py")):
        if "runtime" in p.parts:
            continue
        d.update(p.read_bytes())
    return d.hexdigest()[:16]


def compile_pair(pair: dict, out: Path, *, k: int, k_list: list[int], prefill_len: int, ctx_len: int,
                 log=print) -> dict:
    tlm_onnx, dlm_onnx = Path(pair["paths"]["tlm_onnx"]), Path(pair["paths"]["dlm_onnx"])
    common = ["--target", "ort", "--prefill-len", str(prefill_len), "--ctx-len", str(ctx_len)]
    times = {}
    times["dlm"] = compile_artifact(dlm_onnx, out / "dlm", ["--role", "dlm", *common], log=log)
    tl = ["--role", "tlm", "--k", str(k)] + (["--k-list", ",".join(map(str, k_list))] if k_list else [])
    times["tlm"] = compile_artifact(tlm_onnx, out / "tlm", [*tl, *common], log=log)
    times["tlm-base"] = compile_artifact(tlm_onnx, out / "tlm-base", ["--role", "dlm", *common], log=log)
    return times


# --------------------------------------------------------------------------- prompts

DEF_RE = re.compile(r'^(?P<indent>[ ]*)def [A-Za-z_]\w*\(.*?\).*?:\n(?P=indent)[ ]+(?:r?""")', re.M | re.S)


def held_out_prompts(n: int, max_tokens: int, tok) -> list[tuple[str, str]]:
    """(name, text) pairs: the first documented function of each held-out module,
    from its ``def`` line to the end of its docstring."""
    _, held = train_pair.corpus_files(train_pair.CONFIG["corpus"])
    prompts = []
    for path in held:
        text = train_pair.read(path)
        for m in DEF_RE.finditer(text):
            start = m.start()
            q = text.find('"""', m.end())
            if q < 0:
                continue
            # end right after the closing quotes: the model writes the newline and indentation
            # itself (a bare "\n" token is what precedes column-0 code in the training data)
            body = text[start:q + 3]
            if "\n" not in text[m.end():q] and len(tok(body)["input_ids"]) < 12:
                continue  # a one-line docstring says too little
            if len(tok(body)["input_ids"]) > max_tokens:
                continue
            name = re.match(r"\s*def (\w+)", body).group(1)
            prompts.append((f"{path.stem}.{name}", body))
            break
        if len(prompts) >= n:
            break
    return prompts


# --------------------------------------------------------------------------- printing

class Stream:
    def __init__(self, tok, console, enabled: bool):
        from specdec_compile.runtime.tokenizer import StreamDecoder
        self._SD = StreamDecoder
        self.tok, self.console, self.enabled = tok, console, enabled
        self.sd = None

    def start(self, prompt_ids, title: str, shown: str | None = None):
        """A rule with ``title``, then the prompt (``shown``, or the decoded ids) dimmed."""
        if not self.enabled:
            return
        self.console.rule(title, style="dim")
        text = self.tok.decode(prompt_ids) if shown is None else shown
        self.console.print(text, style="dim", end="", highlight=False, markup=False)
        self.sd = self._SD(self.tok, prompt_ids)

    def __call__(self, ids, sources):
        if not self.enabled:
            return
        for t, s in zip(ids, sources):
            text = self.sd.push(t)
            if text:
                self.console.print(text, style="green" if s == "draft" else "bold", end="",
                                   highlight=False, markup=False, soft_wrap=True)

    def end(self):
        if self.enabled:
            self.console.print()


def decode_rate(m: dict) -> float | None:
    """Decode tokens/s after the first token, not counting the time spent printing."""
    dec = m["new_tokens"] - 1
    t = m["total_time_s"] - m["ttft_s"] - m.get("callback_time_s", 0.0)
    return dec / t if dec > 0 and t > 0 else None


# --------------------------------------------------------------------------- main

def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="The demo: SmolLM2-135M-Instruct with a distilled draft (default), "
                                             "or the toy pair trained here (--toy, --micro).")
    ap.add_argument("--toy", action="store_true",
                    help="the toy pair trained here from the stdlib (2.75M-parameter target; build/demo-toy)")
    ap.add_argument("--micro", action="store_true",
                    help="the toy pair in its micro configuration: seconds, for smoke tests (build/demo-micro)")
    ap.add_argument("--out", type=Path, default=None, help="default build/demo (build/demo-toy, build/demo-micro)")
    ap.add_argument("--k", type=int, default=4, help="the TLM's compiled k (default 4)")
    ap.add_argument("--k-list", default="2,3,4,6", help="toy: extra verification widths (default 2,3,4,6)")
    ap.add_argument("--decode-k", type=int, default=None,
                    help="drafts per round (one of k/k-list); default adaptive over the compiled widths")
    ap.add_argument("--prefill-len", type=int, default=None, help="default 64 (toy: 32)")
    ap.add_argument("--ctx-len", type=int, default=256)
    ap.add_argument("--prompts", type=int, default=None, help="default 4 (micro: 2)")
    ap.add_argument("--max-new-tokens", type=int, default=None, help="default 128 (toy: 160, micro: 24)")
    ap.add_argument("--repeats", type=int, default=None,
                    help="timed runs per prompt and mode, best kept (default 2; micro: 1)")
    ap.add_argument("--threads", type=int, default=2, help="torch threads for conversion and training")
    ap.add_argument("--ort-threads", type=int, default=1,
                    help="ONNX Runtime intra-op threads (1: the measured setting; see BENCHMARKS.md)")
    ap.add_argument("--no-stream", action="store_true")
    a = ap.parse_args(argv)
    toy = a.toy or a.micro
    name = "demo-micro" if a.micro else "demo-toy" if a.toy else "demo"
    a.out = a.out or ROOT / "build" / name
    a.prefill_len = a.prefill_len or (32 if toy else 64)
    a.prompts = a.prompts or (2 if a.micro else 4)
    a.max_new_tokens = a.max_new_tokens or (24 if a.micro else 160 if toy else 128)
    a.repeats = a.repeats or (1 if a.micro else 2)

    from rich.console import Console
    console = Console(highlight=False)
    if not console.is_terminal:
        console = Console(highlight=False, width=110)

    def log(msg):
        console.print(msg, markup=False, highlight=False)

    if not toy:
        import real_demo
        return real_demo.main(a, console, log)
    return toy_main(a, console, log)


def toy_main(a, console, log) -> int:
    """The toy pair: trained here on the stdlib (``train_pair.py``), compiled, decoded."""
    from rich.table import Table
    k_list = [int(x) for x in a.k_list.split(",") if x.strip()]
    cfg = train_pair.deep_update(train_pair.CONFIG, train_pair.MICRO) if a.micro else train_pair.CONFIG
    # 1. the pair
    t0 = time.time()
    pair = train_pair.run(cfg, a.out, threads=a.threads)
    t_pair = time.time() - t0
    m = pair["metrics"]
    log(f"[pair] TLM {pair['params']['tlm'] / 1e6:.2f}M params (held-out loss {m['tlm_loss']}), "
        f"DLM {pair['params']['dlm'] / 1e6:.2f}M (loss {m['dlm_loss']}); greedy agreement "
        f"{m['agreement_held_out_text']} on held-out text, {m['agreement_tlm_continuations']} on TLM "
        f"continuations ({t_pair:.0f} s{', reused' if pair.get('reused') else ''})")

    # 2. compile
    ctimes = compile_pair(pair, a.out, k=a.k, k_list=k_list, prefill_len=a.prefill_len,
                          ctx_len=a.ctx_len, log=log)

    # 3. decode
    from specdec_compile.runtime import OrtBackend, SpecDecoder, TargetOnlyDecoder
    from specdec_compile.runtime.tokenizer import load_tokenizer
    tok = load_tokenizer(a.out / "tokenizer")
    kw = {"intra_op_threads": a.ort_threads} if a.ort_threads else {}
    tlm = OrtBackend(a.out / "tlm", **kw)
    dlm = OrtBackend(a.out / "dlm", **kw)
    base = OrtBackend(a.out / "tlm-base", **kw)
    eos = tok.eos_token_id
    spec = SpecDecoder(tlm, dlm, eos_token_id=eos, k=a.decode_k)
    target = TargetOnlyDecoder(base, eos_token_id=eos)

    room = a.ctx_len - a.max_new_tokens
    prompts = held_out_prompts(a.prompts, max(8, room), tok)
    # warm-up: every specialization once (first calls allocate)
    warm = tok(prompts[0][1])["input_ids"]
    spec.generate(warm, max_new_tokens=24)
    target.generate(warm, max_new_tokens=8)

    stream = Stream(tok, console, enabled=not a.no_stream)
    rows = []
    for name, text in prompts:
        ids = tok(text)["input_ids"]
        best_s = best_t = None
        for r in range(a.repeats):
            first = r == 0
            if first:
                stream.start(ids, f"{name}  ({len(ids)} prompt tokens; accepted drafts in green)")
            rs = spec.generate(ids, max_new_tokens=a.max_new_tokens, on_tokens=stream if first else None)
            if first:
                stream.end()
            rt = target.generate(ids, max_new_tokens=a.max_new_tokens)
            if rs.generated_ids != rt.generated_ids:
                raise SystemExit(f"{name}: speculative output differs from target-only output "
                                 f"(greedy must be exact)")
            if best_s is None or (decode_rate(rs.metrics) or 0) > (decode_rate(best_s.metrics) or 0):
                best_s = rs
            if best_t is None or (decode_rate(rt.metrics) or 0) > (decode_rate(best_t.metrics) or 0):
                best_t = rt
        ms, mt = best_s.metrics, best_t.metrics
        vs, vt = decode_rate(ms), decode_rate(mt)
        rows.append({"prompt": name, "prompt_tokens": len(ids), "new_tokens": ms["new_tokens"],
                     "stop": best_s.stop_reason, "spec_tokens_per_s": vs, "target_tokens_per_s": vt,
                     "speedup": (vs / vt) if vs and vt else None,
                     "acceptance_rate": ms["acceptance_rate"],
                     "tokens_per_tlm_call": ms["mean_tokens_per_tlm_call"],
                     "dlm_time_s": ms["dlm_time_s"], "tlm_time_s": ms["tlm_time_s"],
                     "host_time_s": ms["host_time_s"], "total_time_s": ms["total_time_s"],
                     "target_total_time_s": mt["total_time_s"],
                     "verify_drafts_histogram": ms.get("verify_drafts_histogram"),
                     "identical": True})

    # 4. report
    tot_new = sum(r["new_tokens"] - 1 for r in rows)
    tot_spec = sum((r["new_tokens"] - 1) / r["spec_tokens_per_s"] for r in rows if r["spec_tokens_per_s"])
    tot_tgt = sum((r["new_tokens"] - 1) / r["target_tokens_per_s"] for r in rows if r["target_tokens_per_s"])
    summary = {"spec_tokens_per_s": tot_new / tot_spec if tot_spec else None,
               "target_tokens_per_s": tot_new / tot_tgt if tot_tgt else None}
    summary["speedup"] = (summary["spec_tokens_per_s"] / summary["target_tokens_per_s"]
                          if summary["spec_tokens_per_s"] and summary["target_tokens_per_s"] else None)

    t = Table(title=f"speculative vs target-only decoding (ONNX Runtime CPU, {a.ort_threads} thread(s), "
                    f"k {'adaptive over ' + str(sorted({a.k, *k_list})) if a.decode_k is None else a.decode_k})")
    for col in ("prompt", "new tok", "target tok/s", "spec tok/s", "speedup", "accept", "tok/TLM call"):
        t.add_column(col, justify="right" if col != "prompt" else "left")
    f = lambda v, p=1: "-" if v is None else f"{v:.{p}f}"  # noqa: E731
    for r in rows:
        t.add_row(r["prompt"], str(r["new_tokens"]), f(r["target_tokens_per_s"]), f(r["spec_tokens_per_s"]),
                  f(r["speedup"], 2) + "x", f(r["acceptance_rate"], 2), f(r["tokens_per_tlm_call"], 2))
    t.add_row("all", str(tot_new + len(rows)), f(summary["target_tokens_per_s"]), f(summary["spec_tokens_per_s"]),
              f(summary["speedup"], 2) + "x", "", "", style="bold")
    console.print(t)
    log("every speculative output was identical to the target-only output (greedy)")

    result = {"model": f"toy target trained here ({pair['params']['tlm'] / 1e6:.2f}M parameters"
                       f"{', micro configuration' if a.micro else ''})",
              "draft": "distilled", "prompts": rows, "speedup": summary["speedup"],
              "identical": all(r["identical"] for r in rows),
              "details": {"pair": {k: pair[k] for k in ("key", "params", "metrics", "times", "corpus")},
                          "compile_s": ctimes, "settings": vars(a) | {"out": str(a.out)}, "summary": summary}}
    (a.out / "demo.json").write_text(json.dumps(result, indent=1, default=str))
    log(f"[demo] results in {a.out / 'demo.json'}; artifacts: {a.out / 'dlm'}, {a.out / 'tlm'}, "
        f"{a.out / 'tlm-base'} (target-only baseline)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
