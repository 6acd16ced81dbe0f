"""``specdec-run`` serving options on a real tiny export (ONNX Runtime): --draft ngram,
--k-list 0 fallback, several prompts, bad input as one line + exit 2."""
from __future__ import annotations

import json

import pytest
from runtime_helpers import make_tokenizer, one_line_error, run

from specdec_compile import cli as compile_cli
from specdec_compile.cli import run as run_cli
from specdec_compile.ort_session import SPIN_STOP, has_entry

PL, CL = 8, 64
IDS = [1, 5, 9, 33, 7, 100, 42, 17, 3, 8, 55, 1, 5, 9, 33, 7]


@pytest.fixture(scope="module")
def arts(fixture_path, tmp_path_factory):
    root = tmp_path_factory.mktemp("serving_cli")
    made = {}

    def get(name, role, target="ort", k=None, k_list=None, batch=1):
        key = (name, role, target, k, k_list, batch)
        if key not in made:
            out = root / "-".join(str(x) for x in key if x is not None)
            argv = [str(fixture_path(name)), "--role", role, "--target", target, "--prefill-len", str(PL),
                    "--ctx-len", str(CL), "--batch-size", str(batch), "-o", str(out)]
            if k is not None:
                argv += ["--k", str(k)]
            if k_list is not None:
                argv += ["--k-list", k_list]
            assert compile_cli.main(argv) == 0
            made[key] = out
        return made[key]

    return get


def ids_of(out):
    return [r["generated_ids"] for r in json.loads(out)["results"]]


def test_ngram_drafts_equal_target_only(arts, capsys):
    tlm = arts("llama_gqa", "tlm", k=4)
    base = ["--tlm", tlm, "--prompt-ids", ",".join(map(str, IDS)), "--max-new-tokens", 24, "--json",
            "--eos-id", -1]
    code, out, err = run(base + ["--target-only"], capsys)
    assert code == 0, err
    want = ids_of(out)
    for extra in (["--draft", "ngram"], ["--draft", "ngram", "--ngram-max", "1"],
                  ["--draft", "ngram", "--k", "3"]):
        code, out, err = run(base + extra, capsys)
        assert code == 0, err
        assert ids_of(out) == want, extra


def test_k_list_zero_compiles_width_one_and_decodes(arts, capsys):
    tlm = arts("llama_gqa", "tlm", k=4, k_list="0,4")
    man = json.loads((tlm / "manifest.json").read_text())
    assert 0 in man["k_list"]
    base = ["--tlm", tlm, "--prompt-ids", ",".join(map(str, IDS)), "--max-new-tokens", 24, "--json",
            "--eos-id", -1]
    code, out, err = run(base + ["--target-only"], capsys)
    want = ids_of(out)
    for extra in (["--draft", "ngram"], ["--draft", "ngram", "--k", "0"], ["--dlm", arts("llama_gqa", "dlm")],
                  ["--dlm", arts("llama_gqa", "dlm"), "--no-fallback"]):
        code, out, err = run(base + extra, capsys)
        assert code == 0, err
        assert ids_of(out) == want, extra


def test_ngram_bad_input(arts, capsys):
    tlm = arts("llama_gqa", "tlm", k=4)
    base = ["--tlm", tlm, "--prompt-ids", "1,2,3"]
    one_line_error(*run(base + ["--draft", "ngram", "--dlm", arts("llama_gqa", "dlm")], capsys)[::2], "no --dlm")
    one_line_error(*run(base + ["--draft", "ngram", "--ngram-max", "0"], capsys)[::2], "--ngram-max")
    one_line_error(*run(base + ["--ngram-max", "2", "--dlm", arts("llama_gqa", "dlm")], capsys)[::2],
                   "--draft ngram")
    one_line_error(*run(base, capsys)[::2], "--dlm DIR is required")


def test_every_eos_of_generation_config_stops(arts, capsys, tmp_path):
    tok = make_tokenizer(tmp_path / "tok")
    tlm = arts("llama_gqa", "tlm", k=4)
    base = ["--tlm", tlm, "--dlm", arts("llama_gqa", "dlm"), "--prompt-ids", ",".join(map(str, IDS)),
            "--max-new-tokens", 20, "--json"]
    code, out, err = run(base + ["--eos-id", -1], capsys)
    ids = ids_of(out)[0]
    stop = next(t for t in ids[2:] if t != 2)
    code, out, err = run(base + ["--tokenizer", tok], capsys)      # only the tokenizer's EOS (2)
    assert code == 0, err
    assert ids_of(out)[0] == ids[: ids.index(2) + 1] if 2 in ids else ids_of(out)[0] == ids
    (tok / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, stop]}))
    code, out, err = run(base + ["--tokenizer", tok], capsys)
    r = json.loads(out)["results"][0]
    assert r["generated_ids"] == ids[: ids.index(stop) + 1] and r["metrics"]["stop_reason"] == "eos"
    (tok / "generation_config.json").write_text(json.dumps({"eos_token_id": stop}))
    ngram = ["--tlm", tlm, "--draft", "ngram", "--prompt-ids", ",".join(map(str, IDS)), "--max-new-tokens", 20,
             "--json", "--tokenizer", tok]
    code, out, err = run(ngram, capsys)
    assert code == 0, err
    assert json.loads(out)["results"][0]["generated_ids"] == ids[: ids.index(stop) + 1]
    (tok / "generation_config.json").write_text(json.dumps({"eos_token_id": "x"}))
    one_line_error(*run(base + ["--tokenizer", tok], capsys)[::2], "generation_config.json")


