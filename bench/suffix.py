"""Suffix drafts against n-gram drafts and target-only (``python -m bench.run_bench --only suffix``):
{workload, draft, tokens_per_tlm_call, speedup} on the toy pair, batch 1, fallback on (K=0 compiled).

Workloads, each through one decoder per draft source, in order (the suffix source's
global trie is cleared at the start of each pass, so a pass learns only from its own
earlier requests, never from an earlier pass over the same prompts):

demo_instructions  the instructions ``make demo`` decodes (workshop/prompts.py), as plain text.
repeated           a few held-out def + docstring prompts, each asked three times with small
                   changes: as is, the function renamed, and renamed again with its first
                   parameter renamed and a number changed (as agents and code-edit tools ask).
grounded, free     the n-gram section's prompts (bench/serving.py).

SmolLM2 rows (``--only suffix`` or ``--only suffix-real``; bench/results/results-suffix-real.{json,md}),
when ``make demo``'s build exists (``--real-build DIR``, default build/demo; else skipped, with
the reason printed): the demo's TLM (k_list 0..8: adaptive widths, the K=0 fallback) and its
tokenizer, target-only on ``tlm-base`` (the seq_len-1 baseline, as bench/real_model.py),
every prompt through SmolLM2's chat template:

demo_instructions  the demo's instructions (``--suffix-real-prompts``).
repeated           ``--suffix-real-functions`` held-out def + docstring prompts (the toy's), each
                   as "Complete this Python function" around the code, in ``variants``' three forms.
grounded, free     not measured: the real-model bench has no such prompts.

tokens_per_tlm_call: new tokens / TLM calls over the workload, the prefill counted as one
call (target-only: 1);
speedup: the per-prompt mean decode rate over target-only's (best of ``--serve-repeats``
interleaved passes). Greedy outputs are checked equal to target-only.
"""
from __future__ import annotations

import re
from pathlib import Path

from workshop.prompts import DEMO_PROMPTS, WARMUP_PROMPT
from demo.rates import decode_rate

from .serving import backends, grounded, held_out_functions


def variants(fn_text: str) -> list[str]:
    """The prompt, then with the function renamed, then also its first parameter renamed
    and a number changed (or one added to the docstring)."""
    name = re.match(r"def (\w+)", fn_text).group(1)
    v1 = re.sub(rf"\b{name}\b", f"{name}_new", fn_text)
    v2 = re.sub(rf"\b{name}\b", f"new_{name}", fn_text)
    params = re.match(r"def \w+\(\s*(\w+)", fn_text)
    if params and params.group(1) not in ("self", "cls"):
        v2 = re.sub(rf"\b{params.group(1)}\b", f"{params.group(1)}_in", v2)
    num = re.search(r"\b\d+\b", v2)
    if num:
        v2 = v2[:num.start()] + str(int(num.group()) + 7) + v2[num.end():]
    else:
        v2 = v2.replace('"""', '"""(Version 2.) ', 1)
    return [fn_text, v1, v2]


def workloads(tok, a) -> dict:
    budget = a.ctx_len - a.serve_new_tokens
    rep = [v for _, t in held_out_functions(3, budget - 20, tok) for v in variants(t)]
    return {
        "demo_instructions": [tok(t)["input_ids"] for t in DEMO_PROMPTS],
        "repeated": [tok(t)["input_ids"] for t in rep],
        "grounded": [tok(grounded(t))["input_ids"] for _, t in held_out_functions(6, budget - 40, tok, whole=True)],
        "free": [tok(t)["input_ids"] for _, t in held_out_functions(6, budget, tok)],
    }


def _pass(decs: dict, ids: list, n_new: int, best: dict, calls: dict) -> None:
    """One pass over a workload, every decoder per prompt in turn (the first one: target-only);
    keeps per-prompt best rates."""
    for i, p in enumerate(ids):
        want = None
        for name, dec in decs.items():
            r = dec.generate(p, max_new_tokens=n_new)
            if want is None:
                want = r.generated_ids
            elif r.generated_ids != want:
                raise SystemExit(f"{name}: speculative output differs from target-only output")
            best[name][i] = max(best[name][i], decode_rate(r.metrics) or 0.0)
            m = r.metrics
            calls[name][0] += m["new_tokens"]
            calls[name][1] += m["tlm_verify_calls"] + (1 if m["new_tokens"] else 0)   # + the prefill's token


