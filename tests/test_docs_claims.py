"""What the user docs claim, checked against what the code does: the defaults and choices a
synopsis shows equal the parser's, the extras README names hold what it says, and the defaults
docs/verify.md and docs/qefficient.md state are the ones the commands use."""
from __future__ import annotations

import json
import re
import shutil
import tomllib
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from specdec_compile import cli, diff
from specdec_compile.cli import run as run_cli
from specdec_compile.errors import SpecdecError

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"


def _help(main, argv, capsys) -> str:
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 0
    return capsys.readouterr().out


def _synopsis(page: str, starts: str) -> str:
    """The first line of ``page`` that starts with ``starts`` (a command line in a code block)."""
    for line in (DOCS / page).read_text(encoding="utf-8").splitlines():
        if line.startswith(starts):
            return line
    raise AssertionError(f"docs/{page} shows no line starting {starts!r}")


def _help_choices(text: str, flag: str) -> tuple[list[str], str | None]:
    """(the choices, the default named as "default X", if any) ``--help`` gives ``flag``."""
    m = re.search(rf"{flag} \{{([^}}]*)\}}\s+(.*?)(?=\n  -|\Z)", text, flags=re.S)
    assert m, f"--help shows no choices for {flag}"
    default = re.search(r"default:? (\w+)", " ".join(m.group(2).split()))
    return m.group(1).split(","), default and default.group(1)


def _shown_choices(line: str, flag: str) -> list[str]:
    m = re.search(rf"\[{flag} ([\w.|]+)\]", line)
    assert m, f"the synopsis shows no [{flag} A|B]: {line}"
    return m.group(1).split("|")


def test_import_head_synopsis_shows_the_parsers_choices_and_defaults(capsys):
    """docs/import-head.md: every --target the command takes, the default first (the text says so),
    and the numbers shown are the parser's defaults."""
    from specdec_compile.cli.import_head import build_parser
    line = _synopsis("import-head.md", "specdec-compile import-head ")
    text = _help(cli.main, ["import-head", "--help"], capsys)
    from specdec_compile.eagle3.importer import DEFAULTS
    p = build_parser("specdec-compile import-head")
    # the shapes' defaults (an export's; a compiled TLM gives its own) are importer.DEFAULTS
    default = {"target": DEFAULTS["target"], "weights": p.get_default("weights")}
    for flag in ("--target", "--weights"):
        choices, _ = _help_choices(text, flag)
        shown = _shown_choices(line, flag)
        assert sorted(shown) == sorted(choices), f"docs/import-head.md shows {flag} {shown}; it takes {choices}"
        assert shown[0] == default[flag[2:]], f"{flag}: the first shown is not the default"
    numbers = re.findall(r"\[--([a-z-]+) (\d+)\]", line)
    assert numbers
    for flag, value in numbers:
        assert DEFAULTS[flag.replace("-", "_")] == int(value), f"--{flag}: docs say {value}"
    assert "the default is `qaic`" in (DOCS / "import-head.md").read_text(encoding="utf-8")


def test_diff_passes_synopsis_shows_every_target(capsys):
    line = _synopsis("diff.md", "specdec-compile diff --passes ")
    choices, default = _help_choices(_help(cli.main, ["diff", "--help"], capsys), "--target")
    shown = _shown_choices(line, "--target")
    assert sorted(shown) == sorted(choices), f"docs/diff.md shows --target {shown}; diff --passes takes {choices}"
    assert default and shown[0] == default


def test_readme_names_the_extras_that_hold_torch_transformers_and_optimum():
    """README: torch, transformers and optimum-onnx are not core dependencies, and the sentence
    saying which extras hold them names each extra that does."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]

    def names(reqs):
        return {re.split(r"[<>=!~\[ ;]", r, maxsplit=1)[0].lower() for r in reqs}

    heavy = {"torch", "transformers", "optimum-onnx"}
    assert not heavy & names(project["dependencies"])
    holding = {extra for extra, reqs in project["optional-dependencies"].items() if heavy <= names(reqs)}
    readme = " ".join((ROOT / "README.md").read_text(encoding="utf-8").split())
    m = re.search(r"torch, transformers and optimum-onnx are only in the (.*?) extras?;", readme)
    assert m, "README no longer says which extras hold torch, transformers and optimum-onnx"
    assert set(re.findall(r"`([\w-]+)`", m.group(1))) == holding


def test_verify_defaults_outside_an_artifact_are_the_documented_ones(fixture_path, tmp_path, capsys):
    """docs/verify.md: without a manifest, k, PL, CL and B are 7, 32, 256 and 1."""
    page = " ".join((DOCS / "verify.md").read_text(encoding="utf-8").split())
    m = re.search(r"else (\d+), (\d+), (\d+) and (\d+):", page)
    assert m, "docs/verify.md no longer states the defaults outside an artifact"
    export = fixture_path("llama_gqa")
    art = tmp_path / "art"
    assert cli.main([str(export), "--role", "tlm", "--k", "3", "--prefill-len", "8", "--ctx-len", "64",
                     "--target", "ort", "-o", str(art), "--quiet"]) == 0
    bare = tmp_path / "bare"
    bare.mkdir()
    shutil.copy(art / "model.onnx", bare / "model.onnx")    # no manifest beside it
    capsys.readouterr()
    assert cli.main(["verify", str(export), str(bare / "model.onnx"), "--json", "--quiet"]) == 0
    rep = json.loads(capsys.readouterr().out)
    got = (rep["k"], rep["prefill_len"], rep["ctx_len"], rep["batch_size"])
    assert got == tuple(int(v) for v in m.groups())
    assert rep["tol"] == 1e-4 and "default 1e-4" in page


def test_generation_len_default_is_the_documented_one(capsys):
    """docs/qefficient.md: without --generation-len or --max-new-tokens, 128."""
    page = (DOCS / "qefficient.md").read_text(encoding="utf-8")
    m = re.search(r"Without either: (\d+)", page)
    assert m
    text = " ".join(_help(run_cli.main, ["--help"], capsys).split())
    assert re.search(rf"--max-new-tokens N new tokens per prompt at most \(default {m.group(1)}\b", text)
    from specdec_compile.cli.qeff_words import DEFAULT_MAX_NEW_TOKENS
    assert DEFAULT_MAX_NEW_TOKENS == int(m.group(1))


def test_diff_models_needs_the_directory_of_external_data(tmp_path):
    """docs/diff.md: a model with external data and no directory is one SpecdecError (its
    references alone would be compared, not its bytes)."""
    w = numpy_helper.from_array(np.arange(4096, dtype=np.float32).reshape(64, 64), "w")
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64])], [w])
    onnx.save(helper.make_model(g), tmp_path / "m.onnx", save_as_external_data=True, location="m.data",
              size_threshold=0)
    m = onnx.load(tmp_path / "m.onnx", load_external_data=False)
    with pytest.raises(SpecdecError, match="no directory"):
        diff.diff_models(m, m)
    assert diff.diff_models(m, m, a_dir=tmp_path, b_dir=tmp_path)["identical"]
