"""``specdec-run``: generate text with a DLM/TLM pair of artifact directories.

    specdec-run --tlm OUT_TLM --dlm OUT_DLM --tokenizer DIR --prompt "Hello"
    specdec-run --tlm OUT_TLM --draft ngram --tokenizer DIR --prompt "Hello"
    specdec-run --tlm OUT_TLM --draft suffix --tokenizer DIR --prompt "Hello" --prompt "Hello again"
    specdec-run --tlm OUT_TLM --dlm OUT_DLM --draft hybrid --tokenizer DIR --prompt "Hello"
    specdec-run --tlm OUT_TLM --target-only --prompt-ids 1,2,3 --json
    specdec-run --pair OUT --prompt "Hello"          (a pair directory: specdec-compile pair)

Text streams as it is accepted (accepted drafts and target tokens in two
colours on a terminal, plain otherwise); the metrics follow on stderr.
``--json`` prints one JSON object on stdout instead.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys

from .common import Parser, add_progress_flags, run_cli, start_progress
from .pair_run import add_pair_flags, compile_pair, resolve_pair
from .qeff_words import (add_qeff_run_flags, check_full_batch_size, read_prompt_lines, read_text,
                         resolve_qeff_run_flags, split_prompts)
from .run_args import check_args, check_sampling
from ..errors import SpecdecError

PROG = "specdec-run"
PROMPT_SEP = "<endofprompt>"
DRAFT_STYLE = "green"
#: what each stop_reason means, as the CLI prints it after a text
STOP_REASONS = {"eos": "end of sequence (EOS token)", "max_new_tokens": "--max-new-tokens reached",
                "ctx_len": "the context is full (ctx_len)", "stop_string": "a stop string"}
TARGET_STYLE = "bold"


def add_backend_flags(p: argparse.ArgumentParser) -> None:
    """Where the models run: the backend, its devices, threads and precision."""
    p.add_argument("--backend", choices=("ort", "qaic", "openvino"), default="ort",
                   help="ort: ONNX Runtime (default); qaic: Cloud AI 100; openvino: OpenVINO's CPU plugin, the "
                        "cache in its state variables (artifacts compiled with --target openvino; "
                        "pip install 'specdec-compile[openvino]')")
    p.add_argument("--ov-precision", choices=("f32", "bf16", "f16"), default=None,
                   help="--backend openvino: inference precision (default: OpenVINO's pick for the CPU, bf16 "
                        "where it has bf16; only f32 keeps greedy speculative output equal to target-only, "
                        "the run says so otherwise)")
    p.add_argument("--ov-threads", type=int, default=None, metavar="N",
                   help="--backend openvino: inference threads per model (default: OpenVINO's)")
    p.add_argument("--ov-cache", choices=("fused", "copy"), default=None,
                   help="--backend openvino: fused (each attention rebuilt as OpenVINO's stateful SDPA, the "
                        "cache grown in place; refused where the graph's attention is not that form) or copy "
                        "(MakeStateful, the fixed cache copied per call); default: fused where the graph "
                        "allows it, else copy")
    p.add_argument("--tlm-device-ids", metavar="IDS", help="device ids of the TLM, e.g. 0 or 0,1")
    p.add_argument("--dlm-device-ids", metavar="IDS", help="device ids of the DLM")
    p.add_argument("--ort-threads", type=int, default=None, metavar="N",
                   help="ONNX Runtime intra-op threads per model (default: ORT's own for one model; "
                        "with a DLM and a TLM on the CPU, the usable cores and no spin-waiting, so "
                        "the two never compete)")


def build_parser() -> argparse.ArgumentParser:
    from ..runtime.drafts import NAMES as DRAFT_NAMES
    p = Parser(prog=PROG, description="Speculative decoding with specdec-compile artifacts "
                                       "(ONNX Runtime or Cloud AI 100).")
    p.add_argument("--tlm", metavar="DIR", help="target model artifact directory (required unless --pair)")
    p.add_argument("--dlm", metavar="DIR", help="draft model artifact directory (not needed with "
                   "--target-only, --draft ngram or --draft suffix)")
    p.add_argument("--draft", choices=DRAFT_NAMES, default=None,
                   help="where drafts come from: the DLM (default when --dlm is given), n-gram "
                        "prompt lookup or suffix tries over the prompt, output and earlier requests' "
                        "outputs (no draft model), or hybrid: prompt lookup when an n-gram of 2+ "
                        "tokens matches, the --dlm (a DLM or feature draft) otherwise while its "
                        "drafts pay, 1-token matches when they do not")
    p.add_argument("--ngram-max", type=int, default=None, metavar="N",
                   help="--draft ngram or hybrid: the longest n-gram matched (default 3; at most 32 and the "
                        "context length)")
    p.add_argument("--suffix-cache-tokens", type=int, default=None, metavar="N",
                   help="--draft suffix: tokens of earlier requests' outputs kept (default 16384; whole "
                        "requests evicted oldest first)")
    p.add_argument("--suffix-max-depth", type=int, default=None, metavar="N",
                   help="--draft suffix: the suffix tries' depth in tokens (default 24, at most 256)")
    p.add_argument("--draft-min-prob", type=float, default=0.0, metavar="P",
                   help="with a draft model (--dlm, alone or in --draft hybrid): a round's drafts stop where "
                        "the model's probability of its chain (the product of its drafts' probabilities) "
                        "falls below P, in [0, 1) (default 0: as many as the width policy asks for)")
    p.add_argument("--no-fallback", action="store_true",
                   help="never choose to draft nothing (with 0 in the TLM's k_list the adaptive "
                        "choice may otherwise fall back to plain decoding when drafts do not pay)")
    p.add_argument("--tokenizer", metavar="DIR", help="tokenizer directory (transformers); "
                   "optional with --prompt-ids")
    p.add_argument("--dlm-tokenizer", metavar="DIR", help="the DLM's tokenizer, checked to equal the TLM's")
    g = p.add_mutually_exclusive_group()      # one is required (pair_run.resolve_pair), except --compile alone
    g.add_argument("--prompt", metavar="TEXT", action="append",
                   help="a text prompt; \"a|b\" is two prompts, as QEfficient splits them (a literal | "
                        "is written \\|); repeat for more prompts")
    g.add_argument("--prompt-file", metavar="FILE", help=f"prompts separated by {PROMPT_SEP}")
    g.add_argument("--prompt-ids", metavar="IDS", action="append",
                   help="token ids separated by commas or spaces: 1,2,3 or \"1 2 3\" (repeat for several prompts)")
    p.add_argument("--chat", action="store_true",
                   help="wrap each text prompt as a user message in the tokenizer's chat template "
                        "(with the generation prompt); needs --tokenizer")
    p.add_argument("--max-new-tokens", type=int, default=None, metavar="N", help="new tokens per prompt at most (default 128; QEfficient's --generation-len)")
    p.add_argument("--temperature", type=float, default=0.0, metavar="T",
                   help="0 = greedy (default); below 1e-5 behaves as greedy")
    p.add_argument("--top-k", type=int, default=0, metavar="K",
                   help="sampling: the K most likely tokens only (0 = all, the default)")
    p.add_argument("--top-p", type=float, default=1.0, metavar="P",
                   help="sampling: the most likely tokens holding P of the probability (1 = all, the default)")
    p.add_argument("--seed", type=int, default=None, metavar="S",
                   help="fixes the sampled text: the same prompts, seed, settings and models give the same "
                        "text whatever the batch size or schedule (an integer >= 0). --top-k, --top-p and "
                        "--seed need --temperature > 0 (refused with greedy decoding)")
    p.add_argument("--k", type=int, default=None, metavar="K",
                   help="drafts per round (one of the TLM's compiled widths; default: its k, "
                        "adaptive when several are compiled)")
    add_backend_flags(p)
    p.add_argument("--copy-cache", action="store_true",
                   help="ONNX Runtime: feed the cache back by swapping buffers even for ort targets")
    p.add_argument("--target-only", action="store_true", help="decode with the TLM alone (baseline); --tlm may then also be the target "
                        "compiled with --role dlm, for seq_len-1 steps")
    p.add_argument("--compare", action="store_true",
                   help="run the TLM alone, then speculative decoding, on the same prompts and seed; print "
                        "TTFT, decode tokens/s, total tokens/s and E2E time for both, the speedup, tokens per "
                        "target call, and whether the greedy outputs were identical (--json: as JSON)")
    p.add_argument("--eos-id", type=int, default=None, metavar="ID",
                   help="end-of-sequence id (default: every EOS id of the TLM's manifest and of the "
                        "tokenizer; -1 = none)")
    p.add_argument("--no-warmup", action="store_true",
                   help="skip running each specialization once before timing")
    p.add_argument("--json", action="store_true", help="print one JSON object with ids, text and metrics")
    p.add_argument("--no-color", action="store_true")
    add_qeff_run_flags(p, g)
    add_pair_flags(p)
    add_progress_flags(p, steps="models loaded")
    return p


def _ids(text: str, what: str) -> list[int]:
    """Integers separated by commas and/or whitespace: "1,2,3", "1 2 3", "1, 2 3". ASCII digits only:
    int() would also read "1_0" as 10, "+1" and other scripts' digits (as --device-group refuses them)."""
    import re
    from ..layer_lists import INTEGER
    parts = [x for x in re.split(r"[\s,]+", text.strip()) if x]
    if re.search(r",\s*,", text):
        raise SpecdecError(f"{what}: an empty item between commas in {text!r}")
    if not all(INTEGER.fullmatch(x) for x in parts):
        raise SpecdecError(f"{what}: expected comma-separated (or space-separated) integers, got {text!r}")
    return [int(x) for x in parts]


