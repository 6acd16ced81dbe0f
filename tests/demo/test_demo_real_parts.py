"""The real-model demo's parts, on tiny stand-ins (the real model is never needed by the tests):
held-out prompts, the lean batched teacher against transformers' greedy decoding, the
truncated draft head through specdec-compile and the runtime, n-gram replay, the
draft choice, and the distillation's evaluation arithmetic."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from demo import ngram
from workshop import prompts

ROOT = Path(__file__).resolve().parents[2]


def test_demo_prompts_are_held_out_of_the_distillation_set():
    xs = prompts.training_instructions()
    assert len(xs) > 2000 and len(set(xs)) == len(xs)
    assert xs == prompts.training_instructions()              # deterministic order
    for p in prompts.DEMO_PROMPTS:
        assert p not in xs
    low = [x.lower() for x in xs]
    for w in ("palindrome", "tuple", "readable"):
        assert not any(w in x for x in low), w


def test_prose_instructions_are_held_out_and_not_stdlib_code_prompts():
    xs = prompts.prose_instructions()
    assert len(xs) > 300 and len(set(xs)) == len(xs)
    assert xs == prompts.prose_instructions()                 # deterministic order
    assert not set(xs) & set(prompts.training_instructions())
    for p in prompts.DEMO_PROMPTS:
        assert p not in xs
    low = [x.lower() for x in xs]
    for w in ("palindrome", "tuple", "readable"):
        assert not any(w in x for x in low), w
    # prose, not code: no instruction asks for a function, class or program
    assert not any(x.startswith(("Write a Python function", "Implement", "Write a Python class")) for x in xs)
    assert any(x.startswith("Explain the difference between") for x in xs)


def test_ngram_proposer_and_replay():
    ctx = [5, 6, 7, 8, 9, 5, 6]
    assert ngram.propose(ctx, 3) == [7, 8, 9]                 # "5 6" seen before -> what followed
    assert ngram.propose([1, 2, 3], 2) == []                  # no earlier match
    assert ngram.propose([4, 4, 4], 4) == [4]                 # the latest earlier match of "4 4"
    # an answer that repeats its prompt is drafted in full: 1 + k tokens per call
    prompt = [1, 2, 3, 4, 5, 6, 7, 8, 9]
    r = ngram.replay(prompt + [1], [2, 3, 4, 5, 6], k=4)
    assert r["tokens"] == 5 and r["rounds"] == 1 and r["accepted"] == 4 and r["rejected"] == 0
    m = ngram.measure([(prompt + [1], [2, 3, 4, 9, 9])], k=4)
    assert m["tokens"] == 5 and 0 < m["alpha"] < 1
    # predicted speedup: tokens x step / sum of verification costs by width
    st = {"tokens": 10, "calls_by_drafts": {"0": 2, "4": 2}}
    assert ngram.predicted_speedup(st, 1.0, {1: 1.0, 5: 2.0}) == pytest.approx(10 / 6)


def test_choose_draft_takes_the_fastest_runnable():
    pytest.importorskip("rich")
    from demo import real_demo
    c = [{"name": "distilled", "runnable": True, "speedup": 1.5, "how": "measured"},
         {"name": "ngram", "runnable": False, "speedup": 2.0, "how": "predicted"}]
    assert real_demo.choose_draft(c)["name"] == "distilled"
    c[1]["runnable"] = True
    assert real_demo.choose_draft(c)["name"] == "ngram"
    with pytest.raises(SystemExit):
        real_demo.choose_draft([{"name": "x", "runnable": False, "speedup": 3.0}])


def test_distill_replay_and_sampling_arithmetic():
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from workshop import distill
    # every draft right: k+1 tokens per call; never right: 1
    assert distill.tokens_per_call([[True] * 10], 4) == pytest.approx(10 / 2)
    assert distill.tokens_per_call([[False] * 6], 4) == 1.0
    p = torch.tensor([[0.5, 0.3, 0.2]]).log()
    q = distill._tempered_top_p(p, 1.0, 0.7)                   # keeps 0.5 and 0.3
    assert torch.allclose(q, torch.tensor([[0.625, 0.375, 0.0]], dtype=q.dtype))
    lg = torch.zeros(2, 4, requires_grad=True)
    loss = distill.loss_fn(lg, torch.tensor([1, -1]), torch.randn(2, 4), soft_weight=1.0)
    loss.backward()
    assert torch.isfinite(loss) and lg.grad is not None


@pytest.mark.slow
def test_lean_teacher_matches_transformers_greedy():
    torch = pytest.importorskip("torch")
    tr = pytest.importorskip("transformers")
    from workshop import teacher
    conf = tr.LlamaConfig(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                          rms_norm_eps=1e-5, tie_word_embeddings=True, rope_theta=10000.0)
    torch.manual_seed(0)
    model = tr.LlamaForCausalLM(conf).eval()
    lean = teacher.LeanLlama(model)
    g = torch.Generator().manual_seed(1)
    ps = [torch.randint(3, 97, (n,), generator=g).tolist() for n in (5, 9, 7)]   # left padding differs
    rows, tops, hidden = teacher.greedy_batch(lean, ps, 12, eos={2}, topk=3)
    for p, r, (ti, tp), hid in zip(ps, rows, tops, hidden):
        with torch.inference_mode():
            out = model(input_ids=torch.tensor([p + r[:-1]])).logits[0, len(p) - 1:]
        assert out.argmax(-1).tolist() == r
        assert ti[:, 0].tolist() == r and ti.shape == (len(r), 3)
        assert np.allclose(tp[:, 0].float().numpy(), torch.softmax(out, -1).max(-1).values.numpy(), atol=2e-3)
        # the kept hidden state carries the whole distribution: logits = hidden @ head.T
        assert hid.shape == (len(r), 64)
        assert np.allclose(lean.logits(hid.float()).numpy(), out.numpy(), atol=0.05)


@pytest.mark.slow
def test_truncated_draft_head_compiles_and_runs(fixture_path, tmp_path):
    onnx = pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")
    import subprocess

    from workshop import draft_head
    src = fixture_path("llama_gqa")
    n = 64
    info = draft_head.truncate_head(src, tmp_path / "pad" / "model.onnx", n, pad=True)
    assert info == {"vocab": 211, "head_rows": n, "first_ids": True, "padded_to_vocab": True}
    draft_head.truncate_head(src, tmp_path / "cut" / "model.onnx", n, pad=False)
    some = [0, 2, 5, 17, 100, 210]                         # an arbitrary id set: Gather from [logits, pad]
    draft_head.truncate_head(src, tmp_path / "set" / "model.onnx", some, pad=True)
    with pytest.raises(SystemExit):
        draft_head.truncate_head(src, tmp_path / "bad" / "model.onnx", [5, 2], pad=True)
    # same logits on the first n ids, the pad value on the rest
    feeds = {}
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    ref = ort.InferenceSession(str(src), so)
    for i in ref.get_inputs():
        if i.name == "input_ids":
            feeds[i.name] = np.array([[5, 9, 11]], np.int64)
        elif i.name == "attention_mask":
            feeds[i.name] = np.ones((1, 3), np.int64)
        elif i.name == "position_ids":
            feeds[i.name] = np.arange(3, dtype=np.int64)[None]
        else:
            feeds[i.name] = np.zeros((1, i.shape[1], 0, i.shape[3]), np.float32)
    full = ref.run(["logits"], feeds)[0]
    pad = ort.InferenceSession(str(tmp_path / "pad" / "model.onnx"), so).run(["logits"], feeds)[0]
    cut = ort.InferenceSession(str(tmp_path / "cut" / "model.onnx"), so).run(["logits"], feeds)[0]
    assert pad.shape == full.shape and cut.shape == full.shape[:2] + (n,)
    assert np.allclose(pad[..., :n], full[..., :n], atol=1e-5) and np.all(pad[..., n:] == draft_head.PAD_LOGIT)
    assert np.allclose(cut, full[..., :n], atol=1e-5)
    sub = ort.InferenceSession(str(tmp_path / "set" / "model.onnx"), so).run(["logits"], feeds)[0]
    assert np.allclose(sub[..., some], full[..., some], atol=1e-5)
    assert np.all(np.delete(sub, some, axis=-1) == draft_head.PAD_LOGIT)
    assert onnx.load(str(tmp_path / "pad" / "model.onnx")).graph.output[0].type.tensor_type.shape.dim[2].dim_value == 211

    # specdec-compile takes it as a DLM, and the runtime's proposals never leave the first n ids
    out = tmp_path / "dlm"
    res = subprocess.run([sys.executable, "-m", "specdec_compile.cli", str(tmp_path / "pad" / "model.onnx"),
                          "--role", "dlm", "--target", "ort", "--ctx-len", "64", "-o", str(out)],
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-800:]
    from specdec_compile.runtime import OrtBackend
    b = OrtBackend(out, intra_op_threads=1)
    logits = b.run(np.array([[5, 9, 11] + [0] * 29], np.int64),
                   np.array([list(range(3)) + [-1] * 29], np.int64))
    assert logits.shape == (1, 1, 211) and int(np.argmax(logits[0, 0])) < n
    assert np.allclose(logits[0, 0, :n], full[0, 2, :n], atol=1e-4)


def test_frequent_head_ids():
    pytest.importorskip("torch")
    from workshop import distill
    cfg = {"draft": {"head_rows": 4, "head": "frequent"}}
    data = [{"gen": [9, 9, 9, 7, 7, 3, 5]}, {"gen": [7, 8]}]
    assert distill.head_ids(data, cfg, 20, [2]) == [2, 3, 7, 9]      # EOS, then by count, ties by id
    cfg["draft"]["head"] = "first"
    assert distill.head_ids(data, cfg, 20, [2]) == [0, 1, 2, 3]


def _tiny_pair(fixture_path, tmp_path, k_list="0,1,2,3,4"):
    import subprocess
    src = fixture_path("llama_gqa")
    outs = {}
    for role, args in (("tlm", ["--role", "tlm", "--k", "4", "--k-list", k_list]), ("dlm", ["--role", "dlm"])):
        out = tmp_path / role
        res = subprocess.run([sys.executable, "-m", "specdec_compile.cli", str(src), *args, "--target", "ort",
                              "--ctx-len", "96", "-o", str(out)], capture_output=True, text=True)
        assert res.returncode == 0, res.stderr[-800:]
        outs[role] = out
    return outs


@pytest.mark.slow
def test_demo_decode_measures_both_drafts_and_checks_identity(fixture_path, tmp_path, monkeypatch, decode_standins):
    """The demo's decode phase on a tiny compiled pair: the distilled (DLM) draft, the runtime's
    n-gram draft and the hybrid of both, all run, all identical to target-only greedy output,
    summaries per draft."""
    pytest.importorskip("rich")
    from demo import real_demo
    from specdec_compile.runtime import OrtBackend, SpecDecoder, TargetOnlyDecoder
    outs = _tiny_pair(fixture_path, tmp_path)
    tlm, dlm = OrtBackend(outs["tlm"], intra_op_threads=1), OrtBackend(outs["dlm"], intra_op_threads=1)
    base = OrtBackend(outs["dlm"], intra_op_threads=1)        # the same export at seq_len 1: a target-only baseline
    ng = real_demo.runtime_ngram_decoder(tlm, None)
    assert ng is not None                                    # the runtime has n-gram drafts
    drafts = {"distilled": SpecDecoder(tlm, dlm), "ngram": ng, "hybrid": SpecDecoder(tlm, dlm, draft="hybrid")}

    tok, silent = decode_standins
    monkeypatch.setattr(real_demo.smollm2, "chat_ids", lambda tok, text: [5, 9, 11, 5, 9, 11, 5, 9][: len(text) % 5 + 4])
    rows = real_demo.decode_all(drafts, TargetOnlyDecoder(base), tok, ["ab", "abcd"], max_new_tokens=12,
                                repeats=1, stream=silent, streamed="ngram")
    assert [r["new_tokens"] for r in rows] == [12, 12]
    for r in rows:
        assert r["identical"] and set(r["drafts"]) == {"distilled", "ngram", "hybrid"}
        assert all(d["identical"] and d["speedup"] > 0 for d in r["drafts"].values())
    for name in drafts:
        s = real_demo.summarize(rows, name)
        assert s["identical"] and s["speedup"] > 0
    # the n-gram replay (a prediction) runs on the same answers with the measured call costs
    costs = real_demo.width_costs(tlm, dlm, base, rounds=2, start=20)
    assert set(costs["verify_s"]) >= {1, 2, 5}
    ngp = real_demo.ngram_prediction([(r["prompt_ids"], r["answer_ids"]) for r in rows], costs)
    assert ngp["best_k"] in range(1, 5) and ngp["predicted_speedup"] > 0


REAL = ROOT / "build" / "demo"


@pytest.mark.skipif(not all((REAL / d / "manifest.json").exists() for d in ("tlm", "dlm", "tlm-base")),
                    reason="the real model is not built here (make demo builds build/demo; tests never download it)")
def test_real_model_greedy_speculative_equals_target_only():
    """SmolLM2-135M-Instruct, when `make demo` has built it: one instruction through the chat template,
    speculative greedy (distilled draft and n-gram) token for token equal to target-only."""
    from workshop import smollm2
    from demo import real_demo
    from specdec_compile.runtime import SpecDecoder, TargetOnlyDecoder
    tok, tlm, dlm, base = real_demo.open_backends(REAL, 1)
    eos = tlm.artifact.manifest.get("eos_token_ids") or tok.eos_token_id
    ids = smollm2.chat_ids(tok, prompts.DEMO_PROMPTS[0])
    assert tok.decode(ids).startswith("<|im_start|>")
    want = TargetOnlyDecoder(base, eos_token_id=eos).generate(ids, max_new_tokens=24).generated_ids
    assert len(want) > 0
    for dec in (SpecDecoder(tlm, dlm, eos_token_id=eos), real_demo.runtime_ngram_decoder(tlm, eos)):
        assert dec.generate(ids, max_new_tokens=24).generated_ids == want
    js = REAL / "demo.json"
    if js.exists():
        import json
        d = json.loads(js.read_text())
        assert {"model", "draft", "prompts", "speedup", "identical"} <= set(d)
        for p in d["prompts"]:
            assert {"prompt", "new_tokens", "speedup", "identical"} <= set(p)


def test_bench_real_model_row_arithmetic():
    """bench/real_model.py's row: rates over the decode phase, alpha by definition, c from the draft's
    step over the target's, predicted = decode tokens x target step / the run's decode model time."""
    pytest.importorskip("rich")
    from bench import real_model

    def m(new, total, ttft, tlm, dlm, pre, hist, acc, drafted, verify, tpc, widths):
        return {"new_tokens": new, "total_time_s": total, "ttft_s": ttft, "callback_time_s": 0.0,
                "tlm_time_s": tlm, "dlm_time_s": dlm, "prefill_time_s": {"tlm": pre, "dlm": 0.0},
                "acceptance_histogram": hist, "accepted_tokens": acc, "drafted_tokens": drafted,
                "tlm_verify_calls": verify, "mean_tokens_per_tlm_call": tpc, "host_time_s": 0.1,
                "call_time_by_width": widths, "verify_drafts_histogram": {"2": verify}}
    # target-only: 11 tokens, 10 decode steps of 0.1 s after a 0.5 s prefill
    tm = m(11, 1.5, 0.5, 1.5, 0.0, 0.5, [], 0, 0, 0, None, {"tlm": {"64": [1, 0.5], "1": [10, 1.0]}})
    # speculative, k=2: 5 rounds (3 full, 2 with one accepted) -> 3*3 + 2*2 = 13 tokens ... 11 kept
    sm = m(11, 1.0, 0.5, 0.5 + 0.5, 0.1, 0.5, [0, 2, 3], 8, 10, 5, 2.6,
           {"tlm": {"64": [1, 0.5], "3": [5, 0.5]}, "dlm": {"1": [10, 0.1]}})
    r = real_model.speed_row("distilled", "greedy", 2, [sm], [tm])
    assert r["target_tokens_per_s"] == pytest.approx(10.0) and r["spec_tokens_per_s"] == pytest.approx(20.0)
    assert r["speedup"] == pytest.approx(2.0)
    assert r["alpha"] == pytest.approx(8 / (8 + 2)) and r["alpha_def"].startswith("accepted/(")
    assert r["c"] == pytest.approx(0.1)                       # 10 ms draft step / 100 ms target step
    assert r["predicted_speedup"] == pytest.approx(10 * 0.1 / 0.6, rel=1e-3)
    auto = real_model.speed_row("ngram", "sampling", "auto", [sm], [tm])
    assert auto["alpha"] == pytest.approx(0.8) and auto["alpha_def"] == "accepted/drafted"
    assert any("| distilled | greedy | 2 |" in line for line in real_model.markdown([r], {}))


def test_ngram_prediction_prices_a_round_without_drafts_as_the_tlms_width_1_call():
    """A round with nothing to draft is a width-1 call of the TLM the drafts run on (its measured
    cost), not the target-only baseline's step: the prediction used to take the step, and so
    promised more than the loop can give when the TLM's width-1 call is dearer."""
    pytest.importorskip("rich")
    from demo import real_demo
    pairs = [([1, 2, 3], [10, 11, 12, 13, 14, 15, 16, 17])]        # no n-gram repeats: no drafts at all
    costs = {"step_s": 0.010, "verify_s": {w: 0.020 for w in range(1, 10)}}
    ng = real_demo.ngram_prediction(pairs, costs)
    assert ng["predicted_speedup"] == pytest.approx(0.5)
    assert all(v["predicted_speedup"] == pytest.approx(0.5) for v in ng["by_k"].values())
