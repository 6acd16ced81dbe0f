"""Differential fuzzing of the decoding loop: speculative output against target-only output.

The invariant (docs/runtime.md, "The decoding loop" and "Sampling"): greedy speculative output is
the target's own, token for token, for every draft source and option; seeded sampling gives the
target-only text of the same seed (position-keyed Gumbel noise). Each case draws a random setup
(draft source, k / k_list / fallback, draft_min_prob, EOS ids, prompts of every length up to the
context, max_new_tokens, batch rows and continuous batching, generate / stream / generate_many,
sampling settings) from its seed and checks the tokens, the stop reason and that the metrics
agree with the tokens. FAKE backends (specdec_compile.runtime.testing) run most cases, exactly and
fast; a few run real tiny exports on ONNX Runtime.
"""
from __future__ import annotations

import random

import numpy as np
import pytest
from runtime_helpers import reference_greedy

from specdec_compile.runtime import (DlmDraft, FeatureDraft, HybridDraft, NgramDraft, SamplingParams, SpecDecoder,
                                     SuffixDraft, TargetOnlyDecoder)
from specdec_compile.runtime.testing import fake_feature_pair, fake_pair

KINDS = ("ngram", "suffix", "dlm_same", "dlm_close", "dlm_independent", "hybrid", "feature", "feature_hybrid")


def _prompt(rng, n, vocab):
    """Random, one repeated token, or a short cycle (long n-gram / suffix matches)."""
    kind = rng.choice(["rand", "rep", "cycle"])
    if kind == "rand":
        return [rng.randrange(vocab) for _ in range(n)]
    if kind == "rep":
        return [rng.randrange(vocab)] * n
    cyc = [rng.randrange(vocab) for _ in range(rng.randint(1, 4))]
    return [cyc[i % len(cyc)] for i in range(n)]


def metric_errors(r) -> list[str]:
    """What in a result's metrics contradicts its tokens."""
    m, errs = r.metrics, []
    if m["new_tokens"] != len(r.generated_ids) or len(r.sources) != len(r.generated_ids):
        errs.append(f"new_tokens {m['new_tokens']}, sources {len(r.sources)}, tokens {len(r.generated_ids)}")
    if m["accepted_tokens"] > m["drafted_tokens"]:
        errs.append(f"accepted {m['accepted_tokens']} > drafted {m['drafted_tokens']}")
    if r.sources.count("draft") > m["accepted_tokens"]:
        errs.append(f"{r.sources.count('draft')} draft tokens, {m['accepted_tokens']} accepted")
    h = m["acceptance_histogram"]
    if h and sum(i * c for i, c in enumerate(h)) != m["accepted_tokens"]:
        errs.append(f"acceptance histogram {h} against {m['accepted_tokens']} accepted")
    vdh = m["verify_drafts_histogram"]
    if vdh and sum(vdh.values()) != m["tlm_verify_calls"]:
        errs.append(f"verify histogram {vdh} against {m['tlm_verify_calls']} verify calls")
    if m["drafted_tokens"] - sum(int(j) * c for j, c in vdh.items()) not in (0, 1):   # (1: the first draft d1)
        errs.append(f"drafted {m['drafted_tokens']} against verify histogram {vdh}")
    return errs


def _source(rng, kind, d):
    """(positional args, keywords) of SpecDecoder for a draft kind."""
    mp = rng.choice([0.0, 0.0, 0.3, 0.9])
    if kind == "ngram":
        return (), {"draft": NgramDraft(rng.randint(1, 4))}
    if kind == "suffix":
        return (), {"draft": SuffixDraft(max_depth=rng.randint(2, 10), cache_tokens=rng.choice([1, 5, 50, 16384]))}
    if kind.endswith("hybrid"):
        model = (FeatureDraft if kind.startswith("feature") else DlmDraft)(d, min_prob=mp)
        return (), {"draft": HybridDraft(NgramDraft(3, min_n=2), model, weak=NgramDraft(3))}
    return (d,), {"draft_min_prob": mp}


