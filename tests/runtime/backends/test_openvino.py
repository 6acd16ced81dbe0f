"""The OpenVINO backend on real artifacts: the tiny exports compiled with ``--target openvino``,
run by OpenVINO's CPU plugin with the cache in state variables: the fused cache (each attention
rebuilt as OpenVINO's stateful SDPA, the default where the graph allows it) and the copy path
(MakeStateful). Greedy speculative output equals target-only decoding at f32 for DLM, n-gram and
feature drafts; the cache never crosses to the host per call; every width, the K=0 fallback,
rollbacks, batches and the refusals."""
from __future__ import annotations

import json

import numpy as np
import pytest
from runtime_helpers import hf_greedy_of, one_line_error, run

from feature_draft_models import export_feature_draft
from models import build_hf_model
from specdec_compile import cli as compile_cli
from specdec_compile.errors import SpecdecError
from specdec_compile.runtime import (FeatureDraft, OrtBackend, SamplingParams, SpecDecoder, TargetOnlyDecoder,
                                     open_backend)

ov = pytest.importorskip("openvino")
from specdec_compile.runtime import OpenVinoBackend  # noqa: E402
from specdec_compile.runtime.backends.openvino.fused import SLOT_POSITIONS, STALE, STALE_LIMIT, Cursor  # noqa: E402

PL, CL = 8, 64
PROMPTS = [[1, 5, 9, 33, 7, 100, 42, 17, 3, 8, 55], [1, 150, 20], [1, 2, 3, 4, 5, 6, 7, 8], [7] * 17, [9, 4]]


@pytest.fixture(scope="module")
def art(fixture_path, tmp_path_factory):
    """art(name, role, *flags, target="openvino") -> an artifact dir, compiled once per arguments
    (PL 8, CL 64); name "head" is the tiny feature draft."""
    root = tmp_path_factory.mktemp("ov_artifacts")
    made = {}

    def get(name, role, *flags, target="openvino"):
        if (name, role, flags, target) not in made:
            out = root / f"a{len(made)}"
            src = export_feature_draft(1) if name == "head" else fixture_path(name)
            assert compile_cli.main([str(src), "--role", role, "--target", target, "--prefill-len", str(PL),
                                     "--ctx-len", str(CL), "-o", str(out), *map(str, flags)]) == 0
            made[name, role, flags, target] = out
        return made[name, role, flags, target]

    return get


@pytest.fixture(scope="module")
def hf_greedy():
    return hf_greedy_of(build_hf_model("llama_gqa"))


def refused(argv, capsys, needle):
    code, _, err = run(argv, capsys)
    one_line_error(code, err, needle)


def f32(path, **kw):
    return OpenVinoBackend(path, precision="f32", threads=1, **kw)


@pytest.mark.parametrize("draft", ["llama_gqa", "gpt2"])
def test_greedy_dlm_equals_target_only_and_transformers(art, hf_greedy, draft):
    tlm, dlm = f32(art("llama_gqa", "tlm", "--k", 4)), f32(art(draft, "dlm"))
    assert tlm.exact and tlm.exactness()["note"] is None
    spec, base = SpecDecoder(tlm, dlm), TargetOnlyDecoder(tlm)
    for prompt in PROMPTS[:3]:
        s, b = spec.generate(prompt, max_new_tokens=30), base.generate(prompt, max_new_tokens=30)
        assert s.generated_ids == b.generated_ids == hf_greedy(prompt, 30), prompt
        assert (s.metrics["acceptance_rate"] == 1.0) == (draft == "llama_gqa")


@pytest.mark.parametrize("cache", ["fused", "copy"])
def test_ngram_draft_equals_target_only_and_ort(art, cache):
    tlm = f32(art("llama_gqa", "tlm", "--k", 4), cache=cache)
    assert tlm.cache_kind == cache
    ort = OrtBackend(art("llama_gqa", "tlm", "--k", 4, target="ort"))
    for prompt in PROMPTS:
        s = SpecDecoder(tlm, None, draft="ngram").generate(prompt, max_new_tokens=40)
        b = TargetOnlyDecoder(tlm).generate(prompt, max_new_tokens=40)
        assert s.generated_ids == b.generated_ids == TargetOnlyDecoder(ort).generate(
            prompt, max_new_tokens=40).generated_ids


