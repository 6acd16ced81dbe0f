"""Our runtime on --interface qeff artifacts (ONNX Runtime), both of QEfficient's interfaces: with
continuous batching (--full-batch-size) a new prompt's prefill runs at batch 1 into its cache row
(batch_index) and decoding runs every row; the plain one (no batch_index) runs every row every call.
Greedy output equal, row by row, to the default interface's (target-only, n-gram drafts, a draft
model, a qeff draft model of either interface, more prompts than rows), sampled output equal at
the same seed; a bad batch_index refused in one line before the call."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from specdec_compile.errors import SpecdecError
from specdec_compile.artifact.reader import load_artifact
from specdec_compile.runtime.backends.ort.runner import OrtBackend
from specdec_compile.runtime.decoding import SpecDecoder, TargetOnlyDecoder
from specdec_compile.runtime.drafts.ngram import NgramDraft
from specdec_compile.runtime.sampling import SamplingParams

COMMON = ["--target", "ort", "--ctx-len", "64", "--prefill-len", "8", "--batch-size", "3"]


@pytest.fixture(scope="module")
def arts(tmp_path_factory, fixture_path):
    src = fixture_path("llama_gqa")
    d = tmp_path_factory.mktemp("qeff_rt")
    tlm = ["--role", "tlm", "--k", "3", "--k-list", "0"]
    for name, extra in (("tlm", tlm), ("tlmq", [*tlm, "--interface", "qeff"]),
                        ("tlmcb", [*tlm, "--full-batch-size", "3"]), ("dlm", ["--role", "dlm"]),
                        ("dlmq", ["--role", "dlm", "--interface", "qeff"]),
                        ("dlmcb", ["--role", "dlm", "--full-batch-size", "3"])):
        r = subprocess.run([sys.executable, "-m", "specdec_compile", str(src), *COMMON, *extra, "-o", str(d / name)],
                           capture_output=True, text=True, cwd=Path(__file__).resolve().parents[2])
        assert r.returncode == 0, r.stderr
    return d


PROMPTS = [list(np.random.default_rng(0).integers(3, 211, n)) for n in (5, 11, 3, 17, 9)]


def _tokens(results):
    return [r.generated_ids for r in results]


def test_artifact_shapes(arts):
    a = load_artifact(arts / "tlmcb")
    assert a.qeff and a.cache_rows and a.prefill_batch == 1 and a.batch_size == 3
    assert a.shapes() == [(1, 8), (3, 1), (3, 4)] and a.seq_lens == (1, 4) and a.k_list == (0, 3)
    with pytest.raises(SpecdecError, match=r"matches no specialization"):
        a.check_call(3, 8)          # no full-width prefill in QEfficient's continuous batching
    p = load_artifact(arts / "tlmq")   # the plain interface: every call at batch 3, no batch_index
    assert p.qeff and not p.cache_rows and p.prefill_batch == 3
    assert p.shapes() == [(3, 8), (3, 1), (3, 4)] and p.seq_lens == (1, 4, 8) and p.k_list == (0, 3)
    for name, shapes in (("dlmq", [(3, 8), (3, 1)]), ("dlmcb", [(1, 8), (3, 1)])):
        d = load_artifact(arts / name)   # QEfficient's DLM: prefill and seq_len 1 only
        assert d.role == "dlm" and d.shapes() == shapes and d.cache_rows == (name == "dlmcb")


@pytest.mark.parametrize("draft", ["target", "ngram", "dlm", "dlmq", "dlmcb"])
def test_greedy_rows_equal_the_default_interface(arts, draft):
    """Every TLM interface with every draft interface (all nine pairs): the default target's
    greedy tokens, row by row (llama_gqa drafting for itself: speculative greedy = target greedy)."""
    alone = TargetOnlyDecoder(OrtBackend(arts / "tlm"))
    want = (_tokens(alone.generate_many(PROMPTS, max_new_tokens=12)),
            alone.generate(PROMPTS[3], max_new_tokens=12).generated_ids)
    assert want[0][1] == alone.generate(PROMPTS[1], max_new_tokens=12).generated_ids
    for name in ("tlm", "tlmq", "tlmcb"):
        tlm = OrtBackend(arts / name)
        if draft == "target":
            dec = TargetOnlyDecoder(tlm)
        elif draft == "ngram":
            dec = SpecDecoder(tlm, draft=NgramDraft())
        else:
            dec = SpecDecoder(tlm, OrtBackend(arts / draft))
        got = (_tokens(dec.generate_many(PROMPTS, max_new_tokens=12)),
               dec.generate(PROMPTS[3], max_new_tokens=12).generated_ids)
        assert got == want, name


def test_sampling_equals_the_default_interface_at_a_seed(arts):
    sp = SamplingParams(temperature=0.8, top_k=20, seed=11)
    got = [_tokens(SpecDecoder(OrtBackend(arts / n), draft=NgramDraft()).generate_many(
        PROMPTS, max_new_tokens=10, sampling=sp)) for n in ("tlm", "tlmq", "tlmcb")]
    assert got[0] == got[1] == got[2]


@pytest.mark.parametrize("n,rows,message", [(1, [3], r"out of range \[0, 3\)"), (1, [-1], "out of range"),
                                            (3, [0, 0, 1], "names a cache row twice"),
                                            (1, None, "needs their cache rows"), (1, [0, 1], "must be 1 integers")])
def test_bad_batch_index_is_refused_before_the_call(arts, n, rows, message):
    b = OrtBackend(arts / "tlmcb")
    width = 8 if n == 1 else 1
    ids, pos = np.zeros((n, width), np.int64), np.tile(np.arange(width), (n, 1))
    calls = b.calls
    with pytest.raises(SpecdecError, match=message) as e:
        b.run(ids, pos, rows=rows)
    assert "\n" not in str(e.value) and b.calls == calls
    for name in ("tlm", "tlmq"):
        with pytest.raises(SpecdecError, match="has no batch_index input"):
            OrtBackend(arts / name).run(np.zeros((3, 8), np.int64), np.tile(np.arange(8), (3, 1)), rows=[0, 1, 2])


def test_qeff_dlm_catches_up_one_token_a_call(arts):
    """A qeff DLM has no seq_len 2: after a full accept it ingests the last draft and the bonus
    token in two seq_len-1 calls (QEfficient's own loop splits them the same way)."""
    dlm = OrtBackend(arts / "dlmq")
    dec = SpecDecoder(OrtBackend(arts / "tlmq"), dlm)   # llama_gqa drafting for itself: every draft accepted
    res = dec.generate(PROMPTS[1], max_new_tokens=12)
    assert res.generated_ids == TargetOnlyDecoder(OrtBackend(arts / "tlm")).generate(
        PROMPTS[1], max_new_tokens=12).generated_ids
    assert dlm.calls > 0 and 2 not in dlm.seq_lens
