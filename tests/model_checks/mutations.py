"""A small mutator of ONNX exports, for hostile-input tests.

``mutants(src)`` yields ``(name, mutate)`` pairs; ``mutate(proto, dst_dir)`` takes a
fully loaded copy of the fixture export (weights inline) and writes a mutated export
into ``dst_dir`` (model.onnx, maybe a data file and JSON configs), returning the
path of its model.onnx. Every mutation is deterministic. The cases are the ones a
hostile or broken file brings: dims, dtypes, raw_data, names, ops, external data,
cycles, control flow, opsets and JSON configs.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import onnx
from onnx import TensorProto, helper

DATA = "model.onnx.data"


def _save(m: onnx.ModelProto, dst: Path, src_dir: Path | None = None) -> Path:
    dst.mkdir(parents=True, exist_ok=True)
    if src_dir is not None:
        for name in ("config.json", "generation_config.json"):
            if (src_dir / name).is_file() and not (dst / name).exists():
                shutil.copyfile(src_dir / name, dst / name)
    p = dst / "model.onnx"
    p.write_bytes(m.SerializeToString())
    return p


def save_external(m: onnx.ModelProto, dst: Path, location: str = DATA) -> Path:
    """``m`` with its larger initializers in the data file ``location`` (relative to ``dst``)."""
    dst.mkdir(parents=True, exist_ok=True)
    m = _copy(m)
    onnx.save(m, str(dst / "model.onnx"), save_as_external_data=True, all_tensors_to_one_file=True,
              location=location, size_threshold=256)
    return dst / "model.onnx"


def _copy(m: onnx.ModelProto) -> onnx.ModelProto:
    c = onnx.ModelProto()
    c.CopyFrom(m)
    return c


def _init(m: onnx.ModelProto, name_part: str = "embed_tokens") -> TensorProto:
    return next(t for t in m.graph.initializer if name_part in t.name)


def _set_ext(m: onnx.ModelProto, key: str, value: str) -> onnx.ModelProto:
    t = next(t for t in m.graph.initializer if t.data_location == TensorProto.EXTERNAL)
    for e in t.external_data:
        if e.key == key:
            e.value = value
            return m
    t.external_data.add(key=key, value=value)
    return m


def _external_then(fn):
    """A mutation of the external-data export (re-saved after ``fn`` edits its proto)."""
    def mutate(m, dst):
        p = save_external(m, dst)
        light = onnx.load(str(p), load_external_data=False)
        fn(light, dst)
        p.write_bytes(light.SerializeToString())
        return p
    return mutate


def _kv_input(m, axis: int, value: int):
    for vi in m.graph.input:
        if vi.name.startswith("past_key_values") or vi.name.startswith("past_key"):
            vi.type.tensor_type.shape.dim[axis].Clear()
            vi.type.tensor_type.shape.dim[axis].dim_value = value
    return m


def _edit(fn):
    def mutate(m, dst):
        m = _copy(m)
        fn(m)
        return _save(m, dst)
    return mutate


def _raw(delta: int):
    def fn(m):
        t = _init(m)
        t.raw_data = t.raw_data[:len(t.raw_data) + delta] if delta < 0 else t.raw_data + b"\0" * delta
    return fn


def _dtype(m):
    _init(m).data_type = TensorProto.DOUBLE


def _dims(dims):
    def fn(m):
        t = _init(m)
        del t.dims[:]
        t.dims.extend(dims)
        if 0 in dims:
            t.raw_data = b""
    return fn


def _dup_input(m):
    m.graph.input.append(m.graph.input[0])


def _unknown_domain(m):
    n = next(n for n in m.graph.node if n.op_type == "Sigmoid")
    n.domain = "com.example.hostile"
    m.opset_import.add(domain="com.example.hostile", version=1)


def _cycle(m):
    # the first MatMul reads the output of the last Add: a loop through the graph
    mm = next(n for n in m.graph.node if n.op_type == "MatMul")
    last = [n for n in m.graph.node if n.op_type == "Add"][-1]
    mm.input[0] = last.output[0]


def _if_node(m):
    """A checker-clean If on a constant condition, whose both branches give the logits."""
    logits = m.graph.output[0].name
    last = next(n for n in m.graph.node if logits in n.output)
    last.output[:] = [o if o != logits else "pre_if_logits" for o in last.output]
    branch = lambda tag: helper.make_graph(  # noqa: E731
        [helper.make_node("Identity", ["pre_if_logits"], [f"{tag}_out"])], tag, [],
        [helper.make_tensor_value_info(f"{tag}_out", TensorProto.FLOAT, None)])
    m.graph.initializer.append(helper.make_tensor("if_cond", TensorProto.BOOL, [], [True]))
    m.graph.node.append(helper.make_node("If", ["if_cond"], [logits], then_branch=branch("then"),
                                         else_branch=branch("else"), name="hostile_if"))


def _truncated_constant(m):
    n = next(n for n in m.graph.node if n.op_type == "Constant" and n.attribute[0].t.raw_data
             and len(n.attribute[0].t.raw_data) >= 8)
    n.attribute[0].t.raw_data = n.attribute[0].t.raw_data[:3]


def _undefined_input(m):
    n = next(n for n in m.graph.node if n.op_type == "MatMul")
    n.input[1] = "no_such_tensor"


def _dup_outputs(m):
    adds = [n for n in m.graph.node if n.op_type == "Add"]
    adds[1].output[0] = adds[0].output[0]


def _axis(op: str, value: int):
    def fn(m):
        n = next(n for n in m.graph.node if n.op_type == op)
        for a in n.attribute:
            if a.name == "axis":
                a.i = value
    return fn


def _constant_as(op: str):
    """The first Constant node relabelled ``op`` (no inputs, a ``value`` attribute: not valid ONNX)."""
    def fn(m):
        next(n for n in m.graph.node if n.op_type == "Constant").op_type = op
    return fn


def _opset(v):
    def fn(m):
        m.opset_import[0].version = v
    return fn


def _ir(m):
    m.ir_version = 99


def _no_opset(m):
    del m.opset_import[:]


def _config(text: str, name: str = "config.json"):
    def mutate(m, dst):
        p = _save(m, dst)
        (dst / name).write_text(text)
        return p
    return mutate


def _gen_ids(value):
    return _config(json.dumps({"bos_token_id": 1, "eos_token_id": value}), "generation_config.json")


def _ext_name(name):
    """The weights' data file named ``name`` (the graph is export.onnx where ``name`` is model.onnx)."""
    def mutate(m, dst):
        p = save_external(m, dst)
        light = onnx.load(str(p), load_external_data=False)
        for t in light.graph.initializer:
            for e in t.external_data:
                if e.key == "location":
                    e.value = name
        graph = dst / ("export.onnx" if name == "model.onnx" else "model.onnx")
        p.unlink()
        (dst / DATA).rename(dst / name)
        graph.write_bytes(light.SerializeToString())
        return graph
    return mutate


