"""Serving benchmarks (``python -m bench.run_bench --only batch,ngram,suffix,fallback``), on the demo pair
(suffix_drafts: bench/suffix.py):

batch_throughput  B = 1, 2, 4, 8 rows; 16 held-out prompts through continuous
                  batching; target-only (the TLM's width-1 specialization) and
                  speculative (DLM, adaptive widths with the K=0 fallback); total
                  new tokens / wall time; each B with the default TLM and with the
                  --full-batch-size TLM (QEfficient's continuous batching: a prompt
                  prefilled at batch 1 into its row).
                  Greedy outputs are checked equal.
ngram             n-gram (prompt lookup) drafts, no DLM: "grounded" prompts (a
                  held-out function, then the instruction to write it again with
                  a new name and its def line restated, so the continuation
                  repeats the prompt's own text) and "free" prompts (held-out
                  def + docstring); fallback on (K=0 compiled and chosen when it
                  pays) and off (no width 1 compiled, never draft nothing).
fallback_dlm      the DLM on code it was not trained for (bench/ood_prompts.py,
                  written for this purpose, not in the stdlib): speculative with
                  and without the fallback against target-only, per prompt.

Batch-1 sections take the best of ``--repeats`` interleaved runs per mode.
"""
from __future__ import annotations

import re
import time
from pathlib import Path

from workshop import train_pair
from demo.compiling import compile_artifact
from demo.rates import decode_rate

from . import ood_prompts

DEF_RE = re.compile(r"^def \w+\(", re.M)


def held_out_functions(n: int, max_tokens: int, tok, whole: bool = False) -> list[tuple[str, str]]:
    """(name, text): documented top-level functions of the held-out modules, several per
    module; ``whole``: the full function, else its def line and docstring."""
    _, held = train_pair.corpus_files(train_pair.CONFIG["corpus"])
    out = []
    for path in held:
        text = train_pair.read(path)
        for m in DEF_RE.finditer(text):
            q = text.find('"""', m.end())
            if q < 0 or "\n" not in text[m.end():q]:
                continue
            nxt = DEF_RE.search(text, m.end())
            end = (nxt.start() if nxt else len(text)) if whole else text.find('"""', q + 3) + 3
            body = text[m.start():end].rstrip() if whole else text[m.start():end]
            if not 12 <= len(tok(body)["input_ids"]) <= max_tokens:
                continue
            name = re.match(r"def (\w+)", body).group(1)
            out.append((f"{path.stem}.{name}", body))
            if len(out) >= n:
                return out
    return out


def grounded(fn_text: str) -> str:
    """The function, then an instruction to write it again renamed, and the new def line."""
    name = re.match(r"def (\w+)", fn_text).group(1)
    first = fn_text.split("\n", 1)[0].replace(f"def {name}(", f"def {name}_v2(", 1)
    return f"{fn_text}\n\n\n# The same function again, renamed to {name}_v2:\n{first}\n"


def _art(pair, out, name, role, B, a, k_list=None, k=4, interface="default"):
    onnx = Path(pair["paths"]["tlm_onnx" if role == "tlm" else "dlm_onnx"])
    args = ["--role", role, "--target", "ort", "--prefill-len", "32", "--ctx-len", str(a.ctx_len),
            "--batch-size", str(B)] + (["--full-batch-size", str(B)] if interface == "qeff" else [])
    if role == "tlm":
        args += ["--k", str(k)] + (["--k-list", k_list] if k_list else [])
    compile_artifact(onnx, out / name, args, log=a.log)
    return out / name


def backends(pair, out, a, B, dlm=True, k_list="0,1,2,4", interface="default"):
    """The TLM (``interface``: "qeff" for QEfficient's continuous batching, --full-batch-size: prefill at
    batch 1 into its row) and the DLM."""
    from specdec_compile.runtime import OrtBackend
    kw = {"intra_op_threads": a.ort_threads}
    tag = "" if interface == "default" else f"-{interface}"
    tlm = OrtBackend(_art(pair, out, f"serve-tlm-b{B}-{k_list.replace(',', '')}{tag}", "tlm", B, a, k_list,
                          interface=interface), **kw)
    d = OrtBackend(_art(pair, out, f"serve-dlm-b{B}", "dlm", B, a), **kw) if dlm else None
    return tlm, d


