"""Our OpenVINO backend's decoding in a fresh process: the worker bench/backends.py's paired rounds
run beside GenAI's (bench/ovgenai_worker.py), so that both sides start from the same state.

Why a process of its own: GenAI's worker started from a process that held a compiled OpenVINO
model ran about 12% faster than the same worker started from one that held none (measured
2026-11-26, 1 thread, f32 target-only: 34.2-36.0 tok/s in 5 runs against 29.7-31.1 in 6; a
parent that had closed its model, or only made a Core, showed no such gain). The earlier paired
rounds ran ours in the bench's process, with its model loaded, and started GenAI from it, so they
compared unlike processes. Now both sides are started the same way from the same process.

It reads one JSON request on stdin and writes one JSON answer on stdout:

    {"artifact": DIR, "precision": "f32" | "bf16" | ..., "threads": T, "cache": null | "copy",
     "draft": null | "ngram" | "suffix" | "eagle3-hybrid", "eagle3": [TLM DIR, HEAD DIR] | null,
     "prompts": [[ids], ...], "max_new_tokens": N}
    -> {"tok_s": ..., "cache": "fused" | "copy", "generated": [[ids], ...]}

``draft`` null is target-only on ``artifact``; ``eagle3-hybrid`` runs the ``eagle3`` pair instead
(both loaded at the same precision, threads and cache). As bench/backends.py's rows: greedy, every
prompt gets exactly N new tokens, one untimed warm-up generation first, tokens/s over the wall time
of all prompts. On any failure the answer is ``{"error": one line}`` and the exit status 1.
"""
from __future__ import annotations

from bench.ovgenai_worker import serve


def run(req: dict) -> dict:
    from specdec_compile.runtime import OpenVinoBackend
    from bench.backends import decode       # the rows' own decoding and timing

    def load(d):
        b = OpenVinoBackend(d, precision=req["precision"], threads=int(req["threads"]), cache=req.get("cache"))
        b.warmup()
        return b

    draft = req.get("draft")
    opened = [load(d) for d in req["eagle3"]] if draft == "eagle3-hybrid" else [load(req["artifact"])]
    tlm, dlm = opened[0], (opened[1] if len(opened) > 1 else None)
    new = int(req["max_new_tokens"])
    try:
        decode(tlm, req["prompts"][:1], draft, min(new, 8), dlm)
        outs, rate = decode(tlm, req["prompts"], draft, new, dlm)
    finally:
        for b in opened:
            b.close()
    return {"tok_s": rate, "cache": tlm.cache_kind, "generated": [[int(t) for t in o] for o in outs]}


def main() -> int:
    return serve(run)


if __name__ == "__main__":
    raise SystemExit(main())
