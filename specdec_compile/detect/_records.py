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
    rotary: tuple[RotarySite, ...] = field(default=())
