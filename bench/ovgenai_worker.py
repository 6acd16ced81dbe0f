"""OpenVINO GenAI's own pipeline on token ids: the worker ``bench/ovgenai.py`` runs as a subprocess.

It runs under whichever Python has ``openvino_genai`` (the project's, or a scratch venv named by
``SPECDEC_OVGENAI_PYTHON``), so it imports nothing of the project: the standard library, numpy
and ``openvino_genai`` only. It reads one JSON request on stdin and writes one JSON answer on
stdout:

    {"ir": DIR, "prompts": [[ids], ...], "max_new_tokens": N, "threads": T,
     "runs": [{"precision": "f32" | null, "mode": "target" | "prompt_lookup"}, ...],
     "num_assistant_tokens": K, "max_ngram_size": M}

Per run: greedy decoding (``ignore_eos``: every prompt gets exactly N new tokens, as the bench's
own decoders do) of every prompt fed as ids (``TokenizedInputs``: the same ids as ours, no
tokenizer of GenAI's involved), after one untimed warm-up generation; tokens/s is all new tokens
over the wall time of all prompts. ``precision`` null leaves the CPU plugin's default (what a user
gets); the answer records that default, and per run the KV-cache precision the plugin picks for
the IR at the run's properties (``KV_CACHE_PRECISION``: not the inference precision).
"""
from __future__ import annotations

import json
import sys
import time


def _pipeline(genai, ir: str, threads: int, precision, prompt_lookup: bool):
    props = {"INFERENCE_NUM_THREADS": int(threads)}
    if precision is not None:
        props["INFERENCE_PRECISION_HINT"] = {"f32": "f32", "bf16": "bf16", "f16": "f16"}[precision]
    if prompt_lookup:
        props["prompt_lookup"] = True
    return genai.LLMPipeline(ir, "CPU", **props)


def _kv_precision(ov, ir: str, threads: int, precision) -> str:
    """The CPU plugin's KV-cache precision for this IR at these properties (its default is not the
    inference precision: f16 with an f32 hint here)."""
    props = {"INFERENCE_NUM_THREADS": int(threads)}
    if precision is not None:
        props["INFERENCE_PRECISION_HINT"] = precision
    got = ov.Core().compile_model(f"{ir}/openvino_model.xml", "CPU", props).get_property("KV_CACHE_PRECISION")
    return got.get_type_name() if hasattr(got, "get_type_name") else str(got)


def _config(pipe, new: int, mode: str, req: dict):
    cfg = pipe.get_generation_config()
    cfg.max_new_tokens, cfg.ignore_eos, cfg.do_sample = new, True, False
    if mode == "prompt_lookup":
        cfg.num_assistant_tokens = int(req["num_assistant_tokens"])
        cfg.max_ngram_size = int(req["max_ngram_size"])
    return cfg


def _generate(genai, ov, np, pipe, ids, cfg) -> list[int]:
    a = np.array([ids], dtype=np.int64)
    out = pipe.generate(genai.TokenizedInputs(ov.Tensor(a), ov.Tensor(np.ones_like(a))), cfg)
    return [int(t) for t in out.tokens[0]]


def run(req: dict) -> dict:
    import numpy as np
    import openvino as ov
    import openvino_genai as genai

    default = ov.Core().get_property("CPU", "INFERENCE_PRECISION_HINT")
    default = default.get_type_name() if hasattr(default, "get_type_name") else str(default)
    ans = {"openvino_genai": genai.__version__, "cpu_default_precision": default, "runs": []}
    new = int(req["max_new_tokens"])
    for r in req["runs"]:
        pipe = _pipeline(genai, req["ir"], req["threads"], r["precision"], r["mode"] == "prompt_lookup")
        cfg = _config(pipe, new, r["mode"], req)
        warm = _config(pipe, min(new, 8), r["mode"], req)
        _generate(genai, ov, np, pipe, req["prompts"][0], warm)
        t0 = time.perf_counter()
        outs = [_generate(genai, ov, np, pipe, p, cfg) for p in req["prompts"]]
        wall = time.perf_counter() - t0
        del pipe
        ans["runs"].append({**r, "runs_at": r["precision"] or default, "tok_s": sum(map(len, outs)) / wall,
                            "wall_s": wall, "generated": outs,
                            "kv_cache_precision": _kv_precision(ov, req["ir"], req["threads"], r["precision"])})
    return ans


def serve(run_request) -> int:
    """One JSON request on stdin, ``run_request``'s answer on stdout (exit 0), or ``{"error": one
    line}`` (exit 1). bench/ov_worker.py serves the same way."""
    try:
        ans = run_request(json.loads(sys.stdin.read()))
    except Exception as e:      # the caller shows this one line
        print(json.dumps({"error": f"{type(e).__name__}: {' '.join(str(e).split())[:400]}"}))
        return 1
    print(json.dumps(ans))
    return 0


def main() -> int:
    return serve(run)


if __name__ == "__main__":
    raise SystemExit(main())
