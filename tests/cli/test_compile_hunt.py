"""``specdec-compile``'s options, as typed: lists, integers, an option given twice, and
``Options`` built from Python with sizes or a target the artifact would record wrongly.

Each of these once wrote an artifact (exit 0) that said something the user did not ask for
(``--k-list "3 5"`` compiled the width 35), or kept one of two values without a word."""
from __future__ import annotations

import json

import pytest

from specdec_compile import cli
from specdec_compile.errors import SpecdecError
from specdec_compile.options import Options


def run(argv, capsys):
    rc = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def refused(fixture_path, tmp_path, capsys, args, msg):
    out = tmp_path / "out"
    rc, so, se = run([fixture_path("llama_gqa"), *args, "-o", out, "--quiet"], capsys)
    assert rc == 2, (rc, so, se)
    assert se.count("\n") == 1 and se.startswith("specdec-compile: error: ") and msg in se, se
    assert "Traceback" not in se and so == ""
    assert not out.exists()


LISTS = [
    (["--role", "tlm", "--k", "3", "--k-list", "3 5"], "'3 5'"),        # was the width 35
    (["--role", "tlm", "--k", "3", "--k-list", "0, 1 2"], "'0, 1 2'"),  # was 0 and 12
    (["--role", "tlm", "--k", "3", "--k-list", "1,,2"], "an empty item"),
    (["--role", "tlm", "--k", "3", "--k-list", "1,2,"], "an empty item"),
    (["--role", "tlm", "--k", "3", "--k-list", "1_2"], "'1_2'"),       # was the width 12
    (["--role", "tlm", "--k", "3", "--k-list", "\uff12"], "not an integer"),
    (["--role", "tlm", "--k", "3", "--hidden-states", "1 0"], "'1 0'"),  # was layer 10
    (["--role", "tlm", "--k", "3", "--hidden-states", "1,,0"], "an empty item"),
]


@pytest.mark.parametrize("args,msg", LISTS, ids=[a[-1] for a, _ in LISTS])
def test_lists_are_comma_separated_integers(fixture_path, tmp_path, capsys, args, msg):
    refused(fixture_path, tmp_path, capsys, args, msg)


INTEGERS = [
    (["--role", "tlm", "--k", "1_0"], "argument --k: invalid int value: '1_0'"),   # was k=10
    (["--role", "tlm", "--k", "+3"], "argument --k: invalid int value"),
    (["--role", "tlm", "--k", "\uff13"], "argument --k: invalid int value"),              # fullwidth 3
    (["--role", "tlm", "--k", "3", "--ctx-len", "2_56"], "argument --ctx-len: invalid int value"),
    (["--role", "tlm", "--k", "3", "--mos", "1_0"], "argument --mos: invalid int value"),
    (["--role", "tlm", "--k", "3", "--full-batch-size", "1_0"], "argument --full-batch-size: invalid int value"),
]


@pytest.mark.parametrize("args,msg", INTEGERS, ids=[" ".join(a[2:]) for a, _ in INTEGERS])
def test_integer_options_take_ascii_digits(fixture_path, tmp_path, capsys, args, msg):
    refused(fixture_path, tmp_path, capsys, args, msg)


TWICE = [
    (["--role", "tlm", "--k", "3", "--k", "5"], "--k given twice (3, then 5)"),
    (["--role", "tlm", "--k", "3", "--k-list", "1", "--k-list", "2"], "--k-list given twice ('1', then '2')"),
    (["--role", "tlm", "--k", "3", "--hidden-states", "-1", "--hidden-states", "0"], "--hidden-states given twice"),
    (["--role", "tlm", "--k", "3", "--ctx-len", "128", "--ctx-len", "64"], "--ctx-len given twice"),
    (["--role", "tlm", "--role", "dlm", "--k", "3"], "--role given twice"),
    (["--role", "tlm", "--k", "3", "--target", "ort", "--target", "qaic"], "--target given twice"),
    (["--role", "tlm", "--k", "3", "--mos", "1", "--mos", "2"], "--mos given twice"),
    (["--role", "tlm", "--k", "3", "--full-batch-size", "2", "--full-batch-size", "4"], "--full-batch-size given twice"),
]


