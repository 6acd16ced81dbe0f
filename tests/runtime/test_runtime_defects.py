"""Runtime defects of issue 22, each with the test that failed before the fix:
id lists, the EOS union, seeded sampling that repeats whatever the schedule,
batch size or API, and the bad values that crashed (seed, n-gram size, tiny
temperatures)."""
from __future__ import annotations

import json
import shutil
import warnings

import numpy as np
import pytest

import models
from specdec_compile import cli as compile_cli
from specdec_compile.errors import SpecdecError
from specdec_compile.runtime import SamplingParams, SpecDecoder, TargetOnlyDecoder, WidthPolicy
from specdec_compile.cli import run as run_cli
from specdec_compile.runtime.drafts.ngram import NgramDraft
from specdec_compile.runtime.testing import fake_pair, nominal_costs
from runtime_helpers import make_tokenizer, one_line_error, run

PROMPTS = [[3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 1], [5, 6], [7] * 12, [1, 2, 3, 1, 2, 3, 9], [9, 4, 9]]


# ----------------------------------------------------------------------------- 1. id lists

def test_ids_are_separated_by_commas_and_spaces():
    ids = run_cli._ids
    assert ids("1 2 3", "x") == [1, 2, 3]
    assert ids("12 7", "x") == [12, 7]            # was [127]
    assert ids("1,2,3", "x") == ids("1, 2 ,3", "x") == ids(" 1\t2,3 ", "x") == [1, 2, 3]
    for bad in ("1,,2", "1, ,2", "1 x 2", "1.5"):
        with pytest.raises(SpecdecError):
            ids(bad, "--prompt-ids")
    assert run_cli._device_ids("0 1", "--tlm-device-ids") == [0, 1]   # was [1]


# ----------------------------------------------------------------------------- 2. the EOS union

@pytest.fixture(scope="module")
def eos_case(fixture_path, tmp_path_factory):
    """A llama export whose generation_config lists [2, a, b], a and b ids the model
    emits greedily; a tokenizer saved with save_pretrained (no generation_config,
    EOS "</s>" = 2); the TLM compiled from it; transformers' greedy generate."""
    import torch

    root = tmp_path_factory.mktemp("eos")
    name = "llama_gqa"
    model = models.build_hf_model(name)
    prompts = [[1, 5, 9, 33, 7, 100, 42], [17, 3, 8, 55], [9, 9, 4, 120, 33]]

    def hf(prompt, eos):
        model.generation_config.eos_token_id = eos
        model.generation_config.pad_token_id = 0
        with torch.no_grad():
            out = model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                                 max_new_tokens=24, do_sample=False)
        return out[0, len(prompt):].tolist()

    free = [hf(p, None) for p in prompts]
    a, b = free[0][5], free[1][3]             # tokens the model emits: stopping there is visible
    eos = [2, a, b]
    export = root / "export"
    shutil.copytree(fixture_path(name).parent, export)
    (export / "generation_config.json").write_text(json.dumps({"eos_token_id": eos, "bos_token_id": 1}))
    tlm = root / "tlm"
    assert compile_cli.main([str(export / "model.onnx"), "--role", "tlm", "--k", "3", "--prefill-len", "8",
                             "--ctx-len", "64", "-o", str(tlm)]) == 0
    tok = make_tokenizer(root / "tok")
    assert not (tok / "generation_config.json").exists()
    return {"tlm": tlm, "tok": tok, "prompts": prompts, "eos": eos,
            "expect": [hf(p, eos) for p in prompts], "free": free}


@pytest.mark.slow
def test_the_manifests_eos_ids_stop_a_run_with_a_tokenizer(eos_case, capsys):
    c = eos_case
    assert json.loads((c["tlm"] / "manifest.json").read_text())["eos_token_ids"] == c["eos"]
    assert any(e != f for e, f in zip(c["expect"], c["free"]))      # an extra EOS id really stops a prompt
    argv = ["--tlm", c["tlm"], "--draft", "ngram", "--max-new-tokens", 24, "--json"]
    for p in c["prompts"]:
        argv += ["--prompt-ids", " ".join(map(str, p))]
    for extra in ([], ["--tokenizer", c["tok"]]):                    # with --tokenizer the list was dropped
        code, out, err = run(argv + extra, capsys)
        assert code == 0, err
        got = [r["generated_ids"] for r in json.loads(out)["results"]]
        assert got == c["expect"]


def test_eos_is_the_union_of_manifest_and_tokenizer():
    class Art:
        manifest = {"eos_token_ids": [39, 110]}
        eos_token_id = 39

    class Tlm:
        artifact = Art()

    class Args:
        eos_id = None
        tokenizer = None

    class Tok:
        eos_token_id = 2

    assert run_cli._eos(Args(), Tok(), Tlm()) == [2, 39, 110]
    Tok.eos_token_id = None                                          # a tokenizer without EOS
    assert run_cli._eos(Args(), Tok(), Tlm()) == [39, 110]
    Args.eos_id = -1
    assert run_cli._eos(Args(), Tok(), Tlm()) is None


# ----------------------------------------------------------------------------- 3. seeded sampling

