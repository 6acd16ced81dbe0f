"""The demo's feature draft (workshop/feature_draft.py) on a tiny stand-in target (never the real model):
teacher-forced features equal the target's own last-layer states, the head's pairing and
unrolled training, the exact loop replay, and the export through specdec-compile."""
from __future__ import annotations

import copy
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
tr = pytest.importorskip("transformers")


def _target():
    conf = tr.LlamaConfig(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                          rms_norm_eps=1e-5, tie_word_embeddings=True, rope_theta=10000.0)
    torch.manual_seed(0)
    return tr.LlamaForCausalLM(conf).eval()


def _data(model, n: int, seed: int):
    """Greedy answers of the stand-in, as the distilled draft's teacher stores them."""
    from workshop import teacher
    g = torch.Generator().manual_seed(seed)
    ps = [torch.randint(3, 97, (int(torch.randint(4, 9, (1,), generator=g)),), generator=g).tolist()
          for _ in range(n)]
    rows, _, _ = teacher.greedy_batch(teacher.LeanLlama(model), ps, 16, eos={2}, topk=1)
    return [{"prompt": p, "gen": r} for p, r in zip(ps, rows)]


def test_teacher_forced_features_are_the_last_layer_before_the_norm():
    from workshop import teacher
    model = _target()
    seqs = [[5, 9, 11, 40], [7, 8, 9, 10, 11, 12, 3]]
    feats = teacher.features(teacher.LeanLlama(model), seqs, batch=2)
    for s, f in zip(seqs, feats):
        with torch.inference_mode():
            o = model.model(input_ids=torch.tensor([s]), output_hidden_states=True)
        # transformers' last hidden_states entry is after the norm: the pre-norm one is the last
        # layer's output, recovered by hooking the layer
        got = {}
        hook = model.model.layers[-1].register_forward_hook(lambda m, i, out: got.update(x=out[0] if isinstance(out, tuple) else out))
        with torch.inference_mode():
            model.model(input_ids=torch.tensor([s]))
        hook.remove()
        assert f.shape == (len(s), 64)
        assert np.allclose(f.float().numpy(), got["x"][0].numpy(), atol=2e-2)
        # and the final norm of it is what the model's head reads
        assert np.allclose(model.model.norm(f.float()).detach().numpy(), o.last_hidden_state[0].numpy(), atol=2e-2)


def _setup(tmp_path=None):
    from workshop import feature_draft as fd
    from workshop import teacher
    model = _target()
    train, ev = _data(model, 12, 1), _data(model, 4, 2)
    lean = teacher.LeanLlama(model)
    feats = {p: teacher.features(lean, [d["prompt"] + d["gen"] for d in ds]) for p, ds in (("train", train), ("eval", ev))}
    ids = list(range(64))
    emb, norm_w, head_w, layer_sd = fd._parts(model, ids)
    head = fd.build_head(model.config, emb, norm_w, head_w, ids, 97, layer_sd, 0)
    from workshop.feature_train import FeatureSet
    return fd, model, head, ids, FeatureSet(train, feats["train"], ids, 97), FeatureSet(ev, feats["eval"], ids, 97)


def test_pairing_unroll_training_and_replay():
    from workshop import feature_eval as fe
    from workshop import feature_train as ft
    from workshop.progress import Reporter
    fd, model, head, ids, trs, evs = _setup()
    b = trs.collate([0, 1])
    # row p carries f_{p-1}; zeros at p = 0
    sh = ft.shift(b["f"])
    assert torch.all(sh[:, 0] == 0) and torch.equal(sh[:, 1:], b["f"][:, :-1])
    # the CE rows predict the answer tokens: label at row n-1+i is gen[i]
    it = trs.items[0]
    assert b["labels"][: it["g"]].tolist() == it["seq"][it["n"]:]
    # a perfect feature gives the target's own logits over the head's ids
    lg = head.sub_logits(b["f"][b["rows"], b["cols"]])
    inside = b["sub"] >= 0                                   # labels the head can propose
    assert bool(inside.any()) and torch.equal(torch.tensor(ids)[lg.argmax(-1)][inside], b["labels"][inside])
    outs = ft.unrolled(head, b, 3)
    assert len(outs) == 3 and all(o.shape == b["f"].shape for o in outs)
    cfg = copy.deepcopy(fd.CONFIG)
    cfg["train"].update(epochs=3, batch=4)
    cfg["eval"].update(k_max=3, replay_k=[1, 3])
    before = fe.chain_agreement(head, trs, 3)
    stats = ft.train(head, trs, 1.0, cfg, Reporter(quiet=True))
    after = fe.chain_agreement(head, trs, 3)
    assert stats["steps"] == 9 and after["agreement"][0] >= before["agreement"][0]
    m = fe.evaluate(head, evs, cfg)
    assert set(m["replay"]) == {"1", "3"} and len(m["agreement"]) == 3
    for r in m["replay"].values():
        assert 1.0 <= r["tokens_per_tlm_call"] <= r["k"] + 1 and 0 <= r["alpha"] <= 1
    assert m["replay"]["1"]["tokens"] == m["replay"]["3"]["tokens"] == sum(i["g"] - 1 for i in evs.items)