@pytest.mark.parametrize("args,msg", TWICE, ids=[m for _, m in TWICE])
def test_an_option_given_twice_with_two_values_is_refused(fixture_path, tmp_path, capsys, args, msg):
    refused(fixture_path, tmp_path, capsys, args, msg)


def test_output_given_twice_is_refused(fixture_path, tmp_path, capsys):
    a, b = tmp_path / "a", tmp_path / "b"
    rc, so, se = run([fixture_path("llama_gqa"), "--role", "dlm", "-o", a, "--output", b, "--quiet"], capsys)
    assert rc == 2 and "-o/--output given twice" in se and se.count("\n") == 1
    assert not a.exists() and not b.exists()


def test_same_value_twice_and_spaces_around_commas_still_compile(fixture_path, tmp_path, capsys):
    out = tmp_path / "tlm"
    rc, so, se = run([fixture_path("llama_gqa"), "--role", "tlm", "--k", "3", "--k", "3", "--k-list", " 3 , 5 ",
                      "--hidden-states", "0, -1", "-o", out, "--quiet"], capsys)
    assert rc == 0, se
    m = json.loads((out / "manifest.json").read_text())
    assert m["k"] == 3 and m["k_list"] == [3, 5] and m["specializations"] == [32, 3, 4, 6]
    assert m["hidden_states"]["layer_indices"] == [0, 1]
    spec = json.loads((out / "specializations.json").read_text())["specializations"]
    assert [s["seq_len"] for s in spec] == ["32", "3", "4", "6"]


def test_a_list_item_too_long_for_int_is_one_line(fixture_path, tmp_path, capsys):
    refused(fixture_path, tmp_path, capsys, ["--role", "tlm", "--k", "3", "--k-list", "9" * 5000], "too large")


def test_openvino_with_full_batch_size_names_the_flag_given(fixture_path, tmp_path, capsys):
    refused(fixture_path, tmp_path, capsys, ["--role", "tlm", "--k", "3", "--target", "openvino",
                                             "--full-batch-size", "2"], "--full-batch-size (--interface qeff) is for")


# --------------------------------------------------------------------------- Options from Python

@pytest.mark.parametrize("kw,msg", [
    (dict(role="tlm", k=3, prefill_len=None), "--prefill-len must be an integer, got None"),  # was seq_len "None"
    (dict(role="tlm", k=3, batch_size=None), "--batch-size must be an integer, got None"),    # was batch "None"
    (dict(role="dlm", ctx_len=None), "--ctx-len must be an integer, got None"),
    (dict(role="dlm", num_devices=None), "--num-devices must be an integer, got None"),       # was a TypeError
    (dict(role="tlm", k=3, ctx_len=256.0), "--ctx-len must be an integer, got 256.0"),
])
def test_options_sizes_are_integers(kw, msg):
    with pytest.raises(SpecdecError, match=msg.replace("(", r"\(").replace(")", r"\)")):
        Options(**kw)


@pytest.mark.parametrize("target", ["ab", ("model.onnx",), ("model.onnx", "not-a-digest"), ("", "a" * 64),
                                    ("model.onnx", "A" * 64)])
def test_options_feature_target_is_a_file_and_digest(target):
    # "ab" was recorded as the manifest's target {"file": "a", "sha256": "b"}
    with pytest.raises(SpecdecError, match="--feature-target"):
        Options(role="dlm", k=3, feature_layers=(-1,), feature_target=target)


def test_options_feature_target_as_list_is_kept_as_tuple():
    o = Options(role="dlm", k=3, feature_layers=[-1], feature_target=["model.onnx", "a" * 64])
    assert o.feature_target == ("model.onnx", "a" * 64)


@pytest.mark.parametrize("args", [["--role", "tlm", "--k", "3", "--hidden-states"],
                                  ["--role", "tlm", "--hidden-states", "--k", "3"]])
def test_layer_option_without_its_value_says_so(fixture_path, tmp_path, capsys, args):
    # was "the following arguments are required: -o/--output" (the -o after it taken as the layer list)
    refused(fixture_path, tmp_path, capsys, args, "argument --hidden-states: expected one argument")
