"""demo/compiling.py's compile trio: the three artifacts and their exact options (the options
are part of each artifact's cache stamp, so the toy demo, the real demo and bench/spec.py
reuse what an earlier run compiled only while these stay the same)."""
from __future__ import annotations

from pathlib import Path

from demo import compiling


def _recorded(monkeypatch, seconds: float) -> list:
    """compile_artifact replaced by a recorder: (model name, output name, args) per call."""
    calls = []

    def fake(model, out, args, *, log=print):
        calls.append((model.name, out.name, args))
        return seconds

    monkeypatch.setattr(compiling, "compile_artifact", fake)
    return calls


def test_compile_trio_compiles_the_draft_the_target_and_the_baseline(monkeypatch):
    calls = _recorded(monkeypatch, 1.5)
    common = ["--target", "ort", "--prefill-len", "32", "--ctx-len", "256"]
    times = compiling.compile_trio(Path("t.onnx"), Path("d.onnx"), Path("out"), k=4, k_list=[2, 3],
                                   prefill_len=32, ctx_len=256)
    assert times == {"dlm": 1.5, "tlm": 1.5, "tlm-base": 1.5}
    assert calls == [("d.onnx", "dlm", ["--role", "dlm", *common]),
                     ("t.onnx", "tlm", ["--role", "tlm", "--k", "4", "--k-list", "2,3", *common]),
                     ("t.onnx", "tlm-base", ["--role", "dlm", *common])]
    calls.clear()
    compiling.compile_trio(Path("t.onnx"), Path("d.onnx"), Path("out"), k=4, k_list=[], prefill_len=32,
                           ctx_len=256)
    assert calls[1][2] == ["--role", "tlm", "--k", "4", *common]          # no extra widths: no --k-list


def test_compile_feature_pair_compiles_the_head_and_the_tlm_with_hidden_states(monkeypatch):
    calls = _recorded(monkeypatch, 2.0)
    common = ["--target", "ort", "--prefill-len", "64", "--ctx-len", "256"]
    times = compiling.compile_feature_pair(Path("t.onnx"), Path("f.onnx"), Path("out"), k=4, k_list=[0, 1, 2],
                                           prefill_len=64, ctx_len=256)
    assert times == {"fdlm": 2.0, "tlm-hs": 2.0}
    assert calls == [("f.onnx", "fdlm", ["--role", "dlm", "--k", "4", "--k-list", "0,1,2", "--feature-layers", "-1",
                                         "--feature-target", "t.onnx", *common]),
                     ("t.onnx", "tlm-hs", ["--role", "tlm", "--k", "4", "--k-list", "0,1,2", "--hidden-states", "-1",
                                           *common])]


def test_a_subcommand_is_run_first_and_its_key_files_decide_reuse(monkeypatch, tmp_path):
    """compile_artifact with ``subcommand`` (import-head) puts it before the model; the stamp is keyed
    by ``key_files``' contents (a checkpoint directory's files), so a changed file compiles again."""
    import subprocess
    import types
    cmds = []

    def fake_run(cmd, capture_output, text):
        cmds.append(cmd)
        out = Path(cmd[cmd.index("-o") + 1])
        out.mkdir(parents=True, exist_ok=True)
        (out / "manifest.json").write_text("{}")
        return types.SimpleNamespace(returncode=0, stdout="", stderr="")
    monkeypatch.setattr(subprocess, "run", fake_run)
    head = tmp_path / "head"
    head.mkdir()
    (head / "config.json").write_text("{}")
    (head / "model.safetensors").write_bytes(b"1")
    keys = (head / "config.json", head / "model.safetensors")
    go = lambda: compiling.compile_artifact(head, tmp_path / "out", ["--k", "4"], log=lambda *_: None,  # noqa: E731
                                            subcommand="import-head", key_files=keys)
    go()
    assert cmds[0][-7:] == ["import-head", str(head), "--k", "4", "-o", str(tmp_path / "out"), "--force"]
    assert go() == 0.0 and len(cmds) == 1                                  # the same files: reused
    (head / "model.safetensors").write_bytes(b"2")
    go()
    assert len(cmds) == 2                                                  # another head: compiled again


def test_compile_eagle3_imports_the_heads_weights_beside_one_tlm(monkeypatch, tmp_path):
    """``weights``: the float head in eagle3-SHA/head, an int8 one in eagle3-SHA/head-int8 with
    ``--weights int8`` passed to import-head; the TLM is the same path either way."""
    import json
    calls = []

    def fake(model, out, args, *, log=print, subcommand=None, key_files=()):
        calls.append((out.name, args))
        out.mkdir(parents=True, exist_ok=True)
        if subcommand == "import-head":
            (out / "manifest.json").write_text(json.dumps({"feature_draft": {"target_layers": [1, 14, 26]}}))
        return 1.0
    monkeypatch.setattr(compiling, "compile_artifact", fake)
    monkeypatch.setattr(compiling, "head_sha", lambda head: "ab" * 32)
    got = {w: compiling.compile_eagle3(Path("t.onnx"), tmp_path / "h", tmp_path, k=4, k_list=[0, 4], prefill_len=64,
                                       ctx_len=256, log=lambda *_: None, weights=w) for w in ("float", "int8")}
    assert [c[0] for c in calls] == ["head", "tlm", "head-int8", "tlm"]
    assert "--weights" not in calls[0][1] and calls[2][1][-3:] == ["--weights", "int8", "--quiet"]
    assert got["float"][0] == got["int8"][0] and got["int8"][1].name == "head-int8"
    assert got["int8"][2]["weights"] == "int8" and got["float"][2]["weights"] == "float"
