"""Batches and continuous batching, the corners: an --interface qeff model with continuous
batching compiled at --prefill-len 1 (its prefill is the seq_len-1 call of every row, contract
section 7), run alone and through every row."""
from __future__ import annotations

import pytest

from specdec_compile import cli as compile_cli
from specdec_compile.runtime import OrtBackend, SpecDecoder, TargetOnlyDecoder

PROMPTS = [[1, 5, 9, 33, 7], [1, 150, 20], [1, 2, 3, 4, 5, 6, 7, 8], [1, 9]]


@pytest.fixture(scope="module")
def pl1(fixture_path, tmp_path_factory):
    """llama_gqa compiled at --prefill-len 1, batch 3: a default TLM, a default DLM and a
    --full-batch-size DLM."""
    root = tmp_path_factory.mktemp("batch_pl1")
    src = str(fixture_path("llama_gqa"))
    common = ["--target", "ort", "--ctx-len", "32", "--prefill-len", "1", "--batch-size", "3"]
    for name, extra in (("tlm", ["--role", "tlm", "--k", "3", "--k-list", "0"]), ("dlm", ["--role", "dlm"]),
                        ("dlmcb", ["--role", "dlm", "--full-batch-size", "3"])):
        assert compile_cli.main([src, *common, *extra, "-o", str(root / name)]) == 0
    return root


def test_continuous_batching_at_prefill_len_1_runs(pl1):
    """Its prefill specialization is [3, 1] (no batch-1 call): the runtime used to run the prompt
    at batch 1 and every generation was refused ("a call of shape [1, 1] matches no
    specialization"). Now greedy tokens equal the default interface's, alone and in a batch."""
    def open_(name):
        return OrtBackend(pl1 / name, intra_op_threads=1)

    base = TargetOnlyDecoder(open_("dlm"))
    want = [base.generate(p, max_new_tokens=6).generated_ids for p in PROMPTS]
    cb = TargetOnlyDecoder(open_("dlmcb"))
    assert [cb.generate(p, max_new_tokens=6).generated_ids for p in PROMPTS] == want
    assert [r.generated_ids for r in cb.generate_many(PROMPTS, max_new_tokens=6)] == want
    tlm = open_("tlm")
    want = [TargetOnlyDecoder(tlm).generate(p, max_new_tokens=8).generated_ids for p in PROMPTS]
    spec = SpecDecoder(tlm, open_("dlmcb"))        # llama_gqa drafting for itself
    assert [r.generated_ids for r in spec.generate_many(PROMPTS, max_new_tokens=8)] == want
    assert [spec.generate(p, max_new_tokens=8).generated_ids for p in PROMPTS] == want


def test_generate_many_of_one_prompt_calls_on_tokens_as_documented():
    """generate_many(one prompt, on_tokens=cb): cb(ids, sources) passed the check, then the engine
    called it as (index, ids, sources): a TypeError mid-run, and no callback could work."""
    from specdec_compile.runtime.testing import fake_pair
    tlm, dlm, _ = fake_pair(vocab=211, k=3, ctx_len=64)
    for dec in (SpecDecoder(tlm, dlm), TargetOnlyDecoder(tlm)):
        seen = []
        [r] = dec.generate_many([1, 5, 9], max_new_tokens=6, on_tokens=lambda ids, src: seen.extend(ids))
        assert seen == r.generated_ids and len(seen) == 6
        seen = []
        rs = dec.generate_many([[1, 5, 9], [1, 7]], max_new_tokens=4, on_tokens=lambda i, ids, src: seen.append(i))
        assert sorted(set(seen)) == [0, 1] and len(rs) == 2


def test_a_speculative_decoder_needs_a_tlm_target(pl1):
    """A DLM-role target with an n-gram or suffix draft stopped with a TypeError in the width policy."""
    from specdec_compile.errors import SpecdecError
    dlm = OrtBackend(pl1 / "dlm", intra_op_threads=1)
    for draft in ("ngram", "suffix"):
        with pytest.raises(SpecdecError, match="must be a TLM artifact") as e:
            SpecDecoder(dlm, draft=draft)
        assert "\n" not in str(e.value)


def test_a_plain_qeff_dlm_at_prefill_len_1_loads_and_drafts(fixture_path, tmp_path):
    """--role dlm --interface qeff --prefill-len 1 (no continuous batching) has one specialization,
    the prefill that is also its decode (contract section 7); the compile wrote it and every reader
    refused it ("decodes at seq_len 1, got []")."""
    src = str(fixture_path("llama_gqa"))
    common = ["--target", "ort", "--ctx-len", "32", "--prefill-len", "1", "--quiet"]
    assert compile_cli.main([src, *common, "--role", "dlm", "--interface", "qeff", "-o", str(tmp_path / "d")]) == 0
    assert compile_cli.main([src, *common, "--role", "tlm", "--k", "3", "-o", str(tmp_path / "t")]) == 0
    tlm = OrtBackend(tmp_path / "t", intra_op_threads=1)
    want = [TargetOnlyDecoder(tlm).generate(p, max_new_tokens=8).generated_ids for p in PROMPTS]
    d = OrtBackend(tmp_path / "d", intra_op_threads=1)
    assert [TargetOnlyDecoder(d).generate(p, max_new_tokens=8).generated_ids for p in PROMPTS] == want
    assert [SpecDecoder(tlm, d).generate(p, max_new_tokens=8).generated_ids for p in PROMPTS] == want
