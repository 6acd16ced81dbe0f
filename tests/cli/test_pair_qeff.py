"""``specdec-compile pair`` in QEfficient's words: the Cloud AI 100 compiler's options for both models
(recorded in pair.json, part of the key, in each compile.sh; refused with --target ort), the pair
checked by ``check_compile_pair`` before any work, and QEfficient's interfaces (``--interface qeff``,
``--full-batch-size``) in the one command from Hugging Face folders, run by ``specdec-run --pair``."""
from __future__ import annotations

import json

import onnx
import pytest

from eagle3_models import DATA, target_export
from models import export_fixture
from pair_models import dlm_folder, pair, run, tlm_folder
from qeff_helpers import PLAIN, RECORD, assert_interface_is, io_of
from specdec_compile import cli

SHAPES = ["--k", "3", "--prefill-len", "8", "--ctx-len", "64"]
PROMPTS = "w5 w6 w7 w8 w5 w6 w7|w9 w10 w11 w9 w10"
#: QEfficient's words as a Cloud AI 100 user types them, and the compiler flags each model gets
WORDS = ["--num-cores", "11", "--dlm-num-cores", "5", "--mxfp6-matmul", "--mxint8-kv-cache", "--mos", "1",
         "--aic-enable-depth-first", "--hw-version", "ai200", "--device-group", "[0,1]"]


def exports():
    """The target's and the draft's optimum export folders (no export needed: quick)."""
    return target_export("eagle3_llama").parent, export_fixture("llama_gqa").parent


def _flags(art) -> list[str]:
    text = (art / "compile.sh").read_text()
    return [line.strip() for line in text[text.index("cmd=("):text.index(")\n", text.index("cmd=("))].splitlines()[1:]]


def test_qeff_words_go_to_both_models_and_into_pair_json(tmp_path, capsys):
    tlm, dlm = exports()
    out = tmp_path / "q"
    code, text, err = pair(["--tlm", tlm, "--dlm", dlm, *SHAPES, *WORDS, "-o", out], capsys)
    assert code == 0, err
    assert "num-cores 11" in text and "mxfp6-matmul" in text
    m = json.loads((out / "pair.json").read_text())
    assert m["settings"]["qaic"] == {"num_cores": 11, "dlm_num_cores": 5, "mxfp6_matmul": True,
                                     "mxint8_kv_cache": True, "mos": 1, "aic_enable_depth_first": True,
                                     "hw_version": "ai200", "device_group": [0, 1]}
    t, d = (json.loads((out / x / "manifest.json").read_text()) for x in ("tlm", "dlm"))
    for man, cores, devices in ((t, 11, 2), (d, 5, 1)):   # the draft on one device, as QEfficient's example
        assert (man["precision"], man["num_cores"], man["num_devices"], man["hw_version"]) == \
            ("mx6", cores, devices, "ai200")
        assert man["compile_options"] == {"mxint8_kv_cache": True, "qaic_flags": [], "mos": 1,
                                          "aic_enable_depth_first": True}
    tf, df = _flags(out / "tlm"), _flags(out / "dlm")
    for flags, cores in ((tf, 11), (df, 5)):
        assert {f"-aic-num-cores={cores}", "-mxfp6-matmul", "-mos=1", "-aic-enable-depth-first"} <= set(flags)
    assert "-mdp-load-partition-config=mdp_partition.json" in tf and not any("mdp" in f for f in df)
    assert "ai200" in (out / "tlm" / "compile.sh").read_text()
    # the settings are the key: another --num-cores is another pair (refused without --force)
    other = [a if a != "11" else "12" for a in WORDS]
    code, _, err = pair(["--tlm", tlm, "--dlm", dlm, *SHAPES, *other, "-o", out], capsys)
    assert code == 2 and "other settings" in err
    code, text, err = pair(["--tlm", tlm, "--dlm", dlm, *SHAPES, *WORDS, "-o", out], capsys)
    assert code == 0 and text.startswith("cached: "), err


def test_run_pair_opens_the_tlm_on_the_device_group(tmp_path, capsys):
    from specdec_compile.cli.pair_run import resolve_pair
    from specdec_compile.cli.run import build_parser
    tlm, _ = exports()
    out = tmp_path / "g"
    assert pair(["--tlm", tlm, "--draft", "ngram", *SHAPES, "--device-group", "[2,3]", "-o", out], capsys)[0] == 0
    for extra, want in (([], "2,3"), (["--tlm-device-ids", "5"], "5"), (["--backend", "ort"], None)):
        args = build_parser().parse_args(["--pair", str(out), "--prompt-ids", "1,2", *extra])
        args.backend = "qaic" if "--backend" not in extra else args.backend
        resolve_pair(args)
        assert args.tlm_device_ids == want


