"""Shared by the pass tests: load a fixture with its detection, run a graph on
ONNX Runtime, serialize a graph (to check a pass left its input untouched)."""
from __future__ import annotations

import onnx
import onnx_graphsurgeon as gs
import onnxruntime as ort

from specdec_compile.detect import detect
from specdec_compile.graph_utils import name_unnamed_nodes
from specdec_compile.passes import PassContext


def load(path):
    g = gs.import_onnx(onnx.load(str(path), load_external_data=False))
    name_unnamed_nodes(g)
    return g, detect(g)


def ctx(det=None, **options) -> PassContext:
    return PassContext(detection=det, **options)


def session(graph_or_model):
    m = gs.export_onnx(graph_or_model) if isinstance(graph_or_model, gs.Graph) else graph_or_model
    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.intra_op_num_threads = 1
    return ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])


def serialized(g) -> bytes:
    return gs.export_onnx(g).SerializeToString()
