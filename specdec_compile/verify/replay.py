"""``specdec-compile verify ORIGINAL REWRITTEN``: numerical equivalence.

Replays random token histories through both graphs on ONNX Runtime: the
original with its concatenating cache (one row at a time, unpadded, the
``attention_mask`` all ones), the rewrite with its retained ctx_len cache.
Every call of the rewrite is one shape of the specialization set: a full and a
right-padded prefill chunk, seq_len 1, 2, k and k+1, rollbacks (positions of
rejected drafts reused), and a call at the end of the context whose padding
wraps around the cache. After each call it compares

* the logits at every valid position (DLM: the last valid token),
* a TLM's ``hidden_states`` output (``--hidden-states``) and a feature draft's
  ``draft_hidden_states`` at every valid position, against the export's own
  internal tensors (a copy of the export that outputs them; verify_hidden.py);
  a feature draft is fed random features, the same rows to both graphs,
* the cache: slots written so far equal the original's concatenated cache,
  slots that held history before the call are bit-for-bit unchanged, and
  no slot anywhere holds NaN or Inf.

The verdict fails when any logits or cache difference exceeds ``tol``
(1e-4 by default, float32). The command line (defaults from the manifest, the
table) is ``specdec_compile.cli.verify``.
"""
from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from ..contract import (BATCH_INDEX, CTX_LEN_KEY, HIDDEN_STATES, INPUT_IDS, LOGITS, NUM_LOGITS_TO_KEEP, POSITION_IDS,
                       ROLE_KEY, past_name, retained_name)
from ..errors import SpecdecError
from ..model_io import load_model
from ..options import check_options
from .hidden import ExposedCopy, Request, layer_names, max_diff, random_features, request_of, worst

_log = logging.getLogger(__name__)

#: the most memory the rewrite's cache may take during a verification (each error says it)
MAX_CACHE_BYTES = 4 * 2 ** 30

@dataclass
class ShapeCheck:
    label: str
    seq_len: int
    logits_max_abs_diff: float
    cache_max_abs_diff: float
    history_changed: bool = False
    non_finite: bool = False
    #: the hidden-states output against the export's internal tensors (0: no such output)
    hidden_max_abs_diff: float = 0.0


