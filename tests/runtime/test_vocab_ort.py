"""Issue 14 on real models: one tokenizer, tables of different sizes.

Tiny random-weight Llamas, exported and rewritten like every other fixture,
run on ONNX Runtime for both lowering targets (qaic and ort graphs):

* target ``v224``: the llama_gqa architecture with a 224-row table;
* draft ``prefix211``: the same model with both tables cut to their first 211
  rows (a draft whose table is a strict prefix of the target's);
* draft ``head64``: the same model with only the LM head cut to its first 64
  rows, exported by torch dynamo (a cheaper draft head: it reads every id);
* draft ``llama_gqa``: another model with 211 rows (independent weights).

They share one word-level tokenizer of 200 ids. Greedy output must equal
target-only decoding and transformers' ``generate()``; sampling must draw from
the target's distribution (the chi-square test the equal-size pairs pass).
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil

import numpy as np
import pytest
from runtime_helpers import chi2, chi2_crit, chi2_p, hf_greedy_of, make_tokenizer, one_line_error, sample_counts

import models
from specdec_compile import cli as compile_cli
from specdec_compile.runtime import OrtBackend, SamplingParams, SpecDecoder, TargetOnlyDecoder
from specdec_compile.cli import run as run_cli
from specdec_compile.runtime.sampling import probs

PL, CL = 8, 48
VT, VD, HEAD, TOK = 224, 211, 64, 200
PROMPTS = [[1, 5, 9, 33, 7, 100, 42, 17, 3, 8, 55], [1, 150, 220, 20], [1, 2, 3, 4, 5, 6, 7, 8]]


def _config(vocab: int) -> dict:
    return dict(models.CONFIGS["llama_gqa"]["config"], vocab_size=vocab)


def build_target():
    """The 224-row target as a torch model (seed 0, eager attention). Its LM-head
    rows beyond VD are scaled by 1.5, so that it often prefers them (a random
    model's logits are nearly flat): the rows a smaller draft lacks then matter."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model("llama", **_config(VT)),
                                             attn_implementation="eager")
    with torch.no_grad():
        model.lm_head.weight[VD:] *= 1.5
    return model.eval()


def build_prefix():
    model = build_target()
    model.resize_token_embeddings(VD)           # both tables: their first VD rows
    return model.eval()


def build_head():
    import torch

    model = build_target()
    w = model.lm_head.weight.detach()[:HEAD].clone()
    model.lm_head = torch.nn.Linear(w.shape[1], HEAD, bias=False)
    with torch.no_grad():
        model.lm_head.weight.copy_(w)           # the LM head only: the embedding keeps all VT rows
    return model.eval()


VARIANTS = {"v224": (build_target, "optimum"), "prefix211": (build_prefix, "optimum"),
            "head64": (build_head, "dynamo")}


def export_variant(name: str):
    """Export a variant once into the shared fixture cache (same scheme as models.export_fixture)."""
    build, exporter = VARIANTS[name]
    spec = json.dumps([name, _config(VT), VD, HEAD, exporter], sort_keys=True) + models._versions() + "v2"
    final = models.CACHE / f"rt_vocab_{name}-{hashlib.sha256(spec.encode()).hexdigest()[:12]}"
    if (final / "model.onnx").exists():
        return final / "model.onnx"
    work = models.CACHE / f".tmp-rt_vocab_{name}-{os.getpid()}"
    shutil.rmtree(work, ignore_errors=True)
    out = work / "onnx"
    out.mkdir(parents=True)
    if exporter == "optimum":
        models._export_optimum(build(), out, work)
    else:
        models._export_dynamo(build(), out)
    shutil.rmtree(work / "hf", ignore_errors=True)
    try:
        out.rename(final)
    except OSError:  # another process won the race
        pass
    shutil.rmtree(work, ignore_errors=True)
    return final / "model.onnx"


@pytest.fixture(scope="module")
def art(fixture_path, tmp_path_factory):
    """art(name, role, target, k=None) -> artifact dir (built once)."""
    root = tmp_path_factory.mktemp("rt_vocab")
    made = {}

    def get(name, role, target="ort", k=None, batch=1):
        key = (name, role, target, k, batch)
        if key not in made:
            src = fixture_path(name) if name in models.CONFIGS else export_variant(name)
            out = root / "-".join(str(x) for x in key if x is not None)
            argv = [str(src), "--role", role, "--target", target, "--prefill-len", str(PL), "--ctx-len", str(CL),
                    "--batch-size", str(batch), "-o", str(out)] + (["--k", str(k)] if k else [])
            assert compile_cli.main(argv) == 0
            made[key] = out
        return made[key]

    return get


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    from specdec_compile.runtime.tokenizer import load_tokenizer

    return load_tokenizer(make_tokenizer(tmp_path_factory.mktemp("rt_vocab_tok") / "tok", n=TOK))


