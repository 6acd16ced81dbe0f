"""What detection returns: frozen records made of *names* (tensors, nodes,
inputs), so they stay valid across graph copies. New finders add a field with a
default, so every existing constructor keeps working."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class ModelInfo:
    num_layers: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    dtype: str
    num_heads: int | None = None
    family: str | None = None
    exporter: str | None = None
    #: latent attention (DeepSeek MLA): values have their own head dim (None: same as keys)
    value_head_dim: int | None = None


@dataclass(frozen=True)
class LayerKV:
    index: int
    key_input: str
    value_input: str
    key_concat: str
    value_concat: str
    key_outputs: tuple[str, ...] = ()
    value_outputs: tuple[str, ...] = ()
    softmax: str = ""
    #: sliding window W (the query at p sees slots p-W < c <= p); None: every slot c <= p
    window: int | None = None


@dataclass(frozen=True)
class MaskSite:
    """Input ``input_index`` of node ``node`` is the attention mask of ``layer``.

    kind: "additive" (added to the scores), "visible" (Where condition, true
    keeps the score) or "masked" (Where condition, true drops the score).
    """
    layer: int
    node: str
    input_index: int
    kind: str
    #: numpy dtype name of the operand (an additive mask is built in it); None: unknown
    dtype: str | None = None


@dataclass(frozen=True)
class PositionSource:
    """A tensor the export derived positions into. kind "query": the new
    tokens' positions as ``[1, seq]`` (the export's own position_ids, made
    from the past length); "key": the keys' positions ``[batch, ..., keys]``
    (an ALiBi index made from attention_mask)."""
    kind: str
    tensor: str
    rank: int | None = None
    dtype: str | None = None


@dataclass(frozen=True)
class RotarySite:
    """A ``Cos``/``Sin`` node ``node`` whose input ``angle`` depends on the
    positions; ``table`` is the tensor a per-position table replaces (the trig
    output, or that followed through Cast and constant scaling)."""
    node: str
    op: str
    angle: str
    table: str


@dataclass(frozen=True)
class Detection:
    info: ModelInfo
    input_ids: str
    position_ids: str
    attention_mask: str | None
    logits: str
    layers: tuple[LayerKV, ...]
    mask_sites: tuple[MaskSite, ...] = field(default=())
    #: True when the export has no position_ids input: the rewrite adds it
    #: (named ``position_ids``) and feeds ``position_sources`` from it
    synthesize_position_ids: bool = False
    position_sources: tuple[PositionSource, ...] = field(default=())
    rotary: tuple[RotarySite, ...] = field(default=())
    #: the residual stream after each decoder layer (layers.py; the last: the final norm's
    #: input), its width; empty with ``layer_outputs_problem`` saying why when not found
    layer_outputs: tuple[str, ...] = field(default=())
    hidden_size: int | None = None
    layer_outputs_problem: str | None = None
    #: a feature draft's float input ``[batch, seq, F]`` (feature_input.py) and F; None: none
    feature_input: str | None = None
    feature_width: int | None = None
