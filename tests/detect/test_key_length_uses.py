"""key_length_uses: a value the export computes from the cache's key length K (a Shape of the cache)
must mean the same for the rewrite's ctx_len long cache, or the graph is refused in one line.
Before this check, Qwen-1's logn attention (the queries scaled by logn[K-S:K]) compiled for both
targets with exit 0, and verify then saw the logits off by 7.5e-3."""
from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import pytest
from families import rows
from matrix import spec_of
from models import export_spec
from onnx import TensorProto, helper, numpy_helper

from specdec_compile.detect import detect
from specdec_compile.detect.key_length_uses import PAST, SEQ, agrees, visible
from specdec_compile.errors import UnsupportedPatternError
from specdec_compile.graph_utils import name_unnamed_nodes
from specdec_compile.options import Options
from specdec_compile.pipeline import rewrite
from specdec_compile.verify import verify

L0 = "/model/layers.0/self_attn/"
Q = L0 + "Add_output_0"          # layer 0's rotated queries, read by Mul_8 (the scale)


def _detect(model: onnx.ModelProto):
    g = gs.import_onnx(model)
    name_unnamed_nodes(g)
    return detect(g)


def _const(model, name, value):
    model.graph.initializer.append(numpy_helper.from_array(np.asarray(value), name))


def _insert(model, nodes, before: str, tensor: str, op: str, operand: str) -> None:
    """``nodes`` placed before node ``before``, whose input ``tensor`` becomes ``op(tensor, operand)``."""
    idx = next(i for i, n in enumerate(model.graph.node) if n.name == before)
    reader = model.graph.node[idx]
    nodes = nodes + [helper.make_node(op, [tensor, operand], ["mut_out"])]
    for i, n in enumerate(nodes):
        n.name = f"mut_{i}"
        model.graph.node.insert(idx + i, n)
    reader.input[:] = ["mut_out" if x == tensor else x for x in reader.input]


def _key_length(model, source="present.0.key"):
    _const(model, "i2", np.array([2], np.int64))
    _const(model, "i3", np.array([3], np.int64))
    return [helper.make_node("Shape", [source], ["k_shape"]),
            helper.make_node("Slice", ["k_shape", "i2", "i3"], ["klen"])]


def _logn(model, base: float = 8.0):
    """Qwen-1's logn attention: q *= logn[K-S:K] (a constant table sliced by the key length; 1 up to
    position ``base``)."""
    table = np.maximum(1.0, np.log(np.arange(1, 513, dtype=np.float32)) / np.log(base)).astype(np.float32)
    _const(model, "logn_tab", table.reshape(1, 1, 512, 1))
    nodes = _key_length(model) + [helper.make_node("Shape", [Q], ["q_shape"]),
                                  helper.make_node("Slice", ["q_shape", "i2", "i3"], ["qlen"]),
                                  helper.make_node("Sub", ["klen", "qlen"], ["start"]),
                                  helper.make_node("Slice", ["logn_tab", "start", "klen", "i2"], ["logn_q"])]
    _insert(model, nodes, L0 + "Mul_8", Q, "Mul", "logn_q")


def _scores(model, op: str, value_nodes, value: str):
    sm = next(n for n in model.graph.node if n.name == L0 + "Softmax")
    _insert(model, value_nodes, sm.name, sm.input[0], op, value)


def _log_scale(model):
    """scores *= 1 + log(K)/10"""
    _const(model, "ten", np.array(10.0, np.float32))
    _const(model, "onef", np.array(1.0, np.float32))
    nodes = _key_length(model) + [helper.make_node("Cast", ["klen"], ["kf"], to=TensorProto.FLOAT),
                                  helper.make_node("Log", ["kf"], ["logk"]),
                                  helper.make_node("Div", ["logk", "ten"], ["logk10"]),
                                  helper.make_node("Add", ["logk10", "onef"], ["kscale"])]
    _scores(model, "Mul", nodes, "kscale")


def _alibi(model, quadratic: bool = False):
    """MPT-style ALiBi: scores += slope * arange(1-K, 1) (quadratic: its square / 100)."""
    _const(model, "slopes", (2.0 ** -np.arange(1, 5, dtype=np.float32)).reshape(1, 4, 1, 1))
    _const(model, "one_i", np.array(1, np.int64))
    _const(model, "ax0", np.array([0], np.int64))
    _const(model, "hundred", np.array(100.0, np.float32))
    nodes = _key_length(model) + [helper.make_node("Squeeze", ["klen", "ax0"], ["k"]),
                                  helper.make_node("Sub", ["one_i", "k"], ["start"]),
                                  helper.make_node("Range", ["start", "one_i", "one_i"], ["rel"]),
                                  helper.make_node("Cast", ["rel"], ["relf"], to=TensorProto.FLOAT)]
    last = "relf"
    if quadratic:
        nodes += [helper.make_node("Mul", ["relf", "relf"], ["sq"]), helper.make_node("Div", ["sq", "hundred"], ["q"])]
        last = "q"
    _scores(model, "Add", nodes + [helper.make_node("Mul", [last, "slopes"], ["alibi"])], "alibi")


def _compile_and_verify(tmp_path, model, target="ort"):
    path = tmp_path / "model.onnx"
    onnx.save(model, str(path))
    r = rewrite(str(path), Options(role="tlm", k=3, target=target, prefill_len=8, ctx_len=64))
    out = tmp_path / f"rw-{target}.onnx"
    onnx.save(r.model, str(out))
    return verify(str(path), str(out), k=3, prefill_len=8, ctx_len=64)