def test_feature_draft_every_width_and_k0_fallback(art):
    """A TLM with --hidden-states and widths 0,1,3 (K=0 fallback), the feature head with its extra
    input and output: speculative == target-only, fixed k, adaptive and k=0."""
    tlm = f32(art("llama_gqa", "tlm", "--k", 3, "--k-list", "0,1,3", "--hidden-states", "-1"))
    head = f32(art("head", "dlm", "--k", 3, "--feature-layers", "-1"))
    assert tlm.extra_outputs and head.extra_inputs and head.extra_outputs
    spec, base = SpecDecoder(tlm, head, k=3), TargetOnlyDecoder(tlm)
    assert isinstance(spec.source, FeatureDraft)
    for p in PROMPTS[:3]:
        s = spec.generate(p, max_new_tokens=30)
        assert s.generated_ids == base.generate(p, max_new_tokens=30).generated_ids, p
        assert s.metrics["call_time_by_width"]["dlm"]
    ref = base.generate(PROMPTS[0], max_new_tokens=30).generated_ids
    assert SpecDecoder(tlm, head).generate(PROMPTS[0], max_new_tokens=30).generated_ids == ref
    assert SpecDecoder(tlm, head, k=0).generate(PROMPTS[0], max_new_tokens=30).generated_ids == ref


def test_every_width_matches_onnx_runtime(art):
    """Each specialization of the manifest, the same calls on OpenVINO (state inside) and on ONNX
    Runtime (the same graph, cache in host buffers): logits and cache agree at f32."""
    path = art("llama_gqa", "tlm", "--k", 3, "--k-list", "1,3")
    o, r = f32(path), OrtBackend(path)
    rng = np.random.default_rng(0)
    start = 0
    for width in o.seq_lens:
        ids = rng.integers(0, 200, size=(1, width))
        v = max(1, width - 1)                                   # right padding where there is room
        pos = np.full((1, width), -1)
        pos[0, :v] = np.arange(start, start + v)
        np.testing.assert_allclose(o.run(ids, pos)[0, :v], r.run(ids, pos)[0, :v], atol=1e-4)
        start += v
    for n in o.kv_names:
        np.testing.assert_allclose(o.cache(n), r.cache(n), atol=1e-5)


@pytest.mark.parametrize("cache", ["fused", "copy"])
def test_the_cache_never_crosses_to_the_host(art, cache):
    """The compiled model takes only the ids and positions (the fused cache also OpenVINO's
    beam_idx, one int32 per row, and the position each slot holds, one int per slot) and gives only
    the logits: a call cannot pass the cache through host buffers. The state variables hold it."""
    b = f32(art("llama_gqa", "tlm", "--k", 4), cache=cache)
    ins = sorted(p.get_any_name() for p in b.compiled.inputs)
    outs = sorted(p.get_any_name() for p in b.compiled.outputs)
    fused_ins = ["beam_idx", "input_ids", "position_ids", SLOT_POSITIONS]
    assert ins == (fused_ins if cache == "fused" else ["input_ids", "position_ids"]) and outs == ["logits"]
    if cache == "fused":
        assert b.compiled.input("beam_idx").get_partial_shape().to_shape() == [1]
        assert str(b.compiled.input(SLOT_POSITIONS).get_partial_shape()) == "[1,?]"
    assert sorted(b.states()) == sorted(b.kv_names) and len(b.kv_names) == 4
    ids, pos = np.array([[1, 5, 9, 33, 7, 100, 42, 17]]), np.arange(8)[None]
    first = b.run(ids, pos)
    kv = b.cache("past_key.0")
    assert kv.shape == (1, 2, CL, 16)
    assert np.abs(kv[0, :, :8]).sum() > 0 and np.all(kv[0, :, 8:] == 0)     # slots 0..7 written inside
    b.reset()
    assert all(np.all(b.cache(n) == 0) for n in b.kv_names)
    b.warmup()
    assert np.all(b.cache("past_key.0") == 0) and np.array_equal(b.run(ids, pos), first)
    # a feature draft: its features in and out are the only other tensors crossing
    head = f32(art("head", "dlm", "--k", 3, "--feature-layers", "-1"))
    assert sorted(p.get_any_name() for p in head.compiled.inputs) == ["hidden_states", "input_ids", "position_ids"]