def _run_many(dec, ids, a):
    t = time.perf_counter()
    res = dec.generate_many(ids, max_new_tokens=a.serve_new_tokens)
    wall = time.perf_counter() - t
    return res, sum(r.metrics["new_tokens"] for r in res) / wall


def bench_batch(pair: dict, out: Path, a, tok) -> list:
    from specdec_compile.runtime import SpecDecoder, TargetOnlyDecoder
    eos = tok.eos_token_id
    ids = [tok(t)["input_ids"] for _, t in held_out_functions(16, a.ctx_len - a.serve_new_tokens, tok)]
    a.log(f"[batch] {len(ids)} prompts, {a.serve_new_tokens} new tokens, B = 1, 2, 4, 8, both TLM interfaces")
    rows, first = [], None
    for B in (1, 2, 4, 8):
        for interface in ("default", "qeff"):
            row, outputs = _batch_row(pair, out, a, B, interface, ids, eos)
            first = outputs if first is None else first
            if outputs != first:
                raise SystemExit(f"B={B}, {interface} TLM: greedy output differs from the default interface's")
            rows.append(row)
    return rows


def _batch_row(pair, out, a, B, interface, ids, eos) -> tuple[dict, list]:
    """One batch_throughput row: target-only and speculative at batch B with the TLM of ``interface``."""
    from specdec_compile.runtime import SpecDecoder, TargetOnlyDecoder
    tlm, dlm = backends(pair, out, a, B, interface=interface)
    tlm.warmup()
    dlm.warmup()
    target, spec = TargetOnlyDecoder(tlm, eos_token_id=eos), SpecDecoder(tlm, dlm, eos_token_id=eos)
    best = {"t": 0.0, "s": 0.0}
    for _ in range(a.serve_repeats):
        rt, tps = _run_many(target, ids, a)
        rs, sps = _run_many(spec, ids, a)
        if [r.generated_ids for r in rt] != [r.generated_ids for r in rs]:
            raise SystemExit(f"B={B}: speculative output differs from target-only output")
        best["t"], best["s"] = max(best["t"], tps), max(best["s"], sps)
    acc = sum(r.metrics["accepted_tokens"] for r in rs) / max(1, sum(r.metrics["drafted_tokens"] for r in rs))
    a.log(f"  B={B} {interface}: target {best['t']:.1f} tok/s, speculative {best['s']:.1f} tok/s "
          f"({best['s'] / best['t']:.2f}x), acceptance {acc:.3f}")
    tlm.close()
    dlm.close()
    return ({"batch_size": B, "interface": interface, "target_tokens_per_s": round(best["t"], 1),
             "spec_tokens_per_s": round(best["s"], 1), "speedup": round(best["s"] / best["t"], 3),
             "acceptance_rate": round(acc, 4)}, [r.generated_ids for r in rt])


def _pairwise(dec_t, dec_s, ids, a):
    """Per prompt, best-of-repeats decode tokens/s of both; greedy outputs checked equal."""
    bt, bs, alpha = [0.0] * len(ids), [0.0] * len(ids), [0, 0]
    for _ in range(a.serve_repeats):
        for i, p in enumerate(ids):
            rt = dec_t.generate(p, max_new_tokens=a.serve_new_tokens)
            rs = dec_s.generate(p, max_new_tokens=a.serve_new_tokens)
            if rt.generated_ids != rs.generated_ids:
                raise SystemExit("speculative output differs from target-only output")
            bt[i] = max(bt[i], decode_rate(rt.metrics) or 0.0)
            bs[i] = max(bs[i], decode_rate(rs.metrics) or 0.0)
            alpha[0] += rs.metrics["accepted_tokens"]
            alpha[1] += rs.metrics["drafted_tokens"]
    n = len(ids)
    t_rate, s_rate = n / sum(1 / x for x in bt), n / sum(1 / x for x in bs)   # per-prompt mean time
    return t_rate, s_rate, [round(s / t, 3) for s, t in zip(bs, bt)], alpha[0] / max(1, alpha[1])


