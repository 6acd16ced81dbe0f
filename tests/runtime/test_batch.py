"""Batches with per-row acceptance and continuous batching: each row's greedy output
equals that prompt decoded alone, token for token. FAKE backends first (fast,
exact), then real tiny exports on ONNX Runtime, both lowering targets."""
from __future__ import annotations

import pytest
from runtime_helpers import reference_greedy

from specdec_compile.errors import SpecdecError
from specdec_compile.runtime import NgramDraft, SpecDecoder, TargetOnlyDecoder
from specdec_compile.runtime.testing import fake_pair

PROMPTS = [[3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 1], [5, 6], [7, 7, 7, 7, 7, 7, 7, 7, 7], [1, 2, 3, 1, 2, 3, 1, 2],
           [9], [4, 9, 4, 9, 4, 9, 4, 9, 4, 9, 4, 9, 4, 9, 4, 9, 4], [11, 3, 5]]


@pytest.mark.parametrize("k", [1, 3, 7])
@pytest.mark.parametrize("draft", ["close", "same", "ngram", "target"])
@pytest.mark.parametrize("B", [1, 3])
def test_rows_equal_single_row_decoding(k, draft, B):
    tlm, d, lm = fake_pair(k=k, dlm="close" if draft in ("ngram", "target") else draft, batch_size=B)
    if draft == "ngram":
        dec = SpecDecoder(tlm, NgramDraft(2))
    elif draft == "target":
        dec = TargetOnlyDecoder(tlm)
    else:
        dec = SpecDecoder(tlm, d)
    res = dec.generate_many(PROMPTS, max_new_tokens=30)
    assert [r.prompt_ids for r in res] == PROMPTS                 # input order
    for p, r in zip(PROMPTS, res):
        assert r.generated_ids == reference_greedy(lm, p, 30, tlm.ctx_len), p
        assert r.generated_ids == dec.generate(p, max_new_tokens=30).generated_ids
        assert r.metrics["new_tokens"] == 30                         # each result keeps its own metrics


def test_per_row_stops_and_context_limits():
    tlm, d, lm = fake_pair(k=3, dlm="close", batch_size=2, ctx_len=40)
    ref = reference_greedy(lm, PROMPTS[0], 20, 40)
    eos = ref[5]
    dec = SpecDecoder(tlm, d, eos_token_id=eos)
    prompts = [PROMPTS[0], [2] * 30, PROMPTS[1], PROMPTS[3]]
    res = dec.generate_many(prompts, max_new_tokens=20)
    for p, r in zip(prompts, res):
        want = reference_greedy(lm, p, 20, 40, eos=(eos,))
        assert r.generated_ids == want
    assert res[0].stop_reason == "eos"
    r1 = res[1]
    assert (r1.stop_reason, len(r1.generated_ids)) == ("ctx_len", 10) or \
        (r1.stop_reason == "eos" and r1.generated_ids[-1] == eos)


def test_rows_pad_and_calls_carry_all_rows():
    log = []
    tlm, d, lm = fake_pair(k=3, dlm="close", batch_size=2, call_log=log)
    SpecDecoder(tlm, d).generate_many(PROMPTS[:4], max_new_tokens=12)
    assert all(len(c[2]) in tlm.seq_lens + d.seq_lens for c in log)
    # both rows are used: some TLM calls have row 0 in use while calls of one backend total fewer
    # than two single-row runs would need
    single = []
    t2, d2, _ = fake_pair(k=3, dlm="close", batch_size=2, call_log=single)
    dec2 = SpecDecoder(t2, d2)
    for p in PROMPTS[:4]:
        dec2.generate(p, max_new_tokens=12)
    assert len([c for c in log if c[0] == "tlm"]) < len([c for c in single if c[0] == "tlm"])


