"""The runtime end to end on real artifacts: tiny exported models, rewritten
by specdec-compile, run by ONNX Runtime; checked against transformers' own
greedy ``generate()`` of the original torch model."""
from __future__ import annotations

import shutil

import numpy as np
import pytest
from runtime_helpers import hf_greedy_of

from models import build_hf_model
from specdec_compile import cli as compile_cli
from specdec_compile.errors import SpecdecError
from specdec_compile.runtime import OrtBackend, SamplingParams, SpecDecoder, TargetOnlyDecoder, load_artifact

PL, CL = 8, 64
PROMPTS = [[1, 5, 9, 33, 7, 100, 42, 17, 3, 8, 55], [1, 150, 20], [1, 2, 3, 4, 5, 6, 7, 8]]


@pytest.fixture(scope="module")
def artifact(fixture_path, tmp_path_factory):
    """artifact(name, role, target="ort", k=None, k_list=None, ctx=CL) -> artifact dir (built once)."""
    root = tmp_path_factory.mktemp("rt_artifacts")
    made = {}

    def get(name, role, target="ort", k=None, k_list=None, ctx=CL, pl=PL):
        key = (name, role, target, k, tuple(k_list or ()), ctx, pl)
        if key not in made:
            out = root / "-".join(str(x) for x in key if x not in (None, ()))
            argv = [str(fixture_path(name)), "--role", role, "--target", target, "--prefill-len", str(pl),
                    "--ctx-len", str(ctx), "-o", str(out)]
            if k is not None:
                argv += ["--k", str(k)]
            if k_list:
                argv += ["--k-list", ",".join(map(str, k_list))]
            assert compile_cli.main(argv) == 0
            made[key] = out
        return made[key]

    return get


@pytest.fixture(scope="module")
def hf_greedy():
    return hf_greedy_of(build_hf_model("llama_gqa"))


@pytest.mark.parametrize("k", [1, 2, 4, 7])
@pytest.mark.parametrize("draft", ["llama_gqa", "llama_dynamo", "gpt2"])
def test_greedy_equals_target_only_and_transformers(artifact, hf_greedy, k, draft):
    tlm = OrtBackend(artifact("llama_gqa", "tlm", k=k))
    dlm = OrtBackend(artifact(draft, "dlm"))
    spec, base = SpecDecoder(tlm, dlm), TargetOnlyDecoder(tlm)
    for prompt in PROMPTS:
        ref = hf_greedy(prompt, 30)
        s = spec.generate(prompt, max_new_tokens=30)
        b = base.generate(prompt, max_new_tokens=30)
        assert s.generated_ids == ref, (prompt, s.generated_ids, ref)
        assert b.generated_ids == ref
        if draft == "gpt2":   # an independent draft: rejections
            assert s.metrics["acceptance_rate"] < 0.5
        else:                 # the same weights (llama_dynamo: another exporter): all accepted
            assert s.metrics["acceptance_rate"] == 1.0
            if k > 1:
                assert s.metrics["call_time_by_width"]["dlm"].get("2", [0])[0] > 0   # seq_len 2 used


def test_qaic_target_runs_in_ort_with_swapped_buffers(artifact, hf_greedy):
    tlm = OrtBackend(artifact("llama_gqa", "tlm", target="qaic", k=4))
    dlm = OrtBackend(artifact("gpt2", "dlm", target="qaic"))
    assert not tlm.inplace and not dlm.inplace
    for prompt in PROMPTS[:2]:
        assert SpecDecoder(tlm, dlm).generate(prompt, max_new_tokens=25).generated_ids == hf_greedy(prompt, 25)


def test_inplace_binding_updates_the_input_buffer_and_copy_path_agrees(artifact):
    path = artifact("llama_gqa", "tlm", k=4)
    ip, cp = OrtBackend(path), OrtBackend(path, inplace=False)
    assert ip.inplace and not cp.inplace
    ov = ip._a["past_key.0"]
    ptr = ov.data_ptr()
    ids = np.array([[1, 5, 9, 33, 7, 100, 42, 17]])
    pos = np.arange(8)[None]
    la, lb = ip.run(ids, pos), cp.run(ids, pos)
    assert np.array_equal(la, lb)
    assert ip._a["past_key.0"] is ov and ov.data_ptr() == ptr
    kv = ov.numpy()
    assert np.abs(kv[0, :, :8]).sum() > 0 and np.all(kv[0, :, 8:] == 0)   # written in place, slots 0..7
    assert np.array_equal(kv, cp.cache("past_key.0"))
    ip.reset()
    assert np.all(ip.cache("past_key.0") == 0)
    ip.warmup()
    assert np.all(ip.cache("past_key.0") == 0) and np.array_equal(ip.run(ids, pos), la)
    dlm = OrtBackend(artifact("gpt2", "dlm"), inplace=False)
    p = PROMPTS[0]
    assert (SpecDecoder(cp, dlm).generate(p, max_new_tokens=20).generated_ids
            == SpecDecoder(ip, OrtBackend(artifact("gpt2", "dlm"))).generate(p, max_new_tokens=20).generated_ids)


