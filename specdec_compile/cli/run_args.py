"""``specdec-run``'s argument checks: every combination that cannot work together, refused in one
line before anything loads (an option another mode would drop without a word is refused, not ignored)."""
from __future__ import annotations

from ..errors import SpecdecError


def check_args(args) -> None:
    if args.draft is None and not args.target_only:
        args.draft = "dlm"
    if args.compare and args.target_only:
        raise SpecdecError("--compare runs the target alone itself: give the draft (--dlm DIR or --draft), "
                           "not --target-only")
    if args.target_only and args.dlm:
        raise SpecdecError("--target-only decodes with the TLM alone: it takes no --dlm")
    for flag, given in (("--draft dlm", args.draft == "dlm"), ("--no-fallback", args.no_fallback)):
        if given and args.target_only:      # the decoder drafts nothing: it would be dropped without a word
            raise SpecdecError(f"{flag} has no meaning with --target-only (it decodes with the TLM alone)")
    if args.draft == "ngram" and args.dlm:
        raise SpecdecError("--draft ngram takes no --dlm (the drafts come from the text itself)")
    if args.draft == "ngram" and args.target_only:
        raise SpecdecError("--draft ngram has no meaning with --target-only")
    if args.draft == "hybrid" and (args.target_only or not args.dlm):
        raise SpecdecError("--draft hybrid needs --dlm DIR (prompt lookup first, that draft otherwise)")
    if args.ngram_max is not None and args.draft not in ("ngram", "hybrid"):
        raise SpecdecError("--ngram-max is for --draft ngram or hybrid")
    if args.ngram_max is not None:
        from ..runtime.drafts.ngram import NgramDraft
        if not 1 <= args.ngram_max <= NgramDraft.MAX_N:
            raise SpecdecError(f"--ngram-max must be in [1, {NgramDraft.MAX_N}] (got {args.ngram_max})")
    check_suffix_args(args)
    check_backend_args(args)
    check_min_prob(args)
    if not args.target_only and args.draft == "dlm" and not args.dlm:
        raise SpecdecError("--dlm DIR is required (or --draft ngram, or --target-only)")
    if args.k is not None and args.target_only:
        raise SpecdecError("--k has no meaning with --target-only")
    if args.chat and args.prompt_ids is not None:
        raise SpecdecError("--chat applies the chat template to text: give --prompt or --prompt-file")
    if args.chat and not args.tokenizer:
        raise SpecdecError("--chat needs --tokenizer DIR (its chat template)")
    if args.dlm_tokenizer and not args.tokenizer:
        raise SpecdecError("--dlm-tokenizer needs --tokenizer")
    if args.dlm_tokenizer and (args.target_only or args.draft in ("ngram", "suffix")):
        raise SpecdecError("--dlm-tokenizer is the draft model's tokenizer: it needs --dlm (not --target-only, "
                           "--draft ngram or --draft suffix)")
    if args.dlm_device_ids is not None and (args.target_only or args.draft in ("ngram", "suffix")):
        raise SpecdecError("--dlm-device-ids places the draft model: it needs --dlm (not --target-only, "
                           "--draft ngram or --draft suffix)")


def check_min_prob(args) -> None:
    p = args.draft_min_prob
    if not 0.0 <= p < 1.0:
        raise SpecdecError(f"--draft-min-prob must be in [0, 1) (got {p})")
    if p and (args.target_only or args.draft not in ("dlm", "hybrid")):
        raise SpecdecError("--draft-min-prob is for a draft model (--dlm, alone or in --draft hybrid)")


def check_backend_args(args) -> None:
    for flag, value in (("--ov-precision", args.ov_precision), ("--ov-threads", args.ov_threads),
                        ("--ov-cache", args.ov_cache)):
        if value is not None and args.backend != "openvino":
            raise SpecdecError(f"{flag} is for --backend openvino")
    for flag, given in (("--ort-threads", args.ort_threads is not None), ("--copy-cache", args.copy_cache)):
        if given and args.backend != "ort":     # the other backends would run without it, without a word
            raise SpecdecError(f"{flag} is for --backend ort (ONNX Runtime)")
    if args.ov_threads is not None:
        from ..ort_session import check_threads
        check_threads(args.ov_threads, "--ov-threads")
    if args.backend == "openvino":   # not installed: one line saying how, before anything loads
        from ..runtime.backends.openvino import import_openvino
        import_openvino()


def check_suffix_args(args) -> None:
    if args.draft == "suffix" and args.dlm:
        raise SpecdecError("--draft suffix takes no --dlm (the drafts come from the text itself)")
    if args.draft == "suffix" and args.target_only:
        raise SpecdecError("--draft suffix has no meaning with --target-only")
    for name in ("suffix_cache_tokens", "suffix_max_depth"):
        flag = "--" + name.replace("_", "-")
        if getattr(args, name) is not None and args.draft != "suffix":
            raise SpecdecError(f"{flag} is for --draft suffix")
    if args.suffix_cache_tokens is not None and not 1 <= args.suffix_cache_tokens < 2 ** 63:
        raise SpecdecError(f"--suffix-cache-tokens must be a positive number of tokens, below 2**63 "
                           f"(got {args.suffix_cache_tokens})")
    if args.suffix_max_depth is not None and not 2 <= args.suffix_max_depth <= 256:
        raise SpecdecError(f"--suffix-max-depth must be in [2, 256] (got {args.suffix_max_depth})")


def check_sampling(args, sampling) -> None:
    """--top-k, --top-p and --seed shape a sampled text; greedy decoding (--temperature 0, the
    default, or below 1e-5) would drop them without a word, and the run be taken for a sampled one."""
    if not sampling.greedy:
        return
    for flag, given in (("--top-k", args.top_k != 0), ("--top-p", args.top_p != 1.0),
                        ("--seed", args.seed is not None)):
        if given:
            raise SpecdecError(f"{flag} is for sampling, but --temperature {args.temperature:g} decodes greedily: "
                               f"give --temperature T (T >= 1e-5), or drop {flag}")
