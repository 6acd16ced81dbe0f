"""The Cloud AI 100 backend against a FAKE ``qaicrt`` / ``QAicApi_pb2``.

THE MODULES BELOW ARE FAKES. There is no Cloud AI 100 device or SDK here.
They implement only the calls REFERENCES.md lists (as QEfficient's
cloud_infer.py uses them), and emulate a device that keeps retained state:
a past_* input given as a zero-size buffer means "use the state on the
device"; the *_RetainedState outputs update that state. The "device" runs the
artifact's own model.onnx with ONNX Runtime, so numerics are real; the KV
buffers are float16 on the "device", as custom_io.yaml asks. It rejects a
call whose buffer shapes match none of the QPC's allowed shapes ("No matching
dimension found"), like the real runtime.
"""
from __future__ import annotations

import json
import sys
import types

import numpy as np
import onnxruntime as ort
import pytest

from specdec_compile import cli as compile_cli
from specdec_compile.errors import SpecdecError
from specdec_compile.runtime import OrtBackend, QaicBackend, SpecDecoder, TargetOnlyDecoder, load_artifact
from specdec_compile.cli import run as run_cli

PL, CL = 8, 64
IDS = [1, 5, 9, 33, 7, 100, 42, 17, 3, 8, 55]

# ---------------------------------------------------------------------------- FAKE QAicApi_pb2

FLOAT_TYPE, FLOAT_16_TYPE, INT64_I_TYPE, INT32_I_TYPE = 1, 2, 9, 8
# the other types QEfficient's QAICInferenceSession maps (cloud_infer.py); BFLOAT16_TYPE is 11
# there when the module lacks it, so the fake module leaves it out to exercise that default
BFLOAT16_TYPE, INT8_Q_TYPE, UINT8_Q_TYPE, INT16_Q_TYPE, INT32_Q_TYPE, INT8_TYPE = 11, 3, 4, 5, 6, 7
INP, OUT = 0, 1
NP = {FLOAT_TYPE: np.float32, FLOAT_16_TYPE: np.float16, INT64_I_TYPE: np.int64, INT32_I_TYPE: np.int32,
      BFLOAT16_TYPE: np.uint16, INT8_Q_TYPE: np.int8, UINT8_Q_TYPE: np.uint8, INT16_Q_TYPE: np.int16,
      INT32_Q_TYPE: np.int32, INT8_TYPE: np.int8}


def device_values(t, raw: bytes, dims, feed_dtype):
    """The FAKE device reading a buffer of type ``t`` as the ONNX graph's ``feed_dtype``
    (bfloat16 by torch, independently of the runtime's own conversion)."""
    arr = np.frombuffer(raw, NP[t]).reshape(dims)
    if t == BFLOAT16_TYPE:
        import torch
        arr = torch.from_numpy(arr.view(np.int16).copy()).view(torch.bfloat16).float().numpy()
    return arr.astype(feed_dtype)


def device_bytes(t, arr) -> bytes:
    """The FAKE device writing float32 values into a buffer of type ``t``."""
    if t == BFLOAT16_TYPE:
        import torch
        return torch.from_numpy(np.ascontiguousarray(arr, np.float32)).to(torch.bfloat16).view(torch.int16).numpy().tobytes()
    return np.asarray(arr).astype(NP[t]).tobytes()


class FakeIoDesc:
    """FAKE QAicApi_pb2.IoDesc: parses the JSON our fake QPC holds."""

    def ParseFromString(self, raw: bytes):
        d = json.loads(raw.decode())
        self.selected_set = types.SimpleNamespace(bindings=[
            types.SimpleNamespace(name=b["name"], index=i, dir=b["dir"], dims=list(b["dims"]), type=b["type"],
                                  size=int(np.prod(b["dims"])) * np.dtype(NP[b["type"]]).itemsize,
                                  is_partial_buf_allowed=False)
            for i, b in enumerate(d["bindings"])])
        self.allowed_shapes = [types.SimpleNamespace(shapes=[types.SimpleNamespace(dims=list(s), type=b["type"])
                                                             for s, b in zip(a, d["bindings"])])
                               for a in d["allowed_shapes"]]


