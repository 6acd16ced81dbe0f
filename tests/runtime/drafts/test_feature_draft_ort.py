"""Feature drafts on real artifacts: the tiny llama target compiled with
``--hidden-states``, the tiny EAGLE-style head (tests/feature_draft_models.py)
compiled with ``--feature-layers``, both run by ONNX Runtime (ort and qaic
lowerings); and ``specdec-run``'s handling of such a pair."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from runtime_helpers import one_line_error, run

from feature_draft_models import export_feature_draft
from specdec_compile import cli as compile_cli
from specdec_compile.runtime import (FeatureDraft, OrtBackend, SamplingParams, SpecDecoder, TargetOnlyDecoder)
from specdec_compile.runtime.drafts.feature import FeatureDrafter
from specdec_compile.runtime.policy import WidthPolicy

PL, CL = 8, 64
PROMPTS = [[1, 5, 9, 33, 7, 100, 42, 17, 3, 8, 55], [1, 150, 20], [1, 2, 3, 4, 5, 6, 7, 8], [7] * 17, [9, 4]]


@pytest.fixture(scope="module")
def arts(fixture_path, tmp_path_factory):
    """arts(kind, target="ort", batch=1, layers="-1") -> artifact dir (built once); kind: "tlm" (with
    --hidden-states layers), "plain" (a TLM without), "head" (the feature draft reading layers)."""
    root = tmp_path_factory.mktemp("fd_artifacts")
    made = {}

    def get(kind, target="ort", batch=1, layers="-1"):
        key = (kind, target, batch, layers)
        if key not in made:
            out = root / "-".join(map(str, key)).replace(",", "_")
            common = ["--target", target, "--prefill-len", str(PL), "--ctx-len", str(CL), "--batch-size", str(batch),
                      "-o", str(out)]
            if kind == "head":
                argv = [str(export_feature_draft(len(layers.split(",")))), "--role", "dlm", "--k", "3",
                        "--feature-layers", layers]
            else:
                argv = [str(fixture_path("llama_gqa")), "--role", "tlm", "--k", "3", "--k-list", "0,1,3"]
                argv += ["--hidden-states", layers] if kind == "tlm" else []
            assert compile_cli.main(argv + common) == 0
            made[key] = out
        return made[key]

    return get


@pytest.mark.parametrize("target", ["ort", "qaic"])
def test_greedy_equals_target_only(arts, target):
    tlm, head = OrtBackend(arts("tlm", target)), OrtBackend(arts("head", target))
    spec, base = SpecDecoder(tlm, head, k=3), TargetOnlyDecoder(tlm)
    assert isinstance(spec.source, FeatureDraft)
    for p in PROMPTS[:3]:
        s = spec.generate(p, max_new_tokens=30)
        assert s.generated_ids == base.generate(p, max_new_tokens=30).generated_ids, p
        assert s.metrics["call_time_by_width"]["dlm"]      # the head ran
    # the adaptive choice, the K=0 fallback among its choices
    a = SpecDecoder(tlm, head).generate(PROMPTS[0], max_new_tokens=30)
    assert a.generated_ids == base.generate(PROMPTS[0], max_new_tokens=30).generated_ids
    assert SpecDecoder(tlm, head, k=0).generate(PROMPTS[0], max_new_tokens=30).generated_ids == a.generated_ids


@pytest.mark.parametrize("target", ["ort", "qaic"])
def test_batch_3_continuous_batching(arts, target):
    tlm, head = OrtBackend(arts("tlm", target, batch=3)), OrtBackend(arts("head", target, batch=3))
    s = SpecDecoder(tlm, head, k=3).generate_many(PROMPTS, max_new_tokens=20)      # 5 prompts, 3 rows
    b = TargetOnlyDecoder(tlm).generate_many(PROMPTS, max_new_tokens=20)
    assert [x.generated_ids for x in s] == [x.generated_ids for x in b]
    params = SamplingParams(0.8, top_p=0.95, seed=3)
    s = SpecDecoder(tlm, head, k=3).generate_many(PROMPTS, max_new_tokens=15, sampling=params)
    b = TargetOnlyDecoder(tlm).generate_many(PROMPTS, max_new_tokens=15, sampling=params)
    assert [x.generated_ids for x in s] == [x.generated_ids for x in b]
    # the hybrid (prompt lookup, else the head) over the same rows, greedy and sampling
    h = SpecDecoder(tlm, head, draft="hybrid").generate_many(PROMPTS, max_new_tokens=20)
    assert [x.generated_ids for x in h] == [x.generated_ids for x in TargetOnlyDecoder(tlm).generate_many(
        PROMPTS, max_new_tokens=20)]
    h = SpecDecoder(tlm, head, draft="hybrid").generate_many(PROMPTS, max_new_tokens=15, sampling=params)
    assert [x.generated_ids for x in h] == [x.generated_ids for x in b]


def test_hidden_states_output_equals_a_plain_session(arts):
    import onnxruntime as ort
    path = arts("tlm", "qaic")
    sess = ort.InferenceSession(str(path / "model.onnx"), providers=["CPUExecutionProvider"])
    feeds = {i.name: np.zeros([1, i.shape[1], CL, i.shape[3]], np.float32) for i in sess.get_inputs()
             if i.name.startswith("past_")}
    ids, pos = np.array([PROMPTS[0][:PL]]), np.arange(PL)[None]
    want = sess.run(["hidden_states"], {"input_ids": ids, "position_ids": pos, **feeds})[0]
    for inplace in (False, None):
        b = OrtBackend(arts("tlm", "ort"), inplace=inplace)
        for _ in range(2):       # the second call reuses the logits buffer bound for this width
            b.reset()
            got = b.run_outputs(ids, pos)
            assert np.abs(got["hidden_states"] - want).max() < 1e-4
    got = OrtBackend(path).run_outputs(ids, pos)
    assert np.abs(got["hidden_states"] - want).max() < 1e-4


class _Recording(FeatureDrafter):
    seen: list = []

    def _inputs(self, p0, q):
        rows = super()._inputs(p0, q)
        self.seen.append((p0, rows[self.src.input_name].copy()))
        return rows


def test_the_head_reads_the_targets_feature_of_the_position_before(arts):
    """Row p of every ingest carries f_{p-1}: the TLM's hidden state at p-1 over the final text."""
    tlm_path = arts("tlm", "ort")
    tlm, head = OrtBackend(tlm_path), OrtBackend(arts("head", "ort"))

    class Source(FeatureDraft):
        def drafter(self, ctx):
            return _Recording(self, ctx)
    _Recording.seen = []
    r = SpecDecoder(tlm, draft=Source(head), k=3).generate(PROMPTS[0], max_new_tokens=25)
    assert len(_Recording.seen) > 3
    _check_rows_read(_Recording.seen, _features(OrtBackend(tlm_path), PROMPTS[0] + r.generated_ids))