@pytest.fixture(scope="module")
def hf_greedy():
    return hf_greedy_of(build_target())


@pytest.mark.parametrize("target", ["ort", "qaic"])
@pytest.mark.parametrize("draft,reads", [("prefix211", VD), ("head64", VT), ("llama_gqa", VD)])
def test_greedy_equals_target_only_and_transformers(art, tok, hf_greedy, target, draft, reads):
    tlm = OrtBackend(art("v224", "tlm", target, k=4), intra_op_threads=1)
    dlm = OrtBackend(art(draft, "dlm", target), intra_op_threads=1)
    assert tlm.vocab_size == VT and dlm.vocab_size == (HEAD if draft == "head64" else VD)
    spec = SpecDecoder(tlm, dlm, tokenizer=tok)
    assert dlm.input_vocab == reads and spec.vocab.propose == min(TOK, dlm.vocab_size)
    base, emitted, accepted = TargetOnlyDecoder(tlm), [], 0
    for prompt in PROMPTS:
        ref = hf_greedy(prompt, 30)
        s = spec.generate(prompt, max_new_tokens=30)
        assert s.generated_ids == base.generate(prompt, max_new_tokens=30).generated_ids == ref, prompt
        assert all(t < spec.vocab.propose for t, src in zip(s.generated_ids, s.sources) if src == "draft")
        emitted += ref
        accepted += s.metrics["accepted_tokens"]
    assert max(emitted) >= VD                 # the target emitted ids the draft has no row for
    if draft != "llama_gqa":                  # the target's own weights: some drafts accepted
        assert accepted > 0


@pytest.mark.parametrize("target", ["ort", "qaic"])
def test_cut_drafts_compute_the_targets_first_rows(art, target):
    """The prefix draft's logits are the target's first 211, the cut head's its first 64,
    also after ids beyond 64 (the cut head reads every id)."""
    tlm = OrtBackend(art("v224", "tlm", target, k=4), intra_op_threads=1)
    for draft, prompt in (("prefix211", [1, 150, 20, 7]), ("head64", [1, 150, 220, 20])):
        dlm = OrtBackend(art(draft, "dlm", target), intra_op_threads=1)
        ids = np.zeros((1, PL), np.int64)
        pos = np.full((1, PL), -1, np.int64)
        ids[0, :len(prompt)] = prompt
        pos[0, :len(prompt)] = np.arange(len(prompt))
        tlm.reset()
        dlm.reset()
        want = tlm.run(ids, pos)[0, len(prompt) - 1]
        got = dlm.run(ids, pos)[0, 0]
        assert np.max(np.abs(got - want[:dlm.vocab_size])) < 1e-4, draft


def _target_dist(tlm, prompt, n, params):
    """Exact probability of every n-token continuation under the processed target."""
    def logits(hist):
        tlm.reset()
        ids = np.zeros((1, PL), np.int64)
        pos = np.full((1, PL), -1, np.int64)
        ids[0, :len(hist)] = hist
        pos[0, :len(hist)] = np.arange(len(hist))
        return tlm.run(ids, pos)[0, len(hist) - 1]

    dist = {(): 1.0}
    for _ in range(n):
        nxt = {}
        for seq, pr in dist.items():
            p = probs(logits(list(prompt) + list(seq)), params)
            for t in np.nonzero(p)[0]:
                nxt[seq + (int(t),)] = pr * p[t]
        dist = nxt
    return dist


@pytest.mark.parametrize("target", ["ort", "qaic"])
def test_sampling_with_a_prefix_draft_draws_from_the_target(art, target):
    params, n, N = SamplingParams(1.0, top_k=4), 3, 2000
    tlm = OrtBackend(art("v224", "tlm", target, k=2), intra_op_threads=1)
    dlm = OrtBackend(art("prefix211", "dlm", target), intra_op_threads=1)
    # a prompt under which the target puts real mass on the rows the draft lacks
    for prompt in ([1, a, b] for a in range(5, 200, 17) for b in (9, 60, 130)):
        expect = _target_dist(tlm, prompt, n, params)
        extra = sum(p for s, p in expect.items() if max(s) >= VD)
        if extra > 0.2:
            break
    assert extra > 0.2
    dec = SpecDecoder(tlm, dlm)
    rng = np.random.default_rng(2024 if target == "ort" else 2025)   # two independent samples
    counts, acc = sample_counts(dec, prompt, n, params, rng, N)
    stat, df = chi2(counts, expect, N)
    print(f"chi2 real {target}: prompt {prompt}, mass on ids >= {VD}: {extra:.3f}, stat {stat:.1f}, df {df}, "
          f"p {chi2_p(stat, df):.3f}, acceptance {np.mean(acc):.3f}")
    assert stat < chi2_crit(df), (stat, df)
    assert 0.1 < np.mean(acc) < 0.95
    # negative control: counts that leave out the rows the draft lacks fail the same test
    kept = {s: p for s, p in expect.items() if max(s) < VD}
    z = sum(kept.values())
    bad, bdf = chi2({s: int(round(p / z * N)) for s, p in kept.items()}, expect, N)
    assert bad > chi2_crit(bdf)