def fake_aicapi():
    m = types.ModuleType("QAicApi_pb2")
    m.__doc__ = "FAKE QAicApi_pb2 for tests"
    m.FLOAT_TYPE, m.FLOAT_16_TYPE, m.INT64_I_TYPE, m.INT32_I_TYPE = FLOAT_TYPE, FLOAT_16_TYPE, INT64_I_TYPE, INT32_I_TYPE
    m.INT8_Q_TYPE, m.UINT8_Q_TYPE, m.INT16_Q_TYPE, m.INT32_Q_TYPE, m.INT8_TYPE = (INT8_Q_TYPE, UINT8_Q_TYPE,
                                                                               INT16_Q_TYPE, INT32_Q_TYPE, INT8_TYPE)
    m.BUFFER_IO_TYPE_INPUT, m.BUFFER_IO_TYPE_OUTPUT = INP, OUT
    m.IoDesc = FakeIoDesc
    return m


# ---------------------------------------------------------------------------- FAKE qaicrt

def fake_qaicrt(events: list):
    """FAKE qaicrt module; ``events`` records what the backend did."""
    m = types.ModuleType("qaicrt")
    m.__doc__ = "FAKE qaicrt for tests"

    class QStatus:
        QS_SUCCESS = 0
        QS_ERROR = 1
    m.QStatus = QStatus

    class QIDList(list):
        pass

    class Context:
        def __init__(self, devices=None):
            self.devices = list(devices) if devices is not None else None
            events.append(("context", self.devices))

    class Queue:
        def __init__(self, context, device):
            events.append(("queue", device))

        def enqueue(self, exec_obj):
            exec_obj.enqueued = True
            return QStatus.QS_SUCCESS

    class QBuffer:
        def __init__(self, data: bytes):
            self.data = bytes(data)
            self.size = len(self.data)

        def __bytes__(self):
            return self.data

    class BufferDimensionsVecRef(list):
        pass

    class Qpc:
        def __init__(self, path):
            with open(f"{path}/programqpc.bin", "rb") as f:
                self.raw = f.read()
            self.desc = json.loads(self.raw)

        def getIoDescriptor(self):
            return QStatus.QS_SUCCESS, self.raw

    class QAicProgramProperties:
        devMapping = ""

    class Program:
        """The FAKE device: runs the artifact's model.onnx, keeps the retained state."""

        def __init__(self, context, device, qpc, props):
            events.append(("program", device, props.devMapping))
            self.desc = qpc.desc
            self.bindings = self.desc["bindings"]
            self.session = None
            self.state = {}

        def load(self):
            self.session = ort.InferenceSession(self.desc["model"], providers=["CPUExecutionProvider"])
            ort_types = {"tensor(int64)": np.int64, "tensor(float)": np.float32, "tensor(float16)": np.float16}
            self.feed_types = {i.name: ort_types[i.type] for i in self.session.get_inputs()}
            return QStatus.QS_SUCCESS

        def activate(self):
            for b in self.bindings:
                if b["name"].startswith("past_") and b["dir"] == INP:
                    self.state[b["name"]] = np.zeros(b["dims"], NP[b["type"]])
            return QStatus.QS_SUCCESS

        def deactivate(self):
            return QStatus.QS_SUCCESS

    class ExecObj:
        def __init__(self, context, program):
            self.p = program
            self.out = None

        def setData(self, buffers, dims):
            self.buffers, self.dims = list(buffers), [(s, list(d)) for s, d in dims]
            events.append(("setData", {b["name"]: d for b, (_, d) in zip(self.p.bindings, self.dims)}))
            return QStatus.QS_SUCCESS

        def waitForCompletion(self):
            p = self.p
            given = {}
            for b, buf, (size, d) in zip(p.bindings, self.buffers, self.dims):
                if buf.size == 0:
                    continue
                if buf.size != size * int(np.prod(d)):
                    return QStatus.QS_ERROR
                given[b["name"]] = d
            # every non-skipped buffer must match one allowed shape set
            if not any(all(given[b["name"]] == list(s) for b, s in zip(p.bindings, a) if b["name"] in given)
                       for a in p.desc["allowed_shapes"]):
                events.append(("error", "No matching dimension found"))
                return QStatus.QS_ERROR
            feeds = {}
            for b, buf, (size, d) in zip(p.bindings, self.buffers, self.dims):
                if b["dir"] != INP:
                    continue
                want = p.feed_types[b["name"]]
                if buf.size:
                    arr = device_values(b["type"], buf.data, d, want)
                    if b["name"].startswith("past_"):
                        p.state[b["name"]] = arr.astype(NP[b["type"]])
                else:
                    arr = p.state[b["name"]].astype(want)
                feeds[b["name"]] = arr
            names = [o.name for o in p.session.get_outputs()]
            res = dict(zip(names, p.session.run(names, feeds)))
            self.out = []
            for b, buf in zip(p.bindings, self.buffers):
                if b["name"].endswith("_RetainedState"):
                    p.state[b["name"][: -len("_RetainedState")]] = res[b["name"]].astype(NP[b["type"]])
                    self.out.append(QBuffer(b""))
                elif b["dir"] == OUT:
                    self.out.append(QBuffer(device_bytes(b["type"], res[b["name"]])))
                else:
                    self.out.append(QBuffer(b""))
            return QStatus.QS_SUCCESS

        def getData(self):
            return QStatus.QS_SUCCESS, self.out

    for cls in (QIDList, Context, Queue, QBuffer, BufferDimensionsVecRef, Qpc, QAicProgramProperties,
                Program, ExecObj):
        setattr(m, cls.__name__, cls)
    return m


