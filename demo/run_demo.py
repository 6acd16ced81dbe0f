#!/usr/bin/env python3
"""The end-to-end demo: a target and a draft, compiled, decoded speculatively.

    python -m demo.run_demo            # what `make demo` runs: SmolLM2-135M-Instruct (demo/real_demo.py)
    python -m demo.run_demo --toy      # the toy pair trained here (demo/toy_demo.py), build/demo-toy
    python -m demo.run_demo --micro    # the toy pair, micro configuration (seconds; the smoke test)

This module is the command line only. The real model's path is described in
``demo/real_demo.py``, the toy pair's in ``demo/toy_demo.py``.

Outputs (real model, and the toy pair in its own directory):
OUT/{tokenizer,export,hf,dlm,tlm,tlm-base,tlm-hs,fdlm}, OUT/eagle3-SHA/{head,tlm} (the EAGLE-3
head's pair, real model) and OUT/demo.json with "model", "draft",
"prompts" (each with "prompt", "new_tokens", "speedup", "identical"), "speedup" and
"identical" (greedy speculative output equal to target-only output for every prompt).

Exit status: 0, 1 when a speculative output differed from the target-only output, 2 when an
option or the EAGLE-3 head is refused (one line: a count below 1, --max-new-tokens 1 (no decode
phase to time), a --k-list without --toy/--micro
(the real model's widths are fixed, 0-8), a missing --fdraft-head, another target's head, a missing
--eagle3-head DIR, a --decode-k the artifacts lack).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from specdec_compile.eagle3.quantize import WEIGHTS

ROOT = Path(__file__).resolve().parents[1]
#: the EAGLE-3 head's weights as the demo imports it (import-head --weights; docs/import-head.md)
EAGLE3_WEIGHTS = "float"
#: the toy pair's extra verification widths (--k-list's default with --toy, --micro)
TOY_K_LIST = "2,3,4,6"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="The demo: SmolLM2-135M-Instruct with a distilled draft (default), "
                                             "or the toy pair trained here (--toy, --micro).")
    ap.add_argument("--toy", action="store_true",
                    help="the toy pair trained here from the stdlib (2.75M-parameter target; build/demo-toy)")
    ap.add_argument("--micro", action="store_true",
                    help="the toy pair in its micro configuration: seconds, for smoke tests (build/demo-micro)")
    ap.add_argument("--out", type=Path, default=None, help="default build/demo (build/demo-toy, build/demo-micro)")
    ap.add_argument("--k", type=int, default=4, help="the TLM's compiled k (default 4)")
    ap.add_argument("--k-list", default=None,
                    help=f"toy, micro: extra verification widths (default {TOY_K_LIST}; the real model's TLMs have "
                         f"widths 0-8, and an explicit --k-list without --toy/--micro is refused)")
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
    ap.add_argument("--fdraft-head", type=Path, default=None,
                    help="a feature-draft head trained elsewhere (python -m scripts.feature_scaling --save-head DIR, "
                         "e.g. on a GPU) instead of the one trained here")
    ap.add_argument("--eagle3-head", type=Path, default=None, metavar="DIR",
                    help="the EAGLE-3 head, a speculators checkpoint directory with the trainer's recipe.json "
                         "(default workshop/heads/smollm2-eagle3, skipped in one line when missing; `make "
                         "eagle3-head` trains one); refused (exit 2) when trained for another target checkpoint")
    ap.add_argument("--eagle3-weights", choices=WEIGHTS, default=EAGLE3_WEIGHTS,
                    help=f"the EAGLE-3 head's MatMul weights as imported (import-head --weights; default "
                         f"{EAGLE3_WEIGHTS}: cheaper drafts, the same output)")
    ap.add_argument("--no-eagle3", action="store_true", help="skip the EAGLE-3 head's rows (eagle3, eagle3-hybrid)")
    ap.add_argument("--feature-head", action="store_true",
                    help="with the EAGLE-3 head, also train the feature draft here (rows feature and hybrid; about "
                         "19 minutes on 2 cores); without a head, with --no-eagle3 or --fdraft-head it is always built")
    a = ap.parse_args(argv)
    bad = check_args(a)
    if bad:
        print(f"demo: {bad}", file=sys.stderr)
        return 2
    toy = a.toy or a.micro
    a.k_list = a.k_list or (TOY_K_LIST if toy else None)
    name = "demo-micro" if a.micro else "demo-toy" if a.toy else "demo"
    a.out = a.out or ROOT / "build" / name
    a.prefill_len = a.prefill_len or (32 if toy else 64)
    a.prompts = a.prompts or (2 if a.micro else 4)
    a.max_new_tokens = a.max_new_tokens or (24 if a.micro else 160 if toy else 128)
    a.repeats = a.repeats or (1 if a.micro else 2)

    from rich.console import Console
    console = Console(highlight=False)
    if not console.is_terminal:
        console = Console(highlight=False, width=150)

    def log(msg):
        console.print(msg, markup=False, highlight=False)

    from specdec_compile.errors import SpecdecError
    try:
        if not toy:
            from . import real_demo
            return real_demo.main(a, console, log)
        from . import toy_demo
        return toy_demo.main(a, console, log)
    except SpecdecError as e:      # a refusal found late (a --decode-k the artifacts lack): one line, exit 2
        print(f"demo: {e}", file=sys.stderr)
        return 2


def check_args(a) -> str | None:
    """What is wrong with the options, in one line (None: nothing), before any work. A 0 is refused, not
    read as 'the default'."""
    for flag, v, low in (("--k", a.k, 1), ("--decode-k", a.decode_k, 0), ("--prefill-len", a.prefill_len, 1),
                         ("--ctx-len", a.ctx_len, 2), ("--prompts", a.prompts, 1),
                         ("--max-new-tokens", a.max_new_tokens, 1), ("--repeats", a.repeats, 1),
                         ("--threads", a.threads, 1), ("--ort-threads", a.ort_threads, 1)):
        if v is not None and v < low:
            return f"{flag} must be at least {low} (got {v})"
    if a.max_new_tokens == 1:       # the rates are the tokens after the first over their time: none to time
        return ("--max-new-tokens must be at least 2: the speedups are decode rates, of the tokens after the "
                "first (got 1)")
    if a.k_list is not None and not (a.toy or a.micro):
        return (f"--k-list is the toy pair's (--toy, --micro): the real model's TLMs are compiled with widths "
                f"0-8, whatever --k-list says (got {a.k_list!r})")
    widths = [x.strip() for x in (a.k_list or "").split(",") if x.strip()]
    if not all(x.isdigit() for x in widths):
        return f"--k-list must be a comma list of widths >= 0 (got {a.k_list!r})"
    if a.fdraft_head is not None and not (a.fdraft_head / "head.pt").is_file():
        return (f"--fdraft-head {a.fdraft_head}: no head.pt there (python -m scripts.feature_scaling --save-head DIR "
                f"writes one)")
    return None


if __name__ == "__main__":
    sys.exit(main())
