"""The coverage matrix: every decoder-only family in optimum-onnx's registry
for text-generation-with-past (tiny random config, families.json), plus the
dynamo exports and variants, compiled for both roles and both targets and
verified against the export (batch 2, a history past every window) at 1e-4;
plus one TLM per row and target exposing two layers' hidden states
(``--hidden-states 0,-1``), its extra output checked against the export's
internal tensors at every call.

SPECDEC_MATRIX=core runs only the core rows (one per pattern); the default is
every row. docs/coverage.md is generated from the same rows by
scripts/coverage_matrix.py and must list every one of them."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
from families import WINDOW, registry_families, rows, skip_reason
from matrix import CL, TARGETS, TLM_HIDDEN, TOL, run_row

ROOT = Path(__file__).resolve().parents[2]
#: one row per pattern: plain, windowed, mixed local/global, no position_ids, ALiBi (two forms),
#: sinks + MoE, latent attention, dynamo
CORE = {"llama", "mistral", "gemma3_text", "gemma2", "bloom", "falcon-alibi", "gpt_oss", "deepseek_v3",
        "llama-dynamo", "gemma2-dynamo"}
#: rows whose tiny config has sliding-window layers (families.json gives them WINDOW < CL)
WINDOWED = {"mistral", "phi3", "gemma2", "gemma3_text", "gpt_oss", "gpt_neo", "qwen2-window",
            "mistral-dynamo", "phi3-dynamo", "gemma2-dynamo"}

ALL_ROWS, SKIPPED = rows()
SELECTED = [r for r in ALL_ROWS if os.environ.get("SPECDEC_MATRIX", "full") != "core" or r.id in CORE]


@pytest.mark.slow
@pytest.mark.parametrize("row", SELECTED, ids=[r.id for r in SELECTED])
def test_row_compiles_both_roles_and_targets_and_verifies(row):
    cells = run_row(row)
    bad = [f"{c.role}/{c.target}: {c.status} {c.reason}" for c in cells if c.status != "pass"]
    assert not bad, f"{row.id}: " + "; ".join(bad)
    assert all(c.max_logits_diff <= TOL for c in cells)
    hidden = [c for c in cells if c.role == TLM_HIDDEN]
    assert sorted(c.target for c in hidden) == sorted(TARGETS), f"{row.id}: hidden states not run on both targets"
    assert all(c.max_hidden_diff is not None and c.max_hidden_diff <= TOL for c in hidden), \
        f"{row.id}: the hidden_states output was not checked against the export's internal tensors"
    if row.id in WINDOWED:
        windows = {w for c in cells for w in (c.windows or [])}
        assert WINDOW in windows, f"{row.id}: no layer with the {WINDOW}-token window found: {windows}"
        assert CL > WINDOW, "the verified history must be longer than the window"


@pytest.mark.parametrize("family", registry_families())
def test_every_registry_family_has_a_row_or_a_printed_reason(family):
    reason = skip_reason(family)
    if reason:
        pytest.skip(f"{family}: {reason}")
    assert family in {r.family for r in ALL_ROWS}


def test_coverage_doc_lists_every_row_and_skipped_family():
    text = (ROOT / "docs" / "coverage.md").read_text()
    for r in ALL_ROWS:
        assert f"| {r.name} | {r.exporter} |" in text, f"docs/coverage.md lacks {r.id}: regenerate it"
    for family, _ in SKIPPED:
        assert f"`{family}`" in text


def test_a_bfloat16_export_is_refused_in_one_line(tmp_path, capsys):
    """A bfloat16 export (here: the llama fixture with its cache and logits typed bfloat16; optimum's
    own bf16 export fails on CPU) is refused with the one sentence, exit 2, nothing written."""
    import onnx
    from models import export_fixture

    from specdec_compile import cli
    from specdec_compile.detect import BF16_REFUSAL
    m = onnx.load(str(export_fixture("llama_gqa")))
    for vi in list(m.graph.input) + list(m.graph.output):
        if vi.type.tensor_type.elem_type == onnx.TensorProto.FLOAT:
            vi.type.tensor_type.elem_type = onnx.TensorProto.BFLOAT16
    src = tmp_path / "bf16.onnx"
    onnx.save(m, str(src))
    out = tmp_path / "out"
    assert cli.main([str(src), "--role", "dlm", "-o", str(out)]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and err[0].endswith(BF16_REFUSAL) and "Traceback" not in err[0]
    assert not out.exists()
