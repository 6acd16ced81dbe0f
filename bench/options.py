"""``python -m bench.run_bench``'s options, checked before any work: what is wrong, in one line
(run_bench prints it and exits 2). A count of 0 or a missing ``--pair`` used to start the run and
end minutes later (after the toy pair's training or make demo's build) in a traceback."""
from __future__ import annotations

#: option (its ``dest``) -> the least value it takes; new tokens: 2, so that there is a decode phase
#: (the tokens after the first) to time
LEAST = {"serve_new_tokens": 2, "serve_repeats": 1, "real_prompts": 1, "real_max_new_tokens": 2, "real_repeats": 1,
         "real_threads": 1, "prompts": 1, "max_new_tokens": 2, "ctx_len": 32, "repeats": 1, "ort_threads": 1,
         "steps": 1, "rounds": 1, "big_layers": 1, "big_hidden": 1, "big_intermediate": 1, "big_vocab": 1,
         "rewrite_repeats": 1, "suffix_real_prompts": 1, "suffix_real_functions": 1, "suffix_real_new_tokens": 2,
         "suffix_real_repeats": 1, "step_floor_steps": 1, "fallback_feature_rounds": 1,
         "fallback_feature_prompts": 1, "fallback_feature_new_tokens": 2, "mtbench_ctx_len": 0}
#: list option -> (the least value of each entry, whether it may be empty); contexts: the decode steps
#: of ``kv`` run at the last 64 positions, every compile has a prefill of 32
LISTS = {"kv_ctx": (64, False), "step_floor_ctx": (32, False), "step_floor_widths": (1, True),
         "backends_threads": (1, False), "fallback_feature_threads": (1, False)}
#: the sections that decode the toy pair at --ctx-len
TOY_SECTIONS = {"spec", "batch", "ngram", "suffix", "fallback"}


def flag(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def problem(a, only: set) -> str | None:
    """What is wrong with run_bench's parsed options ``a`` for the sections ``only``, in one line
    (None: nothing)."""
    for dest, least in LEAST.items():
        v = getattr(a, dest)
        if v < least:
            return f"{flag(dest)} must be at least {least} (got {v})"
    for dest, (least, may_be_empty) in LISTS.items():
        vs = getattr(a, dest)
        if not vs and not may_be_empty:
            return f"{flag(dest)} must name at least one value"
        low = [v for v in vs if v < least]
        if low:
            return f"{flag(dest)}: every value must be at least {least} (got {low[0]})"
    for dest in ("max_new_tokens", "serve_new_tokens"):     # the toy sections' prompts come before the new tokens
        if only & TOY_SECTIONS and a.ctx_len <= getattr(a, dest):
            return f"--ctx-len {a.ctx_len} leaves no room for a prompt before {flag(dest)} {getattr(a, dest)}"
    if a.pair is not None and not a.pair.is_file():
        return f"--pair {a.pair}: no such file (workshop/train_pair.py writes pair.json)"
    return None