def _prompts(args, tok) -> list[list[int]]:
    if args.prompt_ids is not None:
        out = []
        for text in args.prompt_ids:
            ids = _ids(text, "--prompt-ids")
            if not ids:
                raise SpecdecError("--prompt-ids: no ids given")
            out.append(ids)
        return out
    if args.prompt is not None:
        texts = split_prompts(args.prompt)
    elif args.prompts_txt_file_path is not None:
        texts = read_prompt_lines(args.prompts_txt_file_path)
    else:
        texts = [t.strip() for t in read_text(args.prompt_file).split(PROMPT_SEP)]
        texts = [t for t in texts if t]
        if not texts:
            raise SpecdecError(f"{args.prompt_file}: no prompts in it")
    if tok is None:
        raise SpecdecError("--tokenizer DIR is needed to encode a text prompt (or give --prompt-ids)")
    if args.chat:
        from ..runtime.hf_args import prompt_inputs
        return prompt_inputs(None, tok, messages=[[{"role": "user", "content": t}] for t in texts])[0]
    out = []
    for t in texts:
        ids = list(tok(t)["input_ids"])
        if not ids:
            raise SpecdecError(f"prompt {t[:40]!r} encodes to no tokens")
        out.append(ids)
    return out


class _Printer:
    """Streams tokens: accepted drafts and target tokens in two styles."""

    def __init__(self, tok, color: bool):
        self.tok = tok
        self.color = color
        self.console = None
        if color:
            from rich.console import Console
            self.console = Console(highlight=False, soft_wrap=True)
        self.stream = None

    def start(self, prompt_ids, index: int, total: int):
        from ..runtime.tokenizer import StreamDecoder
        if total > 1:
            self._write(f"\n[prompt {index + 1}/{total}]\n", "dim")
        if self.tok is not None:
            self._write(self.tok.decode(prompt_ids, skip_special_tokens=True), "dim")
            self.stream = StreamDecoder(self.tok, prompt_ids)

    def _write(self, text: str, style: str | None):
        if not text:
            return
        if self.console is not None:   # out(), not print(): the text is the model's, never rich markup
            self.console.out(text, style=style, highlight=False, end="")   # ("[i]", ":smile:", "[/x]")
        else:
            write_stdout(text)

    def on_tokens(self, ids, sources):
        for t, s in zip(ids, sources):
            text = self.stream.push(t) if self.stream is not None else f" {t}"
            self._write(text, DRAFT_STYLE if s == "draft" else TARGET_STYLE)

    def end(self, reason: str | None = None):
        if self.stream is not None:      # a trailing incomplete character, as TextIteratorStreamer ends
            self._write(self.stream.flush(), TARGET_STYLE)
        self._write("\n", None)
        if reason is not None:
            print(f"[stopped: {STOP_REASONS.get(reason, reason)}]", file=sys.stderr)