def _loc(value):
    return _external_then(lambda m, dst: _set_ext(m, "location", value))


def _ext(key, value):
    return _external_then(lambda m, dst: _set_ext(m, key, value))


def _rename_inputs(m):
    for vi in m.graph.input:
        if vi.name == "input_ids":
            vi.name = "$(touch /tmp/hostile-pwned)"
    for n in m.graph.node:
        n.input[:] = ["$(touch /tmp/hostile-pwned)" if i == "input_ids" else i for i in n.input]


def _non_utf8(m, dst):
    """A node input name whose bytes are not UTF-8 (protobuf then gives readers bytes, not str)."""
    m = _copy(m)
    n = next(n for n in m.graph.node if n.op_type == "MatMul")
    old = n.input[0]
    for x in m.graph.node:
        x.input[:] = ["XXXX" + i[4:] if i == old else i for i in x.input]
        x.output[:] = ["XXXX" + o[4:] if o == old else o for o in x.output]
    data = m.SerializeToString().replace(("XXXX" + old[4:]).encode(), b"\xff\xfe\xff\xfe" + old[4:].encode())
    dst.mkdir(parents=True, exist_ok=True)
    (dst / "model.onnx").write_bytes(data)
    return dst / "model.onnx"


MUTATIONS = {
    "ext-named-specializations": _ext_name("specializations.json"),
    "ext-named-compile-sh": _ext_name("compile.sh"),
    "ext-named-manifest": _ext_name("manifest.json"),
    "ext-named-model-onnx": _ext_name("model.onnx"),
    "ext-location-traversal": _loc("../secret.bin"),
    "ext-location-absolute": _loc("/etc/hostname"),
    "ext-length-short": _ext("length", "8"),
    "ext-length-negative": _ext("length", "-5"),
    "ext-offset-negative": _ext("offset", "-4"),
    "ext-offset-abc": _ext("offset", "abc"),
    "ext-offset-float": _ext("offset", "1e3"),
    "kv-heads-0": _edit(lambda m: _kv_input(m, 1, 0)),
    "kv-heads-huge": _edit(lambda m: _kv_input(m, 1, 2 ** 62)),
    "kv-heads-negative": _edit(lambda m: _kv_input(m, 1, -5)),
    "head-dim-huge": _edit(lambda m: _kv_input(m, 3, 2 ** 62)),
    "init-dim-minus1": _edit(_dims([-1, 64])),
    "init-dim-huge": _edit(_dims([2 ** 40, 64])),
    "embed-0-rows": _edit(_dims([0, 64])),
    "raw-data-short": _edit(_raw(-4)),
    "raw-data-long": _edit(_raw(4)),
    "dtype-changed": _edit(_dtype),
    "truncated-constant": _edit(_truncated_constant),
    "dup-graph-input": _edit(_dup_input),
    "unknown-domain-op": _edit(_unknown_domain),
    "cycle": _edit(_cycle),
    "if-node": _edit(_if_node),
    "undefined-input": _edit(_undefined_input),
    "dup-node-outputs": _edit(_dup_outputs),
    "softmax-axis-99": _edit(_axis("Softmax", 99)),
    "constant-as-softmax": _edit(_constant_as("Softmax")),
    "gather-axis-99": _edit(_axis("Gather", 99)),
    "opset-1": _edit(_opset(1)),
    "opset-7": _edit(_opset(7)),
    "opset-99": _edit(_opset(99)),
    "ir-99": _edit(_ir),
    "no-opset": _edit(_no_opset),
    "shell-input-name": _edit(_rename_inputs),
    "non-utf8-name": _non_utf8,
    "config-list": _config("[1, 2, 3]"),
    "config-model-type-dict": _config('{"model_type": {"a": 1}}'),
    "config-deep": _config("[" * 100000 + "]" * 100000),
    "gen-config-deep": _config("{\"a\":" * 100000 + "1" + "}" * 100000, "generation_config.json"),
    "eos-negative": _gen_ids(-1),
    "eos-huge": _gen_ids(10 ** 29),
    "eos-outside-vocab": _gen_ids(999999),
}


def mutants(names=None):
    """(name, mutate) pairs, all or those named."""
    return [(n, f) for n, f in MUTATIONS.items() if names is None or n in names]


def load_full(path: Path) -> onnx.ModelProto:
    return onnx.load(str(path))


def build(src: Path, name: str, dst: Path) -> Path:
    """The mutant ``name`` of the export ``src`` written into ``dst`` (configs copied first)."""
    dst.mkdir(parents=True, exist_ok=True)
    for cfg in ("config.json", "generation_config.json"):
        if (src.parent / cfg).is_file():
            shutil.copyfile(src.parent / cfg, dst / cfg)
    return MUTATIONS[name](load_full(src), dst)
