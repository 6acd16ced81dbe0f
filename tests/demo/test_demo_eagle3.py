"""The demo's EAGLE-3 rows (demo/eagle3.py, demo/real_demo.py), on tiny stand-ins: a recorded
speculators head (tests/eagle3_data) with its tiny target stands in for the committed head and
SmolLM2, a small file for the converted checkpoint. A head trained for another target checkpoint
is refused in one line (exit 2) before any draft is made; a missing default head skips the rows
in one line naming the Makefile target; the head's pair is imported, compiled and decoded side by
side, greedy, identical to target-only."""
from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
from pathlib import Path

import pytest

from eagle3_models import DATA, cases, target_export

pytest.importorskip("rich")

from demo import eagle3, real_demo, run_demo  # noqa: E402


def _sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def _head(tmp: Path, target_sha: str, case: str = "llama") -> Path:
    """The recorded head ``case`` with a recipe.json as workshop/eagle3_train.py writes it."""
    head = tmp / f"head-{case}"
    head.mkdir()
    for f in ("config.json", "model.safetensors"):
        shutil.copy(DATA / case / f, head / f)
    files = {f: _sha(head / f) for f in ("config.json", "model.safetensors")}
    recipe = {"format": "specdec-eagle3-recipe/1", "target_sha256": target_sha, "dataset_sha256": "d" * 64,
              "seed": 1, "answer_tokens": 1234, "device": "cpu, 2 threads", "files_sha256": files,
              "run": {"aux_ids": cases()[case]["aux_ids"], "ttt_steps": 3,
                      "eval": {"tokens_per_call_greedy": {"1": 1.5, "2": 1.8}}}}
    (head / "recipe.json").write_text(json.dumps(recipe))
    return head


def _checkpoint(tmp: Path, content: bytes = b"the converted target") -> Path:
    ck = tmp / "hf" / "tlm" / "model.safetensors"
    ck.parent.mkdir(parents=True)
    ck.write_bytes(content)
    return ck


def _fake_target(monkeypatch, ck: Path, onnx: Path | None = None):
    """smollm2.prepare returning the stand-in checkpoint (and export); no draft may be made."""
    tgt = {"paths": {"hf": str(ck.parent), "onnx": str(onnx or ck), "tokenizer": str(ck.parent)}}
    monkeypatch.setattr(real_demo.smollm2, "prepare", lambda out, **kw: tgt)

    def no_draft(*a, **k):
        raise AssertionError("a draft was made before the head was checked")
    monkeypatch.setattr(real_demo.distill, "run", no_draft)
    return tgt


def test_head_for_another_target_is_refused_in_one_line_exit_2(tmp_path, monkeypatch, capsys):
    ck = _checkpoint(tmp_path)
    other = "0" * 64
    head = _head(tmp_path, other)
    _fake_target(monkeypatch, ck)
    rc = run_demo.main(["--eagle3-head", str(head), "--out", str(tmp_path / "out"), "--no-stream"])
    err = capsys.readouterr().err
    assert rc == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err
    assert other in lines[0] and _sha(ck) in lines[0] and "make eagle3-head" in lines[0]
    assert not (tmp_path / "out" / "demo.json").exists()


def test_head_for_this_target_passes_the_check(tmp_path):
    ck = _checkpoint(tmp_path)
    info = eagle3.check(_head(tmp_path, _sha(ck)), ck)
    assert info["target_sha256"] == _sha(ck) and info["aux_ids"] == cases()["llama"]["aux_ids"]
    assert info["eval"]["tokens_per_call_greedy"] == {"1": 1.5, "2": 1.8}


@pytest.mark.parametrize("damage", ["no recipe", "recipe garbage", "no target sha", "weights changed",
                                    "no weights", "no checkpoint"])
