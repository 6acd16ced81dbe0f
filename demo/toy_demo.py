"""The demo on the toy pair trained here (``python -m demo.run_demo --toy`` / ``--micro``):

1. ``train_pair``: tokenizer, TLM and distilled DLM trained on the Python standard
   library, exported by ``optimum-cli`` (cached; minutes the first time, seconds after).
2. ``compiling.compile_trio`` (``specdec-compile --target ort``): the DLM, the TLM with a
   few verification widths (``--k`` and ``--k-list``), and the TLM once more with
   ``--role dlm`` -- the plain seq_len-1 target-only baseline.
3. Speculative decoding on prompts taken from held-out standard-library modules (a
   function's signature and docstring): the code streams as it is accepted, accepted
   drafts in green; then the same prompts with the TLM alone. Greedy speculative
   decoding must give exactly the target's tokens; this is checked.
4. Metrics and the speedup over target-only decoding (decode phase, after the first
   token; the time spent printing is not counted in either).
"""
from __future__ import annotations

import json
import re
import time
from pathlib import Path

from workshop import train_pair

from .compiling import compile_trio
from .rates import decode_rate
from .stream import Stream

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


def _train(a, log) -> dict:
    """1. the pair (``train_pair.run``: trained, or reused from its cache)."""
    cfg = train_pair.deep_update(train_pair.CONFIG, train_pair.MICRO) if a.micro else train_pair.CONFIG
    t0 = time.time()
    pair = train_pair.run(cfg, a.out, threads=a.threads)
    t_pair = time.time() - t0
    m = pair["metrics"]
    log(f"[pair] TLM {pair['params']['tlm'] / 1e6:.2f}M params (held-out loss {m['tlm_loss']}), "
        f"DLM {pair['params']['dlm'] / 1e6:.2f}M (loss {m['dlm_loss']}); greedy agreement "
        f"{m['agreement_held_out_text']} on held-out text, {m['agreement_tlm_continuations']} on TLM "
        f"continuations ({t_pair:.0f} s{', reused' if pair.get('reused') else ''})")
    return pair


def _decode_prompt(spec, target, tok, name: str, text: str, a, stream) -> dict:
    """One prompt, speculative and target-only, ``a.repeats`` times (the first run streams):
    the row of the fastest runs. Greedy: the two outputs must be equal."""
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
    return {"prompt": name, "prompt_tokens": len(ids), "new_tokens": ms["new_tokens"],
            "stop": best_s.stop_reason, "spec_tokens_per_s": vs, "target_tokens_per_s": vt,
            "speedup": (vs / vt) if vs and vt else None,
            "acceptance_rate": ms["acceptance_rate"],
            "tokens_per_tlm_call": ms["mean_tokens_per_tlm_call"],
            "dlm_time_s": ms["dlm_time_s"], "tlm_time_s": ms["tlm_time_s"],
            "host_time_s": ms["host_time_s"], "total_time_s": ms["total_time_s"],
            "target_total_time_s": mt["total_time_s"],
            "verify_drafts_histogram": ms.get("verify_drafts_histogram"),
            "identical": True}


def _summary(rows: list[dict]) -> dict:
    """Decode rates over all prompts (total tokens / total time) and the speedup."""
    tot_new = sum(r["new_tokens"] - 1 for r in rows)
    tot_spec = sum((r["new_tokens"] - 1) / r["spec_tokens_per_s"] for r in rows if r["spec_tokens_per_s"])
    tot_tgt = sum((r["new_tokens"] - 1) / r["target_tokens_per_s"] for r in rows if r["target_tokens_per_s"])
    summary = {"spec_tokens_per_s": tot_new / tot_spec if tot_spec else None,
               "target_tokens_per_s": tot_new / tot_tgt if tot_tgt else None}
    summary["speedup"] = (summary["spec_tokens_per_s"] / summary["target_tokens_per_s"]
                          if summary["spec_tokens_per_s"] and summary["target_tokens_per_s"] else None)
    return summary


def _table(a, k_list: list[int], rows: list[dict], summary: dict):
    from rich.table import Table
    t = Table(title=f"speculative vs target-only decoding (ONNX Runtime CPU, {a.ort_threads} thread(s), "
                    f"k {'adaptive over ' + str(sorted({a.k, *k_list})) if a.decode_k is None else a.decode_k})")
    for col in ("prompt", "new tok", "target tok/s", "spec tok/s", "speedup", "accept", "tok/TLM call"):
        t.add_column(col, justify="right" if col != "prompt" else "left")
    f = lambda v, p=1: "-" if v is None else f"{v:.{p}f}"  # noqa: E731
    for r in rows:
        t.add_row(r["prompt"], str(r["new_tokens"]), f(r["target_tokens_per_s"]), f(r["spec_tokens_per_s"]),
                  f(r["speedup"], 2) + "x", f(r["acceptance_rate"], 2), f(r["tokens_per_tlm_call"], 2))
    tot_new = sum(r["new_tokens"] - 1 for r in rows)
    t.add_row("all", str(tot_new + len(rows)), f(summary["target_tokens_per_s"]), f(summary["spec_tokens_per_s"]),
              f(summary["speedup"], 2) + "x", "", "", style="bold")
    return t


def main(a, console, log) -> int:
    """The toy pair: trained here on the stdlib (``train_pair.py``), compiled, decoded."""
    k_list = [int(x) for x in a.k_list.split(",") if x.strip()]
    pair = _train(a, log)

    # 2. compile
    ctimes = compile_trio(Path(pair["paths"]["tlm_onnx"]), Path(pair["paths"]["dlm_onnx"]), a.out, k=a.k, k_list=k_list,
                          prefill_len=a.prefill_len, ctx_len=a.ctx_len, log=log)

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
    rows = [_decode_prompt(spec, target, tok, name, text, a, stream) for name, text in prompts]

    # 4. report
    summary = _summary(rows)
    console.print(_table(a, k_list, rows, summary))
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