@pytest.mark.parametrize("target", ["ort", "qaic"])
def test_batched_greedy_equals_transformers_row_by_row(art, tok, hf_greedy, target):
    """Batch-3 artifacts, more prompts than rows (continuous batching): every row's output
    equals that prompt decoded alone by transformers, drafts only below the draft's size."""
    tlm = OrtBackend(art("v224", "tlm", target, k=4, batch=3), intra_op_threads=1)
    dlm = OrtBackend(art("prefix211", "dlm", target, batch=3), intra_op_threads=1)
    spec = SpecDecoder(tlm, dlm, tokenizer=tok)
    prompts = PROMPTS + [[1, 7, 190, 2], [1, 44]]
    results = spec.generate_many(prompts, max_new_tokens=24)
    for prompt, r in zip(prompts, results):
        assert r.generated_ids == hf_greedy(prompt, 24), prompt
        assert all(t < spec.vocab.propose for t, src in zip(r.generated_ids, r.sources) if src == "draft")
    assert max(t for r in results for t in r.generated_ids) >= VD
    assert sum(r.metrics["accepted_tokens"] for r in results) > 0


def test_batched_sampling_with_a_prefix_draft_draws_from_the_target(art):
    """The chi-square test above, with the samples drawn four rows at a time."""
    params, n, N = SamplingParams(1.0, top_k=4), 3, 2000
    one = OrtBackend(art("v224", "tlm", "ort", k=2), intra_op_threads=1)      # the exact distribution
    tlm = OrtBackend(art("v224", "tlm", "ort", k=2, batch=4), intra_op_threads=1)
    dlm = OrtBackend(art("prefix211", "dlm", "ort", batch=4), intra_op_threads=1)
    for prompt in ([1, a, b] for a in range(5, 200, 17) for b in (9, 60, 130)):
        expect = _target_dist(one, prompt, n, params)
        extra = sum(p for s, p in expect.items() if max(s) >= VD)
        if extra > 0.2:
            break
    assert extra > 0.2
    results = SpecDecoder(tlm, dlm).generate_many([prompt] * N, max_new_tokens=n, sampling=params,
                                                   rng=np.random.default_rng(2026))
    counts: dict = {}
    for r in results:
        counts[tuple(r.generated_ids)] = counts.get(tuple(r.generated_ids), 0) + 1
    stat, df = chi2(counts, expect, N)
    print(f"chi2 batched: prompt {prompt}, stat {stat:.1f}, df {df}, p {chi2_p(stat, df):.3f}")
    assert stat < chi2_crit(df), (stat, df)


def test_cli_runs_the_pair_and_refuses_another_tokenizer(art, tmp_path, capsys):
    tlm, dlm = art("v224", "tlm", "ort", k=4), art("prefix211", "dlm", "ort")
    tok_dir = make_tokenizer(tmp_path / "tok", n=TOK)
    ids = ",".join(map(str, PROMPTS[0]))
    common = ["--tlm", tlm, "--prompt-ids", ids, "--max-new-tokens", 20, "--json", "--eos-id", -1]
    outs = []
    for extra in (["--dlm", dlm, "--tokenizer", tok_dir, "--dlm-tokenizer", tok_dir], ["--target-only"]):
        capsys.readouterr()
        assert run_cli.main([str(a) for a in common + extra]) == 0
        outs.append(json.loads(capsys.readouterr().out)["results"][0]["generated_ids"])
    assert outs[0] == outs[1] and len(outs[0]) == 20
    capsys.readouterr()
    code = run_cli.main([str(a) for a in common + ["--dlm", dlm, "--tokenizer", tok_dir, "--dlm-tokenizer",
                                                   make_tokenizer(tmp_path / "swap", n=TOK, swap=True)]])
    one_line_error(code, capsys.readouterr().err, "tokenizers differ at id 3")
