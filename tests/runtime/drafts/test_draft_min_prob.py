"""A draft model's chain cut by its own probability (``min_prob`` / ``--draft-min-prob``,
EAGLE-2's score): where the chain stops, what it costs, and that the output stays the target's
(greedy token for token, seeded sampling equal to target-only) for an imported EAGLE-3 head and a
plain DLM, alone and in the hybrid."""
from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest
from runtime_helpers import one_line_error, run

from eagle3_models import compile_target, import_case
from specdec_compile.errors import SpecdecError
from specdec_compile.runtime import DlmDraft, OrtBackend, SamplingParams, SpecDecoder, TargetOnlyDecoder
from specdec_compile.runtime.drafts import DraftContext, make_draft_source
from specdec_compile.runtime.drafts.dlm import DlmDrafter
from specdec_compile.runtime.sampling import Noise, probs

PROMPTS = [[1, 5, 9, 33, 7, 100, 42, 17, 3, 8, 55], [1, 150, 20], [7] * 17]


def _drafter(min_prob, sampling=SamplingParams(0.0), noise=None):
    d = DlmDrafter.__new__(DlmDrafter)
    d.ctx = DraftContext(sampling, noise, None, None)
    d.vocab, d.min_prob = None, min_prob
    return d


def _drive(gen):
    try:
        while True:
            next(gen)
    except StopIteration as stop:
        return stop.value


def _chain(d, rows, n):
    """The chain over fixed logits rows (row i for draft i); the steps it called."""
    steps = []

    def step(tok, pos):
        steps.append((tok, pos))
        return rows[len(steps)]
        yield
    return _drive(d.chain(rows[0], 10, n, step)), steps


def _row(top, p_top, v=6):
    """Logits over v ids whose softmax gives ``top`` probability ``p_top``, the rest equal."""
    rest = (1 - p_top) / (v - 1)
    lg = np.full(v, np.log(rest))
    lg[top] = np.log(p_top)
    return lg


def test_the_chain_stops_where_its_probability_falls_below_min_prob():
    rows = [_row(1, 0.9), _row(2, 0.8), _row(3, 0.5), _row(4, 0.99)]
    # scores 0.9, 0.72, 0.36, 0.356
    assert _chain(_drafter(0.0), rows, 4) == ([1, 2, 3, 4], [(1, 10), (2, 11), (3, 12)])
    assert _chain(_drafter(0.5), rows, 4) == ([1, 2], [(1, 10), (2, 11)])       # no call past the cut
    assert _chain(_drafter(0.72 - 1e-9), rows, 4)[0] == [1, 2]
    assert _chain(_drafter(0.95), rows, 4) == ([], [])                          # not even the first
    assert _chain(_drafter(0.3), rows, 4)[0] == [1, 2, 3, 4]
    assert _chain(_drafter(0.3), rows, 2) == ([1, 2], [(1, 10)])                # n still bounds it


def test_scores_are_the_draft_models_probabilities():
    d = _drafter(0.1)
    lg = np.array([0.5, 2.0, -1.0, -np.inf, 1.0])
    tok = d.pick(lg, 0)
    p = d.prob(lg, tok)
    e = np.exp(lg - lg.max())
    assert tok == 1 and p == pytest.approx(e[1] / e.sum())
    sp = SamplingParams(0.7, top_p=0.9, seed=3)
    d = _drafter(0.1, sp, Noise(3))
    for pos in range(20):
        tok = d.pick(lg, pos)
        p = d.prob(lg, tok)
        q = probs(lg, sp)
        assert p == pytest.approx(q[tok]) and q[tok] > 0
        with np.errstate(divide="ignore"):
            assert tok == int(np.argmax(np.log(q) + Noise(3).gumbel(pos, len(q))))   # pick()'s draw


@pytest.mark.parametrize("bad", [-0.1, 1.0, 2, float("nan"), True, "0.5"])
def test_bad_min_prob_is_refused(bad):
    with pytest.raises(SpecdecError, match="min_prob"):
        DlmDraft(SimpleNamespace(), min_prob=bad)


