"""Names and constants of the interface contract (docs/CONTRACT.md), in one place."""

BATCH, SEQ, CTX = "batch_size", "seq_len", "ctx_len"
INPUT_IDS, POSITION_IDS, LOGITS = "input_ids", "position_ids", "logits"
ROLES = ("tlm", "dlm")
TARGETS = ("qaic", "ort", "openvino")
TARGET_OPSET = {"qaic": 17, "ort": 24, "openvino": 17}
#: the TLM's extra output (--hidden-states) and a feature draft's extra input: the target's residual
#: stream after the listed layers, [batch_size, seq_len, width]
HIDDEN_STATES = "hidden_states"
#: a feature draft's own output: its prediction of the target's feature at each position
DRAFT_HIDDEN_STATES = "draft_hidden_states"
#: metadata keys of a rewritten graph: its role, its lowering target, the passes applied (in order)
ROLE_KEY = "specdec.role"
TARGET_KEY = "specdec.target"
PASSES_KEY = "specdec.passes"
#: metadata keys: the layers a TLM exposes (as given, e.g. "2,5,-1"); the target layers a feature draft reads
HIDDEN_STATES_KEY = "specdec.hidden_states"
FEATURE_LAYERS_KEY = "specdec.feature_layers"
#: metadata key: the context length a qaic graph was compiled for (its rotary tables hold that many rows)
CTX_LEN_KEY = "specdec.ctx_len"
QAIC_DOMAIN = "com.qualcomm.cloud"
#: the interfaces a graph can have: ours (docs/CONTRACT.md sections 2-6) and QEfficient's
#: (section 7: continuous batching with batch_index, the TLM's num_logits_to_keep)
INTERFACES = ("default", "qeff")
#: --interface qeff: the cache's row count (dim 0 of every past_* input and *_RetainedState output)
FULL_BATCH = "full_batch_size"
BATCH_INDEX = "batch_index"
NUM_LOGITS_TO_KEEP = "num_logits_to_keep"
#: metadata key of a graph with QEfficient's interface (absent: ours)
INTERFACE_KEY = "specdec.interface"
#: intermediate (target-neutral) op the retained-state pass writes; lowering replaces it
SPECDEC_DOMAIN = "ai.specdec"
CACHE_WRITE = "CacheWrite"
#: large finite negative: exp() of it underflows to 0 in float32, and added to any
#: reasonable score it stays inside float16's range (so no -inf, no NaN)
MASK_VALUE = -30000.0
FP16_MAX = 65504.0

# the files of an artifact directory (section 5)
MODEL_FILE = "model.onnx"
SPECIALIZATIONS_FILE = "specializations.json"
CUSTOM_IO_FILE = "custom_io.yaml"
COMPILE_SCRIPT = "compile.sh"
PARTITION_FILE = "mdp_partition.json"
MANIFEST_FILE = "manifest.json"
#: where compile.sh puts the compiled program (qaic-exec -aic-binary-dir)
QPC_DIR = "qpc"


def past_name(kind: str, layer: int) -> str:
    """``past_key.3`` / ``past_value.3``"""
    return f"past_{kind}.{layer}"


def retained_name(kind: str, layer: int) -> str:
    return f"{past_name(kind, layer)}_RetainedState"


def interface(num_layers: int, *, hidden_states: bool = False, features: bool = False,
              qeff_role: str | None = None, batch_index: bool = True) -> tuple[list[str], list[str]]:
    """The contract's input and output names, in order. ``hidden_states``: a TLM
    that exposes its hidden states (one more output, last); ``features``: a
    feature draft (its feature input last, its own predicted features last).
    ``qeff_role`` ("tlm"/"dlm"): QEfficient's interface, ``batch_index`` after the
    cache inputs (continuous batching; ``batch_index=False``: its plain interface, none),
    then the TLM's ``num_logits_to_keep`` (section 7)."""
    ins = [INPUT_IDS, POSITION_IDS]
    outs = [LOGITS]
    for i in range(num_layers):
        for kind in ("key", "value"):
            ins.append(past_name(kind, i))
            outs.append(retained_name(kind, i))
    if hidden_states:
        outs.append(HIDDEN_STATES)
    if features:
        ins.append(HIDDEN_STATES)
        outs.append(DRAFT_HIDDEN_STATES)
    if qeff_role is not None:
        if batch_index:
            ins.append(BATCH_INDEX)
        if qeff_role == "tlm":
            ins.append(NUM_LOGITS_TO_KEEP)
    return ins, outs