def _fake_setup(rng):
    vocab, B, PL = rng.choice([11, 23]), rng.choice([1, 1, 2, 3]), rng.choice([4, 8])
    CL, k = rng.choice([12, 20, 32, 64]), rng.randint(1, 7)
    kl = sorted(set(rng.sample(range(8), rng.randint(0, 3))) - {k}) if rng.random() < 0.6 else None
    kind = rng.choice(KINDS)
    if kind.startswith("feature"):
        tlm, d, lm = fake_feature_pair(vocab=vocab, ctx_len=CL, prefill_len=PL, k=k, k_list=kl, batch_size=B,
                                       noise=rng.choice([0.0, 1.5]))
    else:
        same = {"dlm_same": "same", "dlm_close": "close", "dlm_independent": "independent"}
        dv = rng.choice([None, None, vocab - 3])        # a draft table cut to its first rows
        tlm, d, lm = fake_pair(vocab=vocab, ctx_len=CL, prefill_len=PL, k=k, k_list=kl, batch_size=B,
                               dlm=same.get(kind, rng.choice(["same", "close"])), dlm_vocab=dv)
    return tlm, d, lm, kind


def _run(dec, prompts, mx, samp, mode):
    """Results of ``prompts`` through ``dec``: generate_many, or one generate / stream each."""
    if mode == "many":
        return dec.generate_many(prompts, max_new_tokens=mx, sampling=samp)
    out = []
    for i, p in enumerate(prompts):
        if mode != "stream":
            out.append(dec.generate(p, max_new_tokens=mx, sampling=samp, prompt_index=i))
            continue
        g, chunks = dec.stream(p, max_new_tokens=mx, sampling=samp, prompt_index=i), []
        while True:
            try:
                chunks.extend(next(g))
            except StopIteration as e:
                r = e.value
                break
        assert chunks == r.generated_ids, ("stream yields", chunks, r.generated_ids)
        out.append(r)
    return out


def _compare(got, want, where):
    for i, (x, y) in enumerate(zip(got, want)):
        assert x.generated_ids == y.generated_ids, (where, i, x.generated_ids, y.generated_ids)
        assert x.stop_reason == y.stop_reason, (where, i, x.stop_reason, y.stop_reason)
        assert not metric_errors(x), (where, i, metric_errors(x))


SAMPLINGS = (None, None, (0.8, 0, 1.0), (1.0, 1, 1.0), (0.7, 0, 1e-9), (1.2, 5, 0.9))


@pytest.mark.parametrize("seed", range(48))
def test_fuzz_fake_speculative_equals_target_only(seed):
    rng = random.Random(seed)
    tlm, d, lm, kind = _fake_setup(rng)
    choices = list(tlm.artifact.k_list) + [tlm.artifact.k - 1]
    eos = rng.choice([None, None, [rng.randrange(tlm.vocab_size)], [rng.randrange(tlm.vocab_size) for _ in "ab"]])
    args, kw = _source(rng, kind, d)
    spec = SpecDecoder(tlm, *args, **kw, eos_token_id=eos, k=rng.choice([None, None, rng.choice(choices)]),
                       fallback=rng.random() < 0.6)
    base = TargetOnlyDecoder(tlm, eos_token_id=eos)
    CL = tlm.ctx_len
    prompts = [_prompt(rng, rng.choice([1, tlm.prefill_len, CL - 1, rng.randint(1, CL - 1)]), tlm.vocab_size)
               for _ in range(rng.randint(1, 5))]
    mx = rng.choice([0, 1, 2, 3, rng.randint(1, 40), 100])
    s = rng.choice(SAMPLINGS)
    samp = SamplingParams() if s is None else SamplingParams(s[0], top_k=s[1], top_p=s[2], seed=seed)
    mode = rng.choice(["generate", "many", "stream"])
    got, want = _run(spec, prompts, mx, samp, mode), _run(base, prompts, mx, samp, "generate")
    _compare(got, want, (kind, mode))
    if samp.greedy or s[1] == 1 or s[2] < 1e-6:       # top_k 1 and a tiny top_p are greedy
        for p, y in zip(prompts, want):
            assert y.generated_ids == reference_greedy(lm, p, mx, CL, set(eos or ())), p