def test_training_is_deterministic():
    """The same data, configuration and seed give the same head bit for bit (the demo caches it
    by a key over them); another seed gives another head."""
    from workshop import feature_train as ft
    from workshop.progress import Reporter

    def trained(seed):
        fd, model, head, ids, trs, evs = _setup()
        cfg = copy.deepcopy(fd.CONFIG)
        cfg["train"].update(epochs=2, batch=4)
        cfg["seed"] = seed
        ft.train(head, trs, 1.0, cfg, Reporter(quiet=True))
        return {k: v.clone() for k, v in head.state_dict().items()}
    a, b, c = trained(5), trained(5), trained(6)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert any(not torch.equal(a[k], c[k]) for k in a)


def test_unrolled_passes_give_each_draft_exactly_the_loops_context():
    """Pass j's row p equals draft j of the loop (KV cache) whose round starts after row p-j+1:
    the target's features up to there, the head's own predictions after."""
    from workshop import feature_train as ft
    fd, model, head, ids, trs, evs = _setup()
    with torch.no_grad():                       # a head that is not the identity on features
        for p_ in ft.trainable(head):
            p_.add_(torch.randn(p_.shape, generator=torch.Generator().manual_seed(1)) * 0.05)
    b = trs.collate([0])
    J = 4
    with torch.inference_mode():
        outs = ft.unrolled(head, b, J)
        L = len(trs.items[0]["seq"])
        x, F = b["x"], b["f"]
        checked = 0
        for m in (0, 3, L // 2, L - J - 1):
            past = __import__("transformers").cache_utils.DynamicCache()
            pre = head.pre_norm(x[:, : m + 1], ft.shift(F)[:, : m + 1], torch.arange(m + 1)[None], past)
            last = pre[:, -1:]
            for j in range(1, J + 1):
                assert torch.allclose(last[0, 0], outs[j - 1][0, m + j - 1], atol=1e-4), (m, j)
                checked += 1
                if j < J:
                    r = m + j
                    last = head.pre_norm(x[:, r: r + 1], last, torch.tensor([[r]]), past)
        assert checked == 4 * J
        # and it is not the all-own-features form: pass 2 differs from a plain causal pass over pass 1's
        plain = head.pre_norm(x, ft.shift(outs[0]), torch.arange(x.shape[1])[None])
        assert not torch.allclose(plain[0, 5:L], outs[1][0, 5:L], atol=1e-4)


@pytest.mark.slow
def test_feature_head_exports_and_compiles_as_a_feature_draft(tmp_path):
    pytest.importorskip("onnxruntime")
    import json

    import onnxruntime as ort
    fd, model, head, ids, trs, evs = _setup()
    path = fd.export(head, tmp_path / "export", fd.CONFIG)
    # the export equals the torch head: full-vocabulary logits, the pad value outside the head's ids
    x = torch.tensor([[5, 9, 11]])
    f = torch.randn(1, 3, 64)
    sess = ort.InferenceSession(str(path))
    kv = np.zeros((1, 2, 0, 16), np.float32)
    got = sess.run(None, {"input_ids": x.numpy(), "attention_mask": np.ones((1, 3), np.int64),
                          "position_ids": np.arange(3)[None], "hidden_states": f.numpy(),
                          "past_key_values.0.key": kv, "past_key_values.0.value": kv})[0]
    with torch.inference_mode():
        ref = head.sub_logits(head.pre_norm(x, f, torch.arange(3)[None]))
    assert got.shape == (1, 3, 97)
    assert np.allclose(got[..., ids], ref.numpy(), atol=1e-4)
    assert np.all(got[..., 64:] == fd.PAD_LOGIT)
    out = tmp_path / "fdraft"
    res = subprocess.run([sys.executable, "-m", "specdec_compile.cli", str(path), "--role", "dlm", "--k", "3",
                          "--k-list", "1,2", "--feature-layers", "-1", "--target", "ort", "--prefill-len", "16",
                          "--ctx-len", "64", "-o", str(out)], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout[-800:] + res.stderr[-800:]
    man = json.loads((out / "manifest.json").read_text())
    assert man["feature_draft"]["width"] == 64 and man["feature_draft"]["target_layers"] == [-1]


def test_teacher_captures_the_features_it_would_compute_teacher_forced():
    from workshop import teacher
    model = _target()
    lean = teacher.LeanLlama(model)
    ps = [[5, 9, 11, 40], [7, 8, 9, 10, 11, 12, 3]]           # left padding differs
    rows, _, hidden, feats = teacher.greedy_batch(lean, ps, 10, eos={2}, topk=1, features=True)
    ref = teacher.features(lean, [p + r for p, r in zip(ps, rows)])
    for p, r, f, g in zip(ps, rows, feats, ref):
        assert f.shape == (len(p) + len(r) - 1, 64)
        assert np.allclose(f.float().numpy(), g[:-1].float().numpy(), atol=0.05)
    rows2, _, hidden2 = teacher.greedy_batch(lean, ps, 10, eos={2}, topk=1)
    assert rows2 == rows and all(torch.equal(a, b) for a, b in zip(hidden, hidden2))


def test_bfloat16_teacher_is_close_to_float32():
    """The bfloat16 teacher (the feature draft's extra answers): cache and activations in
    bfloat16, logits in float32, features within a few percent of float32's, same greedy start."""
    from workshop import teacher
    model = _target()
    l32, lbf = teacher.LeanLlama(model), teacher.LeanLlama(model, torch.bfloat16)
    assert lbf.new_cache(1, 4)[0][0].dtype == torch.bfloat16 and lbf.layers[0]["qkv"].dtype == torch.bfloat16
    seqs = [[5, 9, 11, 40, 7, 7, 3], [7, 8, 9, 10, 11, 12, 3, 50, 60]]
    f32, fbf = teacher.features(l32, seqs), teacher.features(lbf, seqs)
    for a, b in zip(f32, fbf):
        rel = (a.float() - b.float()).norm(dim=-1) / a.float().norm(dim=-1)
        assert float(rel.max()) < 0.05 and float(rel.max()) > 0         # close, and really bfloat16
    assert lbf.logits(lbf.emb[:2]).dtype == torch.float32
    ps = [[5, 9, 11, 40], [7, 8, 9, 10, 11, 12, 3]]
    r32 = teacher.greedy_batch(l32, ps, 6, eos={2}, topk=1)[0]
    rbf = teacher.greedy_batch(lbf, ps, 6, eos={2}, topk=1)[0]
    assert [r[:2] for r in r32] == [r[:2] for r in rbf]


def test_bfloat16_autocast_training_keeps_float32_weights_and_learns():
    from workshop import feature_eval as fe
    from workshop import feature_train as ft
    from workshop.progress import Reporter
    fd, model, head, ids, trs, evs = _setup()
    cfg = copy.deepcopy(fd.CONFIG)
    cfg["train"].update(epochs=3, batch=4, amp="bfloat16")
    before = fe.chain_agreement(head, trs, 2)
    w0 = head.fc.weight.detach().clone()
    ft.train(head, trs, 1.0, cfg, Reporter(quiet=True))
    assert head.fc.weight.dtype == torch.float32 and not torch.equal(w0, head.fc.weight)
    assert fe.chain_agreement(head, trs, 2)["agreement"][0] >= before["agreement"][0]
    cfg["train"]["amp"] = "float16"
    with pytest.raises(SystemExit, match="train.amp"):
        ft.train(head, trs, 1.0, cfg, Reporter(quiet=True))


def test_bench_picture_draws_one_line_per_draft_and_mode(tmp_path):
    """bench/real_model.py's picture (hand-written SVG): speedup and tokens per TLM call against k."""
    import xml.etree.ElementTree as ET

    from bench import real_model
    rows = [{"draft": d, "mode": m, "k": k, "speedup": 1.0 + 0.1 * i, "tokens_per_tlm_call": 1.2 + 0.1 * i}
            for i, (d, m, k) in enumerate((d, m, k) for d in ("feature", "ngram") for m in ("greedy", "sampling")
                                          for k in (2, 3, 4, "auto"))]
    path = real_model.picture(rows, tmp_path / "p.svg")
    root = ET.parse(path).getroot()
    ns = "{http://www.w3.org/2000/svg}"
    lines = root.findall(f"{ns}polyline")
    assert len(lines) == 2 * 2 * 2                       # 2 panels x 2 drafts x 2 modes
    assert sum(1 for pl in lines if pl.get("stroke-dasharray")) == 4        # sampling dashed
    assert len(root.findall(f"{ns}rect")) == 1 + 2 * 4    # background + the adaptive markers
    with pytest.raises(ValueError):
        real_model.picture([{"draft": "x", "mode": "greedy", "k": "auto", "speedup": 1.0}], tmp_path / "q.svg")