def test_eos_in_the_middle_of_a_round(artifact, hf_greedy):
    tlm = OrtBackend(artifact("llama_gqa", "tlm", k=7))
    dlm = OrtBackend(artifact("llama_gqa", "dlm"))
    prompt = PROMPTS[0]
    ref = hf_greedy(prompt, 30)
    i = next(i for i in range(2, 7) if ref[i] not in ref[:i])    # first occurrence inside round 1
    s = SpecDecoder(tlm, dlm, eos_token_id=ref[i]).generate(prompt, max_new_tokens=30)
    b = TargetOnlyDecoder(tlm, eos_token_id=ref[i]).generate(prompt, max_new_tokens=30)
    assert s.generated_ids == b.generated_ids == ref[: i + 1]
    assert s.stop_reason == "eos"


@pytest.mark.parametrize("k", [2, 7])
def test_prompt_running_into_the_context_limit(artifact, hf_greedy, k):
    ctx = 24
    tlm = OrtBackend(artifact("llama_gqa", "tlm", k=k, ctx=ctx))
    for draft in ("llama_gqa", "gpt2"):
        dlm = OrtBackend(artifact(draft, "dlm", ctx=ctx))
        prompt = PROMPTS[0] + PROMPTS[1] + [60, 61, 62]      # 17 tokens: 7 left
        s = SpecDecoder(tlm, dlm).generate(prompt, max_new_tokens=100)
        b = TargetOnlyDecoder(tlm).generate(prompt, max_new_tokens=100)
        assert s.generated_ids == b.generated_ids == hf_greedy(prompt, ctx - len(prompt))
        assert s.stop_reason == "ctx_len" and len(s.generated_ids) == ctx - len(prompt)
        with pytest.raises(SpecdecError, match="does not fit"):
            SpecDecoder(tlm, dlm).generate(list(range(1, ctx + 1)))


def test_several_widths(artifact, hf_greedy):
    tlm = OrtBackend(artifact("llama_gqa", "tlm", k=3, k_list=[1, 6]))
    assert tlm.artifact.k_list == (1, 3, 6)
    for draft in ("llama_gqa", "gpt2"):
        dlm = OrtBackend(artifact(draft, "dlm"))
        s = SpecDecoder(tlm, dlm).generate(PROMPTS[0], max_new_tokens=30)
        assert s.generated_ids == hf_greedy(PROMPTS[0], 30)


def test_sampling_real_models(artifact):
    tlm = OrtBackend(artifact("llama_gqa", "tlm", k=4))
    same = SpecDecoder(tlm, OrtBackend(artifact("llama_gqa", "dlm")))
    params = SamplingParams(0.9, top_k=50, top_p=0.95, seed=11)
    a = same.generate(PROMPTS[0], max_new_tokens=30, sampling=params)
    assert a.generated_ids == same.generate(PROMPTS[0], max_new_tokens=30, sampling=params).generated_ids
    assert a.metrics["acceptance_rate"] > 0.9
    other = SpecDecoder(tlm, OrtBackend(artifact("gpt2", "dlm")))
    r = other.generate(PROMPTS[0], max_new_tokens=30, sampling=params)
    assert len(r.generated_ids) == 30 and r.metrics["acceptance_rate"] < 0.9


def test_backend_errors(artifact, tmp_path):
    tlm = OrtBackend(artifact("llama_gqa", "tlm", k=4))
    with pytest.raises(SpecdecError, match="matches no specialization"):
        tlm.run(np.zeros((1, 1), np.int64), np.zeros((1, 1), np.int64))
    with pytest.raises(SpecdecError, match="matches no specialization"):
        tlm.run(np.zeros((2, 4), np.int64), np.zeros((2, 4), np.int64))
    with pytest.raises(SpecdecError, match="DLM"):
        OrtBackend(artifact("llama_gqa", "tlm", k=4), expect_role="dlm")
    bad = tmp_path / "bad"
    shutil.copytree(artifact("llama_gqa", "dlm"), bad)
    (bad / "model.onnx").write_bytes(b"\x08\x07garbage" * 10)
    with pytest.raises(SpecdecError, match="ONNX Runtime cannot load it"):
        OrtBackend(bad)
    assert load_artifact(bad).role == "dlm"   # the directory itself reads fine


def test_target_only_on_a_seq_len_1_compile_of_the_target(tmp_path):
    """The baseline without padded steps: the target compiled as --role dlm
    (PL/2/1) decodes exactly what the TLM artifact decodes."""
    from models import export_fixture
    from specdec_compile import cli as compile_cli
    from specdec_compile.runtime import OrtBackend, TargetOnlyDecoder

    src = str(export_fixture("llama_gqa"))
    tlm_dir, base_dir = tmp_path / "tlm", tmp_path / "base"
    common = ["--target", "ort", "--ctx-len", "64", "--prefill-len", "8"]
    assert compile_cli.main([src, "--role", "tlm", "--k", "3", "-o", str(tlm_dir)] + common) == 0
    assert compile_cli.main([src, "--role", "dlm", "-o", str(base_dir)] + common) == 0
    prompt = [5, 9, 17, 33, 2 + 40, 7, 7, 100, 3, 61, 11]
    a = TargetOnlyDecoder(OrtBackend(tlm_dir)).generate(prompt, max_new_tokens=20)
    b = TargetOnlyDecoder(OrtBackend(base_dir), record_calls=True).generate(prompt, max_new_tokens=20)
    assert a.generated_ids == b.generated_ids and len(b.generated_ids) == 20
    widths = {c[1] for c in b.metrics["calls"] if c[1] != 8}
    assert widths == {1}