def write_fake_qpc(art_dir, drop_seq_len=None, types=None):
    """A FAKE QPC directory (OUT/qpc/programqpc.bin, JSON) for an artifact; ``types``: binding
    name -> QAicApi type, in place of the default ones."""
    art = load_artifact(art_dir)
    sess = ort.InferenceSession(str(art_dir / "model.onnx"), providers=["CPUExecutionProvider"])
    V = sess.get_outputs()[0].shape[-1]
    B = art.batch_size
    bindings, shape_fns = [], []
    for i in sess.get_inputs():
        if i.name in ("input_ids", "position_ids"):
            bindings.append({"name": i.name, "dir": INP, "type": INT64_I_TYPE})
            shape_fns.append(lambda s: [B, s])
        elif i.name == "hidden_states":     # a feature draft's features: float16 per custom IO
            bindings.append({"name": i.name, "dir": INP, "type": FLOAT_16_TYPE})
            shape_fns.append(lambda s, w=i.shape[2]: [B, s, w])
        else:
            kv = [B, i.shape[1], art.ctx_len, i.shape[3]]
            bindings.append({"name": i.name, "dir": INP, "type": FLOAT_16_TYPE})
            shape_fns.append(lambda s, kv=kv: kv)
    for o in sess.get_outputs():
        if o.name == "logits":
            bindings.append({"name": "logits", "dir": OUT, "type": FLOAT_TYPE})
            shape_fns.append(lambda s: [B, s if art.role == "tlm" else 1, V])
        elif o.name in ("hidden_states", "draft_hidden_states"):
            bindings.append({"name": o.name, "dir": OUT, "type": FLOAT_16_TYPE})
            shape_fns.append(lambda s, w=o.shape[2]: [B, s, w])
        else:
            kv = [B, o.shape[1], art.ctx_len, o.shape[3]]
            bindings.append({"name": o.name, "dir": OUT, "type": FLOAT_16_TYPE})
            shape_fns.append(lambda s, kv=kv: kv)
    seq_lens = [s for s in art.seq_lens if s != drop_seq_len]
    allowed = [[f(s) for f in shape_fns] for s in seq_lens]
    for b, f in zip(bindings, shape_fns):
        b["dims"] = f(seq_lens[0])
        b["type"] = (types or {}).get(b["name"], b["type"])
    qpc = art_dir / "qpc"
    qpc.mkdir(exist_ok=True)
    (qpc / "programqpc.bin").write_text(json.dumps({"model": str(art_dir / "model.onnx"), "bindings": bindings,
                                                     "allowed_shapes": allowed}))
    return qpc