def test_a_head_that_cannot_be_held_to_the_target_is_refused(tmp_path, damage):
    ck = _checkpoint(tmp_path)
    head = _head(tmp_path, _sha(ck))
    recipe = json.loads((head / "recipe.json").read_text())
    if damage == "no recipe":
        (head / "recipe.json").unlink()
    elif damage == "recipe garbage":
        (head / "recipe.json").write_text("{not json")
    elif damage == "no target sha":
        recipe.pop("target_sha256")
        (head / "recipe.json").write_text(json.dumps(recipe))
    elif damage == "weights changed":            # the recipe no longer describes these weights
        with open(head / "model.safetensors", "ab") as f:
            f.write(b"\0")
    elif damage == "no weights":
        (head / "model.safetensors").unlink()
    else:
        ck.unlink()
    with pytest.raises(eagle3.HeadRefused) as e:
        eagle3.check(head, ck)
    assert "\n" not in str(e.value) and str(head) in str(e.value)


def test_missing_default_head_is_skipped_in_one_line(tmp_path, monkeypatch):
    monkeypatch.setattr(eagle3, "HEAD_DIR", tmp_path / "workshop" / "heads" / "smollm2-eagle3")
    lines = []
    assert eagle3.resolve(None, disabled=False, log=lines.append) is None
    assert len(lines) == 1 and "\n" not in lines[0]
    assert "skipped" in lines[0] and "make eagle3-head" in lines[0]
    # --no-eagle3 skips too; an explicit directory that is missing is refused
    assert eagle3.resolve(DATA / "llama", disabled=True, log=lines.append) is None
    with pytest.raises(eagle3.HeadRefused, match="no such directory"):
        eagle3.resolve(tmp_path / "nope", disabled=False, log=lines.append)
    # the committed default is used when it is there
    eagle3.HEAD_DIR.mkdir(parents=True)
    assert eagle3.resolve(None, disabled=False, log=lines.append) == eagle3.HEAD_DIR


class _Stop(Exception):
    pass


def _stub_build(monkeypatch) -> list:
    """real_demo.build replaced by one that records its keywords and stops the demo there."""
    seen = []

    def build(out, **kw):
        seen.append(kw)
        raise _Stop
    monkeypatch.setattr(real_demo, "build", build)
    return seen


def test_demo_without_a_head_goes_on_without_the_rows(tmp_path, monkeypatch, capsys):
    """run_demo: a missing default head logs the skip line and builds with no head."""
    monkeypatch.setattr(eagle3, "HEAD_DIR", tmp_path / "missing")
    seen = _stub_build(monkeypatch)
    with pytest.raises(_Stop):
        run_demo.main(["--out", str(tmp_path / "out"), "--no-stream"])
    assert seen[0]["eagle3_head"] is None and seen[0]["feature_head"] is True  # no head: the feature draft is built
    out = capsys.readouterr().out
    assert "[eagle3] no EAGLE-3 head at" in out and "make eagle3-head" in out
    rc = run_demo.main(["--out", str(tmp_path / "out"), "--eagle3-head", str(tmp_path / "nope")])
    assert rc == 2 and "no such directory" in capsys.readouterr().err


def test_with_a_head_the_feature_draft_is_built_only_when_asked(tmp_path, monkeypatch):
    """The committed head stands in for the feature draft trained here (19 minutes of a fresh
    clone's make demo): built with --feature-head, --fdraft-head, or without a head."""
    seen = _stub_build(monkeypatch)
    monkeypatch.setattr(eagle3, "resolve", lambda head, disabled, log: None if disabled else tmp_path / "head")
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "head.pt").write_bytes(b"")     # run_demo checks that the head is there
    for extra, want in (([], False), (["--feature-head"], True), (["--no-eagle3"], True),
                        (["--fdraft-head", str(tmp_path / "elsewhere")], True)):
        with pytest.raises(_Stop):
            run_demo.main(["--out", str(tmp_path / "out"), "--no-stream", *extra])
        assert seen[-1]["feature_head"] is want, extra
    assert seen[0]["eagle3_head"] == tmp_path / "head"