def test_more_rows_than_prompts():
    tlm, d, lm = fake_pair(k=3, dlm="close", batch_size=4)
    res = SpecDecoder(tlm, d).generate_many(PROMPTS[:2], max_new_tokens=10)
    assert [r.generated_ids for r in res] == [reference_greedy(lm, p, 10, 64) for p in PROMPTS[:2]]
    assert SpecDecoder(tlm, d).generate_many([], max_new_tokens=10) == []


def test_bad_prompt_is_named_before_anything_runs():
    log = []
    tlm, d, _ = fake_pair(k=3, batch_size=2, ctx_len=32, call_log=log)
    with pytest.raises(SpecdecError, match=r"prompt 3: the prompt has 40 tokens"):
        SpecDecoder(tlm, d).generate_many([[1, 2], [3], [1] * 40], max_new_tokens=4)
    assert log == []


def test_sampling_per_row_is_seeded_and_valid():
    tlm, d, lm = fake_pair(k=3, dlm="close", batch_size=3)
    from specdec_compile.runtime import SamplingParams
    sp = SamplingParams(temperature=0.8, seed=3)
    a = SpecDecoder(tlm, d).generate_many(PROMPTS, max_new_tokens=10, sampling=sp)
    b = SpecDecoder(tlm, d).generate_many(PROMPTS, max_new_tokens=10, sampling=sp)
    assert [r.generated_ids for r in a] == [r.generated_ids for r in b]
    assert all(len(r.generated_ids) == 10 for r in a)


# ------------------------------------------------------------------- real exports

@pytest.fixture(scope="module")
def art(fixture_path, tmp_path_factory):
    from specdec_compile import cli as compile_cli
    root = tmp_path_factory.mktemp("batch_arts")
    made = {}

    def get(name, role, target="ort", k=None, batch=2):
        key = (name, role, target, k, batch)
        if key not in made:
            out = root / "-".join(str(x) for x in key if x is not None)
            argv = [str(fixture_path(name)), "--role", role, "--target", target, "--prefill-len", "8",
                    "--ctx-len", "64", "--batch-size", str(batch), "-o", str(out)]
            if k is not None:
                argv += ["--k", str(k)]
            assert compile_cli.main(argv) == 0
            made[key] = out
        return made[key]

    return get


REAL = [[1, 5, 9, 33, 7, 100, 42, 17, 3, 8, 55], [1, 150, 20], [1, 2, 3, 4, 5, 6, 7, 8], [1, 9, 9, 9, 9],
        [1, 60, 61, 62, 60, 61]]


@pytest.mark.parametrize("k", [1, 3, 7])
@pytest.mark.parametrize("target", ["ort", "qaic"])
def test_real_rows_equal_single_row(art, k, target):
    from specdec_compile.runtime import OrtBackend
    tlm = OrtBackend(art("llama_gqa", "tlm", target=target, k=k), intra_op_threads=1)
    dlm = OrtBackend(art("llama_gqa", "dlm", target=target), intra_op_threads=1)
    one = OrtBackend(art("llama_gqa", "tlm", target=target, k=k, batch=1), intra_op_threads=1)
    want = [TargetOnlyDecoder(one).generate(p, max_new_tokens=16).generated_ids for p in REAL]
    got = SpecDecoder(tlm, dlm).generate_many(REAL, max_new_tokens=16)
    assert [r.generated_ids for r in got] == want
    got = SpecDecoder(tlm, None, draft="ngram").generate_many(REAL, max_new_tokens=16)
    assert [r.generated_ids for r in got] == want
    got = TargetOnlyDecoder(tlm).generate_many(REAL, max_new_tokens=16)
    assert [r.generated_ids for r in got] == want


def test_pair_of_different_batch_sizes_is_refused(art):
    from specdec_compile.runtime import OrtBackend
    tlm = OrtBackend(art("llama_gqa", "tlm", k=3, batch=2), intra_op_threads=1)
    dlm = OrtBackend(art("llama_gqa", "dlm", batch=1), intra_op_threads=1)
    with pytest.raises(SpecdecError, match="batch size"):
        SpecDecoder(tlm, dlm)