def test_thread_options():
    from specdec_compile.errors import SpecdecError
    assert run_cli.ort_thread_options(None, two_models=False) == {}
    so = run_cli.ort_thread_options(None, two_models=True)["session_options"]
    assert so.intra_op_num_threads >= 1
    assert not has_entry(so, "session.intra_op.allow_spinning")   # threads spin inside a call (the default)
    assert run_cli.ort_thread_options(1, two_models=False)["session_options"].intra_op_num_threads == 1
    with pytest.raises(SpecdecError):
        run_cli.ort_thread_options(0, two_models=False)


def test_sessions_stop_spinning_when_a_call_returns(arts):
    """Every runtime session idles its threads between calls (two alternating sessions would
    otherwise fight for the cores), unless the caller's own options say otherwise."""
    import onnxruntime as ort
    from specdec_compile.runtime import OrtBackend

    art = arts("llama_gqa", "tlm", k=4)
    opts = OrtBackend(art, intra_op_threads=2).session.get_session_options()
    assert opts.get_session_config_entry(SPIN_STOP) == "1" and opts.intra_op_num_threads == 2
    mine = ort.SessionOptions()
    mine.add_session_config_entry(SPIN_STOP, "0")
    assert OrtBackend(art, session_options=mine).session.get_session_options().get_session_config_entry(SPIN_STOP) == "0"
    cli = run_cli.ort_thread_options(None, two_models=True)["session_options"]
    assert OrtBackend(art, session_options=cli).session.get_session_options().get_session_config_entry(SPIN_STOP) == "1"


def test_only_logits_reach_the_host(arts):
    """The CUDA binding plan, checked without a GPU: logits bound on the host, the
    cache on the model's device, and no copy of every output per call."""
    from specdec_compile.runtime import OrtBackend
    from specdec_compile.runtime.backends.ort.runner import output_plan

    plan = output_plan("cuda", ["past_key.0", "past_value.0"])
    assert plan == {"logits": "cpu", "past_key.0_RetainedState": "cuda", "past_value.0_RetainedState": "cuda"}
    b = OrtBackend(arts("llama_gqa", "tlm", k=4))
    assert b.plan["logits"] == "cpu" and all(v == "cpu" for v in b.plan.values())

    class NoCopy:
        def __init__(self, io):
            self.io = io

        def __getattr__(self, name):
            if name == "copy_outputs_to_cpu":
                raise AssertionError("copy_outputs_to_cpu copies the whole cache")
            return getattr(self.io, name)

    b._io = NoCopy(b._io)
    out = b.run([[5, 6, 7, 8]], [[0, 1, 2, 3]])
    assert out.shape[:2] == (1, 4)
    outs = b._io.get_outputs()
    assert outs[0].device_name().lower() == "cpu"


def test_several_prompts_through_a_batch_artifact(arts, capsys):
    prompts = [IDS, [1, 150, 20], [1, 2, 3, 4, 5, 6, 7, 8], [1, 9, 9, 9, 9], [1, 60, 61]]
    pid = []
    for p in prompts:
        pid += ["--prompt-ids", ",".join(map(str, p))]
    common = pid + ["--max-new-tokens", 12, "--json", "--eos-id", -1]
    code, out, err = run(["--tlm", arts("llama_gqa", "tlm", k=4), "--target-only"] + common, capsys)
    assert code == 0, err
    want = ids_of(out)
    assert json.loads(out)["metrics"]["batch_size"] == 1
    for extra in (["--dlm", arts("llama_gqa", "dlm", batch=2)], ["--draft", "ngram"], ["--target-only"]):
        code, out, err = run(["--tlm", arts("llama_gqa", "tlm", k=4, batch=2)] + extra + common, capsys)
        assert code == 0, err
        obj = json.loads(out)
        assert ids_of(out) == want, extra
        assert [r["prompt_ids"] for r in obj["results"]] == prompts
        assert obj["metrics"]["batch_size"] == 2 and obj["metrics"]["tokens_per_s"] > 0
        assert obj["metrics"]["new_tokens"] == 12 * len(prompts)
        assert all(r["metrics"]["new_tokens"] == 12 for r in obj["results"])
    # plain text: every prompt printed, in input order
    code, out, err = run(["--tlm", arts("llama_gqa", "tlm", k=4, batch=2), "--draft", "ngram", "--no-color"] + pid
                         + ["--max-new-tokens", 4], capsys)
    assert code == 0, err
    assert [out.index(f"[prompt {i}/5]") for i in range(1, 6)] == sorted(out.index(f"[prompt {i}/5]")
                                                                         for i in range(1, 6))
    assert "tokens/s (all prompts, wall time)" in err


def test_batch_bad_input(arts, capsys):
    tlm2 = arts("llama_gqa", "tlm", k=4, batch=2)
    code, out, err = run(["--tlm", tlm2, "--dlm", arts("llama_gqa", "dlm"), "--prompt-ids", "1,2"], capsys)
    one_line_error(code, err, "batch size")
    code, out, err = run(["--tlm", tlm2, "--draft", "ngram", "--prompt-ids", "1,2", "--prompt-ids",
                          ",".join(["3"] * 70), "--json"], capsys)
    one_line_error(code, err, "prompt 2", "does not fit")
    assert out == ""
