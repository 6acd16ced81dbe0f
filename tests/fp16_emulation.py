"""Float16 compute emulated on ONNX Runtime, as ``qaic-exec -convert-to-fp16`` runs a graph.

``emulate_fp16(model)`` returns a copy of ``model`` in which every float32
constant (weights included) is rounded to float16, and every float32 tensor a
node produces is rounded to float16 right after the node (Cast to float16 and
back). Each op thus reads float16 values and stores a float16 result, as on
the device; only the arithmetic inside one op is wider (float32), which, if
anything, flatters float16. Inputs are rounded by the caller (``round16``).
The interface is unchanged, so the same feeds run both models.
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def round16(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float16).astype(np.float32) if x.dtype == np.float32 else x


def _float_outputs(model: onnx.ModelProto) -> set[str]:
    inferred = onnx.shape_inference.infer_shapes(model)
    return {vi.name for vi in [*inferred.graph.value_info, *inferred.graph.output]
            if vi.type.tensor_type.elem_type == TensorProto.FLOAT}


def _round_constants(graph: onnx.GraphProto) -> None:
    for init in graph.initializer:
        if init.data_type == TensorProto.FLOAT:
            init.CopyFrom(numpy_helper.from_array(round16(numpy_helper.to_array(init)), init.name))
    for node in graph.node:
        for a in node.attribute:
            if a.type == onnx.AttributeProto.TENSOR and a.t.data_type == TensorProto.FLOAT:
                a.t.CopyFrom(numpy_helper.from_array(round16(numpy_helper.to_array(a.t)), a.t.name))


def emulate_fp16(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``model`` (weights loaded) that stores every float tensor as float16."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    floats = _float_outputs(m)
    _round_constants(m.graph)
    nodes = []
    for i, node in enumerate(m.graph.node):
        nodes.append(node)
        for j, out in enumerate(node.output):
            if out in floats:
                wide = f"{out}__wide{i}"
                node.output[j] = wide
                nodes.append(helper.make_node("Cast", [wide], [f"{out}__f16"], to=TensorProto.FLOAT16))
                nodes.append(helper.make_node("Cast", [f"{out}__f16"], [out], to=TensorProto.FLOAT))
    del m.graph.node[:]
    m.graph.node.extend(nodes)
    del m.graph.value_info[:]
    return m
