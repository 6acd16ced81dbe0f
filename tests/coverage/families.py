"""The rows of the coverage matrix: every family in optimum-onnx's own registry
of models that export with ``--task text-generation-with-past``, each with a
tiny random config (families.json: a generic recipe, per-family tweaks as
data, extra variants).

A newer optimum adds families here by itself: an unknown family gets the
generic recipe and a row (compiled, or refused with its one-line reason).
Families that are not decoder-only causal LMs are skipped with the reason.
"""
from __future__ import annotations

import inspect
import json
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

DATA = json.loads((Path(__file__).with_name("families.json")).read_text())
WINDOW: int = DATA["window"]


@dataclass(frozen=True)
class Row:
    """One model of the matrix: ``name`` (family or family-variant), the
    transformers ``family`` (model_type), its exporter, and the config
    overrides (a JSON-able dict, part of the export cache key)."""
    name: str
    family: str
    exporter: str = "optimum"
    config: dict = field(default_factory=dict, hash=False, compare=False)

    @property
    def id(self) -> str:
        return self.name if self.exporter == "optimum" else f"{self.name}-{self.exporter}"


@lru_cache(maxsize=None)
def registry_families() -> tuple[str, ...]:
    """optimum-onnx's model types supporting text-generation-with-past (sorted)."""
    import optimum.exporters.onnx.model_configs  # noqa: F401  (registers the ONNX configs)
    from optimum.exporters.tasks import TasksManager
    return tuple(sorted(TasksManager.get_supported_model_type_for_task("text-generation-with-past",
                                                                       exporter="onnx")))


def skip_reason(family: str) -> str | None:
    """Why ``family`` has no row (None when it has one)."""
    from transformers import AutoConfig
    try:
        config = AutoConfig.for_model(family)
    except (ValueError, KeyError):
        return "not in transformers (trust_remote_code model)"
    if getattr(config, "is_encoder_decoder", False):
        return "encoder-decoder (its causal-LM head is a decoder with cross-attention)"
    subs = getattr(config, "sub_configs", {}) or {}
    if "text_config" in subs and len(subs) > 1:
        text = getattr(config, "text_config", None)
        inner = getattr(text, "model_type", "?")
        return f"multimodal (text + {', '.join(k for k in subs if k != 'text_config')}); its text decoder is {inner}"
    return None


def _accepted(family: str) -> tuple[set[str], dict[str, str]]:
    from transformers import AutoConfig
    cls = type(AutoConfig.for_model(family))
    params = set(inspect.signature(cls.__init__).parameters) - {"self", "kwargs"}
    return params, dict(getattr(cls, "attribute_map", {}) or {})


def tiny_config(family: str, extra: dict | None = None) -> dict:
    """The overrides for a tiny random ``family``: the generic recipe, keyed by
    the names the family's config takes, then its tweaks, then ``extra``."""
    params, amap = _accepted(family)
    wanted = dict(DATA["tiny"])
    wanted["sliding_window"] = WINDOW
    out = {}
    for key, value in wanted.items():
        for name in [key, *DATA["aliases"].get(key, [])]:
            real = amap.get(name, name)
            if real in params or name in params:
                out[real if real in params else name] = value
                break
    if "layer_types" in params:
        out["layer_types"] = None   # recomputed by the config for the tiny layer count
    out.update(DATA["tweaks"].get(family, {}))
    out.update(extra or {})
    return out


def rows() -> tuple[list[Row], list[tuple[str, str]]]:
    """(rows, skipped): one optimum row per family (plus variants), one dynamo
    row per family in ``DATA["dynamo"]``; skipped = [(family, reason)]."""
    out, skipped = [], []
    for family in registry_families():
        reason = skip_reason(family)
        if reason:
            skipped.append((family, reason))
            continue
        out.append(Row(family, family, "optimum", tiny_config(family)))
    for name, v in DATA["variants"].items():
        if v["family"] in registry_families():
            out.append(Row(name, v["family"], "optimum", tiny_config(v["family"], v["config"])))
    for family in DATA["dynamo"]:
        out.append(Row(family, family, "dynamo", tiny_config(family)))
    return out, skipped
