"""``PassContext``: the one argument every pass takes besides the graph."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..contract import MASK_VALUE
from ..detect import Detection
from ..errors import SpecdecError
from ..options import check_options


@dataclass(frozen=True)
class PassContext:
    """What a pass may read besides the graph. Frozen: no pass changes it, so
    one context serves a whole pipeline.

    detection     the ``Detection`` of the original graph (names, valid across copies)
    role          "tlm" | "dlm"
    target        "qaic" | "ort" | "openvino"
    k             speculation length (recorded; today no pass's graph depends on it)
    mask_value    the fill for masked scores: large, finite, negative
    source_opset  the exported model's opset (``lower`` reads it; None: the graph's own)
    ctx_len       the context length the artifact is compiled for (``rotary_tables``
                  builds tables of exactly this many rows)
    exposed_layers the decoder layers whose outputs ``expose_hidden_states`` adds as an
                  output (as given: negative from the end; a TLM's --hidden-states, a feature
                  draft's own last layer); None: none. The pass resolves them.
    interface     "default" or "qeff" (QEfficient's: ``batch_index``, ``logits_to_keep``)
    continuous_batching  with "qeff": QEfficient's continuous batching (the input ``batch_index``)
    fuse_rotary   ort: rotate q/k with ONNX Runtime's ``RotaryEmbedding`` kernel (``fuse_rotary``);
                  off by default: the kernel rounds differently (fused multiply-adds), within
                  1e-4 on the fixtures but not on every model (SmolLM2-135M: 4.8e-4)

    A field a pass does not read may stay None; a pass that needs one refuses
    to run without it (``need``). Options for passes to come (a window size,
    an ALiBi slope table) are new fields with defaults.
    """
    detection: Detection | None = None
    role: str | None = None
    target: str | None = None
    k: int | None = None
    mask_value: float = MASK_VALUE
    source_opset: int | None = None
    ctx_len: int | None = None
    exposed_layers: tuple[int, ...] | None = None
    interface: str = "default"
    continuous_batching: bool = False
    fuse_rotary: bool = False

    @classmethod
    def from_options(cls, options, **fields) -> "PassContext":
        """The context of a compile with ``options`` (an ``Options``, checked when it was built:
        trusted here, not checked again) and ``fields`` (detection, source_opset, ...)."""
        ctx = object.__new__(cls)
        given = {"role": options.role, "target": options.target, "k": options.k, "ctx_len": options.ctx_len,
                 "interface": options.interface, "continuous_batching": options.continuous_batching, **fields}
        for f in dataclasses.fields(cls):
            object.__setattr__(ctx, f.name, given.get(f.name, f.default))
        return ctx

    def __post_init__(self):
        check_options(self.role, self.target, self.k, optional=True)
        if self.ctx_len is not None and (not isinstance(self.ctx_len, int) or self.ctx_len < 1):
            raise SpecdecError(f"ctx_len must be an integer >= 1, got {self.ctx_len!r}")
        if self.detection is not None and not isinstance(self.detection, Detection):
            raise SpecdecError(f"PassContext.detection must be a Detection, got {type(self.detection).__name__}")


def need(pass_name: str, ctx, *fields: str) -> PassContext:
    """``ctx``, checked: a ``PassContext`` with every field in ``fields`` set."""
    if not isinstance(ctx, PassContext):
        raise TypeError(f"pass {pass_name} is called as {pass_name}(graph, ctx) with ctx a "
                        f"specdec_compile.passes.PassContext, got {type(ctx).__name__}")
    missing = [f"ctx.{f}" for f in fields if getattr(ctx, f) is None]
    if missing:
        raise SpecdecError(f"pass {pass_name} needs {', '.join(missing)}")
    return ctx
