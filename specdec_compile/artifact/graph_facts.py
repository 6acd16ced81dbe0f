"""What a rewritten graph says about itself, checked against the artifact's options.

``write_artifact`` records role, target, k, batch and ctx_len in the manifest
and the specializations; the runtime trusts them. ``check_graph_agrees`` makes
sure they describe the graph that is written: the role from the logits (a DLM
emits one position) and the rewrite's ``specdec.role``; the target from
``specdec.target`` and the opset (contract: qaic 17, ort 24); ctx_len from
``specdec.ctx_len`` (qaic rotary tables) and a fixed cache dim; batch and
seq_len (so k) from fixed dims of ``input_ids``. A rewrite result's own
``role``/``target``/``ctx_len`` fields count as well. Unknown facts (a symbolic
dim, metadata a hand-made graph lacks) are not checked.
"""
from __future__ import annotations

import onnx

from ..contract import CTX_LEN_KEY, INPUT_IDS, LOGITS, QAIC_DOMAIN, ROLE_KEY, TARGET_KEY, TARGET_OPSET, past_name
from ..errors import SpecdecError
from ..value_types import dims


def _dim(model: onnx.ModelProto, name: str, axis: int, outputs: bool = False):
    """dim ``axis`` of graph input (or output) ``name``: an int, a symbol (str) or None."""
    for vi in (model.graph.output if outputs else model.graph.input):
        shape = dims(vi, unknown=None, no_shape=[]) if vi.name == name else []
        if axis < len(shape):
            return shape[axis]
    return None


def _fixed(v) -> int | None:
    return v if isinstance(v, int) else None


def graph_claims(result) -> dict[str, list[tuple[object, str]]]:
    """{"role"|"target"|"ctx_len"|"batch_size"|"seq_len": [(value, where it comes from), ...]}."""
    model = result.model
    meta = {p.key: p.value for p in model.metadata_props}
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)
    by_opset = {v: t for t, v in TARGET_OPSET.items() if list(TARGET_OPSET.values()).count(v) == 1}
    if any(o.domain == QAIC_DOMAIN for o in model.opset_import):   # opset 17 is qaic's and openvino's
        by_opset[TARGET_OPSET["qaic"]] = "qaic"
    logits_seq = _dim(model, LOGITS, 1, outputs=True)
    claims: dict[str, list[tuple[object, str]]] = {
        "role": [(getattr(result, "role", None), "the rewrite's role"),
                 (meta.get(ROLE_KEY), f"its {ROLE_KEY} metadata"),
                 ("dlm" if logits_seq == 1 else "tlm" if logits_seq is not None else None,
                  f"its logits have seq dim {logits_seq}")],
        "target": [(getattr(result, "target", None), "the rewrite's target"),
                   (meta.get(TARGET_KEY), f"its {TARGET_KEY} metadata"),
                   (by_opset.get(opset), f"its opset {opset}")],
        "ctx_len": [(int(meta[CTX_LEN_KEY]) if meta.get(CTX_LEN_KEY, "").isdigit() else None,
                     f"its {CTX_LEN_KEY} metadata (the rotary tables hold that many rows)"),
                    (_fixed(_dim(model, past_name("key", 0), 2)), f"the fixed dim 2 of {past_name('key', 0)}")],
        "batch_size": [(_fixed(_dim(model, INPUT_IDS, 0)), f"the fixed dim 0 of {INPUT_IDS}")],
        "seq_len": [(_fixed(_dim(model, INPUT_IDS, 1)), f"the fixed dim 1 of {INPUT_IDS}")],
    }
    return {key: [(v, src) for v, src in found if v is not None] for key, found in claims.items()}


def check_graph_agrees(result, options) -> None:
    """One-line SpecdecError when ``options`` (an ``Options``) describe another graph than
    ``result.model``: nothing is written then."""
    rewritten_for = getattr(result, "ctx_len", None)
    if rewritten_for is not None and rewritten_for != options.ctx_len:
        raise SpecdecError(f"the graph was rewritten for ctx_len {rewritten_for} (its tables hold that many "
                           f"positions), the artifact asks for --ctx-len {options.ctx_len}")
    claims = graph_claims(result)
    wanted = {"role": options.role, "target": options.target, "ctx_len": options.ctx_len,
              "batch_size": options.batch_size}
    for key, want in wanted.items():
        for got, source in claims[key]:
            if got != want:
                flag = "--" + key.replace("_", "-")
                raise SpecdecError(f"the graph is for {key} {got} ({source}), the artifact asks for {flag} "
                                   f"{want}; nothing written")
    for got, source in claims["seq_len"]:
        other = [s for s in options.seq_lens() if s != got]
        if other:
            raise SpecdecError(f"the graph takes only seq_len {got} ({source}), the artifact's specializations "
                               f"need seq_len {', '.join(map(str, other))} (k={options.k}); nothing written")