def _features(ref, text) -> list:
    """The TLM's hidden state at each position of ``text`` (run in PL chunks on a fresh backend)."""
    f = []
    for s in range(0, len(text), PL):
        chunk = text[s:s + PL]
        ids = np.zeros((1, PL), np.int64)
        pos = np.full((1, PL), -1, np.int64)
        ids[0, :len(chunk)], pos[0, :len(chunk)] = chunk, np.arange(s, s + len(chunk))
        f.extend(ref.run_outputs(ids, pos)["hidden_states"][0, :len(chunk)])
    ref.reset()
    return f


def _check_rows_read(seen, f) -> None:
    """Every ingested row p carried f[p - 1] (zeros at p = 0)."""
    for p0, rows in seen:
        for i, row in enumerate(rows):
            p = p0 + i
            want = np.zeros_like(row) if p == 0 else f[p - 1]
            assert np.abs(row - want).max() < 1e-4, (p, p0)


def test_cli_runs_a_feature_pair_and_refuses_mismatches(arts, tmp_path, capsys):
    ids = ["--prompt-ids", ",".join(map(str, PROMPTS[0])), "--max-new-tokens", "12", "--json", "--no-warmup"]
    tlm, head = arts("tlm"), arts("head")
    code, out, err = run(["--tlm", tlm, "--dlm", head, "--k", "3", *ids], capsys)
    assert code == 0, err
    got = json.loads(out)["results"][0]["generated_ids"]
    code, out, _ = run(["--tlm", tlm, "--target-only", *ids], capsys)
    assert json.loads(out)["results"][0]["generated_ids"] == got
    code, out, err = run(["--tlm", tlm, "--dlm", head, "--draft", "hybrid", *ids], capsys)   # lookup, else the head
    assert code == 0, err
    assert json.loads(out)["results"][0]["generated_ids"] == got

    code, _, err = run(["--tlm", head, "--target-only", *ids], capsys)      # zero features: refused, not run
    one_line_error(code, err, "is a feature draft: it reads a target's hidden states and cannot decode alone")
    code, _, err = run(["--tlm", arts("plain"), "--dlm", head, *ids], capsys)
    one_line_error(code, err, "exposes no hidden states: compile it with --hidden-states -1")
    code, _, err = run(["--tlm", arts("tlm", layers="0"), "--dlm", head, *ids], capsys)
    one_line_error(code, err, "the target was compiled with --hidden-states 0 but the draft reads layers -1")
    wide = tmp_path / "wide"
    shutil.copytree(tlm, wide)
    m = json.loads((wide / "manifest.json").read_text())
    m["hidden_states"]["width"] = m["hidden_states"]["hidden_size"] = 96
    (wide / "manifest.json").write_text(json.dumps(m))
    code, _, err = run(["--tlm", wide, "--dlm", head, *ids], capsys)
    one_line_error(code, err, "hidden states are 96 wide but the draft reads 64")
    code, _, err = run(["--tlm", arts("tlm", layers="0,-1"), "--dlm", arts("head", layers="0,-1"), *ids], capsys)
    one_line_error(code, err, "draft_hidden_states) are 64 wide but it reads 128")


