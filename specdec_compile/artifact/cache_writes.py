"""What a rewritten graph must still contain: the target's cache write.

The contract (section 2, lowering targets) writes the retained state with
``com.qualcomm.cloud::CtxScatter`` (a model-local ONNX function, the pattern the
Cloud AI 100 compiler knows) on ``qaic`` and with opset-24 ``TensorScatter`` on
``ort`` (QEfficient's interface, section 7: ``CtxScatterCB`` on qaic, ``ScatterND``
routed by ``batch_index`` on ort; read from the graph's ``specdec.interface``). A tool run on the artifact after the compile can lose that form:
onnxscript's optimizer inlines every model-local function, so the qaic graph's
CtxScatter becomes a plain ScatterND that still runs on ONNX Runtime (and still
verifies) but is not what the device compiler must get. ``check_cache_writes``
refuses such a graph in one line; ``specdec-compile verify`` and the runtime's
artifact load call it. The target comes from the manifest (the runtime) or the
graph's own ``specdec.target`` metadata (verify).
"""
from __future__ import annotations

import onnx

from ..contract import INTERFACE_KEY, QAIC_DOMAIN, TARGET_KEY
from ..errors import SpecdecError

#: target -> (domain, op) of the node that writes each retained-state output
CACHE_WRITE_OPS = {"qaic": (QAIC_DOMAIN, "CtxScatter"), "ort": ("", "TensorScatter"),
                   "openvino": ("", "ScatterElements")}
#: the same for QEfficient's interface (contract section 7): the write goes to the row batch_index names
QEFF_CACHE_WRITE_OPS = {"qaic": (QAIC_DOMAIN, "CtxScatterCB"), "ort": ("", "ScatterND")}
RETAINED_SUFFIX = "_RetainedState"


def _shown(domain: str, op: str) -> str:
    return f"{domain}::{op}" if domain else op


def cache_write_problem(model: onnx.ModelProto, target: str | None) -> str | None:
    """Why ``model`` no longer has ``target``'s cache write (None: it has it, or the
    target is unknown). One write per retained-state output is needed, and on qaic the
    CtxScatter function must be defined in the model."""
    if target not in CACHE_WRITE_OPS:
        return None
    qeff = any(p.key == INTERFACE_KEY and p.value == "qeff" for p in model.metadata_props)
    domain, op = (QEFF_CACHE_WRITE_OPS if qeff else CACHE_WRITE_OPS)[target]
    retained = [o.name for o in model.graph.output if o.name.endswith(RETAINED_SUFFIX)]
    writes = [n for n in model.graph.node if n.op_type == op and n.domain == domain]
    if len(writes) < len(retained):
        found = sorted({_shown(n.domain, n.op_type) for n in model.graph.node
                        if "Scatter" in n.op_type and (n.op_type, n.domain) != (op, domain)})
        return (f"the {target} cache write {_shown(domain, op)} is gone ({len(writes)} of {len(retained)} "
                f"retained-state outputs written by it" + (f"; found {', '.join(found)}" if found else "")
                + ")")
    if target == "qaic" and writes and not any(f.name == op and f.domain == domain for f in model.functions):
        return f"the model-local function {_shown(domain, op)} its nodes call is not defined in the model"
    return None


def graph_target(model: onnx.ModelProto) -> str | None:
    """The target the rewrite recorded in the graph (``specdec.target``), if any."""
    return next((p.value for p in model.metadata_props if p.key == TARGET_KEY), None)


def check_cache_writes(model: onnx.ModelProto, target: str | None, what: str) -> None:
    """One-line SpecdecError when ``model`` (named ``what``) lost ``target``'s cache write."""
    problem = cache_write_problem(model, target)
    if problem:
        raise SpecdecError(f"{what}: {problem}; was the graph changed after specdec-compile (an optimizer "
                           f"inlining functions)? Optimize before compiling, then compile again")