@pytest.fixture(scope="module")
def qaic_arts(fixture_path, tmp_path_factory):
    root = tmp_path_factory.mktemp("rt_qaic")
    out = {}
    for name, role, k in (("llama_gqa", "tlm", 4), ("gpt2", "dlm", None), ("llama_gqa", "dlm", None)):
        d = root / f"{name}-{role}"
        argv = [str(fixture_path(name)), "--role", role, "--target", "qaic", "--prefill-len", str(PL),
                "--ctx-len", str(CL), "-o", str(d)]
        if k:
            argv += ["--k", str(k)]
        assert compile_cli.main(argv) == 0
        write_fake_qpc(d)
        out[(name, role)] = d
    return out


def backend(path, events, **kw):
    return QaicBackend(path, qaicrt_module=fake_qaicrt(events), aicapi_module=fake_aicapi(), **kw)


def test_fake_device_decoding_equals_onnx_runtime(qaic_arts):
    ev = []
    tlm = backend(qaic_arts[("llama_gqa", "tlm")], ev, device_ids=[0])
    for draft in ("gpt2", "llama_gqa"):
        dlm = backend(qaic_arts[(draft, "dlm")], ev, device_ids=[1])
        got = SpecDecoder(tlm, dlm).generate(IDS, max_new_tokens=25)
        ref = SpecDecoder(OrtBackend(qaic_arts[("llama_gqa", "tlm")]),
                          OrtBackend(qaic_arts[(draft, "dlm")])).generate(IDS, max_new_tokens=25)
        assert got.generated_ids == ref.generated_ids
    assert TargetOnlyDecoder(tlm).generate(IDS, max_new_tokens=25).generated_ids == ref.generated_ids
    assert not any(e[0] == "error" for e in ev)


def test_retained_state_buffers_are_skipped_and_logits_sized_per_call(qaic_arts):
    ev = []
    tlm = backend(qaic_arts[("llama_gqa", "tlm")], ev)
    dlm = backend(qaic_arts[("llama_gqa", "dlm")], ev)
    SpecDecoder(tlm, dlm).generate(IDS, max_new_tokens=12)
    calls = [e[1] for e in ev if e[0] == "setData"]
    assert calls
    V = 211
    for dims in calls:
        S = dims["input_ids"][1]
        assert dims["position_ids"] == [1, S]
        assert dims["logits"] in ([1, S, V], [1, 1, V])
        ins = [d for n, d in dims.items() if n.startswith("past_") and not n.endswith("_RetainedState")]
        outs = [d for n, d in dims.items() if n.endswith("_RetainedState")]
        assert len(ins) == len(outs) == 4
        assert all(d == [0] for d in outs)                          # outputs: always skipped
        assert all(d == [0] for d in ins) or all(d == [1, 2, CL, 16] for d in ins)
    # reset() uploads zero caches once (first call after it), then skips them again
    uploads = [all(d != [0] for n, d in c.items() if n.startswith("past_") and not n.endswith("_RetainedState"))
               for c in calls]
    assert sum(uploads) == 2          # one per model: the reset before the generation
    assert tlm.vocab_size == V


def test_calls_outside_the_specializations_fail_before_the_device(qaic_arts):
    ev = []
    tlm = backend(qaic_arts[("llama_gqa", "tlm")], ev)
    with pytest.raises(SpecdecError, match="matches no specialization"):
        tlm.run(np.zeros((1, 3), np.int64), np.arange(3)[None])
    assert not [e for e in ev if e[0] == "setData"]


def test_qpc_missing_or_not_matching_the_artifact(qaic_arts, tmp_path):
    import shutil
    d = tmp_path / "t"
    shutil.copytree(qaic_arts[("llama_gqa", "tlm")], d)
    shutil.rmtree(d / "qpc")
    with pytest.raises(SpecdecError, match="no compiled QPC"):
        backend(d, [])
    write_fake_qpc(d, drop_seq_len=5)
    with pytest.raises(SpecdecError, match="compiled for input_ids shapes"):
        backend(d, [])


