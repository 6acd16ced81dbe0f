"""Imported EAGLE-3 heads (tests/eagle3_data, speculators checkpoints) in the decoding loop, on ORT:
greedy output equals target-only decoding token for token (both lowerings), every row the draft
reads is paired as the contract says (target features with an empty own slot; drafted rows with
the head's own state in the slot), and sampling with a draft vocabulary smaller than the target's
(d2t) draws from the target's exact distribution."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from runtime_helpers import chi2, chi2_crit, chi2_p, one_line_error, run

from eagle3_models import cases, compile_target, import_case
from specdec_compile.runtime import FeatureDraft, OrtBackend, SamplingParams, SpecDecoder, TargetOnlyDecoder
from specdec_compile.runtime.drafts.feature import FeatureDrafter
from specdec_compile.runtime.sampling import probs

PL, CL = 8, 64
PROMPTS = [[1, 5, 9, 33, 7, 100, 42, 17, 3, 8, 55], [1, 150, 20], [1, 2, 3, 4, 5, 6, 7, 8], [7] * 17, [9, 4]]


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """pair(case, target="ort") -> (TLM dir, imported head dir), built once."""
    root = tmp_path_factory.mktemp("eagle3_pairs")
    made = {}

    def get(case, target="ort"):
        if (case, target) not in made:
            made[case, target] = (compile_target(case, root / f"tlm-{case}-{target}", target=target),
                                  import_case(case, root / f"head-{case}-{target}", target=target))
        return made[case, target]

    return get


@pytest.mark.parametrize("case,target", [("llama", "ort"), ("llama", "qaic"), ("qwen", "ort")])
def test_greedy_equals_target_only(pair, case, target):
    tlm_dir, head_dir = pair(case, target)
    tlm, head = OrtBackend(tlm_dir), OrtBackend(head_dir)
    spec, base = SpecDecoder(tlm, head, k=3), TargetOnlyDecoder(tlm)
    assert isinstance(spec.source, FeatureDraft)
    for p in PROMPTS:
        assert spec.generate(p, max_new_tokens=30).generated_ids == base.generate(p, max_new_tokens=30).generated_ids, p
    assert head.calls > len(PROMPTS) * 3        # the head drafted every round, not only prefills
    hybrid = SpecDecoder(tlm, head, draft="hybrid", k=3)   # prompt lookup, else the head
    for p in PROMPTS[:3]:
        assert hybrid.generate(p, max_new_tokens=30).generated_ids == base.generate(p, max_new_tokens=30).generated_ids


class _Recording(FeatureDrafter):
    ingests: list = []
    drafted: list = []

    def _inputs(self, p0, q):
        rows = super()._inputs(p0, q)
        self.ingests.append((p0, rows[self.src.input_name].copy()))
        return rows

    def _own_input(self, own):
        row = super()._own_input(own)
        self.drafted.append((own.copy(), row[self.src.input_name].copy()))
        return row


def test_rows_carry_target_features_or_the_heads_own_state(pair):
    """Ingested row p: [f_{p-1} (the TLM's three layers at p-1, zeros at p = 0) ; zeros]; a drafted
    row: [zeros ; the head's draft_hidden_states of the row before]."""
    tlm_dir, head_dir = pair("llama")
    tlm, head = OrtBackend(tlm_dir), OrtBackend(head_dir)

    class Source(FeatureDraft):
        def drafter(self, ctx):
            return _Recording(self, ctx)
    _Recording.ingests, _Recording.drafted = [], []
    r = SpecDecoder(tlm, draft=Source(head), k=3).generate(PROMPTS[0], max_new_tokens=25)
    text = PROMPTS[0] + r.generated_ids
    ref, f = OrtBackend(tlm_dir), []
    for s in range(0, len(text), PL):
        chunk = text[s:s + PL]
        ids, pos = np.zeros((1, PL), np.int64), np.full((1, PL), -1, np.int64)
        ids[0, :len(chunk)], pos[0, :len(chunk)] = chunk, np.arange(s, s + len(chunk))
        f.extend(ref.run_outputs(ids, pos)["hidden_states"][0, :len(chunk)])
    W = len(f[0])
    assert W == 192 and len(_Recording.ingests) > 3 and len(_Recording.drafted) > 3
    for p0, rows in _Recording.ingests:
        assert rows.shape[1] == W + 64
        for i, row in enumerate(rows):
            want = np.zeros(W, np.float32) if p0 + i == 0 else f[p0 + i - 1]
            assert np.abs(row[:W] - want).max() < 1e-4 and not row[W:].any(), (p0, i)
    for own, row in _Recording.drafted:
        assert row.shape == (1, W + 64) and not row[0, :W].any()
        assert np.array_equal(row[0, W:], own) and np.abs(own).max() > 0


def test_sampling_with_a_draft_vocabulary_draws_from_the_target(pair):
    """The head drafts from 150 of the 211 ids (d2t), so the residual carries the target's mass on
    the other 61. The second token (the first the draft proposes) is distributed as the target's
    exact marginal sum_t1 p(t1) p(t2 | t1); counts leaving out the ids the draft lacks fail. With a
    seed, the text is the target-only text, and every proposal is an id the head has."""
    tlm_dir, head_dir = pair("llama")
    tlm, head = OrtBackend(tlm_dir, intra_op_threads=1), OrtBackend(head_dir, intra_op_threads=1)
    params, prompt, N = SamplingParams(1.0), [1, 5, 9], 3000

    def last_logits(hist):
        ids, pos = np.zeros((1, PL), np.int64), np.full((1, PL), -1, np.int64)
        ids[0, :len(hist)], pos[0, :len(hist)] = hist, np.arange(len(hist))
        tlm.reset()
        return tlm.run(ids, pos)[0, len(hist) - 1]

    p1 = probs(last_logits(prompt), params)
    marginal = sum(p1[t] * probs(last_logits(prompt + [t]), params) for t in range(len(p1)))
    from specdec_compile.eagle3.safetensors import read_safetensors
    from eagle3_models import DATA
    d2t = read_safetensors(DATA / "llama" / "model.safetensors")["d2t"]
    drafted_ids = set((np.arange(len(d2t)) + d2t).tolist())
    lacking = [t for t in range(len(p1)) if t not in drafted_ids]
    assert len(lacking) == 61 and marginal[lacking].sum() > 0.1
    dec = SpecDecoder(tlm, head, k=3)
    rng = np.random.default_rng(7)
    counts, acc = {}, []
    for _ in range(N):
        r = dec.generate(prompt, max_new_tokens=3, sampling=params, rng=rng)   # a round drafts token 2
        counts[(r.generated_ids[1],)] = counts.get((r.generated_ids[1],), 0) + 1
        acc.append(r.metrics["acceptance_rate"])
    expect = {(t,): float(marginal[t]) for t in range(len(marginal))}
    stat, df = chi2(counts, expect, N)
    print(f"chi2 eagle3: stat {stat:.1f}, df {df}, p {chi2_p(stat, df):.3f}, acceptance {np.mean(acc):.3f}")
    assert stat < chi2_crit(df), (stat, df)
    assert np.mean(acc) > 0.1                 # the draft's proposals were accepted, not only corrected
    # position-keyed sampling (runtime/sampling.py): the same seed gives the target-only text, token for
    # token; the head proposes only ids it has (its mass sits on i + d2t[i], q = 0 elsewhere)
    base = TargetOnlyDecoder(tlm)

    class Picks(FeatureDrafter):
        seen: list = []

        def pick(self, logits, pos):
            t = super().pick(logits, pos)
            self.seen.append(t)
            return t

    class Source(FeatureDraft):
        def drafter(self, ctx):
            return Picks(self, ctx)
    spec = SpecDecoder(tlm, draft=Source(head), k=3)
    for seed in range(6):
        sp = SamplingParams(0.8, seed=seed)
        for p in PROMPTS[:3]:
            assert spec.generate(p, max_new_tokens=20, sampling=sp).generated_ids == \
                base.generate(p, max_new_tokens=20, sampling=sp).generated_ids
    assert len(Picks.seen) > 50 and set(Picks.seen) <= drafted_ids
    kept = {s: p for s, p in expect.items() if s[0] in drafted_ids}
    z = sum(kept.values())
    bad, bdf = chi2({s: int(round(p / z * N)) for s, p in kept.items()}, expect, N)
    assert bad > chi2_crit(bdf)


def test_recorded_cases_cover_two_families_and_a_draft_vocabulary():
    c = cases()
    assert {x["family"] for x in c.values()} == {"llama", "qwen3"}
    assert any(x["draft_vocab"] < x["vocab"] for x in c.values())


def test_specdec_run_runs_the_pair_and_refuses_a_bad_own_slot(pair, tmp_path, capsys):
    tlm, head = pair("qwen")
    ids = ["--prompt-ids", ",".join(map(str, PROMPTS[0])), "--max-new-tokens", "12", "--json", "--no-warmup"]
    code, out, err = run(["--tlm", tlm, "--dlm", head, "--k", "3", *ids], capsys)
    assert code == 0, err
    got = json.loads(out)["results"][0]["generated_ids"]
    code, out, _ = run(["--tlm", tlm, "--target-only", *ids], capsys)
    assert json.loads(out)["results"][0]["generated_ids"] == got
    bad = tmp_path / "bad"
    shutil.copytree(head, bad)
    m = json.loads((bad / "manifest.json").read_text())
    m["feature_draft"]["own_offset"] = 128
    (bad / "manifest.json").write_text(json.dumps(m))
    code, _, err = run(["--tlm", tlm, "--dlm", bad, *ids], capsys)
    one_line_error(code, err, "own slot [128, 256) does not hold its 64-wide draft_hidden_states")


def test_batch_3_continuous_batching_greedy_and_seeded_sampling(tmp_path):
    """Three rows, five prompts: each row's text is its prompt decoded alone by the target."""
    tlm = OrtBackend(compile_target("qwen", tmp_path / "tlm", batch_size=3))
    head = OrtBackend(import_case("qwen", tmp_path / "head", extra=("--batch-size", "3")))
    spec, base = SpecDecoder(tlm, head, k=3), TargetOnlyDecoder(tlm)
    got = spec.generate_many(PROMPTS, max_new_tokens=20)
    assert [r.generated_ids for r in got] == [r.generated_ids for r in base.generate_many(PROMPTS, max_new_tokens=20)]
    sp = SamplingParams(0.7, top_p=0.95, seed=11)
    got = spec.generate_many(PROMPTS, max_new_tokens=15, sampling=sp)
    want = base.generate_many(PROMPTS, max_new_tokens=15, sampling=sp)
    assert [r.generated_ids for r in got] == [r.generated_ids for r in want]


@pytest.mark.parametrize("weights", ["int8", "int4"])
def test_a_quantized_head_drafts_and_output_stays_target_only(pair, tmp_path, weights):
    """``import-head --weights int8|int4``: the head's MatMuls become MatMulNBits (weight-only). Its
    drafts change a little; the output cannot: greedy equals target-only, alone and in the hybrid, and
    the quantized head still agrees with the float head's top draft on most rows (it is the same head)."""
    import onnx
    tlm_dir, float_dir = pair("llama")
    q_dir = import_case("llama", tmp_path / f"head-{weights}", extra=("--weights", weights))
    m = json.loads((q_dir / "manifest.json").read_text())
    rec = m["feature_draft"]["eagle3"]["weights"]
    g = onnx.load(str(q_dir / "model.onnx"), load_external_data=False).graph
    n = sum(x.op_type == "MatMulNBits" for x in g.node)
    assert rec["format"] == weights and rec["bits"] == int(weights[3:]) and rec["matmuls"] == n >= 9
    assert json.loads((float_dir / "manifest.json").read_text())["feature_draft"]["eagle3"]["weights"] is None
    tlm, head, fhead = OrtBackend(tlm_dir), OrtBackend(q_dir), OrtBackend(float_dir)
    base = TargetOnlyDecoder(tlm)
    for p in PROMPTS:
        want = base.generate(p, max_new_tokens=30).generated_ids
        assert SpecDecoder(tlm, head, k=3).generate(p, max_new_tokens=30).generated_ids == want, p
        assert SpecDecoder(tlm, head, draft="hybrid", k=3).generate(p, max_new_tokens=30).generated_ids == want, p
    # the same head: its top draft on the rows of a text agrees with the float head's on most rows
    rng = np.random.default_rng(0)
    agree = 0
    for t in range(20):
        ids = rng.integers(0, 211, (1, 1))
        x = rng.standard_normal((1, 1, 256)).astype(np.float32)
        a, b = (h.run_outputs(ids, np.array([[t]]), inputs={"hidden_states": x})["logits"] for h in (head, fhead))
        agree += int(np.argmax(a) == np.argmax(b))
    assert agree >= 14, agree


def test_an_int8_head_runs_on_openvino_and_output_stays_target_only(tmp_path):
    """OpenVINO reads MatMulNBits: the int8 head of the openvino lowering drafts there, greedy output
    equal to target-only on the same backend (f32)."""
    pytest.importorskip("openvino")
    from specdec_compile.runtime import OpenVinoBackend
    tlm = OpenVinoBackend(compile_target("llama", tmp_path / "tlm", target="openvino"), precision="f32", threads=1)
    head = OpenVinoBackend(import_case("llama", tmp_path / "head", target="openvino", extra=("--weights", "int8")),
                           precision="f32", threads=1)
    base = TargetOnlyDecoder(tlm)
    for p in PROMPTS[:3]:
        assert SpecDecoder(tlm, head, k=3).generate(p, max_new_tokens=25).generated_ids == \
            base.generate(p, max_new_tokens=25).generated_ids, p
    assert head.calls > 3