class _RequestSpy:
    """An infer request that records what each call hands it; anything that would set a tensor
    by hand fails the test."""

    def __init__(self, req):
        self.req, self.feeds = req, []

    def infer(self, feed, **kw):
        self.feeds.append(sorted(feed))
        return self.req.infer(feed, **kw)

    def set_tensor(self, *a, **k):
        raise AssertionError("a tensor set by hand")

    set_input_tensor = set_tensors = set_input_tensors = set_tensor

    def __getattr__(self, name):
        return getattr(self.req, name)


@pytest.mark.parametrize("cache", ["fused", "copy"])
def test_a_decode_passes_only_ids_and_positions_per_call(art, cache):
    """Decoding (n-gram speculative: widths 1 and 5, rollback of rejected slots) hands the engine
    only input_ids and position_ids per call (and the fused cache's beam_idx and slot positions); the cache is written
    inside (the state read back after the calls holds the answer's slots). Copy path: what the
    engine copies is its own, one Assign per cache pair, each of the whole cache (the CPU plugin's
    double-buffered variables, docs/runtime.md). Fused: one stateful SDPA node per layer holds the
    cache (no Concat, no scatter, no attention MatMul left)."""
    b = f32(art("llama_gqa", "tlm", "--k", 4), cache=cache)
    spy = b._request = _RequestSpy(b._request)
    out = SpecDecoder(b, None, draft="ngram").generate(PROMPTS[3], max_new_tokens=20).generated_ids
    feed = ["beam_idx", "input_ids", "position_ids", SLOT_POSITIONS] if cache == "fused" else \
        ["input_ids", "position_ids"]
    assert len(spy.feeds) >= 5 and all(f == feed for f in spy.feeds)
    n = len(PROMPTS[3]) + len(out) - 1                  # slots written: the prompt and all but the last token
    kv = b.cache("past_key.0")
    assert (np.abs(kv[0, :, :n]).sum(axis=-1) > 0).all() and np.all(kv[0, :, n + 4 + 1:] == 0)
    rt = b.compiled.get_runtime_model()
    ops = rt.get_ordered_ops()
    kinds = [op.get_rt_info()["layerType"].astype(str) for op in ops]
    if cache == "copy":
        assert kinds.count("MemoryInput") == kinds.count("MemoryOutput") == len(b.kv_names)
        return
    layers = len(b.kv_names) // 2
    stateful = [o for o, k in zip(ops, kinds) if k == "ScaledDotProductAttention" and o.get_input_size() >= 6]
    assert len(stateful) == kinds.count("ScaledDotProductAttention") == layers
    assert "ScatterElementsUpdate" not in kinds and "Softmax" not in kinds and kinds.count("MatMul") <= 1


def _calls(rng, widths):
    """A call sequence over a fused cache: prefill (padded), single steps, verifications with
    rollbacks to a draft in the middle, padding at the right end."""
    p, out = 0, []
    for w, v, back in [(8, 8, 0), (1, 1, 0), (4, 4, 2), (4, 3, 0), (1, 1, 1), (2, 2, 0), (8, 5, 0), (4, 4, 3),
                       (1, 1, 0), (4, 1, 0), (2, 2, 0)]:
        w = w if w in widths else max(x for x in widths if x <= w)
        v = min(v, w)
        p -= back
        pos = np.full((1, w), -1)
        pos[0, :v] = np.arange(p, p + v)
        out.append((rng.integers(0, 200, size=(1, w)), pos, v))
        p += v
    return out


@pytest.mark.parametrize("stale_limit", [None, 0, 2])
def test_fused_cache_equals_the_copy_path_through_rollbacks(art, stale_limit):
    """The default cache is the fused one where the graph allows it; call for call (rollbacks, right
    padding, every width) its logits equal the copy path's and its cache the fixed cache's slots,
    whether the rolled-back slots stay masked (the default limit: never compacted here), are trimmed
    at once (0) or are gathered out from between valid slots (2)."""
    path = art("llama_gqa", "tlm", "--k", 3, "--k-list", "0,1,3")
    fused, copy = f32(path, stale_limit=stale_limit), f32(path, cache="copy")
    assert fused.cache_kind == "fused" and fused.model.cache_note is None and copy.cache_kind == "copy"
    assert fused.exactness()["cache"] == "fused" and "fused cache" in fused.describe()
    cur, stale_seen = fused._cursor, 0
    for ids, pos, v in _calls(np.random.default_rng(1), set(fused.seq_lens)):
        np.testing.assert_allclose(fused.run(ids, pos)[0, :v], copy.run(ids, pos)[0, :v], atol=1e-5)
        end = int(pos[0, v - 1]) + 1
        for n in fused.kv_names:
            np.testing.assert_allclose(fused.cache(n)[:, :, :end], copy.cache(n)[:, :, :end], atol=1e-5)
        held = cur.slots[cur.slots != STALE]
        assert np.array_equal(held, np.arange(cur.valid)) and cur.length == fused.states()["past_key.0"].state.shape[2]
        stale_seen = max(stale_seen, cur.length - cur.valid)
    if stale_limit is None:
        assert cur.compactions == 0 and stale_seen > 2       # every rollback masked, none compacted
    else:
        assert cur.compactions >= 3 and stale_seen <= stale_limit + max(fused.seq_lens)


