"""Bad input to the backends' Python API and to the ``specdec-run`` flags that feed them: each is
one line (``SpecdecError``; the CLI: one line on stderr, exit 2), never a traceback from ONNX
Runtime, OpenVINO or numpy, a hang, or an option quietly dropped (docs/runtime.md, *Backends*)."""
from __future__ import annotations

import importlib.util

import numpy as np
import onnxruntime as ort
import pytest
from runtime_helpers import one_line_error, run
from test_qaic import CL, PL, backend as qaic_backend, write_fake_qpc

from specdec_compile import cli as compile_cli
from specdec_compile.errors import SpecdecError
from specdec_compile.ort_session import max_threads
from specdec_compile.runtime import OpenVinoBackend, OrtBackend, open_backend
from specdec_compile.runtime.backends.openvino.loader import load_openvino
from specdec_compile.runtime.backends.ort.loader import load_ort

PROMPT = [1, 5, 9, 33, 7, 100, 42, 17]


@pytest.fixture(scope="module")
def art(fixture_path, tmp_path_factory):
    """art(role, target) -> a llama_gqa artifact dir (TLM: k 3, widths 3/4), compiled once."""
    root = tmp_path_factory.mktemp("refusal_artifacts")
    made = {}

    def get(role="tlm", target="ort"):
        if (role, target) not in made:
            out = root / f"{role}-{target}"
            k = ["--k", "3"] if role == "tlm" else []
            assert compile_cli.main([str(fixture_path("llama_gqa")), "--role", role, "--target", target,
                                     "--prefill-len", str(PL), "--ctx-len", str(CL), "-o", str(out), *k]) == 0
            made[role, target] = out
        return made[role, target]

    return get


def refused(needle, f, *a, **kw):
    with pytest.raises(SpecdecError, match=needle) as e:
        f(*a, **kw)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("n", [0, -1, True, False, "2", 2.5, 10 ** 6])
def test_ort_thread_counts_out_of_range_or_of_the_wrong_type(art, n):
    # 0 and False were ONNX Runtime's default without a word, -1 was accepted, True ran 1 thread,
    # "2" and 2.5 were pybind's TypeError, and 10**6 threads never finished making the pool
    refused("intra_op_threads must be", OrtBackend, art(), intra_op_threads=n)


def test_ort_thread_count_from_the_environment(art, monkeypatch):
    for value, needle in (("abc", "must be an integer"), ("-2", "must be in"), ("0", "must be in")):
        monkeypatch.setenv("SPECDEC_ORT_THREADS", value)      # was int()'s ValueError, or -2 and 0 taken
        refused(f"SPECDEC_ORT_THREADS {needle}", OrtBackend, art())
    monkeypatch.setenv("SPECDEC_ORT_THREADS", "1")
    so = ort.SessionOptions()
    so.intra_op_num_threads = 2          # asked for by the caller: the environment does not replace it
    assert OrtBackend(art(), session_options=so).session.get_session_options().intra_op_num_threads == 2


def test_ort_session_options_that_conflict_or_are_not_session_options(art):
    so = ort.SessionOptions()
    so.intra_op_num_threads = 4
    # was: intra_op_threads silently replaced the caller's 4
    refused("intra_op_threads=2 but session_options.intra_op_num_threads=4", OrtBackend, art(),
            session_options=so, intra_op_threads=2)
    b = OrtBackend(art(), session_options=so, intra_op_threads=4)       # the same count twice is fine
    assert b.session.get_session_options().intra_op_num_threads == 4
    one = ort.SessionOptions()
    OrtBackend(art(), session_options=one, intra_op_threads=1)
    assert one.intra_op_num_threads == 0      # the caller's options keep their own count for the next model
    OrtBackend(art(), session_options=one, intra_op_threads=2)
    refused("session_options must be an onnxruntime.SessionOptions", OrtBackend, art(), session_options={"a": 1})
    bad = ort.SessionOptions()
    bad.intra_op_num_threads = -1
    refused("session_options.intra_op_num_threads must be in", OrtBackend, art(), session_options=bad)


@pytest.mark.parametrize("providers, needle", [
    ([], "providers is empty"),                                 # was IndexError
    ("CPUExecutionProvider", "must be a list"),                 # was split into characters
    (["NoSuchExecutionProvider"], "has no NoSuchExecutionProvider"),   # was run on the CPU, reported as asked
    ([7], "is not a provider name"),
])
def test_ort_providers(art, providers, needle):
    refused(needle, OrtBackend, art(), providers=providers)