@pytest.mark.parametrize("words, flag", [(["--num-cores", "16"], "--num-cores 16"), (["--mxfp6-matmul"], "--mxfp6-matmul"),
                                         (["--mos", "1"], "--mos 1"), (["--aic-enable-depth-first"], "--aic-enable-depth-first"),
                                         (["--hw-version", "ai200"], "--hw-version ai200"),
                                         (["--num-devices", "2"], "--num-devices 2"), (["--device-group", "[0,1]"], "--device-group"),
                                         (["--mxint8-kv-cache"], "--mxint8-kv-cache"),
                                         (["--dlm-num-cores", "5"], "--dlm-num-cores 5")])
def test_qaic_words_with_target_ort_are_refused_in_one_line(tmp_path, capsys, words, flag):
    tlm, dlm = exports()
    work = tmp_path / "work"
    work.mkdir()
    code, _, err = pair(["--tlm", tlm, "--dlm", dlm, *SHAPES, "--target", "ort", *words, "-o", work / "out"], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert flag in err and "needs --target qaic" in err
    assert list(work.iterdir()) == []


@pytest.mark.parametrize("words, needle", [
    (["--full-batch-size", "4", "--batch-size", "2"], "--batch-size 2 contradicts it"),
    (["--full-batch-size", "4", "--interface", "default"], "drop --interface default"),
    (["--full-batch-size", "0"], "--full-batch-size must be >= 1"),
    (["--num-devices", "3", "--device-group", "[0,1]"], "--num-devices 3 contradicts it"),
    (["--device-group", "[0,1"], "unbalanced brackets"),
    (["--mxfp6-matmul", "--num-cores", "17"], "--num-cores must be between 1 and 16"),
    (["--interface", "qeff", "--k", "7"], "QEfficient's plain interface drops that decode")])
def test_contradicting_words_are_refused(tmp_path, capsys, words, needle):
    tlm, dlm = exports()
    work = tmp_path / "work"
    work.mkdir()
    shapes = SHAPES[2:] if "--k" in words else SHAPES      # an option is given once
    code, _, err = pair(["--tlm", tlm, "--dlm", dlm, *shapes, *words, "-o", work / "out"], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1 and needle in err, err
    assert list(work.iterdir()) == []


def test_a_head_with_qeffs_interface_is_refused_before_any_export(tmp_path, capsys, monkeypatch):
    import specdec_compile.pair.export as export
    monkeypatch.setattr(export, "export_hf", lambda *a, **k: pytest.fail("exported"))
    for words in (["--interface", "qeff"], ["--full-batch-size", "2"]):
        code, _, err = pair(["--tlm", tlm_folder(), "--head", DATA / "llama", *SHAPES, *words, "-o",
                             tmp_path / "out"], capsys)
        assert code == 2 and "hidden states" in err and "QEfficient's interface" in err, err
    assert not (tmp_path / "out").exists()


def test_pair_head_for_another_model_family_is_refused_before_any_export(tmp_path, capsys, monkeypatch):
    """The qwen head's recorded verifier (Qwen2ForCausalLM) against the llama target's config.json."""
    import specdec_compile.pair.export as export
    monkeypatch.setattr(export, "export_hf", lambda *a, **k: pytest.fail("exported"))
    code, _, err = pair(["--tlm", tlm_folder(), "--head", DATA / "qwen", *SHAPES, "--target", "ort", "-o",
                         tmp_path / "out"], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "Qwen2ForCausalLM verifier" in err and "is a llama model" in err
    assert list(tmp_path.iterdir()) == []


# --------------------------------------------------------------------------- check_compile_pair, before any work

def test_pair_checks_both_compiles_with_check_compile_pair_before_any_work(tmp_path, capsys, monkeypatch):
    """pair hands both models' Options to runtime.pairing.check_compile_pair (tested on its own in
    tests/runtime/test_pairing_compile.py) before it exports or writes anything: what it refuses is
    refused by pair, in one line, exit 2, nothing written; what it accepts is what pair builds."""
    import specdec_compile.pair.export as export
    import specdec_compile.runtime.pairing as pairing
    from specdec_compile.errors import SpecdecError
    real, seen = pairing.check_compile_pair, []
    monkeypatch.setattr(pairing, "check_compile_pair", lambda t, d: seen.append((t, d)) or real(t, d))
    tlm, dlm = exports()
    out = tmp_path / "cb"
    assert pair(["--tlm", tlm, "--dlm", dlm, *SHAPES, "--full-batch-size", "2", "--target", "ort", "-o", out],
                capsys)[0] == 0
    (t, d), = seen
    got = {r: json.loads((out / r / "manifest.json").read_text()) for r in ("tlm", "dlm")}
    for opts, man in ((t, got["tlm"]), (d, got["dlm"])):
        assert (opts.batch_size, opts.interface, opts.continuous_batching) == (2, "qeff", True)
        assert man["batch_size"] == 2 and man["qeff"]["full_batch_size"] == 2

    def refuse(t, d):
        raise SpecdecError(f"the TLM decodes {t.batch_size} rows and the draft {d.batch_size + 1}: refused")

    monkeypatch.setattr(pairing, "check_compile_pair", refuse)
    monkeypatch.setattr(export, "export_hf", lambda *a, **k: pytest.fail("exported before the pair check"))
    work = tmp_path / "work"
    work.mkdir()
    code, _, err = pair(["--tlm", tlm_folder(), "--dlm", dlm_folder(), *SHAPES, "--batch-size", "2", "-o",
                         work / "out"], capsys)
    assert code == 2 and "the TLM decodes 2 rows and the draft 3" in err and len(err.strip().splitlines()) == 1
    assert list(work.iterdir()) == []


# --------------------------------------------------------------------------- the one command, QEfficient's interfaces

@pytest.fixture(scope="module")
def qeff_pairs(tmp_path_factory):
    """QEfficient's plain SpD pair and its continuous-batching pair (--full-batch-size 2), each built from
    the Hugging Face folders in one command, on ONNX Runtime."""
    root = tmp_path_factory.mktemp("qeff-pairs")
    made = {}
    for name, words in (("plain", ["--interface", "qeff"]), ("cb", ["--full-batch-size", "2"])):
        out = root / name
        argv = ["--tlm", tlm_folder(), "--dlm", dlm_folder(), *SHAPES, *words, "--target", "ort", "-o", out, "--quiet"]
        assert cli.main(["pair", *(str(a) for a in argv)]) == 0
        made[name] = out
    return made


def _expected_names(recorded: dict, layers: int) -> list[str]:
    """QEfficient's recorded input names (a 2-layer model) for a model of ``layers`` layers."""
    names = [w["name"] for w in recorded["inputs"]]
    past = [n for n in names if n.startswith("past_")]
    first = names.index(past[0])
    return names[:first] + [f"past_{kv}.{i}" for i in range(layers) for kv in ("key", "value")] + \
        names[first + len(past):]


@pytest.mark.parametrize("name", ["plain", "cb"])
def test_one_command_qeff_pair_is_qeffs_interface_and_runs_greedy_equal(qeff_pairs, name, capsys):
    out = qeff_pairs[name]
    cb = name == "cb"
    m = json.loads((out / "pair.json").read_text())
    assert (m["settings"]["interface"], m["settings"]["continuous_batching"]) == ("qeff", cb)
    want = RECORD if cb else PLAIN          # QEfficient's own exports (tests/qeff_data, efficient-transformers ebf55e8)
    tlm, dlm = (onnx.load(str(out / r / "model.onnx"), load_external_data=False) for r in ("tlm", "dlm"))
    # the draft is the recorded model (llama_gqa): QEfficient's DLM interface exactly, names, dtypes, dims
    assert_interface_is(dlm, want["dlm"]["interface"], "dlm")
    # the target has 4 layers where the recorded one has 2: the same inputs, layer for layer
    assert [n for n, _, _ in io_of(tlm, "inputs")] == _expected_names(want["tlm"]["interface"], 4)
    assert ("batch_index" in [n for n, _, _ in io_of(tlm, "inputs")]) is cb
    for r in ("tlm", "dlm"):
        man = json.loads((out / r / "manifest.json").read_text())
        assert man["batch_size"] == (2 if cb else 1) and (man["qeff"].get("full_batch_size") == 2) is cb
    prompts = PROMPTS if cb else PROMPTS.split("|")[0]
    code, text, err = run(["--pair", out, "--prompt", prompts, "--max-new-tokens", 16, "--compare", "--json"], capsys)
    assert code == 0, err
    report = json.loads(text)
    assert report["identical"] is True
    assert report["speculative"]["new_tokens"] == 16 * (2 if cb else 1)
    for spec, target in zip(report["results"]["speculative"], report["results"]["target_only"]):
        assert spec["generated_ids"] == target["generated_ids"]
        assert spec["metrics"]["dlm_calls"] > 0 and spec["metrics"]["drafted_tokens"] > 0


def test_a_head_pair_gets_the_words_too(tmp_path, capsys):
    """--head: the imported head is compiled with the draft's options (--dlm-num-cores, the rest shared)."""
    tlm, _ = exports()
    out = tmp_path / "h"
    code, _, err = pair(["--tlm", tlm, "--head", DATA / "llama", *SHAPES, "--num-cores", "12", "--dlm-num-cores", "4",
                         "--mxfp6-matmul", "--mos", "2", "-o", out], capsys)
    assert code == 0, err
    t, d = (json.loads((out / x / "manifest.json").read_text()) for x in ("tlm", "dlm"))
    assert (t["num_cores"], d["num_cores"], t["precision"], d["precision"]) == (12, 4, "mx6", "mx6")
    assert t["compile_options"]["mos"] == d["compile_options"]["mos"] == 2 and d["feature_draft"]["eagle3"]
    assert {"-aic-num-cores=4", "-mxfp6-matmul", "-mos=2"} <= set(_flags(out / "dlm"))


def _specs(path) -> list[dict]:
    return [{k: str(v) for k, v in s.items()} for s in json.loads(path.read_text())["specializations"]]


def _recorded(specs, ctx_len: int) -> list[dict]:
    """QEfficient's recorded specializations (ctx_len 32) at ``ctx_len``, as the flat file's strings."""
    return [{k: str(ctx_len if k == "ctx_len" else v) for k, v in s.items() if k != "_graph_name"} for s in specs]


@pytest.mark.parametrize("words, want", [(["--interface", "qeff", "--batch-size", str(PLAIN["batch_size"])], PLAIN),
                                         (["--full-batch-size", str(RECORD["full_batch_size"])], RECORD)])
def test_a_qaic_qeff_pair_has_qeffs_specializations(tmp_path, capsys, words, want):
    """The pair QEfficient's runtime loads: each model's specializations.json is what QEfficient wrote for
    its own TLM and DLM at the same settings (recorded, tests/qeff_data), key for key (at ctx_len 64: pair's
    verify needs more than the recorded 32)."""
    tlm, dlm = exports()
    out = tmp_path / "q"
    code, _, err = pair(["--tlm", tlm, "--dlm", dlm, "--k", str(RECORD["k"]), "--prefill-len", str(RECORD["prefill_len"]),
                         "--ctx-len", "64", *words, "--num-cores", "14", "-o", out], capsys)
    assert code == 0, err
    assert _specs(out / "tlm" / "specializations.json") == _recorded(want["tlm"]["specializations"]["k3"], 64)
    assert _specs(out / "dlm" / "specializations.json") == _recorded(want["dlm"]["specializations"]["default"], 64)


def test_python_api_refuses_bad_qaic_requests(tmp_path):
    from specdec_compile.errors import SpecdecError
    from specdec_compile.pair.build import PairRequest, build_pair
    for req, words in ((PairRequest(tlm="x", draft="ngram", target="ort", num_cores=8), "--num-cores 8 is an option"),
                       (PairRequest(tlm="x", draft="ngram", device_group=(0, 0)), "distinct device ids"),
                       (PairRequest(tlm="x", draft="ngram", device_group=2), "distinct device ids"),
                       (PairRequest(tlm="x", draft="ngram", device_group=(0, 1), num_devices=4), "contradicts"),
                       (PairRequest(tlm="x", draft="ngram", dlm_num_cores=4), "no draft model to compile"),
                       (PairRequest(tlm="x", draft="ngram", continuous_batching=True), "needs --interface qeff"),
                       (PairRequest(tlm="x", draft="head", dlm="y", interface="qeff"), "no outputs for"),
                       # the draft's cores, named as given, and checked before the TLM is built (a head too)
                       (PairRequest(tlm="x", draft="model", dlm="y", dlm_num_cores=0), "--dlm-num-cores must be"),
                       (PairRequest(tlm="x", draft="head", dlm="y", dlm_num_cores=99), "--dlm-num-cores must be")):
        with pytest.raises(SpecdecError, match=words):
            build_pair(req, tmp_path / "out")
    assert not (tmp_path / "out").exists()
