"""bench/step_floor.py on a tiny GQA export (seconds): the floor's weights, the bare steps and
widths as ratios to it, the profiler's kernel count; the skip without a model. SmolLM2 itself is
measured by ``python -m bench.run_bench --only step_floor`` (BENCHMARKS.md)."""
from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import onnx

from bench import step_floor
from specdec_compile.options import Options


def test_the_floor_reads_every_weight_matrix_once(fixture_path):
    model = fixture_path("llama_gqa")
    weights = step_floor.weight_matrices(model)
    m = onnx.load(str(model), load_external_data=False)
    matmul_weights = {n.input[1] for n in m.graph.node if n.op_type == "MatMul"}
    inits = {t.name: t for t in m.graph.initializer}
    assert len(weights) >= len(matmul_weights & set(inits))
    assert all(w.ndim == 2 and w.dtype == np.float32 for w in weights)
    run = step_floor.floor_session(weights, threads=1)
    outs = run()
    assert [o.shape for o in outs] == [(1, w.shape[1]) for w in weights]


def test_the_section_on_a_tiny_export(fixture_path, tmp_path):
    rec = step_floor.measure(fixture_path("llama_gqa"), tmp_path / "sf", ctxs=[32, 64], widths=[2, 5],
                             steps=2, rounds=1, threads=1, log=lambda *_: None, int4=True)
    assert rec["floor_ms"] > 0 and rec["weight_bytes"] > 0
    calls = [(r["call"], r["ctx_len"], r["width"]) for r in rec["rows"]]
    assert calls == [("int4 target step", 32, 1), ("int4 target step, int8 activations", 32, 1),
                     ("target step", 32, 1), ("target step", 64, 1),
                     ("verify", 32, 2), ("verify", 32, 5)]
    import onnx as _onnx
    q = _onnx.load(str(tmp_path / "sf" / "int4-export" / "model.onnx"), load_external_data=False)
    assert any(n.op_type == "MatMulNBits" for n in q.graph.node)
    for r in rec["rows"]:
        assert abs(r["over_floor"] - r["ms"] / rec["floor_ms"]) < 0.05 * r["over_floor"] + 0.01
    assert all("over_target_step" in r for r in rec["rows"] if r["call"] != "target step")
    # the profiler's count: every kernel of a step, and the same by op (each rounded per step)
    assert rec["nodes_per_step"] > 0 and abs(rec["nodes_per_step"] - sum(rec["by_op"].values())) <= len(rec["by_op"])
    assert rec["by_op"].get("MatMul", 0) + rec["by_op"].get("FusedMatMul", 0) > 0
    md = "\n".join(step_floor.markdown(rec))
    assert "| target step | 64 | 1 |" in md and "kernels per step" in md


def test_skipped_with_the_reason_without_a_model(tmp_path):
    said = []
    a = SimpleNamespace(step_floor_model=None, real_out=tmp_path / "nothing", log=said.append)
    assert step_floor.run(a, {"step_floor"}) == {}
    assert said and "skipped: no model at" in said[0]
    assert step_floor.run(a, {"kv"}) == {}
    assert Path(step_floor.RESULTS).name == "results-step-floor.json"


def test_int4_speculative_rows_need_the_demo_build(tmp_path):
    """Without make demo's build the int4 speculative rows are skipped with the reason (the section
    itself still runs); the reason reaches the markdown."""
    from bench import int4_spec
    rec = int4_spec.run(tmp_path / "no-build", tmp_path / "int4.onnx", tmp_path / "out")
    assert "tokenizer" in rec["skipped"] and "make demo" in rec["skipped"]
    assert "skipped" in "\n".join(int4_spec.markdown(rec))
    assert not (tmp_path / "out").exists()


def test_the_int4_export_keeps_its_config_and_tokenizer_files(fixture_path, tmp_path):
    """The compiled int4 artifact reads its eos ids and vocabulary from the files beside the export."""
    src = tmp_path / "export"
    src.mkdir()
    (src / "model.onnx").write_bytes(Path(fixture_path("llama_gqa")).read_bytes())
    (src / "config.json").write_text('{"eos_token_id": 2}')
    (src / "specdec-stamp.json").write_text("{}")
    q = step_floor.quantize_int4(src / "model.onnx", tmp_path / "q", log=lambda *_: None)
    assert (q.parent / "config.json").read_text() == '{"eos_token_id": 2}'
    assert not (q.parent / "specdec-stamp.json").exists()


def test_width_dependence_of_a_float32_tlm_is_nil(fixture_path, tmp_path):
    """The speculative loop's premise, measured: a float32 TLM gives a position the same logits
    (to rounding) whether it is called with 1 token or 4."""
    from bench import int4_spec
    from specdec_compile import pipeline
    out = tmp_path / "tlm.onnx"
    model = pipeline.compile_model(str(fixture_path("llama_gqa")), Options(role="tlm", target="ort", k=3, ctx_len=256))
    import onnx as _onnx
    _onnx.save(model, str(out))
    dep = int4_spec.width_dependence(out, tokens=12, width=4)
    assert dep["max_abs_diff"] < 1e-4 and dep["top_token_differs"] == 0
    assert dep["tokens"] == 12 and dep["width"] == 4