@dataclass
class VerifyReport:
    role: str
    k: int
    prefill_len: int
    ctx_len: int
    batch_size: int
    tol: float
    checks: list[ShapeCheck] = field(default_factory=list)
    #: TLM: the export's logits of k+1 positions computed in one call against k+1 calls of one
    #: token (greedy speculative output equals one-token decoding only if these agree): the max
    #: abs difference and at how many positions the top token differs (None: not checked)
    width_max_abs_diff: float | None = None
    width_top_token_changes: int | None = None
    #: where the rewrite ran ("ort" or "openvino", verify/openvino.py) and, on OpenVINO, at what
    #: precision; there the same width check runs on the rewrite itself (None: not checked)
    backend: str = "ort"
    precision: str | None = None
    backend_width_max_abs_diff: float | None = None
    backend_width_top_token_changes: int | None = None
    #: on OpenVINO, the caches replayed: "copy" (the graph's own write, MakeStateful) and, at batch 1
    #: where the attention allows it, "fused" (what the runtime runs, checks labelled "fused cache: ...");
    #: ``fused_note``: why the fused cache was not replayed
    caches: list[str] = field(default_factory=list)
    fused_note: str | None = None
    #: the rewrite's hidden-states output compared (``hidden_states`` / ``draft_hidden_states``; None: none)
    hidden_output: str | None = None

    # the maxima are NaN when any difference is (a NaN on either side): never dropped by ``max``
    @property
    def max_logits_diff(self) -> float:
        return worst(c.logits_max_abs_diff for c in self.checks)

    @property
    def max_cache_diff(self) -> float:
        return worst(c.cache_max_abs_diff for c in self.checks)

    @property
    def max_hidden_diff(self) -> float:
        return worst(c.hidden_max_abs_diff for c in self.checks)

    @property
    def width_dependent(self) -> bool:
        """The top token at some position depends on the call's width, beyond the tolerance
        (the export's on ONNX Runtime, or the rewrite's on the backend)."""
        return any(bool(n) and (d or 0.0) > self.tol for n, d in (
            (self.width_top_token_changes, self.width_max_abs_diff),
            (self.backend_width_top_token_changes, self.backend_width_max_abs_diff)))

    @property
    def ok(self) -> bool:
        return bool(self.checks) and not self.width_dependent and all(
            c.logits_max_abs_diff <= self.tol and c.cache_max_abs_diff <= self.tol
            and c.hidden_max_abs_diff <= self.tol and not c.history_changed and not c.non_finite for c in self.checks)

    def per_shape(self) -> list[dict]:
        """The worst check per label (one row per shape of the scenario)."""
        rows: dict[str, dict] = {}
        for c in self.checks:
            r = rows.setdefault(c.label, {"shape": c.label, "seq_len": c.seq_len, "calls": 0,
                                          "logits_max_abs_diff": 0.0, "cache_max_abs_diff": 0.0,
                                          "hidden_max_abs_diff": 0.0, "history_changed": False,
                                          "non_finite": False})
            r["calls"] += 1
            for key in ("logits_max_abs_diff", "cache_max_abs_diff", "hidden_max_abs_diff"):
                r[key] = worst((r[key], getattr(c, key)))
            r["history_changed"] |= c.history_changed
            r["non_finite"] |= c.non_finite
        return list(rows.values())

    def to_json(self) -> dict:
        """The report as JSON values: a difference that is NaN is null (a bare NaN is not JSON)."""
        d = {k: v for k, v in asdict(self).items() if k != "checks"}
        d.update(ok=self.ok, max_logits_diff=self.max_logits_diff, max_cache_diff=self.max_cache_diff,
                 max_hidden_diff=self.max_hidden_diff, shapes=self.per_shape())
        return _json_safe(d)


def _json_safe(value):
    """``value`` with every non-finite float made None, in dicts and lists too."""
    if isinstance(value, float) and not np.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_json_safe(v) for v in value]
    return value


def _quiet():
    """Run options under which ONNX Runtime logs nothing: a failing call is reported once, as our line."""
    import onnxruntime as ort
    ro = ort.RunOptions()
    ro.log_severity_level = 4
    return ro


def _session(path: Path):
    """A CPU session with one intra-op thread."""
    from ..ort_session import CPU, create_session
    return create_session(path, providers=[CPU], intra_op_threads=1)


def _detection(path: Path):
    """The ``Detection`` of the export at ``path``, as the compile sees it (``import_and_detect``)."""
    from ..model_io import read_any
    from ..pipeline import import_and_detect
    return import_and_detect(*read_any(Path(path))[:3])[1]