def test_device_ids_per_model(qaic_arts):
    ev = []
    backend(qaic_arts[("llama_gqa", "tlm")], ev, device_ids=[2, 3])
    backend(qaic_arts[("gpt2", "dlm")], ev, device_ids=[1])
    assert ("context", [2, 3]) in ev and ("queue", 2) in ev and ("program", None, "2:3") in ev
    assert ("context", [1]) in ev and ("program", 1, "") in ev


def test_cli_backend_qaic_with_fake_modules(qaic_arts, monkeypatch, capsys):
    ev = []
    monkeypatch.setitem(sys.modules, "qaicrt", fake_qaicrt(ev))
    monkeypatch.setitem(sys.modules, "QAicApi_pb2", fake_aicapi())
    argv = ["--tlm", str(qaic_arts[("llama_gqa", "tlm")]), "--dlm", str(qaic_arts[("gpt2", "dlm")]),
            "--prompt-ids", ",".join(map(str, IDS)), "--max-new-tokens", "15", "--json", "--backend", "qaic",
            "--tlm-device-ids", "0", "--dlm-device-ids", "1"]
    capsys.readouterr()
    assert run_cli.main(argv) == 0
    got = json.loads(capsys.readouterr().out)["results"][0]["generated_ids"]
    assert run_cli.main(argv[:-6] + ["--backend", "ort"]) == 0
    assert json.loads(capsys.readouterr().out)["results"][0]["generated_ids"] == got
    assert ("context", [0]) in ev and ("context", [1]) in ev


def test_fake_device_with_a_feature_draft_pair(fixture_path, tmp_path):
    """A TLM with hidden states and a feature draft: their extra buffers (float16 on the
    device) are set and read per call; the text equals ONNX Runtime's and target-only."""
    from feature_draft_models import export_feature_draft
    dirs = {}
    for role, src, extra in (("tlm", fixture_path("llama_gqa"), ["--hidden-states", "-1"]),
                             ("dlm", export_feature_draft(1), ["--feature-layers", "-1"])):
        d = dirs[role] = tmp_path / role
        assert compile_cli.main([str(src), "--role", role, "--k", "3", "--target", "qaic", "--prefill-len", str(PL),
                                 "--ctx-len", str(CL), "-o", str(d), *extra]) == 0
        write_fake_qpc(d)
    ev = []
    tlm, dlm = backend(dirs["tlm"], ev), backend(dirs["dlm"], ev)
    got = SpecDecoder(tlm, dlm).generate(IDS, max_new_tokens=20)
    assert got.metrics["call_time_by_width"]["dlm"]
    ref = SpecDecoder(OrtBackend(dirs["tlm"]), OrtBackend(dirs["dlm"])).generate(IDS, max_new_tokens=20)
    assert got.generated_ids == ref.generated_ids
    assert TargetOnlyDecoder(tlm).generate(IDS, max_new_tokens=20).generated_ids == got.generated_ids
    calls = [e[1] for e in ev if e[0] == "setData"]
    assert not any(e[0] == "error" for e in ev)
    assert all(c["hidden_states"] == [1, c["input_ids"][1], 64] for c in calls)
    assert any("draft_hidden_states" in c for c in calls)
    out = tlm.run_outputs(np.array([IDS[:PL]]), np.arange(PL)[None])
    want = OrtBackend(dirs["tlm"]).run_outputs(np.array([IDS[:PL]]), np.arange(PL)[None])
    assert np.abs(out["hidden_states"] - want["hidden_states"]).max() < 1e-2     # float16 on the device


def test_backend_qaic_without_the_sdk(qaic_arts, monkeypatch):
    monkeypatch.setitem(sys.modules, "qaicrt", None)     # import fails
    with pytest.raises(SpecdecError, match="Cloud AI 100 runtime"):
        QaicBackend(qaic_arts[("llama_gqa", "tlm")])