def bench_ngram(pair: dict, out: Path, a, tok) -> list:
    from specdec_compile.runtime import SpecDecoder, TargetOnlyDecoder
    eos = tok.eos_token_id
    budget = a.ctx_len - a.serve_new_tokens
    fns = held_out_functions(6, budget - 40, tok, whole=True)
    sets = {"grounded": [tok(grounded(t))["input_ids"] for _, t in fns],
            "free": [tok(t)["input_ids"] for _, t in held_out_functions(6, budget, tok)]}
    on, _ = backends(pair, out, a, 1, dlm=False, k_list="0,1,2,4")
    off, _ = backends(pair, out, a, 1, dlm=False, k_list="1,2,4")
    target = TargetOnlyDecoder(on, eos_token_id=eos)           # width 1: plain decoding
    rows = []
    for kind, ids in sets.items():
        for fb in (True, False):
            spec = SpecDecoder(on if fb else off, None, draft="ngram", fallback=fb, eos_token_id=eos)
            t_rate, s_rate, per, alpha = _pairwise(target, spec, ids, a)
            rows.append({"prompts": kind, "fallback": fb, "target_tokens_per_s": round(t_rate, 1),
                         "spec_tokens_per_s": round(s_rate, 1), "speedup": round(s_rate / t_rate, 3),
                         "alpha": round(alpha, 4), "per_prompt_speedup": per})
            a.log(f"[ngram] {kind}, fallback {'on' if fb else 'off'}: {s_rate:.1f} vs {t_rate:.1f} tok/s "
                  f"({s_rate / t_rate:.2f}x), alpha {alpha:.3f}, per prompt {per}")
    return rows


def bench_fallback_dlm(pair: dict, out: Path, a, tok) -> list:
    from specdec_compile.runtime import SpecDecoder, TargetOnlyDecoder
    eos = tok.eos_token_id
    ids = [tok(t)["input_ids"] for t in ood_prompts.PROMPTS]
    tlm, dlm = backends(pair, out, a, 1)
    off, _ = backends(pair, out, a, 1, dlm=False, k_list="1,2,4")
    target = TargetOnlyDecoder(tlm, eos_token_id=eos)
    rows = []
    for fb in (True, False):
        spec = SpecDecoder(tlm if fb else off, dlm, fallback=fb, eos_token_id=eos)
        t_rate, s_rate, per, alpha = _pairwise(target, spec, ids, a)
        rows.append({"prompts": "ood_code", "fallback": fb, "target_tokens_per_s": round(t_rate, 1),
                     "spec_tokens_per_s": round(s_rate, 1), "speedup": round(s_rate / t_rate, 3),
                     "min_prompt_speedup": min(per), "alpha": round(alpha, 4), "per_prompt_speedup": per})
        a.log(f"[fallback] DLM, OOD code, fallback {'on' if fb else 'off'}: {s_rate / t_rate:.2f}x "
              f"(min per prompt {min(per):.2f}x), alpha {alpha:.3f}")
    return rows


def run(pair: dict, out: Path, a, only: set) -> dict:
    from specdec_compile.runtime.tokenizer import load_tokenizer
    tok = load_tokenizer(Path(pair["paths"]["tokenizer"]))
    res = {}
    if "batch" in only:
        res["batch_throughput"] = bench_batch(pair, out, a, tok)
    if "ngram" in only:
        res["ngram"] = bench_ngram(pair, out, a, tok)
    if "fallback" in only:
        res["fallback_dlm"] = bench_fallback_dlm(pair, out, a, tok)
    return res