class OriginalModel:
    """The stock export, run one row at a time with a concatenating cache."""

    def __init__(self, path: Path, req: Request = Request(), det=None):
        self.det = det if det is not None else _detection(path)
        self.hidden = layer_names(self.det, req)  # the export's internal tensors the rewrite outputs
        self.copy = ExposedCopy(path, self.hidden) if self.hidden else None
        self.sess = _session(self.copy.path if self.copy else path)
        for layer in self.det.layers:
            if not layer.key_outputs or not layer.value_outputs:
                raise SpecdecError(f"{path}: layer {layer.index} has no present key/value output to compare")
        ins = {i.name: i for i in self.sess.get_inputs()}
        self.dtype = np.float16 if "float16" in ins[self.det.layers[0].key_input].type else np.float32
        self.out_names = [self.det.logits] + [n for layer in self.det.layers
                                              for n in (layer.key_outputs[0], layer.value_outputs[0])]
        self.out_names += self.hidden
        self.in_types = {n: i.type for n, i in ins.items()}

    def empty(self):
        info = self.det.info
        k = np.zeros((1, info.num_kv_heads, 0, info.head_dim), self.dtype)
        v = np.zeros((1, info.num_kv_heads, 0, info.value_head_dim or info.head_dim), self.dtype)
        return [k, v] * info.num_layers

    def run(self, tokens: np.ndarray, start: int, past: list[np.ndarray], feats: np.ndarray | None = None):
        v = len(tokens)
        feeds = {self.det.input_ids: tokens[None].astype(np.int64)}
        if self.det.feature_input is not None:
            feeds[self.det.feature_input] = feats[None].astype(self.dtype)
        if not self.det.synthesize_position_ids:
            feeds[self.det.position_ids] = np.arange(start, start + v, dtype=np.int64)[None]
        if self.det.attention_mask is not None:
            feeds[self.det.attention_mask] = np.ones((1, start + v), np.int64)
        for layer in self.det.layers:
            feeds[layer.key_input] = past[2 * layer.index][:, :, :start]
            feeds[layer.value_input] = past[2 * layer.index + 1][:, :, :start]
        for name, t in self.in_types.items():
            if name in feeds and "int32" in t:
                feeds[name] = feeds[name].astype(np.int32)
        try:
            out = self.sess.run(self.out_names, feeds, _quiet())
        except Exception as e:
            raise SpecdecError(f"original model failed on {v} tokens after {start}: "
                               f"{' '.join(str(e).split())[:300]}") from None
        n = 1 + 2 * self.det.info.num_layers
        hidden = np.concatenate([h[0] for h in out[n:]], axis=-1) if self.hidden else None
        return out[0][0].astype(np.float32), out[1:n], hidden


class _Rewritten:
    def __init__(self, path: Path, ctx_len: int, batch: int, req: Request = Request()):
        self.sess = _session(path)
        ins = {i.name: i for i in self.sess.get_inputs()}
        self.layers = sum(1 for n in ins if n.startswith("past_key."))
        if INPUT_IDS not in ins or POSITION_IDS not in ins or self.layers == 0:
            raise SpecdecError(f"{path}: not a rewritten graph (inputs: {', '.join(ins)})")
        dtype = np.float16 if "float16" in ins[past_name("key", 0)].type else np.float32
        self.names = [past_name(kind, i) for i in range(self.layers) for kind in ("key", "value")]
        self.out_names = [LOGITS] + [retained_name(kind, i) for i in range(self.layers)
                                     for kind in ("key", "value")]
        shapes = [(batch, ins[n].shape[1], ctx_len, ins[n].shape[3]) for n in self.names]
        if not all(isinstance(d, int) and d >= 1 for s in shapes for d in s):
            raise SpecdecError(f"{path}: cache inputs of shape {ins[self.names[0]].shape}: not a rewritten graph")
        need = sum(int(np.prod(s)) for s in shapes) * np.dtype(dtype).itemsize
        if need > MAX_CACHE_BYTES:
            raise SpecdecError(f"verify would hold {need / 2 ** 30:.1f} GiB of cache (batch {batch}, "
                               f"ctx_len {ctx_len}), over its limit of {MAX_CACHE_BYTES // 2 ** 30} GiB; lower --ctx-len or --batch-size")
        self.state = [np.zeros(s, dtype) for s in shapes]
        self.req = req
        self.feature_dtype = (np.float16 if "float16" in ins[HIDDEN_STATES].type else np.float32) \
            if req.feature_width else None
        self.out_names += [req.output] if req.output else []
        logits_shape = next(o for o in self.sess.get_outputs() if o.name == LOGITS).shape
        self.vocab = logits_shape[-1] if logits_shape else None
        self._ins = ins
        self.role = _role(path, logits_shape, self.sess.get_modelmeta().custom_metadata_map.get(ROLE_KEY))
        #: --interface qeff (contract section 7): every row in its own cache row, every column's logits
        self.qeff = [n for n in (BATCH_INDEX, NUM_LOGITS_TO_KEEP) if n in ins]
        meta = self.sess.get_modelmeta().custom_metadata_map
        #: the context a qaic graph was compiled for (its rotary tables have that many rows); None: any
        self.max_ctx_len = int(meta[CTX_LEN_KEY]) if meta.get(CTX_LEN_KEY, "").isdigit() else None

    def kv_shape(self, kind: str) -> list:
        return list(self._ins[past_name(kind, 0)].shape)

    def run(self, ids: np.ndarray, pos: np.ndarray, feats: np.ndarray | None = None):
        feeds = {INPUT_IDS: ids, POSITION_IDS: pos, **dict(zip(self.names, self.state))}
        if BATCH_INDEX in self.qeff:
            feeds[BATCH_INDEX] = np.arange(ids.shape[0], dtype=np.int64).reshape(-1, 1)
        if NUM_LOGITS_TO_KEEP in self.qeff:
            feeds[NUM_LOGITS_TO_KEEP] = np.zeros((ids.shape[1], 1), np.int64)
        if self.feature_dtype is not None:
            feeds[HIDDEN_STATES] = feats.astype(self.feature_dtype)
        try:
            out = self.sess.run(self.out_names, feeds, _quiet())
        except Exception as e:  # ONNX Runtime's own errors: a graph unlike the one it claims to be
            raise SpecdecError(f"the rewrite failed on ONNX Runtime at seq_len {ids.shape[1]}: "
                               f"{' '.join(str(e).split())[:300]}") from None
        self.state = out[1:1 + len(self.names)]
        want = (ids.shape[0], ids.shape[1] if self.role == "tlm" else 1)
        if out[0].ndim != 3 or out[0].shape[:2] != want:
            raise SpecdecError(f"the rewrite's logits at seq_len {ids.shape[1]} are {list(out[0].shape)}, not "
                               f"[{want[0]}, {want[1]}, vocab] as its role ({self.role}) has them")
        return out[0], (out[-1] if self.req.output else None)