def test_the_cursor_marks_rollbacks_stale_and_refuses_gaps():
    """Slot bookkeeping without an engine: a call's first position marks that position and every
    later one stale; padded rows are stale from the start; a call past the last valid position + 1
    and a negative limit are refused in one line."""
    cur = Cursor(["k"], "tlm", stale_limit=100)
    S = STALE
    f = cur.feeds(None, np.array([[0, 1, 2, -1]]))
    assert f["beam_idx"].tolist() == [0] and f[SLOT_POSITIONS].tolist() == [[0, 1, 2, S]] and cur.valid == 3
    f = cur.feeds(None, np.array([[3, 4, 5]]))
    assert f[SLOT_POSITIONS].tolist() == [[0, 1, 2, S, 3, 4, 5]]
    f = cur.feeds(None, np.array([[4, 5]]))                  # positions 4 and 5 rejected: written again
    assert f[SLOT_POSITIONS].tolist() == [[0, 1, 2, S, 3, S, S, 4, 5]] and cur.valid == 6
    data = np.arange(9, dtype=np.float32).reshape(1, 1, 9, 1)
    assert cur.contract_view(data, (1, 1, 8, 1))[0, 0, :, 0].tolist() == [0, 1, 2, 4, 7, 8, 0, 0]
    with pytest.raises(SpecdecError, match=r"^tlm: the fused OpenVINO cache holds positions 0\.\.5 and the call "
                                           r"starts at 7"):
        cur.feeds(None, np.array([[7]]))
    with pytest.raises(SpecdecError, match="stale-slot limit must be >= 0"):
        Cursor(["k"], "tlm", stale_limit=-1)


def test_fused_cache_refusals_and_fallbacks(art, fixture_path, tmp_path):
    """A call that starts past the fused cache's end is refused in one line; a graph the matcher
    does not rebuild (GPT-2's attention, a batch of 2, a cache write that is not the contract's)
    runs the copy path and says why, and asking for the fused cache there is refused in one line."""
    b = f32(art("llama_gqa", "tlm", "--k", 4))
    b.run(np.arange(1, 9)[None], np.array([[0, 1, 2, 3, -1, -1, -1, -1]]))     # slots 4..7 taken by padding
    with pytest.raises(SpecdecError, match=r"holds positions 0\.\.3 and the call starts at 5") as e:
        b.run(np.array([[7, 8, 9, 10]]), np.arange(5, 9)[None])
    assert "\n" not in str(e.value)
    b.run(np.array([[7, 8, 9, 10]]), np.arange(4, 8)[None])     # at the end: fine
    gpt2 = art("gpt2", "tlm", "--k", 4)
    g = f32(gpt2)
    assert g.cache_kind == "copy" and g.model.cache_note.startswith("the cache is copied per call (no fused cache:")
    with pytest.raises(SpecdecError, match="no fused OpenVINO cache: ") as e:
        f32(gpt2, cache="fused")
    assert "\n" not in str(e.value)
    two = f32(art("llama_gqa", "tlm", "--k", 4, "--batch-size", "2"))
    assert two.cache_kind == "copy" and "batch 2" in two.model.cache_note
    with pytest.raises(SpecdecError, match="unknown OpenVINO cache 'grown'"):
        f32(gpt2, cache="grown")
    # a hand-edited write that adds to the slot: the fused cache would not run that graph's write
    import shutil

    import onnx
    src = art("llama_gqa", "tlm", "--k", 4)
    bad = tmp_path / "bad"
    shutil.copytree(src, bad)
    m = onnx.load(str(bad / "model.onnx"))
    next(n for n in m.graph.node if n.op_type == "ScatterElements").attribute.append(
        onnx.helper.make_attribute("reduction", "add"))
    onnx.save(m, str(bad / "model.onnx"))
    from specdec_compile.runtime.backends.openvino.loader import load_openvino
    with pytest.raises(SpecdecError, match="not a plain write along the slots"):
        load_openvino(bad, precision="f32", cache="fused")


