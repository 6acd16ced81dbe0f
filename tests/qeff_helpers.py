"""Shared by the --interface qeff tests: QEfficient's recorded calls (tests/qeff_data/, made by
scripts/record_qeff.py), and running a rewrite on ONNX Runtime call after call, the retained
state of each call fed to the next."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnxruntime as ort

from specdec_compile import pipeline
from specdec_compile.options import Options

DATA = Path(__file__).resolve().parent / "qeff_data"
RECORD = json.loads((DATA / "qeff.json").read_text())
FBS, PL, CTX, K = RECORD["full_batch_size"], RECORD["prefill_len"], RECORD["ctx_len"], RECORD["k"]
#: QEfficient's plain SpD interface (continuous_batching=False): its batch_size
PLAIN = RECORD["plain"]
BS = PLAIN["batch_size"]


def recorded_calls(role: str, plain: bool = False) -> list[dict]:
    """QEfficient's calls of ``role``, in order: the inputs and its logits (``plain``: its plain
    interface's, without batch_index)."""
    data = np.load(DATA / f"{role}{'_plain' if plain else ''}.npz")
    calls, n = [], 0
    while f"call{n}_logits" in data:
        keys = ("input_ids", "position_ids", "logits") + (() if plain else ("batch_index",))
        c = {key: data[f"call{n}_{key}"] for key in keys}
        if f"call{n}_num_logits_to_keep" in data:
            c["num_logits_to_keep"] = int(data[f"call{n}_num_logits_to_keep"])
        calls.append(c)
        n += 1
    return calls


def session(model) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.intra_op_num_threads = 1
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def rewrite(path, role: str, target: str, interface: str = "qeff", k: int | None = K, ctx_len: int = CTX,
            cb: bool = True):
    """``cb``: QEfficient's continuous batching (--full-batch-size), else its plain interface."""
    return pipeline.rewrite(path, Options(role=role, target=target, k=k if role == "tlm" else None, ctx_len=ctx_len,
                                          interface=interface, continuous_batching=cb and interface == "qeff"))


class Replay:
    """One model's session and its retained state (``rows`` cache rows, zeros at first)."""

    def __init__(self, model, rows: int):
        self.sess = session(model)
        self.names = [o.name for o in self.sess.get_outputs()]
        self.state = {}
        for i in self.sess.get_inputs():
            if i.name.startswith("past_"):
                self.state[i.name] = np.zeros([rows, i.shape[1], ctx_of(i), i.shape[3]], np.float32)

    def __call__(self, input_ids, position_ids, batch_index=None, num_logits_to_keep=None) -> np.ndarray:
        feed = {"input_ids": np.asarray(input_ids, np.int64), "position_ids": np.asarray(position_ids, np.int64),
                **self.state}
        if batch_index is not None:
            feed["batch_index"] = np.asarray(batch_index, np.int64).reshape(-1, 1)
        if num_logits_to_keep is not None:
            feed["num_logits_to_keep"] = np.zeros((num_logits_to_keep, 1), np.int64)
        out = dict(zip(self.names, self.sess.run(self.names, feed)))
        self.state = {k: out[k + "_RetainedState"] for k in self.state}
        return out["logits"]


def ctx_of(inp) -> int:
    """The cache length of a past_* input: fixed, or the recorded calls' ctx_len."""
    return inp.shape[2] if isinstance(inp.shape[2], int) else CTX


def io_of(model, kind: str) -> list[tuple[str, str, list]]:
    """(name, numpy dtype name, dims) of each graph input or output."""
    import onnx
    vis = model.graph.input if kind == "inputs" else model.graph.output
    return [(v.name, onnx.helper.tensor_dtype_to_np_dtype(v.type.tensor_type.elem_type).name,
             [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]) for v in vis]


def assert_interface_is(model, want: dict, role: str) -> None:
    """Same input and output names, order and dtypes as QEfficient's recorded export; the same dims,
    except that ours name the logits' dims (QEfficient's exporter leaves them anonymous)."""
    for kind in ("inputs", "outputs"):
        got = io_of(model, kind)
        assert [(n, t) for n, t, _ in got] == [(w["name"], w["dtype"]) for w in want[kind]]
        for (name, _, dims), w in zip(got, want[kind]):
            if name == "logits":
                assert dims == ["batch_size", "num_logits_to_keep" if role == "tlm" else 1, w["dims"][2]]
            else:
                assert dims == w["dims"], name


def assert_logits_are(replay: Replay, calls: list[dict]) -> None:
    """Each recorded call replayed: QEfficient's logits within 1e-5 wherever it computes them (its
    padded columns are NaN, ours finite)."""
    for n, c in enumerate(calls):
        got = replay(c["input_ids"], c["position_ids"], c.get("batch_index"), c.get("num_logits_to_keep"))
        want = c["logits"]
        assert got.shape == want.shape, n
        assert np.isfinite(got).all(), n
        ok = ~np.isnan(want)
        assert ok.sum() >= want.size // 4, n
        np.testing.assert_allclose(got[ok], want[ok], atol=1e-5, err_msg=f"call {n}")