def write_stdout(text: str) -> None:
    """``text`` on stdout now: one line (exit 2), not an internal error, when stdout cannot take it
    (a full disk, a closed or read-only descriptor); a closed pipe stays quiet (run_cli)."""
    try:
        if sys.stdout is None:
            raise OSError("standard output is closed")
        sys.stdout.write(text)
        sys.stdout.flush()
    except BrokenPipeError:
        raise
    except (OSError, ValueError) as e:     # ValueError: "I/O operation on closed file"
        why = getattr(e, "strerror", None) or str(e)
        raise SpecdecError(f"cannot write the output to standard output: {why}") from None


def _fmt(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


METRIC_ROWS = [
    ("new_tokens", "new tokens"),
    ("batch_size", "batch size (rows per call)"),
    ("tokens_per_s", "tokens/s (all prompts, wall time)"),
    ("ttft_s", "time to first token (s)"),
    ("decode_tokens_per_s", "decode tokens/s"),
    ("acceptance_rate", "acceptance rate"),
    ("mean_tokens_per_tlm_call", "mean tokens per TLM call"),
    ("acceptance_histogram", "acceptance histogram (rounds by drafts accepted)"),
    ("dlm_time_s", "DLM time (s)"),
    ("tlm_time_s", "TLM time (s)"),
    ("host_time_s", "host overhead (s)"),
]


def print_metrics(metrics: dict, color: bool, file=None) -> None:
    file = file or sys.stderr
    if color:
        from rich.console import Console
        from rich.table import Table
        t = Table(title="specdec-run metrics", show_header=False)
        for key, label in METRIC_ROWS:
            t.add_row(label, _fmt(metrics.get(key)))
        Console(file=file, highlight=False).print(t)
    else:
        for key, label in METRIC_ROWS:
            print(f"{label}: {_fmt(metrics.get(key))}", file=file)


def _device_ids(text, what):
    if text is None:
        return None
    ids = _ids(text, what)
    if not ids or min(ids) < 0:
        raise SpecdecError(f"{what}: expected device ids like 0 or 0,1")
    return ids


def ort_thread_options(threads: int | None, two_models: bool) -> dict:
    """Session options for ONNX Runtime on the CPU. DLM and TLM calls alternate,
    never overlap; every session stops its threads spinning when a call returns
    (``ort_session.create_session``), so the two pools do not fight for the cores.
    Two models: each pool gets the usable cores. ``threads`` (--ort-threads) fixes the count."""
    import os
    if threads is not None:
        from ..ort_session import check_threads
        check_threads(threads, "--ort-threads")
    if threads is None and not two_models:
        return {}
    import onnxruntime as ort
    so = ort.SessionOptions()
    n = threads
    if n is None:
        n = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    so.intra_op_num_threads = n
    so.inter_op_num_threads = 1
    return {"session_options": so}


def _open(args):
    """(tlm backend, dlm backend or None, (tokenizer, dlm tokenizer), prompts): cheap checks first
    (artifacts, their pairing, tokenizers, prompts), then the models are loaded."""
    from ..artifact.reader import load_artifact
    from ..runtime.pairing import check_feature_pair, check_pair
    from ..runtime.backends import open_backend
    from ..runtime.tokenizer import check_tokenizer_fits, load_tokenizer

    tlm_dev = _device_ids(args.tlm_device_ids, "--tlm-device-ids")
    dlm_dev = _device_ids(args.dlm_device_ids, "--dlm-device-ids")
    need_model = args.backend in ("ort", "openvino")
    # --target-only also takes the target compiled with --role dlm: the seq_len-1 baseline
    tlm_art = load_artifact(args.tlm, expect_role=None if args.target_only else "tlm", need_model=need_model)
    check_full_batch_size(args, tlm_art.batch_size)
    dlm_art = None if (args.target_only or args.draft in ("ngram", "suffix")) else \
        load_artifact(args.dlm, expect_role="dlm", need_model=need_model)
    tok = load_tokenizer(args.tokenizer) if args.tokenizer else None
    dlm_tok = load_tokenizer(args.dlm_tokenizer) if tok is not None and args.dlm_tokenizer and dlm_art else None
    if dlm_art is not None:   # shapes; the tokenizers when both are given, else the manifests' token ids
        check_pair(tlm_art, dlm_art, tokenizers=(tok, dlm_tok))
        check_feature_pair(tlm_art, dlm_art)   # a feature draft: the target exposes the layers it reads
    prompts = _prompts(args, tok)

    kw = {"inplace": False} if (args.copy_cache and args.backend == "ort") else {}
    if args.backend == "ort":
        kw.update(ort_thread_options(args.ort_threads, two_models=dlm_art is not None))
    if args.backend == "openvino":
        kw.update(precision=args.ov_precision, threads=args.ov_threads, cache=args.ov_cache)
    tlm = open_backend(tlm_art, args.backend, expect_role=None if args.target_only else "tlm",
                       device_ids=tlm_dev, **kw)
    dlm = None
    if dlm_art is not None:
        dlm = open_backend(dlm_art, args.backend, expect_role="dlm", device_ids=dlm_dev, **kw)
    if not args.no_warmup:
        for b in (tlm, dlm):
            if b is not None:
                b.warmup()
    if tok is not None:   # the DLM may have fewer rows: it drafts only the ids it has
        check_tokenizer_fits(tok, tlm.vocab_size, "TLM")
    return tlm, dlm, (tok, dlm_tok), prompts


def _eos(args, tok, tlm):
    """--eos-id (-1: none); else the union of the TLM manifest's EOS ids (from the export's
    generation_config.json) and the tokenizer's (its EOS and a generation_config.json beside it)."""
    from ..runtime.tokenizer import eos_ids
    v = getattr(tlm, "vocab_size", None)
    if args.eos_id is not None:
        if v and args.eos_id >= v:
            raise SpecdecError(f"--eos-id {args.eos_id} is outside the TLM's vocabulary [0, {v})")
        if args.eos_id < -1:
            raise SpecdecError(f"--eos-id must be a token id, or -1 for none (got {args.eos_id})")
        return None if args.eos_id < 0 else args.eos_id
    art = tlm.artifact
    ids = set(art.manifest.get("eos_token_ids") or [])
    if art.eos_token_id is not None:
        ids.add(art.eos_token_id)
    if tok is not None:
        ids.update(eos_ids(tok, args.tokenizer))
    # an id beyond the logits can never be generated: nothing to stop at
    return sorted(int(i) for i in ids if not v or 0 <= i < v) or None


def run(argv: list[str]) -> int:
    from ..runtime.decoding import TargetOnlyDecoder
    from ..runtime.metrics import aggregate_metrics, backend_counts, use_backend_counts
    from ..runtime.sampling import SamplingParams

    args = build_parser().parse_args(argv)
    if sys.stdout is None:        # a closed descriptor: before any work, not after it
        raise SpecdecError("standard output is closed: nowhere to write the output")
    start_progress(PROG, args)
    resolve_pair(args)
    resolve_qeff_run_flags(args)     # also refuses a negative --max-new-tokens / --generation-len
    sampling = SamplingParams(args.temperature, args.top_k, args.top_p, args.seed)
    check_sampling(args, sampling)
    if not sampling.greedy:   # one seed for the run (drawn when --seed is not given): prompt i samples as
        sampling = dataclasses.replace(sampling, seed=sampling.run_seed())   # (seed, i); --json records it
    check_args(args)
    if compile_pair(args):
        return 0
    tlm, dlm, (tok, dlm_tok), prompts = _open(args)
    eos = _eos(args, tok, tlm)
    note = tlm.exactness(speculative=not args.target_only)["note"] if args.backend == "openvino" else None
    if note:
        print(f"{PROG}: note: {note}", file=sys.stderr, flush=True)
    if args.compare:
        return _run_compare(args, tlm, dlm, (tok, dlm_tok), prompts, eos, sampling)
    if args.target_only:
        dec = TargetOnlyDecoder(tlm, eos_token_id=eos)
    else:
        dec = _spec_decoder(args, tlm, dlm, (tok, dlm_tok), eos)

    color = (not args.no_color) and sys.stdout.isatty() and not args.json
    printer = None if args.json else _Printer(tok, color)
    before = backend_counts(tlm=tlm, dlm=dlm)
    results, wall = _decode_all(dec, prompts, args, sampling, printer, tok)
    summary = aggregate_metrics(results)
    summary.batch_size = tlm.batch_size
    if tlm.batch_size > 1:    # rows share calls: each row's metrics count every call it took part in
        use_backend_counts(summary, before, backend_counts(tlm=tlm, dlm=dlm), wall)
    summary.tokens_per_s = summary.new_tokens / wall if wall > 0 else None
    out = {"results": [r.to_json() for r in results], "metrics": summary.to_json()}
    if not sampling.greedy:   # the run's seed (drawn when not given): --seed S reproduces the text
        out["seed"] = sampling.seed
    if args.backend == "openvino":   # contract: whether greedy output is target-only's, recorded
        out["backend"] = _backend_record(tlm, None if args.target_only else dlm, not args.target_only)
    if args.json:
        write_stdout(json.dumps(out) + "\n")
    else:
        print_metrics(summary, color=(not args.no_color) and sys.stderr.isatty())
    return 0


def _backend_record(tlm, dlm, speculative: bool) -> dict:
    """``--json``'s ``backend`` on OpenVINO: the TLM's exactness record, and under ``draft`` the
    draft model's own precision, threads and cache (None without a draft model)."""
    rec = tlm.exactness(speculative=speculative)
    ex = getattr(dlm, "exactness", None)
    rec["draft"] = None if ex is None else {k: v for k, v in ex().items()
                                            if k in ("kind", "precision", "threads", "cache", "cache_note")}
    return rec


def _spec_decoder(args, tlm, dlm, toks, eos):
    """The speculative decoder the arguments ask for (--draft, --k, --no-fallback)."""
    from ..runtime.decoding import SpecDecoder
    from ..runtime.drafts import make_draft_source
    tok, dlm_tok = toks
    source = make_draft_source(args.draft, dlm, ngram_max=args.ngram_max, tokenizer=tok, dlm_tokenizer=dlm_tok,
                               suffix={"cache_tokens": args.suffix_cache_tokens, "max_depth": args.suffix_max_depth},
                               min_prob=args.draft_min_prob)
    return SpecDecoder(tlm, draft=source, eos_token_id=eos, k=args.k, fallback=not args.no_fallback, tokenizer=tok)


def _run_compare(args, tlm, dlm, toks, prompts, eos, sampling) -> int:
    """--compare: the TLM alone, then speculative decoding, on the same prompts, settings and
    seed (one seed drawn for both when --seed is not given); the report of runtime/compare.py."""
    from ..runtime.compare import compare_runs, format_report
    from ..runtime.decoding import TargetOnlyDecoder
    runs = {"target_only": _decode_all(TargetOnlyDecoder(tlm, eos_token_id=eos), prompts, args, sampling,
                                       None, toks[0]),
            "speculative": _decode_all(_spec_decoder(args, tlm, dlm, toks, eos), prompts, args, sampling,
                                       None, toks[0])}
    report = compare_runs(runs["target_only"], runs["speculative"], greedy=sampling.greedy)
    if args.json:
        report["seed"] = sampling.seed
        if args.backend == "openvino":   # contract: whether greedy output is target-only's, recorded
            report["backend"] = _backend_record(tlm, dlm, True)
        report["results"] = {name: [r.to_json() for r in res] for name, (res, _) in runs.items()}
        write_stdout(json.dumps(report) + "\n")
        return 0
    printer = _Printer(toks[0], (not args.no_color) and sys.stdout.isatty())
    for i, r in enumerate(runs["speculative"][0]):     # the texts (speculative decoding's), then the report
        printer.start(r.prompt_ids, i, len(prompts))
        printer.on_tokens(r.generated_ids, r.sources)
        printer.end(r.stop_reason)
    write_stdout("\n".join(format_report(report)) + "\n")
    return 0


def _decode_all(dec, prompts, args, sampling, printer, tok):
    """Every prompt through the decoder: one after another, streaming, with a batch-1
    artifact; through every row at once (continuous batching) with a batch-B one,
    each text printed whole, in input order. ``sampling`` carries the run's seed (``run``
    draws it). Returns (results in input order, wall s)."""
    import time

    from ..runtime.batch import BatchEngine
    engine = BatchEngine(dec)
    engine.check_prompts(prompts, args.max_new_tokens)       # a prompt that does not fit: before anything runs
    results = [None] * len(prompts)
    t0 = time.perf_counter()
    if dec.tlm.batch_size == 1:
        for i, ids in enumerate(prompts):
            if printer:
                printer.start(ids, i, len(prompts))
            results[i] = dec.generate(ids, max_new_tokens=args.max_new_tokens, sampling=sampling, prompt_index=i,
                                      on_tokens=printer.on_tokens if printer else None)
            if printer:
                printer.end(results[i].stop_reason)
    else:
        shown = 0
        for i, r in engine.stream(prompts, max_new_tokens=args.max_new_tokens, sampling=sampling):
            results[i] = r
            while printer and shown < len(prompts) and results[shown] is not None:
                printer.start(prompts[shown], shown, len(prompts))
                printer.on_tokens(results[shown].generated_ids, results[shown].sources)
                printer.end(results[shown].stop_reason)
                shown += 1
    wall = time.perf_counter() - t0
    for r in results:
        r.text = tok.decode(r.generated_ids, skip_special_tokens=True) if tok is not None else None
        r.metrics.stop_reason = r.stop_reason
    return results, wall


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    return run_cli(run, argv, PROG)


if __name__ == "__main__":
    sys.exit(main())