def _wide_or_narrow(tlm, d, wide: bool):
    """A decoder whose width choice is forced by nominal call times: wide calls cheap or dear."""
    def cost(role, w):   # nominal seconds: far above the measured host work per round, so load cannot flip it
        if role == "dlm":
            return 0.1
        return 1.0 if wide else 1.0 * w ** 3
    return SpecDecoder(tlm, d, policy=WidthPolicy(costs=nominal_costs(cost)))


def test_seeded_text_does_not_depend_on_width_choice_batch_or_api():
    sp = SamplingParams(0.9, top_p=0.95, seed=7)
    runs = {}
    for B in (1, 3):
        tlm, d, _ = fake_pair(k=4, k_list=[0, 1, 2, 4], dlm="close", batch_size=B)
        for wide in (True, False):
            dec = _wide_or_narrow(tlm, d, wide)
            many = [r.generated_ids for r in dec.generate_many(PROMPTS, max_new_tokens=20, sampling=sp)]
            one = [dec.generate(p, max_new_tokens=20, sampling=sp, prompt_index=i).generated_ids
                   for i, p in enumerate(PROMPTS)]
            hist = {}
            for i, p in enumerate(PROMPTS):
                r = dec.generate(p, max_new_tokens=20, sampling=sp, prompt_index=i)
                for j, c in r.metrics["verify_drafts_histogram"].items():
                    hist[int(j)] = hist.get(int(j), 0) + c
            runs[(B, wide)] = (many, one, hist)
        base = TargetOnlyDecoder(tlm)
        runs[(B, "target")] = ([r.generated_ids for r in base.generate_many(PROMPTS, max_new_tokens=20, sampling=sp)],)
    ref = runs[(1, True)][0]
    assert len({tuple(map(tuple, x)) for v in runs.values() for x in v[:2]}) == 1, "seeded text differs"
    assert runs[(1, "target")][0] == ref                      # and it is the target's own sampled text
    wide_h, narrow_h = runs[(1, True)][2], runs[(1, False)][2]
    assert max(wide_h, key=wide_h.get) > max(narrow_h, key=narrow_h.get)   # the schedules really differed
    other = SamplingParams(0.9, top_p=0.95, seed=8)
    tlm, d, _ = fake_pair(k=4, dlm="close")
    assert [r.generated_ids for r in SpecDecoder(tlm, d).generate_many(PROMPTS, max_new_tokens=20,
                                                                       sampling=other)] != ref
    assert len({tuple(x) for x in ref}) == len(ref)            # prompts do not share one stream


@pytest.mark.slow
def test_seeded_cli_runs_repeat_across_batch_sizes(fixture_path, tmp_path, capsys):
    outs = {}
    for B in (1, 3):
        tlm = tmp_path / f"tlm{B}"
        assert compile_cli.main([str(fixture_path("llama_gqa")), "--role", "tlm", "--k", "4", "--k-list", "0,1,2,4",
                                 "--prefill-len", "8", "--ctx-len", "64", "--batch-size", str(B),
                                 "-o", str(tlm)]) == 0
        argv = ["--tlm", tlm, "--draft", "ngram", "--temperature", "0.9", "--seed", "7", "--max-new-tokens", 16,
                "--json", "--eos-id", -1]
        for p in PROMPTS[:4]:
            argv += ["--prompt-ids", ",".join(map(str, p))]
        for rep in range(2):
            code, out, err = run(argv, capsys)
            assert code == 0, err
            outs[(B, rep)] = [r["generated_ids"] for r in json.loads(out)["results"]]
    assert len({tuple(map(tuple, v)) for v in outs.values()}) == 1


# ----------------------------------------------------------------------------- 4-6. bad values

def test_bad_seed_and_ngram_size_are_one_line_errors(capsys):
    for argv, needle in ((["--seed", "-1"], "seed"),
                         (["--seed", "-1", "--temperature", "0.8"], "seed"),
                         (["--draft", "ngram", "--ngram-max", "1000000000"], "--ngram-max"),
                         (["--draft", "ngram", "--ngram-max", "33"], "--ngram-max")):
        code, out, err = run(["--tlm", "/nonexistent", "--prompt-ids", "1,2"] + argv, capsys)
        one_line_error(code, err, needle)


def test_ngram_size_is_bounded_by_the_context():
    tlm, _, _ = fake_pair(ctx_len=16)
    with pytest.raises(SpecdecError, match="context"):
        SpecDecoder(tlm, draft=NgramDraft(20))
    with pytest.raises(SpecdecError, match="at most 32"):
        NgramDraft(10 ** 9)
    ix = NgramDraft(16).drafter(type("C", (), {"target_vocab": None})())
    assert ix.maps == {}                                    # nothing allocated up front


def test_tiny_temperatures_decode_greedily_without_warnings():
    tlm, d, _ = fake_pair(k=3, dlm="close")
    greedy = SpecDecoder(tlm, d).generate(PROMPTS[0], max_new_tokens=20).generated_ids
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with np.errstate(over="raise", divide="raise", invalid="raise"):
            for t in (1e-310, 1e-320, 5e-324):
                sp = SamplingParams(t, seed=1)
                assert SpecDecoder(tlm, d).generate(PROMPTS[0], max_new_tokens=20, sampling=sp).generated_ids == greedy
