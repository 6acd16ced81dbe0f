"""The passes, each a small ``Graph -> Graph`` function with one job.

They take an onnx-graphsurgeon graph and the ``Detection`` of the original
model (made of names, so it survives graph copies), and return a new graph;
the input graph is not modified. The pipeline runs them in this order:

    retained_kv     growing Concat cache -> fixed ctx_len cache written at position_ids
    position_mask   mask derived from position_ids; attention_mask removed
    role_logits     TLM: all positions; DLM: the last valid token
    canonical_dims  contract names/order; only batch_size, seq_len, ctx_len symbolic
    fp16_safe       constants clamped to float16's range
    lower           target form: qaic (opset 17, CtxScatter) or ort (opset 24, TensorScatter)
    cleanup         dead nodes removed, topological order
"""
from .dead_code import cleanup
from .dims import canonical_dims
from .fp16 import fp16_safe
from .kv_cache import retained_kv
from .logits import role_logits
from .lowering import lower
from .mask import position_mask

__all__ = ["retained_kv", "position_mask", "role_logits", "canonical_dims", "fp16_safe", "lower", "cleanup"]