def test_build_without_the_feature_draft_makes_and_compiles_none(tmp_path, monkeypatch):
    ck = _checkpoint(tmp_path)
    _fake_target(monkeypatch, ck)
    monkeypatch.setattr(real_demo.distill, "run", lambda *a, **k: {"paths": {"onnx": str(ck)}})

    def never(*a, **k):
        raise AssertionError("the feature draft was made")
    monkeypatch.setattr(real_demo.feature_draft, "run", never)
    monkeypatch.setattr(real_demo, "compile_feature_pair", never)
    monkeypatch.setattr(real_demo, "compile_trio", lambda *a, **k: {"tlm": 1.0})
    built = real_demo.build(tmp_path / "out", k=4, prefill_len=8, ctx_len=64, threads=1, log=lambda m: None,
                            feature_head=False)
    assert built["fdraft"] is None and built["compile_s"] == {"tlm": 1.0}
    line = real_demo._costs_line({"step_s": 0.03, "dlm_s": 0.003, "verify_s": {1: 0.03, 2: 0.035}})
    assert line == "[costs] target step 30.0 ms, draft step 3.00 ms (c = 0.100), verification w1 30, w2 35 ms"
    lines = []
    real_demo._log_build(lines.append, {**built, "target": {"name": "t", "license": "l", "source": "s",
                                                            "facts": {"params": 1e6, "layers": 2}},
                                        "draft": {"metrics": {"greedy_agreement": 0.1, "head_coverage": 0.9},
                                                  "layers": [0], "head_rows": 8, "params": 1e6,
                                                  "train_answer_tokens": 10}})
    assert any("not built" in m and "--feature-head" in m for m in lines)


@pytest.mark.slow
def test_eagle3_rows_are_built_and_decoded_side_by_side(tmp_path, monkeypatch, decode_standins):
    """build() holds the head to the checkpoint, imports it against the target's export with the
    TLM compiled at the layers the import names; its two decoders run beside another draft in
    decode_all, greedy, identical to target-only."""
    from demo.compiling import compile_artifact
    from specdec_compile.runtime import OrtBackend, TargetOnlyDecoder
    export = target_export(cases()["llama"]["target"])
    ck = _checkpoint(tmp_path)
    head = _head(tmp_path, _sha(ck))
    _fake_target(monkeypatch, ck, export)
    monkeypatch.setattr(real_demo.distill, "run", lambda *a, **k: {"paths": {"onnx": str(export)}})
    monkeypatch.setattr(real_demo.feature_draft, "run", lambda *a, **k: {"paths": {"onnx": str(export)}})
    monkeypatch.setattr(real_demo, "compile_trio", lambda *a, **k: {"tlm": 0.0})
    monkeypatch.setattr(real_demo, "compile_feature_pair", lambda *a, **k: {"fdlm": 0.0})
    out = tmp_path / "out"
    built = real_demo.build(out, k=4, prefill_len=8, ctx_len=64, threads=1, log=lambda m: None, eagle3_head=head)
    e3 = built["eagle3"]
    want_layers = ",".join(str(i - 1) for i in cases()["llama"]["aux_ids"])
    assert e3["hidden_states"] == want_layers and e3["sha256"] == _sha(head / "model.safetensors")
    assert e3["target_sha256"] == _sha(ck) and Path(e3["paths"]["tlm"]).parent.name.startswith("eagle3-")
    assert {"eagle3-head", "eagle3-tlm"} <= set(built["compile_s"])
    assert "held-out greedy tokens per target call k=1 1.5" in eagle3.describe(e3)

    compile_artifact(export, out / "tlm-base", ["--role", "dlm", "--target", "ort", "--prefill-len", "8",
                                                "--ctx-len", "64"], log=lambda m: None)
    base = OrtBackend(out / "tlm-base", intra_op_threads=1)
    e3_drafts, e3_opened = real_demo.eagle3_decoders(e3, 1, eos=None, k=None)
    assert set(e3_drafts) == {"eagle3", "eagle3-hybrid"}
    # open_drafts: every draft side by side; the EAGLE-3 pair stands in for the feature pair here,
    # and the target at seq_len 1 for the distilled draft
    tlm = OrtBackend(Path(e3["paths"]["tlm"]), intra_op_threads=1)
    dlm = OrtBackend(out / "tlm-base", intra_op_threads=1)
    monkeypatch.setattr(real_demo, "open_feature_pair", lambda o, t: real_demo.eagle3_decoders(e3, t, eos=None,
                                                                                                k=None)[1])
    a = argparse.Namespace(out=out, ort_threads=1, decode_k=None)
    drafts, opened = real_demo.open_drafts(a, built, tlm, dlm, None)
    names = {"feature", "hybrid", "distilled", "ngram", "eagle3", "eagle3-hybrid"}
    assert set(drafts) == names and len(opened) == 4
    assert set(real_demo.open_drafts(a, {**built, "eagle3": None}, tlm, dlm, None)[0]) == names - {"eagle3",
                                                                                                  "eagle3-hybrid"}
    no_fd, no_fd_opened = real_demo.open_drafts(a, {**built, "fdraft": None}, tlm, dlm, None)
    assert set(no_fd) == names - {"feature", "hybrid"} and len(no_fd_opened) == 2
    for b in no_fd_opened:
        b.close()

    tok, silent = decode_standins
    monkeypatch.setattr(real_demo.smollm2, "chat_ids", lambda tok, text: [1, 5, 9, 33, 7, 100, 42, 5, 9][: len(text) + 5])
    rows = real_demo.decode_all(drafts, TargetOnlyDecoder(base), tok, ["ab", "abcd"], max_new_tokens=16,
                                repeats=1, stream=silent, streamed="eagle3")
    for r in rows:
        assert r["new_tokens"] == 16 and r["identical"] and set(r["drafts"]) == names
        assert r["drafts"]["eagle3"]["tokens_per_tlm_call"] >= 1.0
    assert opened[3].calls > 2 * 4                      # the EAGLE-3 head drafted rounds, not only prefills
    for name in drafts:
        assert real_demo.summarize(rows, name)["identical"]
    for b in e3_opened + opened + [base, tlm, dlm]:
        b.close()