def test_min_prob_without_a_draft_model_is_refused():
    for draft in ("ngram", "suffix"):
        with pytest.raises(SpecdecError, match="for a draft model"):
            make_draft_source(draft, None, min_prob=0.2)


@pytest.fixture(scope="module")
def eagle3_pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("minprob")
    return compile_target("llama", root / "tlm"), import_case("llama", root / "head")


def _gen(dec, p, n=30, sp=None):
    r = dec.generate(p, max_new_tokens=n, **({"sampling": sp} if sp else {}))
    return r.generated_ids, r.metrics


@pytest.mark.parametrize("draft", [None, "hybrid"])
def test_eagle3_head_output_is_the_targets_at_every_floor(eagle3_pair, draft):
    tlm_dir, head_dir = eagle3_pair
    tlm, head = OrtBackend(tlm_dir), OrtBackend(head_dir)
    base = TargetOnlyDecoder(tlm)
    drafted = {}
    for mp in (0.0, 0.02, 0.2, 0.99):
        spec = SpecDecoder(tlm, head, draft=draft, k=3, draft_min_prob=mp)
        drafted[mp] = 0
        for p in PROMPTS:
            ids, m = _gen(spec, p)
            assert ids == _gen(base, p)[0], (mp, p)
            drafted[mp] += m.drafted_tokens
        for seed in range(3):
            sp = SamplingParams(0.8, top_p=0.95, seed=seed)
            for p in PROMPTS[:2]:
                assert _gen(spec, p, 20, sp)[0] == _gen(base, p, 20, sp)[0], (mp, seed, p)
    # a higher floor drafts less; a floor near 1 leaves the head's drafts out (the random head is unsure)
    assert drafted[0.0] >= drafted[0.02] >= drafted[0.2] >= drafted[0.99]
    assert drafted[0.0] > drafted[0.99]
    if draft is None:
        assert drafted[0.99] == 0


def test_plain_dlm_output_is_the_targets_and_the_cli_takes_the_floor(fixture_path, tmp_path, capsys):
    from specdec_compile import cli
    src = str(fixture_path("llama_gqa"))
    tlm_dir, dlm_dir = tmp_path / "tlm", tmp_path / "dlm"
    assert cli.main([src, "--role", "tlm", "--k", "3", "--k-list", "0,1,3", "--prefill-len", "8", "--ctx-len", "64",
                     "-o", str(tlm_dir)]) == 0
    assert cli.main([src, "--role", "dlm", "--prefill-len", "8", "--ctx-len", "64", "-o", str(dlm_dir)]) == 0
    tlm, dlm = OrtBackend(tlm_dir), OrtBackend(dlm_dir)
    base = TargetOnlyDecoder(tlm)
    for mp in (0.0, 0.3, 0.9):
        spec = SpecDecoder(tlm, dlm, k=3, draft_min_prob=mp)
        for p in PROMPTS:
            assert _gen(spec, p)[0] == _gen(base, p)[0], (mp, p)
    ids = ["--prompt-ids", ",".join(map(str, PROMPTS[0])), "--max-new-tokens", "16", "--json", "--no-warmup"]
    code, out, err = run(["--tlm", str(tlm_dir), "--dlm", str(dlm_dir), "--draft-min-prob", "0.4", *ids], capsys)
    assert code == 0, err
    code2, out2, _ = run(["--tlm", str(tlm_dir), "--target-only", *ids], capsys)
    assert json.loads(out)["results"][0]["generated_ids"] == json.loads(out2)["results"][0]["generated_ids"]
    for argv, msg in ((["--draft-min-prob", "1.5"], "must be in [0, 1)"),
                      (["--draft", "ngram", "--draft-min-prob", "0.2"], "is for a draft model")):
        dl = [] if "ngram" in argv else ["--dlm", str(dlm_dir)]
        code, _, err = run(["--tlm", str(tlm_dir), *dl, *argv, *ids], capsys)
        one_line_error(code, err, msg)