def test_batch_2_continuous_batching(art, tmp_path):
    tlm = f32(art("llama_gqa", "tlm", "--k", 4, "--batch-size", "2"))
    dlm = f32(art("llama_gqa", "dlm", "--batch-size", "2"))
    s = SpecDecoder(tlm, dlm).generate_many(PROMPTS, max_new_tokens=20)        # 5 prompts, 2 rows
    b = TargetOnlyDecoder(tlm).generate_many(PROMPTS, max_new_tokens=20)
    assert [x.generated_ids for x in s] == [x.generated_ids for x in b]
    one = TargetOnlyDecoder(f32(art("llama_gqa", "tlm", "--k", 4)))
    assert [x.generated_ids for x in b] == [one.generate(p, max_new_tokens=20).generated_ids for p in PROMPTS]
    params = SamplingParams(0.8, top_p=0.95, seed=3)
    s = SpecDecoder(tlm, dlm).generate_many(PROMPTS, max_new_tokens=15, sampling=params)
    b = TargetOnlyDecoder(tlm).generate_many(PROMPTS, max_new_tokens=15, sampling=params)
    assert [x.generated_ids for x in s] == [x.generated_ids for x in b]


def test_precision_option_and_exactness_record(art):
    caps = set(ov.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES"))
    path = art("llama_gqa", "tlm", "--k", 4)
    assert f32(path).precision == "f32"
    low = "bf16" if "BF16" in caps else "f16" if "FP16" in caps else None
    if low is None:
        with pytest.raises(SpecdecError, match="cannot run OpenVINO at bf16"):
            OpenVinoBackend(path, precision="bf16")
        return
    b = OpenVinoBackend(path, precision=low, threads=1)
    rec = b.exactness()
    assert b.precision == low and not b.exact and rec["greedy_equals_target_only"] is False
    assert low in rec["note"] and "\n" not in rec["note"]
    assert b.exactness(speculative=False)["greedy_equals_target_only"] is True
    # below f32 too the default cache is the fused one, trimmed at every rollback, its state held at that precision
    assert b.cache_kind == "fused" and rec["cache_note"] is None and b._cursor.stale_limit == 0
    assert b.states()["past_key.0"].state.element_type.get_type_name() == low
    assert OpenVinoBackend(path, precision=low, threads=1, cache="copy").cache_kind == "copy"
    assert OpenVinoBackend(path, precision=low, threads=1, cache="fused", stale_limit=4)._cursor.stale_limit == 4
    # on more threads a trimmed cache does not keep the logits either (docs/runtime.md): masked, as at f32
    assert OpenVinoBackend(path, precision=low, threads=2)._cursor.stale_limit == STALE_LIMIT
    assert f32(path)._cursor.stale_limit == STALE_LIMIT


def _width_invariance(b, widths, rng):
    """A position's logits from calls of each width (rollbacks of the last two rows) against calls of
    one: (the largest difference, rows compared)."""
    seq = rng.integers(0, 200, 60)
    b.reset()
    b.run(seq[None, :8], np.arange(8)[None])
    ref = {p: b.run(seq[None, p:p + 1], np.array([[p]]))[0, 0] for p in range(8, 60)}
    worst, rows = 0.0, 0
    for w in widths:
        b.reset()
        b.run(seq[None, :8], np.arange(8)[None])
        p, keep = 8, max(1, w - 2)
        while p + w <= 60:
            ids = seq[p:p + w].copy()
            ids[keep:] = 7                           # rejected drafts: written, then rolled back
            out = b.run(ids[None], np.arange(p, p + w)[None])[0]
            worst = max([worst] + [float(np.abs(out[i] - ref[p + i]).max()) for i in range(keep)])
            rows, p = rows + keep, p + keep
    return worst, rows


def test_a_trimmed_fused_cache_gives_every_width_the_same_logits(art, fixture_path):
    """A fused cache trimmed at every rollback holds the same slots a width-1 decode holds, and a
    position's logits are the same bit for bit at every compiled width, at f32 and (where the CPU
    has it) bf16, for two families; the masked rollback (the f32 default) is within float32
    rounding of them."""
    caps = set(ov.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES"))
    precs = ["f32"] + (["bf16"] if "BF16" in caps else [])
    for fam in ("llama_gqa", "qwen2"):
        path = art(fam, "tlm", "--k", 4, "--k-list", "0,1,2,4")
        for prec in precs:
            b = OpenVinoBackend(path, precision=prec, threads=1, stale_limit=0)
            assert b.cache_kind == "fused"
            widths = [w for w in b.seq_lens if 1 < w <= 5]
            worst, rows = _width_invariance(b, widths, np.random.default_rng(0))
            assert worst == 0.0 and rows > 40, (fam, prec, worst)
        masked = OpenVinoBackend(path, precision="f32", threads=1)
        assert masked._cursor.stale_limit > 0
        worst, rows = _width_invariance(masked, [5], np.random.default_rng(0))
        assert worst < 1e-4, (fam, worst)


def test_cli_backend_openvino(art, capsys):
    t, d = art("llama_gqa", "tlm", "--k", 4), art("gpt2", "dlm")
    code, out, err = run(["--tlm", str(t), "--dlm", str(d), "--backend", "openvino", "--ov-precision", "f32",
                          "--ov-threads", "1", "--prompt-ids", "1,5,9,33,7", "--max-new-tokens", "12", "--json"], capsys)
    assert code == 0, err
    rec = json.loads(out)
    assert rec["backend"]["greedy_equals_target_only"] is True and rec["backend"]["precision"] == "f32"
    assert "note:" not in err
    code, out2, _ = run(["--tlm", str(t), "--target-only", "--backend", "openvino", "--ov-precision", "f32",
                         "--prompt-ids", "1,5,9,33,7", "--max-new-tokens", "12", "--json"], capsys)
    assert json.loads(out2)["results"][0]["generated_ids"] == rec["results"][0]["generated_ids"]
    assert rec["backend"]["cache"] == "fused" and rec["backend"]["cache_note"] is None
    # the draft model's own cache, not the TLM's: GPT-2 has no fused cache (it recorded the TLM's only)
    assert rec["backend"]["draft"]["cache"] == "copy" and rec["backend"]["draft"]["cache_note"]
    assert rec["backend"]["draft"]["precision"] == "f32" and json.loads(out2)["backend"]["draft"] is None
    code, out3, err = run(["--tlm", str(t), "--target-only", "--backend", "openvino", "--ov-precision", "f32",
                           "--ov-cache", "copy", "--prompt-ids", "1,5,9,33,7", "--max-new-tokens", "12", "--json"],
                          capsys)
    assert code == 0, err
    rec3 = json.loads(out3)
    assert rec3["backend"]["cache"] == "copy" and rec3["results"][0]["generated_ids"] == rec["results"][0]["generated_ids"]
    refused(["--tlm", str(art("gpt2", "tlm", "--k", 4)), "--target-only", "--backend", "openvino", "--ov-cache",
             "fused", "--prompt-ids", "1,2"], capsys, "no fused OpenVINO cache: ")
    refused(["--tlm", str(t), "--target-only", "--ov-cache", "copy", "--prompt-ids", "1,2"], capsys,
            "--ov-cache is for --backend openvino")


def test_cli_says_when_greedy_may_differ(art, capsys):
    caps = set(ov.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES"))
    if "BF16" not in caps:
        pytest.skip("this CPU has no bf16")
    code, out, err = run(["--tlm", str(art("llama_gqa", "tlm", "--k", 4)), "--draft", "ngram", "--backend", "openvino",
                          "--ov-precision", "bf16", "--prompt-ids", "1,5,9,33,7", "--max-new-tokens", "8", "--json"],
                         capsys)
    assert code == 0
    notes = [line for line in err.splitlines() if "note:" in line]
    assert len(notes) == 1 and "bf16" in notes[0] and "differ from target-only" in notes[0]
    assert json.loads(out)["backend"]["greedy_equals_target_only"] is False


def test_refusals_are_one_line(art, capsys, monkeypatch):
    ort_art = art("llama_gqa", "tlm", "--k", 4, target="ort")
    with pytest.raises(SpecdecError, match="compiled for --target ort; the openvino backend runs"):
        OpenVinoBackend(ort_art)
    with pytest.raises(SpecdecError, match="compiled for --target ort"):
        open_backend(ort_art, "openvino")
    refused(["--tlm", str(ort_art), "--target-only", "--backend", "openvino", "--prompt-ids", "1,2"],
                   capsys, "compiled for --target ort")
    refused(["--tlm", str(ort_art), "--target-only", "--ov-threads", "2", "--prompt-ids", "1,2"],
                   capsys, "--ov-threads is for --backend openvino")
    b = f32(art("llama_gqa", "tlm", "--k", 4))
    with pytest.raises(SpecdecError, match="matches no specialization"):
        b.run(np.zeros((1, 3), np.int64), np.arange(3)[None])
    with pytest.raises(SpecdecError, match="batch_index"):
        b.run(np.zeros((1, 4), np.int64), np.arange(4)[None], rows=[0])
    monkeypatch.setitem(__import__("sys").modules, "openvino", None)     # not installed
    refused(["--tlm", str(ort_art), "--target-only", "--backend", "openvino", "--prompt-ids", "1,2"],
                   capsys, "pip install 'specdec-compile[openvino]'")
    with pytest.raises(SpecdecError, match=r"needs OpenVINO, which is not installed: pip install"):
        OpenVinoBackend(art("llama_gqa", "tlm", "--k", 4))


def test_a_thread_count_openvino_would_lower_is_refused(art, capsys, monkeypatch):
    """OpenVINO's CPU plugin runs at most as many threads as the host has cores: threads=8 on 2 cores
    compiled at 2 without a word. A count it does not keep is refused in one line, from the
    constructor, SPECDEC_OV_THREADS and --ov-threads alike; a count it keeps is what runs and what
    --json records."""
    from specdec_compile.ort_session import max_threads
    path, many = art("llama_gqa", "tlm", "--k", 4), max_threads()     # above any host's cores
    with pytest.raises(SpecdecError, match=f"{many} OpenVINO threads asked for .threads., but OpenVINO's CPU "
                                           f"plugin runs at most [0-9]+ on this host") as e:
        OpenVinoBackend(path, precision="f32", threads=many)
    assert "\n" not in str(e.value)
    refused(["--tlm", str(path), "--target-only", "--backend", "openvino", "--ov-precision", "f32", "--ov-threads",
             str(many), "--prompt-ids", "1,5,9", "--max-new-tokens", "2"], capsys, "OpenVINO threads asked for")
    monkeypatch.setenv("SPECDEC_OV_THREADS", str(many))
    with pytest.raises(SpecdecError, match=f"{many} OpenVINO threads asked for .SPECDEC_OV_THREADS."):
        OpenVinoBackend(path, precision="f32")
    monkeypatch.delenv("SPECDEC_OV_THREADS")
    b = f32(path)
    assert b.threads == 1 and b.exactness()["threads"] == 1
    code, out, err = run(["--tlm", str(path), "--target-only", "--backend", "openvino", "--ov-precision", "f32",
                          "--ov-threads", "1", "--prompt-ids", "1,5,9", "--max-new-tokens", "2", "--json"], capsys)
    assert code == 0, err
    assert json.loads(out)["backend"]["threads"] == 1


def test_qeff_interface_refused_for_the_openvino_target(fixture_path, tmp_path, capsys):
    code = compile_cli.main([str(fixture_path("llama_gqa")), "--role", "tlm", "--k", "3", "--target", "openvino",
                             "--interface", "qeff", "-o", str(tmp_path / "q")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "--interface qeff is for --target qaic or ort" in err[0]
    assert not (tmp_path / "q").exists()


def test_the_kv_fusion_probe_sees_the_plugins_in_place_cache():
    """scripts/ov_kv_fusion.py (docs/runtime.md, "What a growing cache would take"): OpenVINO's own
    ReadValue -> Gather(beam_idx) -> Concat -> SDPA -> Assign compiles to one stateful SDPA node
    (no MatMul, no Concat left), and ONNX Attention with past/present, made stateful, computes
    what numpy does over 4 calls, with and without the Gather."""
    from scripts import ov_kv_fusion as probe
    core = ov.Core()
    got = probe.native(core, True)
    assert got["stateful_sdpa"] == 1 and got["matmul"] == 0 and got["concat"] == 0, got
    for gather in (False, True):
        assert probe.onnx_attention(core, gather)["max_abs_err"] < 1e-5