@pytest.mark.parametrize("seed", range(6))
def test_fuzz_batch_rows_swapped_in_equal_one_prompt_at_a_time(seed):
    """More prompts than rows (continuous batching), rows ending at different times: each row is
    its prompt decoded alone, greedy and seeded."""
    rng = random.Random(1000 + seed)
    B = rng.choice([2, 3])
    tlm, d, lm = fake_pair(vocab=11, ctx_len=24, prefill_len=4, k=rng.randint(1, 5), k_list=[0, 1, 2],
                           batch_size=B, dlm=rng.choice(["same", "close"]))
    eos = [rng.randrange(11)]
    prompts = [_prompt(rng, rng.randint(1, 23), 11) for _ in range(2 * B + 1)]
    one = TargetOnlyDecoder(tlm, eos_token_id=eos)
    for samp in (SamplingParams(), SamplingParams(0.9, top_p=0.95, seed=seed)):
        want = [one.generate(p, max_new_tokens=30, sampling=samp, prompt_index=i) for i, p in enumerate(prompts)]
        for draft in ((d,), ()):
            spec = SpecDecoder(tlm, *draft, draft=None if draft else "ngram", eos_token_id=eos)
            got = spec.generate_many(prompts, max_new_tokens=30, sampling=samp)
            _compare(got, want, (B, draft, samp))


# ----------------------------------------------------------------------------- real exports (ONNX Runtime)

@pytest.fixture(scope="module")
def real(fixture_path, tmp_path_factory):
    """(TLM k=4 k_list 0,1,2,4, the same export as its DLM), batch 2, ctx 32, ONNX Runtime."""
    from specdec_compile import cli as compile_cli
    from specdec_compile.runtime import OrtBackend
    root = tmp_path_factory.mktemp("fuzz_arts")
    out = {}
    for role, extra in (("tlm", ["--k", "4", "--k-list", "0,1,2,4"]), ("dlm", [])):
        argv = [str(fixture_path("llama_gqa")), "--role", role, "--target", "ort", "--prefill-len", "8",
                "--ctx-len", "32", "--batch-size", "2", "-o", str(root / role), "--quiet", *extra]
        assert compile_cli.main(argv) == 0
        out[role] = OrtBackend(root / role, intra_op_threads=1)
    return out["tlm"], out["dlm"]


@pytest.mark.parametrize("seed", range(6))
def test_fuzz_real_speculative_equals_target_only(real, seed):
    """The draft is the target itself (long accepted runs), n-gram, suffix or hybrid drafts; EOS
    ids taken from the target's own output (inside accepted runs) or the prompt's last token."""
    rng = random.Random(2000 + seed)
    tlm, dlm = real
    kind = ("dlm", "ngram", "suffix", "hybrid", "dlm", "hybrid")[seed]
    prompts = [_prompt(rng, rng.choice([1, 8, 30, 31, rng.randint(1, 31)]), 211) for _ in range(3)]
    s = rng.choice(SAMPLINGS[1:])
    samp = SamplingParams() if s is None else SamplingParams(s[0], top_k=s[1], top_p=s[2], seed=seed)
    mx = rng.choice([1, 3, 13, 40])
    seen = [t for r in TargetOnlyDecoder(tlm).generate_many(prompts, max_new_tokens=mx, sampling=samp)
            for t in r.generated_ids]
    eos = rng.choice([[rng.choice(seen)], [rng.choice(seen), prompts[0][-1]]])
    args = (dlm,) if kind in ("dlm", "hybrid") else ()
    kw = {"draft": kind} if kind != "dlm" else {"draft_min_prob": rng.choice([0.0, 0.5])}
    spec = SpecDecoder(tlm, *args, **kw, eos_token_id=eos, k=rng.choice([None, 1, 4]), fallback=seed % 2 == 0)
    base = TargetOnlyDecoder(tlm, eos_token_id=eos)
    for mode in ("many", rng.choice(["generate", "stream"])):
        _compare(_run(spec, prompts, mx, samp, mode), _run(base, prompts, mx, samp, "generate"), (kind, mode))


def test_draft_min_prob_takes_numpy_numbers():
    """A NumPy float (a probability read from an array) is a number in [0, 1), as SamplingParams
    takes it; it was refused with "must be a number in [0, 1) (got np.float32(0.5))"."""
    tlm, d, _ = fake_pair(vocab=23, ctx_len=32, k=3, dlm="same")
    base = TargetOnlyDecoder(tlm).generate([1, 2, 3], max_new_tokens=12).generated_ids
    for p in (np.float32(0.5), np.float64(0.25), np.int64(0)):
        assert SpecDecoder(tlm, d, draft_min_prob=p).generate([1, 2, 3], max_new_tokens=12).generated_ids == base
        assert DlmDraft(d, min_prob=p).min_prob == float(p)
