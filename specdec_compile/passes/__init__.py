"""The passes, each a small ``pass(graph, ctx) -> graph`` function with one job.

Every pass takes an onnx-graphsurgeon graph and a ``PassContext`` (the
``Detection`` of the original model, the role, the target and the options) and
returns a new graph; the input graph is not modified. Each pass lives in the
module of its name (``passes/retained_kv.py`` defines ``retained_kv``) and is
tested in ``tests/passes/test_<name>.py``.

``REGISTRY`` below is the single source of the pipeline: the order the passes
run in, the ``specdec.passes`` metadata written into the model, the pass names
``--explain`` and ``diff --passes`` show, and the pass table of
docs/compiler.md (``render_table``). ``pipeline.PASS_ORDER`` is derived from it.

Which passes run (the rule): an entry names the roles, targets and interfaces it
is for (default: all of them; ``batch_index`` and ``logits_to_keep`` are for
``--interface qeff`` only). ``select(role, target, interface)`` keeps the entries that match,
in registry order; the pipeline runs exactly those and records exactly those.
So the list of passes a compile applies depends on the options alone, never on
the model. Whether a selected pass changes a given model is the pass's own
business: when the detection gives it nothing to do (no mask sites; later: an
export that already has position_ids, no sliding window, no ALiBi), it returns
the graph unchanged. A target-only legalization (qaic: CastLike -> Cast, ...)
is an entry with ``targets=("qaic",)``; ``openvino`` runs the entries for every target and
the two ``ort`` passes that read the cache as it is and share shape arithmetic
(``grouped_attention``, ``share_shapes``: no per-call copy of the cache for the grouped
heads), not ``gather_rotate_half`` (OpenVINO fuses the export's rotary form into one RoPE
node, and a Gather in its place stops that); a pass for a model feature is an entry
for every target that no-ops on models without the feature. A pass called
directly runs as asked: the roles/targets of its entry are the pipeline's
selection rule, not a check inside the pass.

Adding a pass: a module ``passes/<name>.py`` defining ``<name>(graph, ctx)`` (decorated
``@graph_pass``: a graph that is not an onnx-graphsurgeon ``Graph`` is refused in one line),
an entry in ``REGISTRY`` at its place in the order, and
``tests/passes/test_<name>.py`` (tests/test_pass_registry.py checks all three),
then regenerate the table in docs/compiler.md (``python -c "from
specdec_compile.passes import render_table; print(render_table())"``).

Calling one pass alone, in your own toolchain::

    import onnx, onnx_graphsurgeon as gs
    from specdec_compile import passes
    from specdec_compile.detect import detect
    from specdec_compile.graph_utils import name_unnamed_nodes

    g = gs.import_onnx(onnx.load("model.onnx", load_external_data=False))
    name_unnamed_nodes(g)                 # detection refers to nodes by name
    ctx = passes.PassContext(detection=detect(g), role="tlm", target="qaic", source_opset=g.opset)
    masked = passes.position_mask(g, ctx)     # one pass alone (or passes.get("position_mask").run)
    for p in passes.select("tlm", "qaic"):    # or every pass for this role and target, in order
        g = p.run(g, ctx)

(``pipeline.rewrite`` does the latter, then exports, checks and records.)

Bad arguments are one-line ``SpecdecError``s: a ``graph`` that is not an onnx-graphsurgeon
``Graph`` (a path, a ``ModelProto``, None) or a ``ctx`` that is not a ``PassContext``
(``PassArgumentError``, also a ``TypeError``); a ``PassContext`` field out of range (built by
hand: ``ctx_len`` 0 or over 2^18, a NaN or non-negative ``mask_value``, an unknown
``interface``, ``source_opset`` outside 13..onnx's newest, booleans that are not ``bool``);
a node or tensor the detection names that the graph lacks (the detection of another graph);
``retained_kv``, ``role_logits``, ``rotary_tables``, ``expose_hidden_states``, ``batch_index`` and
``logits_to_keep`` run a second time on their own output; a graph with two nodes of one name (or
several unnamed: run ``name_unnamed_nodes`` first), as the detection names nodes by name; a past
input read by more than its cache Concat and Shape, or ``attention_mask`` read inside an If, Loop
or Scan body (``_subgraphs``: such reads are not their node's inputs), would read other values
after the rewrite.
A pass called alone leaves its input graph as it was (its model-local functions included:
``graph_utils.copy_graph``). A pass refuses a context that lacks what it reads (``SpecdecError`` naming
the field): ``fp16_safe``, ``cleanup``, ``fold_static_shapes``, ``dense_experts``,
``flatten_to_reshape``, ``castlike_to_cast``,
``greater_compares``, ``tile_to_expand``, ``clamp_gather_positions``, ``grouped_attention``, ``gather_rotate_half`` and ``share_shapes`` need nothing (``PassContext()``),
``lower`` needs the target, ``role_logits`` and ``expose_hidden_states`` the detection and the role,
``rotary_tables`` and ``fuse_rotary`` (when on) the detection and, for a rotary model, ``ctx_len``; the others
the detection.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import onnx_graphsurgeon as gs

from ..contract import FP16_MAX, INTERFACES, MASK_VALUE, ROLES, TARGETS
from ._context import PassArgumentError, PassContext, check_options, graph_pass, need
from .batch_index import batch_index
from .canonical_dims import canonical_dims
from .castlike_to_cast import castlike_to_cast
from .clamp_gather_positions import clamp_gather_positions
from .cleanup import cleanup
from .dense_experts import dense_experts
from .drop_nan_guards import drop_nan_guards
from .expose_hidden_states import expose_hidden_states
from .flatten_to_reshape import flatten_to_reshape
from .fold_static_shapes import fold_static_shapes
from .fp16_safe import fp16_safe
from .fuse_rotary import fuse_rotary
from .gather_rotate_half import gather_rotate_half
from .greater_compares import greater_compares
from .grouped_attention import grouped_attention
from .logits_to_keep import logits_to_keep
from .lower import lower
from .position_mask import position_mask
from .retained_kv import retained_kv
from .role_logits import role_logits
from .rotary_tables import rotary_tables
from .share_shapes import share_shapes
from .synth_positions import synth_positions
from .tile_to_expand import tile_to_expand


@dataclass(frozen=True)
class Pass:
    """One registry entry. ``job``: what the pass does, one paragraph (the
    docs/compiler.md table's second column). ``roles``/``targets``: what it is for."""
    name: str
    run: Callable[[gs.Graph, PassContext], gs.Graph]
    job: str
    roles: tuple[str, ...] = ROLES
    targets: tuple[str, ...] = TARGETS
    interfaces: tuple[str, ...] = INTERFACES

    def applies(self, role: str, target: str, interface: str = "default") -> bool:
        return role in self.roles and target in self.targets and interface in self.interfaces


REGISTRY: tuple[Pass, ...] = (
    Pass("synth_positions", synth_positions,
         "an export without a `position_ids` input (Gemma-2/3, gpt-oss, Bloom, ...) gets one, and every "
         "position it derived from the past length (the rotary index) is fed from it; ALiBi key positions "
         "made from `attention_mask` become the slot index. No-op on exports that take `position_ids` and "
         "have no ALiBi"),
    Pass("retained_kv", retained_kv,
         "each growing `Concat` becomes a write into a fixed `ctx_len` cache at `position_ids`. Inputs are "
         "renamed `past_key.{i}`/`past_value.{i}`, outputs `*_RetainedState`. Shape computations that read "
         "the past length see `ctx_len - seq_len`, so \"past + seq\" is the cache length (the dynamo "
         "export's GQA Expand needs this)"),
    Pass("position_mask", position_mask,
         "every mask operand is replaced by one mask built from `position_ids`: slot c is visible to a "
         "query at position p iff c <= p, and on a layer with a sliding window of W tokens (read off the "
         "export's own mask) iff p - W < c <= p; position -1 (padding) sees nothing. Masked scores get "
         f"{MASK_VALUE:g} (finite, so a padded row is uniform, never NaN). `attention_mask` is removed"),
    Pass("role_logits", role_logits,
         "TLM: logits for every position. DLM: only the last valid token (largest position) of each row, "
         "picked *before* the LM head, so a prefill chunk pays the vocabulary projection once. Logits are "
         "float32"),
    Pass("expose_hidden_states", expose_hidden_states,
         "TLM with `--hidden-states LAYERS`: the residual stream after those decoder layers (found by the "
         "`layers` finder; -1 is the last layer's output, before the final norm), concatenated in the listed "
         "order, becomes the output `hidden_states` `[batch_size, seq_len, n*hidden]`, every position. A "
         "feature draft (`--feature-layers`): its own last layer's output becomes `draft_hidden_states`. "
         "No-op otherwise"),
    Pass("canonical_dims", canonical_dims,
         "the contract's interface, names and order. Only `batch_size`, `seq_len` and `ctx_len` stay "
         "symbolic"),
    Pass("batch_index", batch_index,
         "`--interface qeff`, with `--full-batch-size` (continuous batching): the cache holds `full_batch_size` rows and the new input `batch_index` "
         "`[batch_size, 1]` names the cache row of each row of the call (QEfficient's continuous batching): "
         "qaic writes with `com.qualcomm.cloud::CtxScatterCB` and reads the rows with `CtxGatherCB`, ort with "
         "ScatterND / GatherND / Gather. Padding at either end of a row changes no slot. Without "
         "`--full-batch-size` (QEfficient's plain interface) there is no `batch_index`: the same write with "
         "the call's rows 0..B-1, and attention reads the written cache",
         interfaces=("qeff",)),
    Pass("logits_to_keep", logits_to_keep,
         "`--interface qeff`, TLM: the new shape-only input `num_logits_to_keep` `[n, 1]`; the logits are "
         "those of the n positions ending at each row's last valid token (the first n when it is closer to "
         "the start), picked before the LM head, as QEfficient's TLM picks them",
         roles=("tlm",), interfaces=("qeff",)),
    Pass("rotary_tables", rotary_tables,
         "rotary `Cos`/`Sin` computed from `position_ids` become a `Gather` from constant cos/sin tables of "
         "exactly `ctx_len` rows, made at compile time by evaluating the export's own frequency subgraph in "
         "float64 (every rope variant it computes) and stored in the model dtype; the row is "
         "`Max(position, 0)`. Under `-convert-to-fp16` the angles are then exact at every position",
         targets=("qaic",)),
    Pass("fp16_safe", fp16_safe,
         f"embedded float constants are clamped to \u00b1{FP16_MAX:g}, so `-convert-to-fp16` cannot turn a "
         "float32-min mask fill into -inf"),
    Pass("lower", lower,
         "`qaic`: opset 17, the cache write as the model-local function "
         "`com.qualcomm.cloud::CtxScatter(data, position_ids, updates)` (a ScatterND over [batch, head, "
         "position], the form QEfficient's device graphs use); newer ops are rewritten to their opset-17 "
         "forms (Reduce* axes, Split num_outputs, Gelu). `ort`: opset 24, `TensorScatter(mode=\"circular\")`, "
         "which ONNX Runtime updates in place when the output is bound to the input's buffer. `openvino`: opset 17 "
         "as for qaic, `ScatterElements(cache, slots, updates, axis=2)` (OpenVINO's ScatterElementsUpdate, kept on "
         "a state variable inside the engine by its `MakeStateful`)"),
    Pass("grouped_attention", grouped_attention,
         "grouped-query attention reads the cache as it is: where the export repeats the KV heads "
         "(`Reshape(Expand(Unsqueeze(cache, [2])))`, a copy of g times the cache per step), the key product "
         "reads the cache itself against the queries as `[batch, kv_heads, g*seq, head_dim]` (each KV head's "
         "keys read once), the value product `Unsqueeze(cache, [2])` (a view, broadcast over the group) "
         "against the attention weights as `[batch, kv_heads, g, seq, ctx]`; the results are reshaped back to "
         "`[batch, heads, seq, x]`: each element the export's own dot product, bit for bit. Made only where "
         "shape inference proves the repeat exact; any other form is left as it is",
         targets=("ort", "openvino")),
    Pass("fold_static_shapes", fold_static_shapes,
         "integer shape arithmetic whose answer is static (every value it reads is a small constant or a "
         "static dim) becomes a constant: GLM's rotary `repeat_interleave` loses its `NonZero`; on `ort`, "
         "every layer's reads of head counts and head dims"),
    Pass("share_shapes", share_shapes,
         "shape arithmetic once per graph, not per layer: every read of `batch_size`, `seq_len` or `ctx_len` "
         "off a tensor's shape (where shape inference names the dim) reads it once off the graph input, then "
         "identical nodes (same op, attributes and inputs; constants by value) are merged",
         targets=("ort", "openvino")),
    Pass("fuse_rotary", fuse_rotary,
         "opt-in (`fuse_rotary=True`; off, a no-op: the kernel's fused multiply-adds round unlike the export, "
         "past 1e-4 on SmolLM2-135M): the rotary Cos/Sin become `rotary_tables`' tables (evaluated by ONNX Runtime, "
         "`ctx_len` rows: the graph's context is then fixed) and each q/k rotation `x*cos + rotate_half(x)*sin` becomes one "
         "`RotaryEmbedding` (ai.onnx opset 23: x `[B, N, S, d]`, the tables' first halves as "
         "`cos_cache`/`sin_cache`, `Max(position_ids, 0)`; Cohere's interleaved pairs: `interleaved=1`), "
         "one ONNX Runtime kernel in place of "
         "seven. Made only where the form is exactly that (halves of the tables equal, float32, shapes "
         "inferred); any other rotation is left as it is, with the reason",
         targets=("ort",)),
    Pass("gather_rotate_half", gather_rotate_half,
         "each rotary `rotate_half(x) * sin` left (two Slices, a Neg, a Concat and a Mul) becomes "
         "`Gather(x, permutation) * (sin * sign)`: `-x[j] * s` is `x[j] * -s` bit for bit, and the signed "
         "sin is computed once per call for every layer (Cohere's interleaved pairs too). Made only where the "
         "form is exactly that and the sin operand is `d` wide; anything else is left as it is, with the reason. "
         "Not for openvino: there the export's form is what OpenVINO's CPU plugin fuses into its RoPE node",
         targets=("ort",)),
    Pass("dense_experts", dense_experts,
         "Hugging Face's sparse MoE routing (each expert's tokens picked with a data-dependent `NonZero`) "
         "becomes dense where it is exactly that form: every expert runs on every token and its output is "
         "scaled by the token's routing weight for it, `ReduceSum` over the slots of weight x 0/1 selection "
         "(one non-zero term at most), and a token that did not choose the expert adds exactly 0 "
         "(`Where`, so even an expert output that overflows on it cannot leak). A routing that differs anywhere "
         "is left alone", targets=("qaic",)),
    Pass("flatten_to_reshape", flatten_to_reshape,
         "`Flatten(x, axis)` becomes `Reshape(x, [-1, n])` (or `[m, -1]`) with the static product of one side",
         targets=("qaic",)),
    Pass("castlike_to_cast", castlike_to_cast,
         "`CastLike(x, like)` becomes `Cast(x, to=dtype of like)`, or nothing where x has that dtype already",
         targets=("qaic",)),
    Pass("greater_compares", greater_compares,
         "`LessOrEqual(a, b)` becomes `GreaterOrEqual(b, a)` (exact for every dtype), whatever mask form "
         "arrives", targets=("qaic",)),
    Pass("drop_nan_guards", drop_nan_guards,
         "`Where(IsNaN(p), 0, p)` around an attention Softmax is removed where it cannot fire: every mask "
         "entering that layer's scores is finite", targets=("qaic",)),
    Pass("tile_to_expand", tile_to_expand,
         "`Tile(x, r)` becomes `Expand(x, r)` where every repeated axis of x is provably 1 (GPT-J's "
         "shape-derived position Tile)", targets=("qaic",)),
    Pass("clamp_gather_positions", clamp_gather_positions,
         "every gather indexed by the positions reads row `Max(index, 0)`, so padding (-1) never indexes "
         "out of range; indices provably >= 0 are left alone, other position-derived indices are refused",
         targets=("qaic",)),
    Pass("cleanup", cleanup, "dead nodes removed, topological order"),
)


def names() -> tuple[str, ...]:
    """Every pass name, in pipeline order."""
    return tuple(p.name for p in REGISTRY)


def get(name: str) -> Pass:
    for p in REGISTRY:
        if p.name == name:
            return p
    raise KeyError(f"no pass named {name!r} (passes: {', '.join(names())})")


def select(role: str, target: str, interface: str = "default") -> tuple[Pass, ...]:
    """The passes a compile for ``role``, ``target`` and ``interface`` runs, in order."""
    check_options(role, target, None)
    return applicable(role, target, interface)


def applicable(role: str, target: str, interface: str = "default") -> tuple[Pass, ...]:
    """``select`` for a role, target and interface already checked (an ``Options``'): no check."""
    return tuple(p for p in REGISTRY if p.applies(role, target, interface))


def _scope(p: Pass) -> str:
    parts = []
    if p.roles != ROLES:
        parts.append("role " + "/".join(p.roles))
    if p.targets != TARGETS:
        parts.append("target " + "/".join(p.targets))
    if p.interfaces != INTERFACES:
        parts.append("interface " + "/".join(p.interfaces))
    return f"*({', '.join(parts)} only)* " if parts else ""


def render_table() -> str:
    """The pass table of docs/compiler.md (markdown), rendered from ``REGISTRY``."""
    rows = ["| pass | job |", "| --- | --- |"]
    rows += [f"| `{p.name}` | {_scope(p)}{p.job} |" for p in REGISTRY]
    return "\n".join(rows) + "\n"


__all__ = ["PassContext", "Pass", "REGISTRY", "names", "get", "select", "applicable", "render_table", "check_options",
           "need", "graph_pass", "PassArgumentError", *names()]
