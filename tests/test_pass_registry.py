"""The pass registry is the single source of the pipeline: order, names, metadata,
the documented pass table; and the package layout follows it (module name =
pass name, one test module per pass, one per detection finder)."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import onnx
import onnx_graphsurgeon as gs
import pytest

from specdec_compile import passes, pipeline
from specdec_compile.detect import detect
from specdec_compile.errors import SpecdecError
from specdec_compile.passes import REGISTRY, Pass, PassContext
from specdec_compile.options import Options

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "specdec_compile"
#: the document holding the pass table
TABLE_DOC = ROOT / "docs" / "compiler.md"


def _public_modules(package: str) -> set[str]:
    """Modules of a subpackage that are not helpers (helpers start with ``_``)."""
    return {p.stem for p in (PKG / package).glob("*.py") if not p.stem.startswith("_")}


def test_registry_names_are_the_pass_modules_and_functions():
    assert [p.name for p in REGISTRY] == list(passes.names())
    assert len(set(passes.names())) == len(REGISTRY)
    assert set(passes.names()) == _public_modules("passes")
    for p in REGISTRY:
        assert p.run.__module__ == f"specdec_compile.passes.{p.name}" and p.run.__name__ == p.name
        assert getattr(passes, p.name) is p.run, "each pass is importable from specdec_compile.passes"


def test_every_pass_has_its_test_module_and_no_test_module_lacks_a_pass():
    tests = {p.stem for p in (ROOT / "tests" / "passes").glob("test_*.py")}
    assert tests == {f"test_{name}" for name in passes.names()}


def test_every_detection_finder_has_its_test_module():
    finders = _public_modules("detect")
    tests = {p.stem for p in (ROOT / "tests" / "detect").glob("test_*.py")}
    assert {f"test_{f}" for f in finders} <= tests
    assert tests - {f"test_{f}" for f in finders} == {"test_detect"}, "test_detect: the composition"


def test_pass_table_in_the_docs_is_the_rendering_of_the_registry():
    text = TABLE_DOC.read_text()
    table = passes.render_table()
    assert table in text
    start = text.index("| pass | job |")
    end = text.index("\n\n", start)
    assert text[start:end + 1] == table, "the documented table has rows the registry does not render"


def test_pass_order_is_derived_from_the_registry():
    assert pipeline.PASS_ORDER == passes.names()
    assert passes.names()[0] == REGISTRY[0].name and passes.names()[-1] == REGISTRY[-1].name
    qaic_only = {p.name for p in REGISTRY if p.targets == ("qaic",)}
    ort_only = {p.name for p in REGISTRY if p.targets == ("ort",)}
    ort_openvino = {p.name for p in REGISTRY if p.targets == ("ort", "openvino")}
    assert ort_openvino == {"grouped_attention", "share_shapes"}, \
        "the ort passes that also serve OpenVINO (no per-call copy of the grouped cache)"
    assert {"rotary_tables", "dense_experts", "flatten_to_reshape", "castlike_to_cast",
            "greater_compares", "drop_nan_guards", "tile_to_expand", "clamp_gather_positions"} == qaic_only, "the qaic legalizations are the only qaic-restricted entries"
    assert {"fuse_rotary", "gather_rotate_half"} == ort_only, \
        "fuse_rotary (ONNX Runtime's RotaryEmbedding kernel) and gather_rotate_half (OpenVINO fuses the export's " \
        "rotary form into its RoPE node instead) are ort's alone"
    ort_only |= ort_openvino
    qeff_only = {p.name for p in REGISTRY if p.interfaces == ("qeff",)}
    assert qeff_only == {"batch_index", "logits_to_keep"}, "--interface qeff's passes are its only entries"
    default = tuple(p for p in REGISTRY if p.name not in qeff_only)
    for role in ("tlm", "dlm"):
        assert passes.select(role, "qaic") == tuple(p for p in default if p.name not in ort_only)
        assert passes.select(role, "ort") == tuple(p for p in default if p.name not in qaic_only)
        # OpenVINO: the target-neutral passes, the lowering, and the ort passes it shares
        assert passes.select(role, "openvino") == tuple(p for p in default if p.name not in qaic_only | {
            "fuse_rotary", "gather_rotate_half"})
        qeff = {p.name for p in passes.select(role, "ort", "qeff")} - {p.name for p in default}
        assert qeff == ({"batch_index", "logits_to_keep"} if role == "tlm" else {"batch_index"})
    with pytest.raises(SpecdecError, match="unknown target 'cpu'"):
        passes.select("tlm", "cpu")


def test_render_table_marks_a_restricted_entry():
    only = Pass("x_legalize", passes.cleanup, "job text", targets=("qaic",))
    assert not only.applies("tlm", "ort") and only.applies("dlm", "qaic")
    assert passes._scope(only) == "*(target qaic only)* "


def _noop(graph, ctx):
    passes.need("noop_qaic", ctx, "target")
    return graph.copy()


def test_a_target_only_entry_runs_and_is_recorded_only_for_its_target(fixture_path, monkeypatch):
    """The registry rule, end to end: selection by (role, target), recorded in
    CompileResult.passes, the snapshots and the model's specdec.passes."""
    extra = Pass("noop_qaic", _noop, "nothing", targets=("qaic",))
    at = passes.names().index("lower") + 1
    monkeypatch.setattr(passes, "REGISTRY", REGISTRY[:at] + (extra,) + REGISTRY[at:])
    for target, want in (("qaic", True), ("ort", False)):
        res = pipeline.rewrite(str(fixture_path("gpt2")), Options(role="tlm", target=target, k=3), record=True)
        assert ("noop_qaic" in res.passes) is want
        assert [n for n, _ in res.snapshots[1:]] == res.passes
        meta = {p.key: p.value for p in res.model.metadata_props}
        assert meta["specdec.passes"] == ",".join(res.passes)
        assert res.passes == [p.name for p in passes.select("tlm", target)]


def test_pass_context_is_frozen_and_checked(fixture_path):
    ctx = PassContext(role="dlm", target="ort", k=3)
    with pytest.raises(dataclasses.FrozenInstanceError):
        ctx.role = "tlm"
    with pytest.raises(SpecdecError, match="unknown role 'draft'"):
        PassContext(role="draft")
    with pytest.raises(SpecdecError, match="k must be an integer >= 1"):
        PassContext(k=0)
    with pytest.raises(SpecdecError, match="must be a Detection"):
        PassContext(detection="not a detection")
    g = gs.import_onnx(onnx.load(str(fixture_path("gpt2")), load_external_data=False))
    det = detect(g)
    with pytest.raises(TypeError, match=r"retained_kv\(graph, ctx\)"):
        passes.retained_kv(g, det)  # the pre-registry signature names the new one
    with pytest.raises(SpecdecError, match=r"pass retained_kv needs ctx\.detection"):
        passes.retained_kv(g, ctx)