def _role(path, logits_shape, meta_role: str | None) -> str:
    """The rewrite's role: its metadata's, else its logits' fixed seq dim (1: a DLM); the two must agree."""
    seq = logits_shape[1] if logits_shape and len(logits_shape) == 3 else None
    by_shape = ("dlm" if seq == 1 else "tlm") if isinstance(seq, int) or meta_role not in ("tlm", "dlm") else None
    if meta_role in ("tlm", "dlm") and by_shape not in (None, meta_role):
        raise SpecdecError(f"{path}: its {ROLE_KEY} metadata says {meta_role}, but its logits have seq dim {seq}")
    return meta_role if meta_role in ("tlm", "dlm") else by_shape


def _scenario(prefill_len: int, k: int, ctx_len: int, n_prompt: int, widths: tuple[int, ...] = (),
              fill_calls: int | None = None):
    """[(label, width, start, n_valid)] for one row. Starts are absolute positions. ``widths``:
    further call widths (an artifact's other specializations), each run once, full, all at the
    same start (each rewrites the one before: the context they need is the widest's).
    ``fill_calls``: how many calls fill the context (default: as few as hold it), so that the rows
    of a batch, which start at other positions, make calls of the same widths."""
    calls = []
    pos = 0
    while pos < n_prompt:  # chunked prefill; the last chunk right-padded
        v = min(prefill_len, n_prompt - pos)
        calls.append(("prefill" if v == prefill_len else "prefill (padded)",
                      prefill_len, pos, v))
        pos += v
    for label, width in (("seq_len 1", 1), ("seq_len 2", 2), ("seq_len k", k), ("seq_len k+1", k + 1)):
        calls.append((label, width, pos, width))
        pos += width
    calls += [(f"seq_len {w}", w, pos, w) for w in _extra_widths(widths, k, prefill_len)]
    # rollback: the last k drafts rejected, their positions reused
    pos -= k
    calls.append(("rollback k+1", k + 1, pos, k + 1))
    pos += k + 1
    pos -= 1
    calls.append(("rollback 2", 2, pos, 2))
    pos += 2
    # fill up to the end of the context, then a fixed-width call padded past it
    end_start = ctx_len - 2
    n_fill = max(0, -(-(end_start - pos) // prefill_len)) if fill_calls is None else fill_calls
    for i in range(n_fill):   # full chunks first; the last ones hold what is left (at least 1 each)
        v = min(prefill_len, end_start - pos - (n_fill - 1 - i))
        calls.append(("fill", prefill_len, pos, v))
        pos += v
    calls.append(("ctx end (padded)", k + 1, pos, ctx_len - pos))
    return calls


def _extra_widths(widths, k: int, prefill_len: int) -> list[int]:
    """The widths of ``widths`` the scenario does not call anyway."""
    return sorted(set(int(w) for w in widths) - {1, 2, k, k + 1, prefill_len})


def verify(original, rewritten, *, k: int = 7, prefill_len: int = 32, ctx_len: int = 256, batch_size: int = 1,
           seed: int = 0, tol: float = 1e-4, original_source=None, rewritten_source=None,
           widths=(), backend: str = "auto", precision: str = "f32") -> VerifyReport:
    """The rewrite against the export on ONNX Runtime (``VerifyReport``). ``widths``: call widths
    to run besides prefill, 1, 2, k and k+1 (an artifact's other specializations, e.g. from
    ``--k-list``). ``backend``: where the rewrite runs, "ort", "openvino" (its cache state
    variables inside OpenVINO, at ``precision``, default f32) or "auto" (openvino for a graph lowered for it). ``original`` and
    ``rewritten``: paths, ``onnx.ModelProto``s or ``onnx_ir.Model``s (a model in memory is
    written to a scratch directory, its external data hard-linked from its source directory:
    ``*_source``, the file it was read from, or an ir model's own ``base_dir``)."""
    check_options(k=k, prefill_len=prefill_len, ctx_len=ctx_len, batch_size=batch_size, optional=True)
    check_verify_options(seed=seed, tol=tol, widths=widths)
    import contextlib
    with contextlib.ExitStack() as stack:
        original = _as_path(original, original_source, stack)
        rewritten = _as_path(rewritten, rewritten_source, stack)
        return _verify_paths(original, rewritten, k=k, prefill_len=prefill_len, ctx_len=ctx_len,
                             batch_size=batch_size, seed=seed, tol=tol, widths=tuple(widths), backend=backend,
                             precision=precision)


def check_verify_options(*, seed, tol, widths, dash: str = "") -> None:
    """One line for a seed that is not an integer >= 0, a tolerance that is not a finite number >= 0,
    or a width that is not an integer >= 1 (a width the context cannot hold is the scenario's
    refusal). ``dash="--"``: named as the command line's flags."""
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise SpecdecError(f"{dash}seed must be an integer >= 0, got {seed!r}")
    if isinstance(tol, bool) or not isinstance(tol, (int, float, np.floating, np.integer)) \
            or not np.isfinite(tol) or tol < 0:
        raise SpecdecError(f"{dash}tol must be a finite number >= 0, got {tol!r}")
    for w in widths:
        if isinstance(w, bool) or not isinstance(w, (int, np.integer)) or w < 1:
            raise SpecdecError(f"widths: {w!r} is not a call width (an integer >= 1)")


def _as_path(model, source, stack) -> Path:
    """``model`` as a file ONNX Runtime can open: a path as it is, a model in memory saved to a
    scratch directory that ``stack`` removes."""
    import os
    import tempfile

    from ..model_io import read_any, save_model
    if isinstance(model, (str, os.PathLike)):
        return Path(model)
    proto, _, src_dir, _ = read_any(model, source)
    tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="specdec-verify-")))
    save_model(proto, tmp / "model.onnx", src_dir, link=True)
    return tmp / "model.onnx"