def test_a_logn_query_scale_sliced_by_the_key_length_is_refused(fixture_path):
    # was: compiled for ort and qaic (exit 0); verify then differed by 7.5e-3 in the logits
    model = onnx.load(str(fixture_path("llama_gqa")))
    _logn(model)
    with pytest.raises(UnsupportedPatternError, match=r"layer 0: 'logn_q' \(read by Mul 'mut_6'\) is computed "
                                                      r"from the cache's key length.*\[1.0, 1.0566, 1.1073\]"):
        _detect(model)


def test_a_logn_table_that_is_flat_for_short_histories_is_refused_at_the_table_length(fixture_path):
    """Qwen-1's table is 1 up to its training length: a short probe alone would not see it."""
    model = onnx.load(str(fixture_path("llama_gqa")))
    _logn(model, base=100.0)
    with pytest.raises(UnsupportedPatternError, match=r"'logn_q' .*\[1.0, 1.0, 1.0\] for 3 tokens after 7 cached, "
                                                      r"but \[1, 1, 3, 1\] \[1.3538.*with a 512-slot cache"):
        _detect(model)


def test_a_logn_table_sliced_by_the_past_length_is_refused(fixture_path):
    model = onnx.load(str(fixture_path("llama_gqa")))
    _logn(model)
    shape = next(n for n in model.graph.node if n.name == "mut_0")
    shape.input[0] = "past_key_values.0.key"     # [P:P+S] written from the past input: the same value
    for n in model.graph.node:
        if n.name == "mut_4":
            n.op_type, n.input[:] = "Add", ["klen", "qlen"]
        if n.name == "mut_5":
            n.input[:] = ["logn_tab", "klen", "start", "i2"]
    with pytest.raises(UnsupportedPatternError, match="layer 0: 'logn_q'"):
        _detect(model)


def test_scores_scaled_by_the_log_of_the_key_length_are_refused(fixture_path):
    # was: compiled (exit 0), logits off like the logn table's
    model = onnx.load(str(fixture_path("llama_gqa")))
    _log_scale(model)
    with pytest.raises(UnsupportedPatternError, match=r"layer 0: 'kscale' .* it is \[1\] \[1.2303\] for 3 tokens "
                                                      r"after 7 cached, but \[1\] \[1.3178\] for them with a 24-slot"):
        _detect(model)


def test_a_bias_that_is_not_a_shift_per_query_is_refused(fixture_path):
    model = onnx.load(str(fixture_path("llama_gqa")))
    _alibi(model, quadratic=True)
    with pytest.raises(UnsupportedPatternError, match="layer 0: 'alibi' .*computed from the cache's key length"):
        _detect(model)


def test_mpt_style_alibi_from_a_key_length_range_compiles_and_verifies(fixture_path, tmp_path):
    """slope * (c - (K-1)): with a ctx_len cache every visible score of a row moves by the same
    slope * (K - ctx_len), which the softmax ignores."""
    model = onnx.load(str(fixture_path("llama_gqa")))
    _alibi(model)
    rep = _compile_and_verify(tmp_path, model)
    assert rep.ok, rep


def test_the_mpt_export_keeps_its_alibi(fixture_path):
    """optimum's MPT slices a max_seq_len ALiBi table by -K: detected (its coverage row verifies)."""
    row = next(r for r in rows()[0] if r.id == "mpt")
    g = gs.import_onnx(onnx.load(str(export_spec(f"cov-{row.id}", spec_of(row))), load_external_data=False))
    name_unnamed_nodes(g)
    assert len(detect(g, "mpt").layers) == 2


def test_a_table_sliced_to_the_first_k_rows_and_gathered_by_position_compiles(fixture_path, tmp_path):
    model = onnx.load(str(fixture_path("llama_gqa")))
    _const(model, "tabp", 1.0 + np.arange(512, dtype=np.float32) / 1000.0)
    _const(model, "z0", np.array([0], np.int64))
    _const(model, "ax13", np.array([1, 3], np.int64))
    nodes = _key_length(model) + [helper.make_node("Slice", ["tabp", "z0", "klen", "z0"], ["tab_k"]),
                                  helper.make_node("Gather", ["tab_k", "position_ids"], ["tab_pos"]),
                                  helper.make_node("Unsqueeze", ["tab_pos", "ax13"], ["tab_u"])]
    _insert(model, nodes, L0 + "Mul_8", Q, "Mul", "tab_u")
    assert _compile_and_verify(tmp_path, model).ok


def test_agrees_compares_the_first_slots_and_allows_a_row_shift_only_on_seen_slots():
    k = np.arange(PAST + SEQ, dtype=np.float32)
    c = np.arange(24, dtype=np.float32)
    alibi_e, alibi_r = (k - k[-1])[None], (c - c[-1])[None]
    assert agrees(alibi_e, alibi_r, 24, visible(PAST + SEQ, None))
    assert not agrees(alibi_e, alibi_r, 24, None)              # not a bias on the scores: exact
    assert agrees(k, c, 24, None)                              # the first K slots are the export's
    assert not agrees(k, c[::-1].copy(), 24, None)
    assert not agrees(k[:SEQ], c[-SEQ:], 24, None)             # the last rows: another value
    shifted = np.tile(alibi_r, (SEQ, 1))
    shifted[0, -5:] = 1e4                                      # slots query 0 does not see
    assert agrees(np.tile(alibi_e, (SEQ, 1)), shifted, 24, visible(PAST + SEQ, None))
    assert not agrees(np.zeros((2, 10)), np.zeros((3, 24)), 24, None)
