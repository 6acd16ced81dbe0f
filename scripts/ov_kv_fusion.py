"""Which stateful graphs OpenVINO's CPU plugin runs with its cache in place (issue 34's way forward).

The plugin has one in-place KV cache: its stateful ScaledDotProductAttention node, which it makes
from ReadValue -> Gather(beam_idx) -> Concat -> ScaledDotProductAttention -> Assign. This probe
compiles small graphs and says, for each, whether that node appears (a ScaledDotProductAttention
with the past cache among its inputs) or the attention was decomposed (MatMul, Softmax, a Concat
copied into the state):

* ``onnx-attention`` / ``onnx-attention+gather``: ONNX ``Attention`` (opset 23, GQA 9/3 heads,
  causal) with past/present, made stateful by ``MakeStateful``, without and with a Gather over
  ``beam_idx`` on the past (its output checked against numpy over 4 calls);
* ``native`` / ``native+gather``: the same built with OpenVINO's own ops (no ONNX; 3 heads, as its
  ScaledDotProductAttention takes equal query and key heads);
* ``genai-ir`` (``--ir XML``): an OpenVINO GenAI model, as ``bench/backends.py`` converts it;
* ``stock-export`` (``--export ONNX``): an optimum decoder export (growing cache, attention as
  MatMul/Softmax) made stateful, and its greedy decode rate at 1 thread, f32;
  ``stock-export+gather``: the same with a Gather over ``beam_idx`` after every ReadValue.

    python -m scripts.ov_kv_fusion --ir build/bench/backends/genai-ir/tlm-fp32/openvino_model.xml \\
        --export build/demo/export/tlm/model.onnx
"""
from __future__ import annotations

import argparse
import json
import time

import numpy as np

H, KV, D = 9, 3, 64
CFG = {"INFERENCE_PRECISION_HINT": "f32", "INFERENCE_NUM_THREADS": 1}


def fused(compiled) -> dict:
    """The runtime model's attention: stateful SDPA nodes (past cache inside) or decomposed."""
    ops = compiled.get_runtime_model().get_ordered_ops()
    kinds = [o.get_rt_info()["layerType"].astype(str) for o in ops]
    sdpa = [o.get_input_size() for o, k in zip(ops, kinds) if k == "ScaledDotProductAttention"]
    return {"stateful_sdpa": sum(n >= 6 for n in sdpa), "matmul": kinds.count("MatMul"),
            "softmax": kinds.count("Softmax"), "concat": kinds.count("Concatenation")}


