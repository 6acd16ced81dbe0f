"""``specdec-compile pair --tlm T (--dlm D | --head CKPT | --draft ngram|suffix) -o OUT``: one verified pair."""
from __future__ import annotations

import argparse
import json
import time

from ..contract import INTERFACES
from ..eagle3.quantize import WEIGHTS
from ..options import HW_VERSIONS, MAX_CORES, MAX_DEVICES
from ..pair.build import TARGETS, PairRequest, build_pair
from .common import Parser, add_progress_flags, start_progress
from .qeff_words import add_qeff_compile_flags, device_group, resolve_qeff_compile_flags

EPILOG = """\
example: a target and its draft, from their Hugging Face folders, for ONNX Runtime

  specdec-compile pair --tlm ./target --dlm ./draft --k 4 --target ort -o out/pair
  specdec-run --pair out/pair --prompt "def fib(n):"

  T and D are each an .onnx file, an optimum export folder (model.onnx) or a Hugging Face
  folder (config.json and *.safetensors / pytorch_model*.bin; exported with optimum, the
  [export] extra). Both are compiled with the same batch, context and prefill length and
  verified against their exports; OUT gets tlm/, dlm/, tokenizer/ (the target's, when it has
  one) and pair.json. --head CKPT imports a speculators EAGLE-3 checkpoint as the draft (the
  TLM then outputs the layers it reads; --head-weights int8 quantizes its MatMuls, ort only);
  --draft ngram|suffix compiles the TLM alone.
  --target qaic writes compile.sh in tlm/ and dlm/ (run them on a machine with the Cloud AI
  100 SDK, or specdec-run --pair OUT --compile). The settings and the inputs' hashes make the
  pair's key (pair.json); the same command again finds it and says "cached" (--force
  rebuilds). A draft with another tokenizer is refused. docs/pair.md.

example: Cloud AI 100 in QEfficient's words (docs/qefficient.md)

  specdec-compile pair --tlm ./target --draft ngram --k 4 --num-cores 16 --mxfp6-matmul -o out/
  specdec-compile pair --tlm ./target --dlm ./draft --k 4 --full-batch-size 4 --num-cores 11 \\
      --dlm-num-cores 5 --mxfp6-matmul --aic-enable-depth-first --device-group [0,1] -o out/cb

  The compiler options go to both models, as QEfficient compiles a TLM and its draft, except
  --num-devices / --device-group (the TLM's; the draft is compiled for one device) and
  --dlm-num-cores (the draft's cores, default --num-cores; the two share a device's 16 cores
  when they run on one). --interface qeff gives QEfficient's SpD TLM and its DLM, which its
  runtime and specdec-run both drive; --full-batch-size N its continuous-batching pair.
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
    p.add_argument("--head-weights", choices=WEIGHTS, default="float",
                   help="--head: the head's MatMul weights, float (the checkpoint's; default) or int8/int4 "
                        "weight-only (--target ort; import-head --weights)")
    p.add_argument("--k", type=int, default=4, help="drafted tokens per round (default 4)")
    p.add_argument("--target", choices=TARGETS, default="qaic",
                   help="qaic: Cloud AI 100 (default; compile.sh for each model); ort: ONNX Runtime")
    p.add_argument("--prefill-len", type=int, default=32, help="prompt chunk length (default 32)")
    p.add_argument("--ctx-len", type=int, default=256, help="context length / KV slots (default 256)")
    p.add_argument("--batch-size", type=int, default=None, help="rows per call, both models (default 1)")
    p.add_argument("--interface", choices=INTERFACES, default=None,
                   help="both models: default, or qeff (QEfficient's SpD TLM with num_logits_to_keep, and its DLM)")
    add_qeff_compile_flags(p)
    p.add_argument("--num-cores", type=int, default=None,
                   help=f"qaic: AI 100 cores per device for each model (default {MAX_CORES})")
    p.add_argument("--dlm-num-cores", type=int, default=None, metavar="N",
                   help="qaic: the draft's cores (default --num-cores; QEfficient's SpD example: 11 and 5)")
    p.add_argument("--num-devices", type=int, default=None,
                   help=f"qaic: devices to partition the TLM over (at most {MAX_DEVICES}; the draft: one)")
    p.add_argument("--device-group", metavar="IDS", default=None,
                   help="qaic: QEfficient's [0,1] (commas or spaces): the TLM partitioned over these devices "
                        "(--num-devices their count), recorded for specdec-run --pair")
    p.add_argument("--hw-version", choices=HW_VERSIONS, default=None, help="qaic: -aic-hw-version, both models")
    p.add_argument("--mxint8-kv-cache", action="store_true",
                   help="qaic: both models' KV cache in MXINT8 (custom IO precision mxint8)")
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
    req = _request(a)
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


def _request(a) -> PairRequest:
    """The request from the arguments, QEfficient's words folded into ours (compile's rules)."""
    a.precision = None
    resolve_qeff_compile_flags(a)    # --mxfp6-matmul (qaic only), --full-batch-size, the defaults
    group = device_group(a.device_group) if a.device_group is not None else None
    draft = "model" if a.dlm else "head" if a.head else a.draft
    return PairRequest(tlm=a.tlm, draft=draft, dlm=a.dlm or a.head, k=a.k, target=a.target,
                       prefill_len=a.prefill_len, ctx_len=a.ctx_len, batch_size=a.batch_size,
                       interface=a.interface, continuous_batching=a.continuous_batching, num_cores=a.num_cores,
                       dlm_num_cores=a.dlm_num_cores, num_devices=a.num_devices, mxfp6_matmul=a.mxfp6_matmul,
                       mxint8_kv_cache=a.mxint8_kv_cache, mos=a.mos, aic_enable_depth_first=a.aic_enable_depth_first,
                       hw_version=a.hw_version, device_group=group, head_weights=a.head_weights)


def _print_built(a, m: dict, seconds: float) -> None:
    v = m["verify"]
    parts = [f"TLM tlm/ (verified: max |Δ logits| {v['tlm']['max_logits_diff']:.1e})"]
    if m.get("dlm"):
        parts.append(f"{'head' if m['draft'] == 'head' else 'DLM'} dlm/ (verified: max |Δ logits| "
                     f"{v['dlm']['max_logits_diff']:.1e})")
    else:
        parts.append(f"draft {m['draft']} (no draft model)")
    st = m["settings"]
    how = [m["target"], f"k {m['k']}"]
    if st.get("interface") == "qeff":
        how.append(f"--full-batch-size {st['batch_size']}" if st.get("continuous_batching") else
                   f"--interface qeff, batch {st['batch_size']}")
    how += [f"{k.replace('_', '-')} {v}" if not isinstance(v, bool) else k.replace("_", "-")
            for k, v in (st.get("qaic") or {}).items()]
    print(f"pair {a.output} (key {m['key']}, {', '.join(how)}, {seconds:.1f} s): " + ", ".join(parts))
    if m["target"] == "qaic":
        scripts = " and ".join(f"{a.output}/{s}" for s in m.get("compile_scripts") or [])
        print(f"  compile  {scripts} on a machine with the Cloud AI 100 SDK (or specdec-run --pair {a.output} "
              f"--compile)")
    print(f"  run      specdec-run --pair {a.output} --prompt \"...\"" +
          ("" if m.get("tokenizer") else " (no tokenizer in the inputs: --tokenizer DIR or --prompt-ids)"))