def rows_of(kind: str, best: dict, calls: dict) -> list[dict]:
    """A workload's rows, one per decoder: tokens per TLM call over the workload ([tokens, calls]),
    the per-prompt decode rates' harmonic mean (prompts with no decode phase left out), and its
    ratio to target-only's (the decoder named "none")."""
    def mean(xs):
        xs = [x for x in xs if x > 0]
        return len(xs) / sum(1 / x for x in xs) if xs else 0.0
    base = mean(best["none"])
    return [{"workload": kind, "draft": name, "prompts": len(best[name]),
             "tokens_per_tlm_call": round(calls[name][0] / max(1, calls[name][1]), 3),
             "tokens_per_s": round(mean(best[name]), 1),
             "speedup": round(mean(best[name]) / base, 3) if base else None} for name in best]


def measure(decs: dict, work: dict, n_new: int, repeats: int, log, tag: str = "[suffix]") -> list[dict]:
    """Every workload through every decoder, ``repeats`` passes (best rate per prompt kept)."""
    rows = []
    for kind, ids in work.items():
        best = {k: [0.0] * len(ids) for k in decs}
        calls = {k: [0, 0] for k in decs}
        for _ in range(repeats):
            decs["suffix"].source.clear()
            _pass(decs, ids, n_new, best, calls)
        for r in rows_of(kind, best, calls):
            rows.append(r)
            log(f"{tag} {kind:17s} {r['draft']:6s}: {r['tokens_per_tlm_call']:.2f} tokens/TLM call, "
                f"{r['tokens_per_s']:.1f} tok/s ({r['speedup'] or 0:.2f}x)")
    return rows


def bench_suffix(pair: dict, out: Path, a, tok) -> list:
    from specdec_compile.runtime import SpecDecoder, SuffixDraft, TargetOnlyDecoder
    eos = tok.eos_token_id
    tlm, _ = backends(pair, out, a, 1, dlm=False, k_list="0,1,2,4")
    tlm.warmup()
    decs = {"none": TargetOnlyDecoder(tlm, eos_token_id=eos),
            "ngram": SpecDecoder(tlm, None, draft="ngram", eos_token_id=eos),
            "suffix": SpecDecoder(tlm, SuffixDraft(), eos_token_id=eos)}
    rows = measure(decs, workloads(tok, a), a.serve_new_tokens, a.serve_repeats, a.log)
    tlm.close()
    return rows


# --------------------------------------------------------------------------- SmolLM2 (make demo's build)

CODE_REQUEST = "Complete this Python function:\n\n```python\n{}\n```"
REAL_RESULTS = Path(__file__).resolve().parent / "results" / "results-suffix-real.json"


def real_workloads(tok, n_instructions: int, n_functions: int, ctx_len: int, n_new: int) -> dict:
    """SmolLM2's workloads, chat-formatted (smollm2.chat_ids): the demo's instructions, and the
    repeated requests (every prompt fits ctx_len with n_new tokens after it)."""
    from workshop.smollm2 import chat_ids
    budget = ctx_len - n_new - len(chat_ids(tok, CODE_REQUEST.format("")))
    fits = lambda ids: len(ids) + n_new <= ctx_len  # noqa: E731
    rep: list = []
    for _, t in held_out_functions(2 * n_functions, budget, tok):     # the first n whose variants all fit
        group = [chat_ids(tok, CODE_REQUEST.format(v)) for v in variants(t)]
        if len(rep) < 3 * n_functions and all(map(fits, group)):
            rep += group
    work = {"demo_instructions": [chat_ids(tok, t) for t in DEMO_PROMPTS[:n_instructions]], "repeated": rep}
    if not all(map(fits, work["demo_instructions"])):
        raise SystemExit(f"a demo instruction with {n_new} new tokens exceeds the context length {ctx_len}")
    return work


def real_build_missing(build: Path) -> str | None:
    """Why the SmolLM2 rows cannot run from ``build`` (None: they can)."""
    need = [build / d / "manifest.json" for d in ("tlm", "dlm", "tlm-base")] + [build / "tokenizer"]
    miss = [str(p) for p in need if not p.exists()]
    return f"no SmolLM2 build in {build} (missing {', '.join(miss)}; `make demo` builds it)" if miss else None