def _verify_paths(original: Path, rewritten: Path, *, k: int, prefill_len: int, ctx_len: int, batch_size: int,
                  seed: int, tol: float, widths: tuple[int, ...] = (), backend: str = "auto",
                  precision: str | None = None) -> VerifyReport:
    widest = max(_extra_widths(widths, k, prefill_len), default=0)
    # the prompt, then 2k+6 tokens of decoding and rollbacks, then at least one token at the end of the
    # context: at prefill 1 and 2 the prompt (1.5 chunks) leaves less than the sum below
    need = max(2 * prefill_len + 3 + 2 * (k + 1) + batch_size + widest, _prompt_len(prefill_len) + 2 * k + 7)
    if ctx_len < need:
        extra = f", a width of {widest}" if widest else ""
        raise SpecdecError(f"ctx_len {ctx_len} too small for the verification scenario of prefill {prefill_len}, "
                           f"k {k}, batch {batch_size}{extra} (needs >= {need}: 2*prefill + 2*(k+1) + batch + 3"
                           f"{' + width' if widest else ''}, and 2*k + 7 past a prompt of 1.5 prefill chunks): "
                           f"raise --ctx-len or lower the others")
    from .openvino import pick_backend
    model = load_model(rewritten)   # read once: the cache-write check and the request both look at it
    backend = pick_backend(backend, _check_writes(model, rewritten))
    req = request_of(model, rewritten)
    _log.info("verifying %s against %s on ONNX Runtime (k %d, prefill %d, context %d, batch %d)", rewritten,
              original, k, prefill_len, ctx_len, batch_size)
    det = _detection(Path(original))
    layers = sum(1 for i in model.graph.input if i.name.startswith("past_key."))
    if layers != det.info.num_layers:   # before the hidden-state layers are resolved against the export
        raise SpecdecError(f"layer count differs: original {det.info.num_layers}, rewrite {layers} "
                           f"({rewritten} is not a rewrite of this export)")
    orig = OriginalModel(Path(original), req, det)
    try:
        new = _Rewritten(Path(rewritten), ctx_len, batch_size, req)
        if backend == "openvino":
            from .openvino import replay_both
            return replay_both(lambda rw: _replay(orig, rw, rewritten, k=k, prefill_len=prefill_len,
                                                  ctx_len=ctx_len, batch_size=batch_size, seed=seed, tol=tol,
                                                  widths=widths), new, Path(rewritten), batch_size, precision)
        return _replay(orig, new, rewritten, k=k, prefill_len=prefill_len, ctx_len=ctx_len,
                       batch_size=batch_size, seed=seed, tol=tol, widths=widths)
    finally:
        if orig.copy is not None:
            orig.copy.close()


