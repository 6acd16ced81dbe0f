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