def bench_suffix_real(build: Path, a) -> tuple[list, dict] | tuple[None, str]:
    """The SmolLM2 rows and their settings, or (None, why) when the build's TLM has no K=0 width."""
    from demo import real_demo
    from workshop.smollm2 import chat_ids
    from specdec_compile.runtime import SpecDecoder, SuffixDraft, TargetOnlyDecoder
    tok, tlm, dlm, base = real_demo.open_backends(build, a.ort_threads)
    dlm.close()
    art = tlm.artifact
    if 0 not in art.k_list:
        for b in (tlm, base):
            b.close()
        return None, f"{build / 'tlm'} has no K=0 width (k_list {list(art.k_list)}): rebuild with make demo"
    eos = art.manifest.get("eos_token_ids") or tok.eos_token_id
    decs = {"none": TargetOnlyDecoder(base, eos_token_id=eos), "ngram": real_demo.runtime_ngram_decoder(tlm, eos),
            "suffix": SpecDecoder(tlm, SuffixDraft(), eos_token_id=eos)}
    n_new = a.suffix_real_new_tokens
    work = real_workloads(tok, a.suffix_real_prompts, a.suffix_real_functions, art.ctx_len, n_new)
    a.log(f"[suffix-real] SmolLM2 ({build}): " + ", ".join(f"{k} {len(v)} prompts" for k, v in work.items())
          + f", {n_new} new tokens, {a.suffix_real_repeats} pass(es), TLM k_list {list(art.k_list)}, "
          f"ORT {a.ort_threads} thread(s); grounded/free: not measured (no such real-model prompts)")
    warm = chat_ids(tok, WARMUP_PROMPT)
    for dec in decs.values():
        dec.generate(warm, max_new_tokens=16)
    rows = measure(decs, work, n_new, a.suffix_real_repeats, a.log, "[suffix-real]")
    for b in (tlm, base):
        b.close()
    info = {"build": str(build), "prompts": {k: len(v) for k, v in work.items()}, "max_new_tokens": n_new,
            "repeats": a.suffix_real_repeats, "k_list": list(art.k_list), "ort_threads": a.ort_threads,
            "not_measured": "grounded, free (the real-model bench has no such prompts)"}
    return rows, info


def add_args(ap) -> None:
    """run_bench's options for the SmolLM2 rows (the build: ``--real-build``)."""
    ap.add_argument("--suffix-real-prompts", type=int, default=4, help="suffix, SmolLM2: demo instructions")
    ap.add_argument("--suffix-real-functions", type=int, default=3,
                    help="suffix, SmolLM2: functions of the repeated workload (3 requests each)")
    ap.add_argument("--suffix-real-new-tokens", type=int, default=48, help="suffix, SmolLM2: new tokens per prompt")
    ap.add_argument("--suffix-real-repeats", type=int, default=1, help="suffix, SmolLM2: passes (best rate kept)")


def run_real(a, only: set) -> dict:
    """The SmolLM2 rows (skipped, with the reason printed, when no build exists); written to
    bench/results/results-suffix-real.{json,md}."""
    if not only & {"suffix", "suffix-real"}:
        return {}
    why = real_build_missing(a.real_out)
    rows, info = (None, why) if why else bench_suffix_real(a.real_out, a)
    if rows is None:
        a.log(f"[suffix-real] skipped: {info}")
        return {}
    import json
    import time
    info["finished"] = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    from .record import beside_results
    path = beside_results(a, REAL_RESULTS)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"settings": info, "rows": rows}, indent=1) + "\n")
    path.with_suffix(".md").write_text("\n".join(markdown(rows, real_title(info))))
    a.log(f"[suffix-real] wrote {path} and {path.with_suffix('.md')}")
    return {"suffix_drafts_real": rows, "suffix_drafts_real_settings": info}


def real_title(info: dict) -> str:
    return (f"suffix drafts on SmolLM2-135M-Instruct ({info.get('build')}): greedy, batch 1, "
            f"{info.get('max_new_tokens')} new tokens, best of {info.get('repeats')} pass(es), TLM k_list "
            f"{info.get('k_list')} (K=0 fallback); every output equal to target-only; grounded/free not measured")


def run(pair: dict, out: Path, a, only: set) -> dict:
    if "suffix" not in only:
        return {}
    from specdec_compile.runtime.tokenizer import load_tokenizer
    return {"suffix_drafts": bench_suffix(pair, out, a, load_tokenizer(Path(pair["paths"]["tokenizer"])))}


def markdown(rows: list, title: str | None = None) -> list[str]:
    """The table of the toy's rows and of SmolLM2's (``title``: a line above it)."""
    L = ([title, ""] if title else []) + ["| workload | draft | tokens / TLM call | speedup vs none |",
                                          "|---|---|---|---|"]
    for r in rows:
        sp = "-" if r["speedup"] is None else f"{r['speedup']:.2f}x"
        L.append(f"| {r['workload']} | {r['draft']} | {r['tokens_per_tlm_call']:.2f} | {sp} |")
    return L + [""]
