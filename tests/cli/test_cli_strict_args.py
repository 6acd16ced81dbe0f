"""Every command's parser (cli/common.py ``Parser``): an option given twice with two values is refused
(argparse kept the last without a word), integer options read ASCII digits only ("1_0" was 10, "+3"
and other scripts' digits were read too), in groups as well; the same value twice and repeatable
options still work. All refused in one line, exit 2, before anything is read."""
from __future__ import annotations

import pytest

from specdec_compile import cli
from specdec_compile.cli import run as run_cli

CASES = [
    # (argv of specdec-compile, or ["run", ...] for specdec-run), the line's needle
    (["pair", "--tlm", "t", "--dlm", "d", "-o", "o", "--k", "3", "--k", "5"], "--k given twice (3, then 5)"),
    (["pair", "--tlm", "t", "--dlm", "d", "-o", "o", "--k", "1_0"], "invalid int value: '1_0'"),
    (["pair", "--tlm", "t", "--dlm", "a", "--dlm", "b", "-o", "o"], "--dlm given twice"),
    (["import-head", "c", "--tlm", "t", "-o", "o", "--k", "3", "--k", "4"], "--k given twice (3, then 4)"),
    (["import-head", "c", "--tlm", "t", "-o", "o", "--k", "+3"], "invalid int value: '+3'"),
    (["verify", "a.onnx", "b.onnx", "--ctx-len", "64", "--ctx-len", "128"], "--ctx-len given twice"),
    (["verify", "a.onnx", "b.onnx", "--seed", "\uff13"], "invalid int value"),
    (["diff", "a.onnx", "b.onnx", "--color", "never", "--color", "always"], "--color given twice"),
    (["run", "--tlm", "t", "--target-only", "--prompt-ids", "1", "--max-new-tokens", "3", "--max-new-tokens", "4"],
     "--max-new-tokens given twice (3, then 4)"),
    (["run", "--tlm", "t", "--target-only", "--prompt-file", "a", "--prompt-file", "b"], "--prompt-file given twice"),
    (["run", "--tlm", "t", "--target-only", "--prompt-ids", "1", "--max-new-tokens", "1_0"], "invalid int value"),
]


@pytest.mark.parametrize("argv,needle", CASES, ids=[" ".join(c[0][:1] + c[0][-2:]) for c in CASES])
def test_every_command_refuses_a_second_value_and_odd_integers(argv, needle, capsys):
    code = run_cli.main(argv[1:]) if argv[0] == "run" else cli.main(argv)
    err = capsys.readouterr().err.strip()
    assert code == 2 and needle in err and "\n" not in err, err


def test_the_same_value_twice_is_one_value(tmp_path, capsys):
    """--k 3 --k 3 is --k 3: refused here only for what follows (the missing files), not the repeat."""
    code = cli.main(["pair", "--tlm", str(tmp_path / "t"), "--dlm", str(tmp_path / "d"), "-o", str(tmp_path / "o"),
                     "--k", "3", "--k", "3"])
    err = capsys.readouterr().err
    assert code == 2 and "given twice" not in err and "invalid int" not in err, err
