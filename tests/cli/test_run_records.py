"""``specdec-run``'s records say what ran: a batch run's top-level model calls and times as the
backends ran them (a call of B rows counted once), the OpenVINO exactness record in ``--compare
--json`` too, and ``--dlm-device-ids`` refused where no draft model runs (it would be dropped)."""
from __future__ import annotations

import json

import pytest
from runtime_helpers import one_line_error, run

from specdec_compile import cli as compile_cli

PL, CL = 8, 64
IDS = "1,5,9,33,7,100,42,17,3,8,55"


@pytest.fixture(scope="module")
def build(fixture_path, tmp_path_factory):
    root = tmp_path_factory.mktemp("rt_records")
    made = {}

    def get(role, target="ort", batch=1):
        key = (role, target, batch)
        if key not in made:
            out = root / "-".join(map(str, key))
            argv = [str(fixture_path("llama_gqa")), "--role", role, "--target", target, "--prefill-len", str(PL),
                    "--ctx-len", str(CL), "--batch-size", str(batch), "-o", str(out)]
            assert compile_cli.main(argv + (["--k", "4"] if role == "tlm" else [])) == 0
            made[key] = out
        return made[key]

    return get


def test_a_batch_runs_summary_counts_each_call_once(build, capsys):
    """Two rows share every call: the summary's calls and model times are the backends' (once per
    call), not each row's sum (twice the DLM time that ran, on the old code), and within the wall time."""
    code, out, err = run(["--tlm", build("tlm", batch=2), "--dlm", build("dlm", batch=2), "--prompt-ids", IDS,
                          "--prompt-ids", "4,4,4", "--max-new-tokens", 30, "--eos-id", -1, "--json"], capsys)
    assert code == 0, err
    obj = json.loads(out)
    m, rows = obj["metrics"], [r["metrics"] for r in obj["results"]]
    wall = m["new_tokens"] / m["tokens_per_s"]
    assert m["batch_size"] == 2
    assert m["total_time_s"] == pytest.approx(wall, rel=1e-6)
    assert m["tlm_time_s"] + m["dlm_time_s"] + m["host_time_s"] == pytest.approx(wall, rel=1e-6)
    for role in ("tlm", "dlm"):
        # every call had a row in it, and the rows shared calls: fewer calls ran than the rows count
        assert max(r[f"{role}_calls"] for r in rows) <= m[f"{role}_calls"] < sum(r[f"{role}_calls"] for r in rows)
    # batch 1: the prompts run one after another, and the sums are what ran
    code, out, err = run(["--tlm", build("tlm"), "--dlm", build("dlm"), "--prompt-ids", IDS, "--prompt-ids",
                          "4,4,4", "--max-new-tokens", 30, "--eos-id", -1, "--json"], capsys)
    obj = json.loads(out)
    m, rows = obj["metrics"], [r["metrics"] for r in obj["results"]]
    assert m["tlm_calls"] == sum(r["tlm_calls"] for r in rows)


@pytest.mark.parametrize("mode", [["--target-only"], ["--draft", "ngram"], ["--draft", "suffix"]])
def test_dlm_device_ids_without_a_draft_model_are_refused(build, capsys, mode):
    code, out, err = run(["--tlm", build("tlm"), *mode, "--prompt-ids", IDS, "--max-new-tokens", 3,
                          "--dlm-device-ids", 1, "--json"], capsys)
    one_line_error(code, err, "--dlm-device-ids")
    assert out == ""


def test_compare_json_records_the_openvino_backend(build, capsys):
    """Contract section 6: a --json run on OpenVINO records under ``backend`` whether greedy output is
    target-only's; --compare's JSON, which says whether the outputs were identical, too."""
    pytest.importorskip("openvino")
    tlm, dlm = build("tlm", "openvino"), build("dlm", "openvino")
    common = ["--tlm", tlm, "--dlm", dlm, "--backend", "openvino", "--ov-precision", "f32", "--prompt-ids", IDS,
              "--max-new-tokens", 6, "--json"]
    code, out, err = run(common, capsys)
    assert code == 0, err
    plain = json.loads(out)["backend"]
    code, out, err = run(common + ["--compare"], capsys)
    assert code == 0, err
    rep = json.loads(out)
    assert rep["backend"] == plain
    assert rep["backend"]["kind"] == "openvino" and rep["backend"]["greedy_equals_target_only"] is True
    assert rep["identical"] is True


def test_a_suffix_cache_too_large_for_an_integer_is_one_line(build, capsys):
    """10**20 tokens passed the CLI's check and then failed inside the draft source (exit 3)."""
    code, out, err = run(["--tlm", build("tlm"), "--draft", "suffix", "--prompt-ids", IDS, "--max-new-tokens", 3,
                          "--suffix-cache-tokens", 10 ** 20], capsys)
    one_line_error(code, err, "--suffix-cache-tokens", "positive")
    assert out == ""


def test_a_closed_stderr_keeps_stdout_clean_and_the_exit_status(tmp_path):
    """``2>&-``: Python's sys.stderr is None. The old code's progress check called None.isatty() (exit
    3), and print(file=None) put the error line on stdout; now the line goes nowhere, the status is 2."""
    import subprocess
    import sys
    code = ("import sys; from specdec_compile.cli.run import main; "
            f"sys.exit(main(['--tlm', {str(tmp_path / 'missing')!r}, '--prompt-ids', '1,2,3', '--json']))")
    p = subprocess.run([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                       close_fds=True, pass_fds=(), preexec_fn=lambda: __import__("os").close(2))
    assert (p.returncode, p.stdout) == (2, b"")


def test_an_unseeded_sampled_run_records_the_seed_that_reproduces_it(build, capsys):
    """Without --seed a run draws one; --json records it, and --seed with it gives the same text
    (the old code recorded no seed: a sampled run could not be repeated)."""
    argv = ["--tlm", build("tlm"), "--dlm", build("dlm"), "--prompt-ids", IDS, "--max-new-tokens", 24,
            "--eos-id", -1, "--temperature", 0.9, "--json"]
    code, out, err = run(argv, capsys)
    assert code == 0, err
    first = json.loads(out)
    seed = first["seed"]
    code, out, err = run(argv + ["--seed", seed], capsys)
    assert code == 0, err
    again = json.loads(out)
    assert again["seed"] == seed
    assert [r["generated_ids"] for r in again["results"]] == [r["generated_ids"] for r in first["results"]]
    code, out, err = run(argv[:-3] + ["--json"], capsys)      # greedy: no seed to record
    assert code == 0 and "seed" not in json.loads(out)