def test_feature_target_is_recorded_and_another_target_refused(arts, fixture_path, tmp_path, capsys):
    """--feature-target records the target's export (file name, sha256; from the file or from a
    compiled TLM's manifest); specdec-run refuses a TLM compiled from another export."""
    from specdec_compile.model_io import sha256_file
    tlm = arts("tlm")
    src = fixture_path("llama_gqa")
    want = {"file": src.name, "sha256": sha256_file(src)}
    head_args = [str(export_feature_draft(1)), "--role", "dlm", "--k", "3", "--feature-layers", "-1", "--target",
                 "ort", "--prefill-len", str(PL), "--ctx-len", str(CL)]
    by_file, by_dir = tmp_path / "by-file", tmp_path / "by-dir"
    assert compile_cli.main(head_args + ["--feature-target", str(src), "-o", str(by_file)]) == 0
    assert compile_cli.main(head_args + ["--feature-target", str(tlm), "-o", str(by_dir)]) == 0
    for d in (by_file, by_dir):
        assert json.loads((d / "manifest.json").read_text())["feature_draft"]["target"] == want
    capsys.readouterr()
    ids = ["--prompt-ids", ",".join(map(str, PROMPTS[0])), "--max-new-tokens", "8", "--json", "--no-warmup"]
    code, out, err = run(["--tlm", tlm, "--dlm", by_file, "--k", "3", *ids], capsys)
    assert code == 0, err
    other = tmp_path / "other-tlm"
    shutil.copytree(tlm, other)
    m = json.loads((other / "manifest.json").read_text())
    m["source"] = {"file": "another.onnx", "sha256": "f" * 64}
    (other / "manifest.json").write_text(json.dumps(m))
    code, _, err = run(["--tlm", other, "--dlm", by_file, *ids], capsys)
    one_line_error(code, err, "is a feature draft for the target model.onnx")
    assert "was compiled from another.onnx" in err


@pytest.mark.parametrize("extra, msg", [
    (["--feature-target", "/nonexistent/model.onnx"], "--feature-target /nonexistent/model.onnx: no such file"),
    (["--feature-target", "."], "a directory without manifest.json"),
])
def test_bad_feature_target_is_one_line_exit_2(extra, msg, tmp_path, capsys):
    out = tmp_path / "out"
    argv = [str(export_feature_draft(1)), "--role", "dlm", "--k", "3", "--feature-layers", "-1", *extra,
            "-o", str(out)]
    capsys.readouterr()
    assert compile_cli.main(argv) == 2
    err = [x for x in capsys.readouterr().err.splitlines() if x.strip()]
    assert len(err) == 1 and msg in err[0] and not out.exists(), err


