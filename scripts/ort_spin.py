#!/usr/bin/env python3
"""Two ONNX Runtime sessions that take turns: how their thread pools' idle spinning changes a pair.

Each configuration runs in a fresh process: target-only (``tlm-base``) and eagle3-hybrid (the
EAGLE-3 head with prompt lookup) on MT-bench's first turns (the first question of each category,
64 new tokens, greedy), best of 2 passes each, N threads per session. Configurations:

    spin     ONNX Runtime's default: threads spin-wait after every call
    off      no spinning at all (session.intra_op.allow_spinning = 0; specdec-run's old choice)
    stop     spinning inside a call, stopped when it returns (session.force_spinning_stop = 1;
             what every runtime session does now: ort_session.create_session)

    python -m scripts.ort_spin --rounds 2 --json bench/results/ort-spin.json

It reads the artifacts ``python -m bench.run_bench --only mtbench`` builds (ctx 512, the committed
head). docs/serving.md ("End of text, threads, host work") has the numbers.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BUILD = ROOT / "build" / "bench" / "mtbench" / "ctx512"
MODES = {"spin": {"session.force_spinning_stop": "0"},
         "off": {"session.force_spinning_stop": "0", "session.intra_op.allow_spinning": "0"},
         "stop": {"session.force_spinning_stop": "1"}}


def one(mode: str, threads: int) -> dict:
    """Target-only and the pair under one configuration, in this process: tokens per second."""
    import onnxruntime as ort

    from bench import mtbench
    from specdec_compile.runtime import OrtBackend, SamplingParams, SpecDecoder, TargetOnlyDecoder

    def options(entries):
        so = ort.SessionOptions()
        so.intra_op_num_threads, so.inter_op_num_threads = threads, 1
        for k, v in entries.items():
            so.add_session_config_entry(k, v)
        return so

    heads = sorted(BUILD.glob("eagle3-*"))
    if not heads or not (BUILD / "tlm-base").is_dir():
        raise SystemExit(f"ort_spin: no MT-bench build under {BUILD} (python -m bench.run_bench --only mtbench)")
    tok = mtbench.load_tok(ROOT / "build" / "demo")
    base = OrtBackend(BUILD / "tlm-base", session_options=options(MODES["spin"]))   # target-only: ORT's default
    tlm = OrtBackend(heads[-1] / "tlm", session_options=options(MODES[mode]))
    head = OrtBackend(heads[-1] / "head", session_options=options(MODES[mode]))
    eos = tlm.artifact.manifest.get("eos_token_ids") or tok.eos_token_id
    prompts = [mtbench.turn_ids(tok, q, 1, None) for q in mtbench.select(mtbench.questions(), 1)]
    decoders = {"target": TargetOnlyDecoder(base, eos_token_id=eos),
                "pair": SpecDecoder(tlm, head, draft="hybrid", eos_token_id=eos)}
    rates: dict = {}
    for d in decoders.values():
        d.generate(prompts[0], max_new_tokens=8, sampling=SamplingParams())     # warm-up
    for _ in range(2):
        for name, d in decoders.items():
            n, t0 = 0, time.perf_counter()
            for p in prompts:
                n += len(d.generate(p, max_new_tokens=64, sampling=SamplingParams()).generated_ids)
            rates.setdefault(name, []).append(n / (time.perf_counter() - t0))
    return {"mode": mode, "threads": threads, **{k: round(max(v), 2) for k, v in rates.items()}}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=2, help="intra-op threads per session (2)")
    ap.add_argument("--rounds", type=int, default=2, help="passes over the configurations (2)")
    ap.add_argument("--modes", default="spin,off,stop")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)      # a child process: one configuration
    a = ap.parse_args(argv)
    if a.one:
        print(json.dumps(one(a.one, a.threads)), flush=True)
        return 0
    modes = [m for m in a.modes.split(",") if m]
    if not modes or any(m not in MODES for m in modes):
        raise SystemExit(f"ort_spin: --modes takes {', '.join(MODES)} (got {a.modes!r})")
    rows = []
    for r in range(a.rounds):
        for m in (modes if r % 2 == 0 else modes[::-1]):
            out = subprocess.run([sys.executable, "-m", "scripts.ort_spin", "--one", m, "--threads", str(a.threads)],
                                 cwd=ROOT, capture_output=True, text=True, check=False)
            if out.returncode:
                raise SystemExit(out.stderr.strip().splitlines()[-1] if out.stderr.strip() else f"ort_spin: {m} failed")
            rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
            print(json.dumps(rows[-1]), flush=True)
    if a.json:
        a.json.write_text(json.dumps({"rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