def _check_writes(model, rewritten) -> str | None:
    """A rewrite (``model``, read from ``rewritten``) that lost its target's cache write (an
    optimizer after the compile) is refused; returns its target."""
    from ..artifact.cache_writes import check_cache_writes, graph_target
    names = [i.name for i in model.graph.input]
    if not {INPUT_IDS, POSITION_IDS, past_name("key", 0)} <= set(names):  # before ONNX Runtime opens it
        raise SpecdecError(f"{rewritten}: not a rewritten graph (inputs: {', '.join(names)})")
    check_cache_writes(model, graph_target(model), str(rewritten))
    return graph_target(model)


def _replay(orig: OriginalModel, new: _Rewritten, rewritten, *, k: int, prefill_len: int, ctx_len: int,
            batch_size: int, seed: int, tol: float, widths: tuple[int, ...] = ()) -> VerifyReport:
    if new.max_ctx_len is not None and ctx_len > new.max_ctx_len:
        raise SpecdecError(f"{rewritten} was compiled for ctx_len {new.max_ctx_len} (a qaic graph: fixed context, "
                           f"rotary tables of that many rows); verify with --ctx-len <= {new.max_ctx_len}")
    _check_same_model(orig, new, rewritten)
    rng = np.random.default_rng(seed)
    vocab = orig.det.info.vocab_size
    report = VerifyReport(role=new.role, k=k, prefill_len=prefill_len, ctx_len=ctx_len,
                          batch_size=batch_size, tol=tol, backend="openvino" if hasattr(new, "precision") else "ort",
                          precision=getattr(new, "precision", None), hidden_output=new.req.output)
    rows = _batch_rows(prefill_len, k, ctx_len, batch_size, widths)
    n_calls = len(rows[0])
    tokens = [rng.integers(0, vocab, size=ctx_len + k + 2) for _ in range(batch_size)]
    feats = [random_features(rng, ctx_len + k + 2, new.req.feature_width) for _ in range(batch_size)]
    caches = [orig.empty() for _ in range(batch_size)]
    for c in range(n_calls):
        width = rows[0][c][1]
        ids = np.zeros((batch_size, width), np.int64)
        frows = np.zeros((batch_size, width, new.req.feature_width or 0), np.float32)
        pos = np.full((batch_size, width), -1, np.int64)
        for b in range(batch_size):
            _, w, start, v = rows[b][c]
            assert w == width
            # a rollback rewrites history: new tokens at reused positions
            if rows[b][c][0].startswith("rollback"):
                tokens[b][start:start + v] = rng.integers(0, vocab, size=v)
                if feats[b] is not None:
                    feats[b][start:start + v] = random_features(rng, v, new.req.feature_width)
            ids[b, :v] = tokens[b][start:start + v]
            ids[b, v:] = rng.integers(0, vocab, size=width - v)  # garbage under padding
            if feats[b] is not None:
                frows[b, :v] = feats[b][start:start + v]
                frows[b, v:] = 1e3 * random_features(rng, width - v, new.req.feature_width)
            pos[b, :v] = np.arange(start, start + v)
        before = [s.copy() for s in new.state]
        logits, hidden = new.run(ids, pos, frows if new.req.feature_width else None)
        for b in range(batch_size):
            label, _, start, v = rows[b][c]
            ref, present, ref_hidden = orig.run(tokens[b][start:start + v], start, caches[b],
                                                feats[b][start:start + v] if feats[b] is not None else None)
            caches[b] = present
            got = logits[b, :v] if new.role == "tlm" else logits[b, :1]
            want = ref[:v] if new.role == "tlm" else ref[v - 1:v]
            cache_diff = worst(max_diff(s[b, :, :start + v], p[0], "cache slots") for s, p in zip(new.state, present))
            changed = any(not np.array_equal(s0[b, :, :start], s1[b, :, :start])
                          for s0, s1 in zip(before, new.state))
            # padding must not change any slot: compare everything outside the written run
            written = np.zeros(ctx_len, bool)
            written[start:start + v] = True
            changed |= any(not np.array_equal(s0[b][:, ~written], s1[b][:, ~written])
                           for s0, s1 in zip(before, new.state))
            got_hidden = None if hidden is None else hidden[b, :v]
            non_finite = any(not np.all(np.isfinite(s[b])) for s in new.state) or not np.all(np.isfinite(got)) \
                or (got_hidden is not None and not np.all(np.isfinite(got_hidden)))
            report.checks.append(ShapeCheck(label=label, seq_len=width,
                                            logits_max_abs_diff=max_diff(got, want, "logits"),
                                            cache_max_abs_diff=cache_diff, history_changed=bool(changed),
                                            hidden_max_abs_diff=max_diff(got_hidden, ref_hidden, new.req.output),
                                            non_finite=bool(non_finite)))
    if new.role == "tlm":
        report.width_max_abs_diff, report.width_top_token_changes = _width_dependence(
            orig, tokens[0], prefill_len, k + 1)
        if report.backend == "openvino":
            from .openvino import backend_width_dependence
            report.backend_width_max_abs_diff, report.backend_width_top_token_changes = backend_width_dependence(
                new, tokens[0], prefill_len, k + 1, new.req.feature_width)
    return report


