"""Compile a target and a draft export for ONNX Runtime, then decode speculatively.

    python examples/compile_and_decode.py TARGET.onnx DRAFT.onnx OUT_DIR [--tokenizer DIR] [--prompt TEXT]

TARGET/DRAFT are stock exports (optimum-cli export onnx --task text-generation-with-past).
Without --tokenizer the prompt is a list of token ids.
"""
import argparse
from pathlib import Path

from specdec_compile import pipeline
from specdec_compile.artifact.writer import write_artifact
from specdec_compile.options import Options
from specdec_compile.runtime import OrtBackend, SpecDecoder, TargetOnlyDecoder


def compile_one(export: str, out: Path, role: str, k: int | None = None) -> Path:
    opts = Options(role=role, k=k, target="ort", ctx_len=128, prefill_len=16)
    write_artifact(pipeline.rewrite(export, opts), opts, out, force=True)
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("target"), ap.add_argument("draft"), ap.add_argument("out", type=Path)
    ap.add_argument("--tokenizer"), ap.add_argument("--prompt", default="5 9 33 7 100 42 17 3 8 55")
    args = ap.parse_args(argv)
    tlm = OrtBackend(compile_one(args.target, args.out / "tlm", "tlm", k=4))
    dlm = OrtBackend(compile_one(args.draft, args.out / "dlm", "dlm"))
    prompt = args.prompt if args.tokenizer else [int(t) for t in args.prompt.split()]

    spec = SpecDecoder(tlm, dlm, tokenizer=args.tokenizer).generate(prompt, max_new_tokens=24)
    base = TargetOnlyDecoder(tlm, tokenizer=args.tokenizer).generate(prompt, max_new_tokens=24)
    m = spec.metrics
    print("speculative:", spec.text if args.tokenizer else spec.generated_ids)
    print(f"tokens per target call {m.mean_tokens_per_tlm_call:.2f}, acceptance {m.acceptance_rate:.2f}")
    # greedy speculative decoding gives exactly the target's own tokens
    print("identical to target-only:", spec.generated_ids == base.generated_ids)


if __name__ == "__main__":
    main()