def test_feature_target_without_feature_layers_is_refused(fixture_path, tmp_path, capsys):
    out = tmp_path / "out"
    src = fixture_path("llama_gqa")
    assert compile_cli.main([str(src), "--role", "tlm", "--k", "3", "--feature-target", str(src),
                             "-o", str(out)]) == 2
    err = [x for x in capsys.readouterr().err.splitlines() if x.strip()]
    assert len(err) == 1 and "--feature-target names the target a feature draft reads" in err[0]
    assert not out.exists()


class _IoLog:
    """An IOBinding that records what the backend binds and reads (issue 30, part 5)."""

    def __init__(self, io):
        self._real, self.log = io, []

    def __getattr__(self, name):
        attr = getattr(self._real, name)
        if name.startswith("_") or not callable(attr):
            return attr

        def call(*args):
            self.log.append((name, args[0] if args and isinstance(args[0], str) else None))
            return attr(*args)
        return call


def _steps_of(backend, decode):
    """The binding calls of each call of ``decode()``'s width-1 decode steps (after its prefill)."""
    io = backend._io = _IoLog(backend._io)
    per_call = []
    real = backend._run_outputs

    def run_outputs(ids, pos, extra):
        io.log = []
        out = real(ids, pos, extra)
        if ids.shape[1] == 1:
            per_call.append(io.log)
        return out
    backend._run_outputs = run_outputs
    try:
        result = decode()
    finally:
        backend._io, backend._run_outputs = io._real, real
    return result, per_call


def test_a_round_without_drafts_binds_and_reads_what_target_only_does(arts):
    """The K=0 fallback on a feature pair: its width-1 TLM call binds the ids and positions only, as a
    plain TLM's target-only step does (no get_outputs, no output rebound: the features land in a
    host buffer bound once), and still hands the drafter the target's features."""
    tlm, plain, head = OrtBackend(arts("tlm")), OrtBackend(arts("plain")), OrtBackend(arts("head"))
    base, want = _steps_of(plain, lambda: TargetOnlyDecoder(plain).generate(PROMPTS[0], max_new_tokens=12))
    got, calls = _steps_of(tlm, lambda: SpecDecoder(tlm, head, k=0).generate(PROMPTS[0], max_new_tokens=12))
    assert got.generated_ids == base.generated_ids
    assert len(calls) == len(want) == 11
    # the first width-1 call sizes the host buffers, the second binds them; every later one binds
    # what target-only binds, and reads no output back through the binding
    assert calls[2:] == want[2:] == [[("bind_cpu_input", "input_ids"), ("bind_cpu_input", "position_ids")]] * 9
    assert [c for c in calls[1] if c[0] != "bind_cpu_input"] == [("bind_ortvalue_output", "logits"),
                                                                 ("bind_ortvalue_output", "hidden_states")]
    assert not got.metrics["call_time_by_width"]["dlm"]            # no head call in a K=0 decode


class _Resuming(WidthPolicy):
    """No drafts for the first rounds (the fallback), then k every round."""

    def choose(self, row):
        row.rounds = getattr(row, "rounds", 0) + 1
        return 0 if row.rounds <= 6 else self.k


def test_drafting_resumes_after_rounds_without_drafts_with_the_targets_features(arts):
    """After six K=0 rounds the head ingests every row since with the target's own features (read from
    the reused host buffers, not stale ones): greedy output is target-only's, and each ingested row p
    carries the TLM's hidden state at p - 1 over the final text."""
    tlm_path = arts("tlm")
    tlm, head, ref = OrtBackend(tlm_path), OrtBackend(arts("head")), OrtBackend(tlm_path)

    class Source(FeatureDraft):
        def drafter(self, ctx):
            return _Recording(self, ctx)
    for sampling in (None, SamplingParams(0.8, top_p=0.95, seed=5)):
        _Recording.seen = []
        spec = SpecDecoder(tlm, draft=Source(head), policy=_Resuming(3))
        r = spec.generate(PROMPTS[0], max_new_tokens=25, sampling=sampling)
        b = TargetOnlyDecoder(tlm).generate(PROMPTS[0], max_new_tokens=25, sampling=sampling)
        assert r.generated_ids == b.generated_ids
        assert r.metrics["verify_drafts_histogram"]["0"] >= 6 and r.metrics["drafted_tokens"] > 0
        assert len(_Recording.seen[0][1]) > 6           # the first ingest: every row of the K=0 rounds too
        _check_rows_read(_Recording.seen, _features(ref, PROMPTS[0] + r.generated_ids))