def test_ort_device_id_and_inplace(art):
    refused("device_id must be", OrtBackend, art(), device_id=-1)
    refused("device_id must be", OrtBackend, art(), device_id="0")
    refused("device_id 1 names a CUDA device, but the session runs on CPUExecutionProvider", OrtBackend, art(),
            providers=["CPUExecutionProvider"], device_id=1)          # was ignored
    refused("inplace must be None, True or False", OrtBackend, art(), inplace="no")   # was bool("no"): in place
    assert OrtBackend(art(), providers=[("CPUExecutionProvider", {})]).providers == ["CPUExecutionProvider"]


def test_loading_options_given_with_a_model_already_loaded(art):
    model = load_ort(art())
    refused("intra_op_threads given with a model load_ort already loaded", OrtBackend, model, intra_op_threads=1)
    refused("providers given with", OrtBackend, model, providers=["CPUExecutionProvider"])
    OrtBackend(model, inplace=False)       # a running option, not a loading one


@pytest.mark.parametrize("path", [5, None, ["/tmp"]])
def test_a_path_that_is_not_a_path(path):
    refused("expected an artifact directory", OrtBackend, path)      # was os.fspath's TypeError


def test_open_backend_options_and_device_ids(art):
    refused("the ort backend takes no option 'precision'", open_backend, art(), "ort", precision="f32")
    refused("device_ids must be a list", open_backend, art(), "ort", device_ids="ab")   # was int()'s ValueError
    refused("runs a model on one device", open_backend, art(), "ort", device_ids=[0, 1])   # 1 was dropped
    refused("expect_role must be", open_backend, art(), "ort", expect_role="xyz")
    refused("warmup rounds must be", OrtBackend(art()).warmup, "2")


def test_a_closed_backend_refuses_every_call(art):
    b = OrtBackend(art())
    b.run([PROMPT], [list(range(8))])
    name = b.kv_names[0]
    b.close()
    for call in (lambda: b.run([[1, 2, 3]], [[8, 9, 10]]), b.reset, b.warmup, lambda: b.cache(name)):
        refused("the ort backend was closed", call)      # was AttributeError, or a reset that did nothing
    b.close()


def test_a_closed_qaic_backend_does_not_run_on_its_deactivated_program(art):
    d = art(target="qaic")
    write_fake_qpc(d)
    ev = []
    b = qaic_backend(d, ev)
    b.run([PROMPT], [list(range(8))])
    b.close()
    n = len(ev)
    refused("the qaic backend was closed", b.run, [PROMPT], [list(range(8, 16))])   # ran without a word
    assert len(ev) == n
    for ids, needle in (("0", "must be a list"), ([-1], ">= 0"), ([0, 0], "names a device twice"),
                        ([True], ">= 0"), ([], "at least one")):
        refused(needle, qaic_backend, d, [], device_ids=ids)
    refused("qpc must be the QPC directory", qaic_backend, d, [], qpc=5)


# ---------------------------------------------------------------------------- OpenVINO

needs_ov = pytest.mark.skipif(importlib.util.find_spec("openvino") is None, reason="OpenVINO is not installed")


@needs_ov
@pytest.mark.parametrize("n", [True, "2", 2.5, 10 ** 6])
def test_openvino_thread_counts(art, n):
    # True ran 1 thread, 2.5 ran 2, "2" was a TypeError, 10**6 was cut to the cores without a word
    refused("OpenVINO threads must be", OpenVinoBackend, art(target="openvino"), precision="f32", threads=n)


