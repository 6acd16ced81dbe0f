"""``specdec-compile pair --tlm T (--dlm D | --head CKPT | --draft ngram|suffix) -o OUT``: one verified pair."""
from __future__ import annotations

import argparse
import json
import time

from ..pair.build import TARGETS, PairRequest, build_pair
from .common import Parser, add_progress_flags, start_progress

EPILOG = """\
example: a target and its draft, from their Hugging Face folders, for ONNX Runtime

  specdec-compile pair --tlm ./target --dlm ./draft --k 4 --target ort -o out/pair
  specdec-run --pair out/pair --prompt "def fib(n):"

  T and D are each an .onnx file, an optimum export folder (model.onnx) or a Hugging Face
  folder (config.json and *.safetensors / pytorch_model*.bin; exported with optimum, the
  [export] extra). Both are compiled with the same batch, context and prefill length and
  verified against their exports; OUT gets tlm/, dlm/, tokenizer/ (the target's, when it has
  one) and pair.json. --head CKPT imports a speculators EAGLE-3 checkpoint as the draft (the
  TLM then outputs the layers it reads); --draft ngram|suffix compiles the TLM alone.
  --target qaic writes compile.sh in tlm/ and dlm/ (run them on a machine with the Cloud AI
  100 SDK, or specdec-run --pair OUT --compile). The settings and the inputs' hashes make the
  pair's key (pair.json); the same command again finds it and says "cached" (--force
  rebuilds). A draft with another tokenizer is refused. docs/pair.md.
"""


def build_parser(prog: str) -> argparse.ArgumentParser:
    p = Parser(prog=prog, help_hint=f" (see {prog} --help)", formatter_class=argparse.RawDescriptionHelpFormatter,
               epilog=EPILOG, description="Export, compile and verify a target and its draft with matching "
                                          "settings, into one pair directory that specdec-run --pair runs.")
    p.add_argument("--tlm", required=True, metavar="T", help="the target: .onnx, optimum export folder or "
                                                              "Hugging Face folder")
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--dlm", metavar="D", help="the draft model: .onnx, optimum export folder or Hugging Face folder")
    g.add_argument("--head", metavar="CKPT", help="a speculators EAGLE-3 checkpoint folder as the draft")
    g.add_argument("--draft", choices=("ngram", "suffix"), help="no draft model: n-gram prompt lookup or suffix "
                                                                "tries at run time (the TLM alone is compiled)")
    p.add_argument("--k", type=int, default=4, help="drafted tokens per round (default 4)")
    p.add_argument("--target", choices=TARGETS, default="qaic",
                   help="qaic: Cloud AI 100 (default; compile.sh for each model); ort: ONNX Runtime")
    p.add_argument("--prefill-len", type=int, default=32, help="prompt chunk length (default 32)")
    p.add_argument("--ctx-len", type=int, default=256, help="context length / KV slots (default 256)")
    p.add_argument("--batch-size", type=int, default=1, help="rows per call, both models (default 1)")
    p.add_argument("-o", "--output", required=True, metavar="OUT", help="the pair directory to write")
    p.add_argument("--force", action="store_true", help="rebuild even when OUT holds this pair (cached), or "
                                                        "replace a pair built with other settings")
    p.add_argument("--json", action="store_true", help="print pair.json (and whether it was cached) as JSON")
    add_progress_flags(p, steps="export, compile, verify of each model")
    return p


def main(argv: list[str], prog: str = "specdec-compile pair") -> int:
    a = build_parser(prog).parse_args(argv)
    start_progress(prog, a)
    t0 = time.perf_counter()
    draft = "model" if a.dlm else "head" if a.head else a.draft
    req = PairRequest(tlm=a.tlm, draft=draft, dlm=a.dlm or a.head, k=a.k, target=a.target,
                      prefill_len=a.prefill_len, ctx_len=a.ctx_len, batch_size=a.batch_size)
    m, cached = build_pair(req, a.output, force=a.force)
    if a.json:
        print(json.dumps({"out": a.output, "cached": cached, "pair": m}, indent=2, sort_keys=True))
        return 0
    if cached:
        print(f"cached: {a.output} already holds this pair (key {m['key']}, same settings and inputs; "
              f"{time.perf_counter() - t0:.2f} s); --force rebuilds it")
        return 0
    _print_built(a, m, time.perf_counter() - t0)
    return 0


def _print_built(a, m: dict, seconds: float) -> None:
    v = m["verify"]
    parts = [f"TLM tlm/ (verified: max |Δ logits| {v['tlm']['max_logits_diff']:.1e})"]
    if m.get("dlm"):
        parts.append(f"{'head' if m['draft'] == 'head' else 'DLM'} dlm/ (verified: max |Δ logits| "
                     f"{v['dlm']['max_logits_diff']:.1e})")
    else:
        parts.append(f"draft {m['draft']} (no draft model)")
    print(f"pair {a.output} (key {m['key']}, {m['target']}, k {m['k']}, {seconds:.1f} s): " + ", ".join(parts))
    if m["target"] == "qaic":
        scripts = " and ".join(f"{a.output}/{s}" for s in m.get("compile_scripts") or [])
        print(f"  compile  {scripts} on a machine with the Cloud AI 100 SDK (or specdec-run --pair {a.output} "
              f"--compile)")
    print(f"  run      specdec-run --pair {a.output} --prompt \"...\"" +
          ("" if m.get("tokenizer") else " (no tokenizer in the inputs: --tokenizer DIR or --prompt-ids)"))
