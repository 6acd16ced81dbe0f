"""The EAGLE-3 head's training data (workshop/data/eagle3-smollm2, written by workshop/magpie_data.py):
the committed shards are intact and deduplicated, and hold none of MT-bench's questions nor the
demo's and the benchmarks' own prompts (exact or normalized); the checker catches a planted
one; the storage round-trips and resumes; the batched sampler and the instruction filters do
what they say. Never loads the real model (a tiny stand-in Llama where a model is needed)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from workshop import eagle3_data as store

ROOT = Path(__file__).resolve().parents[2]


def _mtbench_or_skip():
    try:
        return store.mtbench_questions()
    except LookupError as e:
        pytest.skip(str(e))


# --------------------------------------------------------------------------- the committed data


def test_committed_data_is_intact_and_made_by_one_target():
    rows = store.load(store.DATA_DIR, verify=True)          # every npz's sha256, the dataset hash
    idx = json.loads((store.DATA_DIR / "index.json").read_text())
    mans = store.manifests(store.DATA_DIR)
    assert rows and len(rows) == idx["examples"] == sum(m["examples"] for m in mans)
    assert sum(len(r["answer"]) for r in rows) == idx["answer_tokens"]
    assert len({m["target"]["checkpoint_sha256"] for m in mans}) == 1
    assert {m["answers"]["mode"] for m in mans} <= {"greedy", "sampled"}
    for r in rows:
        assert r["answer"] and max(r["answer"] + r["prompt"]) < 49152
        assert r["ended"] == (r["answer"][-1] == 2)          # <|im_end|> ends exactly the ended ones
    # every prompt is the chat template's: the same system turn opens all of them
    head = rows[0]["prompt"][:20]
    assert all(r["prompt"][:20] == head for r in rows)


def test_committed_data_is_free_of_the_project_prompts_and_duplicates():
    banned = store.held_out(with_mtbench=False)
    assert store.problems(store.DATA_DIR, banned) == []


def test_committed_data_is_free_of_mtbench_questions():
    qs = _mtbench_or_skip()
    assert len(qs) == 80 and sum(len(q["turns"]) for q in qs) == 160
    banned = store.held_out(with_mtbench=True)
    assert len(banned) >= 160 + len(store.project_prompts())
    assert store.problems(store.DATA_DIR, banned) == []


def test_the_project_prompts_are_all_found():
    from bench import ood_prompts
    from workshop import prompts
    found = store.project_prompts()
    for s in prompts.DEMO_PROMPTS + [prompts.WARMUP_PROMPT] + ood_prompts.PROMPTS:
        assert s in found
    assert any("Lisbon" in s for s in found)                  # bench/real_ood.py's chat turns


# --------------------------------------------------------------------------- the checker


def _examples(texts, source="magpie"):
    return [{"instruction": t, "source": source, "prompt": [1, 9, 9, 5 + i], "answer": [7, 8, 2],
             "ended": True} for i, t in enumerate(texts)]


def _shard(out, i, texts, mode="greedy"):
    man = {"answers": {"mode": mode}, "target": {"checkpoint_sha256": "x"}}
    return store.write_shard(out, i, _examples(texts), man)


def test_a_planted_held_out_prompt_or_duplicate_fails_the_check(tmp_path):
    from workshop import prompts
    banned = store.held_out(with_mtbench=False) + [("mtbench 81 turn 1", "Compose an engaging travel blog post.")]
    _shard(tmp_path, 0, ["Tell me a story about a fox.", "How do tides work?"])
    store.write_index(tmp_path)
    assert store.problems(tmp_path, banned) == []
    # a shard with a demo prompt (exact), an MT-bench turn (normalized) and a repeat
    _shard(tmp_path, 1, [prompts.DEMO_PROMPTS[0], "  COMPOSE an engaging travel-blog post!! ",
                         "how do tides work"])
    store.write_index(tmp_path)
    hits = store.problems(tmp_path, banned)
    assert len(hits) == 3, hits
    assert any("repeats example 1" in h for h in hits)
    assert any("exactly project" in h for h in hits)
    assert any("normalized, mtbench 81" in h for h in hits)


def test_a_tampered_shard_fails_the_check(tmp_path):
    _shard(tmp_path, 0, ["Tell me a story about a fox."])
    store.write_index(tmp_path)
    p = tmp_path / "shard-00000.npz"
    p.write_bytes(p.read_bytes() + b"\0")
    assert any("sha256 differs" in h for h in store.problems(tmp_path, []))


def test_storage_round_trips_and_resumes(tmp_path):
    _shard(tmp_path, 0, ["First instruction here.", "Second one, with ünïcode."])
    i1 = store.write_index(tmp_path)
    (tmp_path / ".shard-00001.npz.tmp-1").write_bytes(b"partial")   # a killed run's leftover
    (tmp_path / "shard-00002.npz").write_bytes(b"no manifest")      # killed before its manifest
    assert [m["shard"] for m in store.manifests(tmp_path)] == [0]
    _shard(tmp_path, 1, ["Third."], mode="sampled")
    i2 = store.write_index(tmp_path)
    assert (i1["shards"], i2["shards"]) == (1, 2) and i1["dataset_sha256"] != i2["dataset_sha256"]
    assert i2["by_mode"] == {"greedy": 6, "sampled": 3} and i2["examples"] == 3
    rows = store.load(tmp_path)
    assert [r["instruction"] for r in rows] == ["First instruction here.", "Second one, with ünïcode.", "Third."]
    assert rows[1]["prompt"] == [1, 9, 9, 6] and rows[2]["answer"] == [7, 8, 2]
    with np.load(tmp_path / "shard-00000.npz", allow_pickle=False) as z:
        assert z["prompt_ids"].dtype == np.uint16 and z["answer_off"].tolist() == [0, 3, 6]
    # the first N shards: what a head trained on a prefix of the data names (eagle3_train --shards)
    assert [r["instruction"] for r in store.load(tmp_path, shards=1)] == ["First instruction here.",
                                                                           "Second one, with ünïcode."]
    assert store.dataset_hash(store.first_shards(i2, 1)) == i1["dataset_sha256"]
    assert store.first_shards(i2, None) == i2["files"]
    for bad in (0, 3):
        with pytest.raises(ValueError, match="holds 2 shards"):
            store.load(tmp_path, shards=bad)


def test_normalized_keys():
    assert store.key("Explain X, please!") == store.key("  explain x please") != store.key("explain y please")
    assert store.near({"a", "b", "c"}, {"a", "b", "c", "d"}, 0.6) and not store.near({"a"}, {"b"}, 0.6)


# --------------------------------------------------------------------------- the generator


def test_filters_and_the_gate():
    from workshop import magpie_data as md
    f = md.CONFIG["filter"]
    assert md.why_not("Can you suggest a recipe for dinner tonight?", f) is None
    assert md.why_not("Hi", f) == "length"
    assert md.why_not("x <|im_start|>assistant hello there", f) == "template tokens"
    assert md.why_not("#### ____ 1234 5678 $$$$ %%%% 9999 ((((", f) == "not text"
    assert md.why_not(" ".join(["buy the cat"] * 10), f) == "repeats itself"
    gate = md.Gate([("project", "Explain the difference between a list and a tuple in Python.")], set(), 0.6)
    assert gate.admit("explain the difference between a LIST and a tuple in python") == "held out"
    assert gate.admit("Explain the difference between a list and a tuple in Python 3?") == "near a held-out prompt"
    assert gate.admit("Write a haiku about autumn leaves.") is None
    assert gate.admit("write a haiku about autumn leaves") == "duplicate"


def test_nucleus_sampling_keeps_exactly_the_top_p_set():
    torch = pytest.importorskip("torch")
    from workshop import magpie_data as md
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]])).repeat(4000, 1)
    g = torch.Generator().manual_seed(0)
    got = md.pick(logits, 1.0, 0.8, g)                       # 0.5 + 0.3 reaches 0.8: two tokens
    assert set(got.tolist()) == {0, 1}
    assert abs((got == 0).float().mean().item() - 0.5 / 0.8) < 0.03
    assert set(md.pick(logits, 1.0, 0.81, g).tolist()) == {0, 1, 2}
    assert md.pick(logits, 0.0, 0.8, g).tolist() == [0] * 4000


def _tiny():
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from test_workshop_feature_draft import _target             # the demo tests' tiny stand-in Llama
    return torch, _target()


def test_batched_generation_equals_the_teachers_greedy_and_is_seeded():
    torch, model = _tiny()
    from workshop import magpie_data as md, teacher
    lean = teacher.LeanLlama(model)
    g = torch.Generator().manual_seed(1)
    ps = [torch.randint(3, 97, (n,), generator=g).tolist() for n in (5, 9, 7, 4, 11, 6)]
    free, _ = md.generate(lean, ps, 20, eos={0})
    eos = {free[0][2], free[1][9]}                           # rows end at different steps: the batch shrinks
    ref, _, _ = teacher.greedy_batch(lean, ps, 20, eos=eos, topk=1)
    rows, ended = md.generate(lean, ps, 20, eos=eos)
    assert rows == ref and len({len(r) for r in rows}) > 1
    assert ended == [r[-1] in eos for r in rows]
    s1 = md.generate(lean, ps, 20, eos=eos, temperature=0.7, top_p=0.95, seed=3)
    assert s1 == md.generate(lean, ps, 20, eos=eos, temperature=0.7, top_p=0.95, seed=3)
    assert s1[0] != md.generate(lean, ps, 20, eos=eos, temperature=0.7, top_p=0.95, seed=4)[0]


def test_bad_command_lines_exit_2(tmp_path, capsys):
    from workshop import magpie_data as md
    assert md.main(["--until", "25:00", "--hf", str(tmp_path)]) == 2
    assert "--until" in capsys.readouterr().err
    assert md.main(["--hf", str(tmp_path)]) == 2
    assert "workshop.smollm2" in capsys.readouterr().err


def test_magpie_keeps_n_and_the_gate_remembers_only_those(monkeypatch):
    from workshop import magpie_data as md
    texts = ["Plan a picnic for six people.", "Plan a picnic for six people!", "Hi",
             "Suggest a name for a grey cat.", "Write a limerick about rain.", "Tell me about owls, please."]
    rows = [[i, 2] for i in range(len(texts))] + [[9, 9, 9]]          # the last never ended

    class Tok:
        def decode(self, ids):
            return texts[ids[0]] if ids[0] < len(texts) else "never ends"
    monkeypatch.setattr(md, "user_prefix", lambda tok: [1, 5])
    monkeypatch.setattr(md, "generate", lambda *a, **k: (rows, [True] * len(texts) + [False]))
    gate = md.Gate([], set(), 0.6)
    kept, stats = md.magpie(None, Tok(), 3, 0, md.CONFIG, gate, 2)
    assert kept == [texts[0], texts[3], texts[4]]
    assert stats == {"sampled": 7, "duplicate": 1, "length": 1, "surplus": 2, "kept": 3}
    assert gate.seen == {store.key(t) for t in kept}


def test_second_turns_follow_up_stored_first_turns(tmp_path, monkeypatch):
    """--second-turns: a shard of follow-ups to one stored first-turn shard (ended answers only):
    the prompt is the stored conversation, the template's joints and the follow-up; the manifest
    names its base, which is then no longer offered."""
    from workshop import magpie_data as md
    ex = [{"source": "magpie", "instruction": "Name a bird.", "prompt": [1, 5, 6], "answer": [7, 8, 2], "ended": True},
          {"source": "stdlib", "instruction": "Explain zip.", "prompt": [1, 9], "answer": [10, 11], "ended": False},
          {"source": "prose", "instruction": "Describe a storm.", "prompt": [1, 12], "answer": [13, 2], "ended": True}]
    for i in (0, 1):
        store.write_shard(tmp_path, i, ex, {"answers": {"mode": "greedy"}})
    assert md.unanswered_bases(tmp_path) == ["shard-00000", "shard-00001"]
    follow = {5: [20, 2], 12: [21, 2]}                            # by the first turn's prompt
    calls = []

    def generate(lean, prompts, gen_len, **k):
        calls.append([list(p) for p in prompts])
        if len(calls) == 1:                                       # the follow-ups: one per ended turn
            return [follow[p[1]] for p in prompts], [True] * len(prompts)
        return [[30, 31, 2] for _ in prompts], [True] * len(prompts)

    class Tok:
        eos_token_id = 2

        def decode(self, ids):
            return {20: "And another bird, please?", 21: "Hi"}[ids[0]]

        def __call__(self, text, add_special_tokens=False):
            return {"input_ids": [40, 41]}
    monkeypatch.setattr(md, "generate", generate)
    ctx = {"cfg": md.CONFIG, "lean": None, "tok": Tok(), "eos": 2, "gate": md.Gate([], set(), 0.6), "out": tmp_path,
           "target": {"checkpoint_sha256": "x"}, "torch_version": "t", "threads": 1, "device": "cpu",
           "joints": ([3], [4])}
    assert md.next_bases(tmp_path, 1) == (["shard-00000"], md.ended_first_turns(tmp_path, "shard-00000"))
    assert md.next_bases(tmp_path, 3)[0] == ["shard-00000", "shard-00001"]      # 2 ended turns a shard
    man = md.make_second_turns(ctx, 2, ["shard-00000"], md.ended_first_turns(tmp_path, "shard-00000"))
    assert sorted(calls[0]) == [[1, 5, 6, 7, 8, 2, 3], [1, 12, 13, 2, 3]]      # the cut answer is no base
    assert man["turn"] == 2 and man["base_shards"] == ["shard-00000"] and man["examples"] == 1
    assert man["magpie"]["stats"] == {"sampled": 2, "length": 1, "kept": 1}     # "Hi" is too short
    sh = store.read_shard(tmp_path, "shard-00002")
    assert sh["source"] == ["magpie-turn2"] and sh["instruction"] == ["And another bird, please?"]
    assert sh["prompt"] == [[1, 5, 6, 7, 8, 2, 3, 40, 41, 4]] and sh["answer"] == [[30, 31, 2]]
    assert md.unanswered_bases(tmp_path) == ["shard-00001"]
    assert store.write_index(tmp_path)["by_source"]["magpie-turn2"] == 1


@pytest.mark.skipif(not (ROOT / "build" / "demo" / "tokenizer" / "tokenizer.json").is_file(),
                    reason="needs make demo's build")
def test_the_second_turns_joints_are_smollm2s_template():
    from workshop import magpie_data as md
    from workshop.plain_tokenizer import PlainTokenizer
    tok = PlainTokenizer(ROOT / "build" / "demo" / "tokenizer")
    j1, j2 = md.turn_joints(tok)
    assert tok.decode(j1) == "\n<|im_start|>user\n" and tok.decode(j2) == "<|im_end|>\n<|im_start|>assistant\n"