@needs_ov
def test_openvino_options_of_the_wrong_type_or_ignored(art, monkeypatch):
    path = art(target="openvino")
    refused("unknown OpenVINO precision", OpenVinoBackend, path, precision=["f32"])   # was unhashable TypeError
    for s, needle in ((True, "must be an integer"), ("3", "must be an integer"), (2.7, "must be an integer"),
                      (float("nan"), "must be an integer"), (CL + 1, f"{CL + 1} is more than ctx_len {CL}")):
        refused(f"stale-slot limit {needle}", OpenVinoBackend, path, precision="f32", stale_limit=s)
    # the copy path has no stale slots: the limit was dropped without a word
    refused("stale_limit is for the fused cache", OpenVinoBackend, path, precision="f32", cache="copy", stale_limit=0)
    model = load_openvino(path, precision="f32", threads=1)
    refused("precision given with a model load_openvino already compiled", OpenVinoBackend, model, precision="f32")
    refused("cache given with", OpenVinoBackend, model, cache="copy")
    assert OpenVinoBackend(model, stale_limit=0)._cursor.stale_limit == 0
    monkeypatch.setenv("SPECDEC_OV_THREADS", "abc")     # was int()'s ValueError
    refused("SPECDEC_OV_THREADS must be an integer", OpenVinoBackend, path, precision="f32")
    refused("runs on the CPU: it takes no device ids", open_backend, path, "openvino", device_ids=[1])


@needs_ov
def test_fused_cache_refuses_positions_that_skip_or_repeat(art):
    """The fused cache gives each token of a call a slot at its position: a gap inside a call, or a
    repeated position, gave logits unlike the fixed cache's (0.12 and 0.06 off ONNX Runtime's, no
    word said), so it is refused; consecutive calls, rollbacks and right padding still run."""
    path = art(target="openvino")
    fused, ref = OpenVinoBackend(path, precision="f32", threads=1), OrtBackend(path)
    assert fused.cache_kind == "fused"
    for b in (fused, ref):
        b.run([PROMPT], [list(range(8))])
    for pos in ([8, 20, 21], [8, 8, 9], [8, 10, 9]):      # a gap, a repeat, out of order
        refused("takes a call's positions one after another", fused.run, [[5, 6, 7]], [pos])
    for pos in ([8, 9, -1], [8, 9, 10], [9, 10, 11]):       # padding, a call, a rollback of one
        got, want = fused.run([[5, 6, 7]], [pos]), ref.run([[5, 6, 7]], [pos])
        v = np.array(pos) >= 0
        np.testing.assert_allclose(got[:, v], want[:, v], atol=1e-5)


@needs_ov
def test_a_closed_openvino_backend_refuses_every_call(art):
    b = OpenVinoBackend(art(target="openvino"), precision="f32", threads=1)
    b.close()
    for call in (lambda: b.run([PROMPT], [list(range(8))]), b.reset, b.states, lambda: b.cache("past_key.0")):
        refused("the openvino backend was closed", call)     # reset, states and cache were AttributeError


# ---------------------------------------------------------------------------- specdec-run


@needs_ov
def test_cli_backend_flags(art, capsys):
    tlm, ov_tlm = art(), art(target="openvino")
    base = ["--target-only", "--prompt-ids", "1,2,3", "--max-new-tokens", "2"]
    for argv, needle in (
            (["--tlm", ov_tlm, "--backend", "openvino", "--ort-threads", "2"], "--ort-threads is for --backend ort"),
            (["--tlm", ov_tlm, "--backend", "openvino", "--copy-cache"], "--copy-cache is for --backend ort"),
            (["--tlm", tlm, "--ort-threads", str(max_threads() + 1)], "--ort-threads must be in"),   # was a hang
            (["--tlm", ov_tlm, "--backend", "openvino", "--ov-threads", "100000"], "--ov-threads must be in"),
            (["--tlm", ov_tlm, "--backend", "openvino", "--tlm-device-ids", "1"], "takes no device ids"),
            (["--tlm", tlm, "--tlm-device-ids", "0,1"], "runs a model on one device")):
        code, _, err = run([*argv, *base], capsys)
        one_line_error(code, err, needle)


def test_expect_role_of_an_artifact_object(art):
    """An Artifact object of the other role passed every backend's expect_role (a directory was refused)."""
    from specdec_compile.artifact.reader import load_artifact
    tlm = load_artifact(art())
    refused("is a TLM artifact, expected a DLM", OrtBackend, tlm, expect_role="dlm")
    refused("is a TLM artifact, expected a DLM", open_backend, tlm, "ort", expect_role="dlm")
    refused("is a TLM artifact, expected a DLM", load_ort, tlm, expect_role="dlm")
    assert OrtBackend(tlm, expect_role="tlm").role == "tlm"
    loaded = load_ort(tlm)      # a model loaded already: the backend checks the role it was asked for
    refused("is a TLM artifact, expected a DLM", OrtBackend, loaded, expect_role="dlm")