def _reference(q, K, V, S):
    Kr, Vr = np.repeat(K, H // KV, 1), np.repeat(V, H // KV, 1)
    N = K.shape[2]
    s = np.where(np.arange(N)[None, :] <= (N - S + np.arange(S))[:, None], q @ Kr.transpose(0, 1, 3, 2) / np.sqrt(D),
                 -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    return (p / p.sum(-1, keepdims=True)) @ Vr


def onnx_attention(core, gather: bool) -> dict:
    import onnx
    from onnx import TensorProto as T
    from onnx import helper as h
    from openvino import passes as ovp
    x = h.make_tensor_value_info
    past = ["pk", "pv"] if gather else ["past_key", "past_value"]
    nodes = [h.make_node("Gather", [p, "beam_idx"], [g], axis=0) for p, g in
             (("past_key", "pk"), ("past_value", "pv"))] if gather else []
    nodes.append(h.make_node("Attention", ["q", "k", "v", ""] + past, ["y", "present_key", "present_value"],
                             is_causal=1, q_num_heads=H, kv_num_heads=KV))
    ins = [x("q", T.FLOAT, [1, H, "S", D]), x("k", T.FLOAT, [1, KV, "S", D]), x("v", T.FLOAT, [1, KV, "S", D]),
           x("past_key", T.FLOAT, [1, KV, "P", D]), x("past_value", T.FLOAT, [1, KV, "P", D])]
    ins += [x("beam_idx", T.INT64, [1])] if gather else []
    outs = [x("y", T.FLOAT, [1, H, "S", D]), x("present_key", T.FLOAT, [1, KV, "N", D]),
            x("present_value", T.FLOAT, [1, KV, "N", D])]
    proto = h.make_model(h.make_graph(nodes, "attn", ins, outs), opset_imports=[h.make_opsetid("", 23)])
    m = core.read_model(proto.SerializeToString(), b"")
    man = ovp.Manager()
    man.register_pass(ovp.MakeStateful({"past_key": "present_key", "past_value": "present_value"}))
    man.run_passes(m)
    c = core.compile_model(m, "CPU", CFG)
    req, rng, ks, vs, err = c.create_infer_request(), np.random.default_rng(0), [], [], 0.0
    for S in (5, 1, 1, 3):
        q, k, v = (rng.standard_normal((1, n, S, D)).astype(np.float32) for n in (H, KV, KV))
        ks.append(k)
        vs.append(v)
        feed = {"q": q, "k": k, "v": v, **({"beam_idx": np.zeros(1, np.int64)} if gather else {})}
        y = req.infer(feed)["y"]
        err = max(err, float(np.abs(y - _reference(q, np.concatenate(ks, 2), np.concatenate(vs, 2), S)).max()))
    return {**fused(c), "max_abs_err": err}


def native(core, gather: bool) -> dict:
    import openvino as ov
    import openvino.opset13 as op
    from openvino.op.util import Variable, VariableInfo
    q, k, v = (op.parameter([1, KV, -1, D], np.float32, name=nm) for nm in ("q", "k", "v"))   # SDPA wants equal heads
    beam = op.parameter([1], np.int32, name="beam_idx")
    cat, sinks = [], []
    for name, new in (("K", k), ("V", v)):
        info = VariableInfo()
        info.data_shape, info.data_type, info.variable_id = ov.PartialShape([1, KV, -1, D]), ov.Type.f32, name
        var = Variable(info)
        rv = op.read_value(op.broadcast(op.constant(np.float32(0)), op.constant(np.array([1, KV, 0, D]))), var)
        c = op.concat([op.gather(rv, beam, op.constant(np.int64(0))) if gather else rv, new], 2)
        sinks.append(op.assign(c, var))
        cat.append(c)
    y = op.result(op.scaled_dot_product_attention(q, *cat, causal=True))
    m = ov.Model([y], sinks, [q, k, v, beam], "native")
    return fused(core.compile_model(m, "CPU", CFG))


def _beam_gathers(m) -> None:
    """A Gather over a new ``beam_idx`` input after every ReadValue (GenAI's IR has them)."""
    import openvino.opset13 as op
    beam = op.parameter([1], np.int32, name="beam_idx")
    for node in m.get_ordered_ops():
        if node.get_type_name() == "ReadValue":
            targets = list(node.output(0).get_target_inputs())
            g = op.gather(node.output(0), beam, op.constant(np.int64(0)))
            for t in targets:
                t.replace_source_output(g.output(0))
    m.add_parameters([beam])
    m.validate_nodes_and_infer_types()


def stock_export(core, path: str, gather: bool, new_tokens: int = 128) -> dict:
    from openvino import passes as ovp
    m = core.read_model(path)
    pairs = {p.get_any_name(): p.get_any_name().replace("past_key_values.", "present.") for p in m.inputs
             if p.get_any_name().startswith("past_key_values.")}
    m.reshape({p.get_any_name(): [1, KV, -1, D] if p.get_any_name() in pairs else [1, -1] for p in m.inputs})
    man = ovp.Manager()
    man.register_pass(ovp.MakeStateful(pairs))
    man.run_passes(m)
    if gather:
        _beam_gathers(m)
    c = core.compile_model(m, "CPU", CFG)
    if gather:
        return fused(c)
    req, best = c.create_infer_request(), 0.0
    for _ in range(3):
        req.reset_state()
        ids = [1, 9690, 198, 2683, 359, 253, 5356, 5646, 2, 198, 1, 4093, 198, 19161, 253, 7018, 30, 2, 198, 1]
        n = len(ids)
        out = req.infer({"input_ids": np.array([ids]), "attention_mask": np.ones((1, n), np.int64),
                         "position_ids": np.arange(n)[None]})
        t0 = time.perf_counter()
        for i in range(new_tokens):
            tok = int(np.argmax(out["logits"][0, -1]))
            out = req.infer({"input_ids": np.array([[tok]]), "attention_mask": np.ones((1, n + i + 1), np.int64),
                             "position_ids": np.array([[n + i]])})
        best = max(best, new_tokens / (time.perf_counter() - t0))
    return {**fused(c), "greedy_tokens_per_s": round(best, 1)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ir", default=None, help="an OpenVINO GenAI model's openvino_model.xml")
    ap.add_argument("--export", default=None, help="an optimum decoder export (model.onnx), SmolLM2's shapes")
    a = ap.parse_args(argv)
    import openvino as ov
    core = ov.Core()
    rows = {"onnx-attention": onnx_attention(core, False), "onnx-attention+gather": onnx_attention(core, True),
            "native": native(core, False), "native+gather": native(core, True)}
    if a.ir:
        rows["genai-ir"] = fused(core.compile_model(core.read_model(a.ir), "CPU", CFG))
    if a.export:
        rows["stock-export"] = stock_export(core, a.export, False)
        rows["stock-export+gather"] = stock_export(core, a.export, True)
    print(json.dumps({"openvino": ov.get_version(), **rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
