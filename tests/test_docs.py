"""The documentation in the repository: the contract is there (and is the shared
one where that exists beside the repository), every relative link in README.md,
BENCHMARKS.md and docs/ resolves inside the repository, README stays a short
front door, and the command lines the pages show use only flags the tools'
``--help`` lists."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from specdec_compile import cli
from specdec_compile.cli import run as run_cli

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
CONTRACT = DOCS / "CONTRACT.md"
#: the team's shared copy, beside the repository (absent in a plain clone)
SHARED_CONTRACT = ROOT.parent / "shared" / "CONTRACT.md"
README_MAX_BYTES = 10 * 1024


def _pages() -> list[Path]:
    return [ROOT / "README.md", ROOT / "BENCHMARKS.md", *sorted(DOCS.glob("*.md"))]


def _prose(text: str) -> str:
    """``text`` without fenced code blocks and inline code (links in code are not links)."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    return re.sub(r"`[^`\n]*`", "", text)


def _links(text: str) -> list[str]:
    return re.findall(r"\[[^\]\n]*\]\(([^)\s]+)\)", _prose(text))


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    h = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip()).lower()
    h = re.sub(r"[^\w\- ]", "", h)
    return h.replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    text = re.sub(r"^```.*?^```", "", page.read_text(encoding="utf-8"), flags=re.S | re.M)
    return {_slug(m) for m in re.findall(r"^#{1,6}\s+(.*?)\s*#*\s*$", text, flags=re.M)}


def test_the_contract_is_in_the_repository():
    assert CONTRACT.is_file(), "docs/CONTRACT.md is missing: copy the interface contract into the repository"
    assert CONTRACT.read_text(encoding="utf-8").startswith("# "), "docs/CONTRACT.md is not the contract"


@pytest.mark.skipif(not SHARED_CONTRACT.is_file(), reason="no ../shared/CONTRACT.md beside the repository")
def test_the_contract_equals_the_shared_one():
    assert CONTRACT.is_file(), "docs/CONTRACT.md is missing"
    assert CONTRACT.read_bytes() == SHARED_CONTRACT.read_bytes(), (
        f"docs/CONTRACT.md differs from {SHARED_CONTRACT}: keep the two byte-identical")


def test_every_relative_link_resolves_inside_the_repository():
    broken = []
    for page in _pages():
        for link in _links(page.read_text(encoding="utf-8")):
            if re.match(r"[a-z][a-z0-9+.-]*:", link, flags=re.I):   # http:, https:, mailto:
                continue
            path, _, anchor = link.partition("#")
            target = (page.parent / path).resolve() if path else page
            where = f"{page.relative_to(ROOT)}: ({link})"
            if not target.is_relative_to(ROOT):
                broken.append(f"{where} -> outside the repository (a clone has only what is in it)")
            elif not target.exists():
                broken.append(f"{where} -> no such file")
            elif anchor and target.suffix == ".md" and anchor not in _anchors(target):
                broken.append(f"{where} -> no heading #{anchor} in {target.relative_to(ROOT)}")
    assert not broken, "\n".join(broken)


def test_the_link_check_sees_links_and_anchors():
    text = "see [a](docs/x.md#part) and `[not](a-link)`\n```\n[nor](this)\n```\n"
    assert _links(text) == ["docs/x.md#part"]
    assert _slug("Summary, JSON and `--explain`") == "summary-json-and---explain"
    assert _slug("Adding a detection finder") == "adding-a-detection-finder"


def test_readme_is_the_front_door():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.encode()) < README_MAX_BYTES, "README.md is over 10 KB: move detail into docs/"
    for cmd in ("make demo", "make test"):
        assert re.search(rf"^{cmd}\b", readme, flags=re.M), f"README.md lost the command {cmd!r}"
    linked = {(ROOT / link.partition("#")[0]).resolve() for link in _links(readme)}
    assert CONTRACT.resolve() in linked
    assert "../shared" not in readme, "a clone has no ../shared: link docs/CONTRACT.md"


def _help(main, argv, capsys) -> str:
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 0
    return capsys.readouterr().out


def _commands(text: str):
    """(tool, command line) for every specdec-compile / specdec-run line in a fenced code block;
    indented lines continue the command above them."""
    for block in re.findall(r"^```[^\n]*\n(.*?)^```", text, flags=re.S | re.M):
        cmd = None
        for line in block.splitlines() + [""]:
            if cmd and line[:1].isspace() and line.strip():
                cmd += " " + line.strip()
                continue
            if cmd:
                yield cmd
            cmd = line.split("#")[0].strip() if line.startswith(("specdec-compile", "specdec-run")) else None


def test_documented_command_lines_use_only_real_flags(capsys):
    helps = {"specdec-compile": _help(cli.main, ["--help"], capsys),
             "specdec-compile diff": _help(cli.main, ["diff", "--help"], capsys),
             "specdec-compile verify": _help(cli.main, ["verify", "--help"], capsys),
             "specdec-compile import-head": _help(cli.main, ["import-head", "--help"], capsys),
             "specdec-compile pair": _help(cli.main, ["pair", "--help"], capsys),
             "specdec-run": _help(run_cli.main, ["--help"], capsys)}
    known = {tool: set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", h)) for tool, h in helps.items()}
    unknown, seen = [], set()
    for page in _pages():
        for cmd in _commands(page.read_text(encoding="utf-8")):
            words = cmd.split()
            tool = " ".join(words[:2]) if len(words) > 1 and words[1] in ("diff", "verify", "import-head", "pair") else words[0]
            seen.add(tool)
            for flag in re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", cmd):
                if flag not in known[tool]:
                    unknown.append(f"{page.relative_to(ROOT)}: {tool} has no {flag}: {cmd}")
    # the option table of docs/runtime.md
    for row in re.findall(r"^\| (`--.*?) \|", (DOCS / "runtime.md").read_text(encoding="utf-8"), flags=re.M):
        for flag in re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", row):
            if flag not in known["specdec-run"]:
                unknown.append(f"docs/runtime.md: specdec-run has no {flag}: {row}")
    assert not unknown, "\n".join(unknown)
    assert seen == set(helps), f"the docs show no command line for {set(helps) - seen}"