def test_eagle3_head_make_target_reproduces_it_from_scratch():
    """The Makefile's eagle3-head target: the target converted, then the trainer into build/eagle3-head,
    DEVICE passed through; make demo passes EAGLE3_HEAD on."""
    import subprocess
    root = Path(__file__).resolve().parents[2]
    if shutil.which("make") is None:
        pytest.skip("no make")
    res = subprocess.run(["make", "-n", "-C", str(root), "eagle3-head", "demo", "DEVICE=cuda", "EAGLE3_HEAD=h",
                          f"VENV={sys.prefix}"], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    cmds = res.stdout.splitlines()
    smol = next(i for i, c in enumerate(cmds) if "-m workshop.smollm2" in c)
    train = next(i for i, c in enumerate(cmds) if "-m workshop.eagle3_train" in c)
    assert smol < train and "--out build/eagle3-head" in cmds[train] and "--device cuda" in cmds[train]
    assert any("-m demo.run_demo --eagle3-head h" in c for c in cmds)
    # the committed head's recipe: its shards, its epochs, the steps it ran
    recipe = json.loads((root / "workshop" / "heads" / "smollm2-eagle3" / "recipe.json").read_text())
    assert (f"--shards {recipe['shards']} --epochs {recipe['config']['epochs']} "
            f"--steps {recipe['run']['train']['steps']}") in cmds[train]
    one = subprocess.run(["make", "-n", "-C", str(root), "eagle3-head", "SHARDS=20", f"VENV={sys.prefix}"],
                         capture_output=True, text=True).stdout
    assert one.count("-m workshop.eagle3_train") == 1 and "--out build/eagle3-head --shards 20\n" in one


def test_the_table_fits_six_drafts_in_one_line_per_prompt():
    """Speedup and tokens per call share a column per draft: six drafts fit 150 columns unwrapped."""
    from rich.console import Console
    names = ["feature", "hybrid", "distilled", "ngram", "eagle3", "eagle3-hybrid"]
    d = {n: {"speedup": 1.234, "tokens_per_tlm_call": 1.88} for n in names}
    rows = [{"prompt": "Write a Python function that checks whether a string is a palindrome.", "new_tokens": 128,
             "target_tokens_per_s": 21.5, "drafts": d, "identical": True}] * 2
    sums = {n: {"speedup": 1.1} for n in names}
    con = Console(width=150, record=True, file=open("/dev/null", "w"))
    con.print(real_demo._table(argparse.Namespace(ort_threads=1, repeats=2), rows, sums,
                               {"target_tokens_per_s": 21.5}, True))
    text = con.export_text()
    body = [line for line in text.splitlines() if line.startswith("│")]
    assert len(body) == 3                                   # two prompts and "all", one line each
    assert body[0].count("1.23x (1.88)") == 6 and "eagle3-hybrid" in text
