"""``specdec-run --pair OUT``: the TLM, its draft and the tokenizer a pair directory names.

``--pair OUT`` stands for ``--tlm OUT/tlm`` and, by the pair's draft kind, ``--dlm OUT/dlm``
(a draft model or an imported head) or ``--draft ngram|suffix``; ``--tokenizer`` defaults to
OUT/tokenizer when the pair has one, and a qaic pair compiled with ``--device-group`` opens its TLM
on those devices (``--backend qaic``) unless ``--tlm-device-ids`` / ``--device-group`` say otherwise. ``--draft``, ``--target-only`` and ``--compare`` still
apply (``--draft ngram`` on a model pair leaves its DLM out). ``--compile`` first runs each
model's compile.sh (a qaic pair, with the Cloud AI 100 compiler found here).
"""
from __future__ import annotations

import sys
from pathlib import Path

from ..errors import SpecdecError


def add_pair_flags(p) -> None:
    p.add_argument("--pair", metavar="OUT", help="a pair directory (specdec-compile pair -o OUT): its TLM, draft "
                                                 "and tokenizer, in place of --tlm/--dlm/--draft/--tokenizer")
    p.add_argument("--compile", action="store_true",
                   help="with --pair of a qaic pair: run compile.sh of the TLM and the draft first (the Cloud AI "
                        "100 compiler must be here)")


PROMPT_FLAGS = ("prompt", "prompt_file", "prompt_ids", "prompts_txt_file_path")


def has_prompt(args) -> bool:
    return any(getattr(args, f, None) is not None for f in PROMPT_FLAGS)


def resolve_pair(args) -> None:
    """Fill --tlm, --dlm, --draft and --tokenizer from --pair; without --pair, --tlm is required.
    A prompt is required too, except with --compile (then the pair is compiled and nothing run)."""
    if not has_prompt(args) and not args.compile:
        raise SpecdecError("one of the arguments --prompt --prompt-file --prompt-ids --prompts-txt-file-path "
                           "is required")
    if args.pair is None:
        if args.compile:
            raise SpecdecError("--compile runs the compile.sh of a pair: it needs --pair OUT")
        if args.tlm is None:
            raise SpecdecError("--tlm DIR is required (or --pair OUT, a pair directory)")
        return
    if args.tlm is not None or args.dlm is not None:
        raise SpecdecError("--pair OUT names the TLM and its draft: give --pair or --tlm/--dlm, not both")
    from ..pair.manifest import read_pair
    m = read_pair(args.pair)
    args.tlm = m["tlm"]
    if m["draft"] in ("ngram", "suffix"):
        if args.draft in ("dlm", "hybrid"):    # (it said "--dlm DIR is required", which --pair refuses)
            raise SpecdecError(f"--draft {args.draft} needs a draft model, and --pair {args.pair} is a "
                               f"{m['draft']} pair: it has none (build a pair with --dlm or --head)")
        if args.draft is None and not args.target_only:
            args.draft = m["draft"]
    elif not args.target_only and args.draft not in ("ngram", "suffix"):
        args.dlm = m["dlm"]
    if args.tokenizer is None and m.get("tokenizer"):
        args.tokenizer = m["tokenizer"]
    group = ((m.get("settings") or {}).get("qaic") or {}).get("device_group")    # read_pair checked its types
    if group and args.backend == "qaic" and args.tlm_device_ids is None and args.device_group is None:
        args.tlm_device_ids = ",".join(str(i) for i in group)   # compiled with --device-group: opened on it


def compile_pair(args) -> bool:
    """--compile: each model's compile.sh, TLM first; one line when there is no compiler or one fails.
    True when it compiled and no prompt was given (nothing to run)."""
    if not args.compile:
        return False
    from ..artifact.writer import find_compiler
    from ..pair.manifest import read_pair
    from .compile import run_compile
    out = Path(args.pair)
    m = read_pair(out)
    if m["target"] != "qaic":
        raise SpecdecError(f"--compile: {out} is a {m['target']} pair; compile.sh is for Cloud AI 100 (qaic) pairs")
    dirs = [Path(m[k]) for k in ("tlm", "dlm") if m.get(k)]
    compiler = find_compiler()
    if compiler is None:
        raise SpecdecError(f"--compile: no Cloud AI 100 compiler here (neither qaic-compile nor qaic-exec on PATH or "
                           f"in /opt/qti-aic/exec/); on a machine with the SDK run "
                           f"{' and '.join(str(d / 'compile.sh') for d in dirs)}")
    for d in dirs:
        rc = run_compile(d, compiler)
        if rc != 0:
            raise SpecdecError(f"--compile: {d / 'compile.sh'} failed (exit status {rc})")
    print(f"compiled {' and '.join(str(d) for d in dirs)}", file=sys.stderr)
    return not has_prompt(args)