def _batch_rows(prefill_len: int, k: int, ctx_len: int, batch_size: int, widths: tuple[int, ...]) -> list:
    """One ``_scenario`` per row, each row's prompt longer by a few tokens (but not by a prefill
    call more), all of the same call widths: every call of the batch has one width."""
    base = _prompt_len(prefill_len)
    slack = -(-base // prefill_len) * prefill_len - base   # tokens a row may add without another call
    first = _scenario(prefill_len, k, ctx_len, base, widths)
    n_fill = sum(1 for c in first if c[0] == "fill")
    rows = [first] + [_scenario(prefill_len, k, ctx_len, base + b % (slack + 1), widths, n_fill)
                      for b in range(1, batch_size)]
    if any([c[1] for c in r] != [c[1] for c in first] or min(c[3] for c in r) < 1 for r in rows[1:]):
        raise SpecdecError(f"ctx_len {ctx_len} leaves too little context to fill for the rows of batch "
                           f"{batch_size} at prefill {prefill_len}: raise --ctx-len or lower --batch-size")
    return rows


def _prompt_len(prefill_len: int) -> int:
    """The first row's prompt: a full prefill chunk and a right-padded one."""
    return prefill_len + prefill_len // 2 + 1


def _check_same_model(orig: OriginalModel, new: _Rewritten, rewritten) -> None:
    """One line when the rewrite is not of this export: layers, KV heads, head dims, vocabulary."""
    info = orig.det.info
    if new.layers != info.num_layers:
        raise SpecdecError(f"layer count differs: original {info.num_layers}, rewrite {new.layers} "
                           f"({rewritten} is not a rewrite of this export)")
    want = {"KV heads": info.num_kv_heads, "key head_dim": info.head_dim,
            "value head_dim": info.value_head_dim or info.head_dim, "vocabulary": info.vocab_size}
    got = {"KV heads": new.kv_shape("key")[1], "key head_dim": new.kv_shape("key")[3],
           "value head_dim": new.kv_shape("value")[3], "vocabulary": new.vocab}
    for what, w in want.items():
        if isinstance(got[what], int) and got[what] != w:
            raise SpecdecError(f"{what} differ: original {w}, rewrite {got[what]} ({rewritten} is not a rewrite "
                               f"of this export)")


def _width_dependence(orig: OriginalModel, tokens: np.ndarray, start: int, width: int) -> tuple[float, int]:
    """The export's logits of positions start..start+width-1 after ``start`` tokens of history:
    one call of ``width`` tokens against ``width`` calls of one (max abs difference, positions
    whose top token differs)."""
    _, past, _ = orig.run(tokens[:start], 0, orig.empty())
    wide, _, _ = orig.run(tokens[start:start + width], start, past)
    rows = []
    for i in range(width):
        one, past, _ = orig.run(tokens[start + i:start + i + 1], start + i, past)
        rows.append(one[0])
    narrow = np.stack(rows)
    return float(np.max(np.abs(wide - narrow))), int(np.sum(wide.argmax(-1) != narrow.argmax(-1)))


def compiled_ctx_len(rewritten: str | Path) -> int | None:
    """The context length a qaic graph was compiled for (its metadata), None for any."""
    value = {p.key: p.value for p in load_model(rewritten).metadata_props}.get(CTX_LEN_KEY, "")
    return int(value) if value.isdigit() else None


def history_past_windows(original: str | Path, ctx_len: int, prefill_len: int, limit: int | None = None) -> int:
    """The default history: ``ctx_len``, lengthened when the original has a
    sliding window that long or longer, so the replay always runs past every
    window (``--ctx-len`` overrides); never past ``limit``, the context a qaic
    graph was compiled for (a window longer than that never takes effect there)."""
    windows = [layer.window for layer in _detection(Path(original)).layers if layer.window]
    history = max(ctx_len, max(windows) + 2 * prefill_len) if windows else ctx_len
    return min(history, limit) if limit else history
