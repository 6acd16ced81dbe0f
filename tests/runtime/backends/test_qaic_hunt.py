"""The Cloud AI 100 backend against QPCs that disagree with their artifact and a runtime that
raises, with the FAKE qaicrt / QAicApi_pb2 of test_qaic.py (no device here: what a real device
does with such a QPC is not claimed; the fake refuses a call of shapes its QPC lacks, as the
runtime does, and raises where a test makes it raise).

A QPC whose IO descriptor is not the artifact's recorded interface is refused at load, in one
line naming the binding, before anything runs: an input the runtime never writes, a cache of
another ctx_len, features of another width, a TLM's logits of one column, an --interface qeff
TLM whose decode keeps fewer logits columns than its width (which decoded token 0 without a
word). An exception from a qaicrt call is one line (SpecdecError; exit 2), never a traceback."""
from __future__ import annotations

import json
import shutil
import sys

import numpy as np
import pytest
from test_qaic import (CL, IDS, INP, INT64_I_TYPE, PL, backend, fake_aicapi, fake_qaicrt, write_fake_qpc)
from test_qaic_qeff import write_fake_qeff_qpc

from specdec_compile import cli as compile_cli
from specdec_compile.cli import run as run_cli
from specdec_compile.errors import SpecdecError
from specdec_compile.runtime import QaicBackend, SpecDecoder
from specdec_compile.runtime.backends.qaic import load_qaic

FBS = 2


@pytest.fixture(scope="module")
def arts(fixture_path, tmp_path_factory):
    from feature_draft_models import export_feature_draft
    root = tmp_path_factory.mktemp("qaic_hunt")
    llama = fixture_path("llama_gqa")
    out = {}
    for name, src, extra in (("tlm", llama, ["--role", "tlm", "--k", "3"]),
                             ("dlm", llama, ["--role", "dlm"]),
                             ("tlmq", llama, ["--role", "tlm", "--k", "3", "--interface", "qeff", "--batch-size", str(FBS)]),
                             ("dlmq", llama, ["--role", "dlm", "--interface", "qeff", "--batch-size", str(FBS)]),
                             ("fd", export_feature_draft(1), ["--role", "dlm", "--k", "3", "--feature-layers", "-1"])):
        d = out[name] = root / name
        assert compile_cli.main([str(src), "--target", "qaic", "--prefill-len", str(PL), "--ctx-len", str(CL),
                                 "-o", str(d), *extra]) == 0
        (write_fake_qeff_qpc if name.endswith("q") else write_fake_qpc)(d)
    return out


def edited(art, tmp_path, edit):
    """A copy of the artifact ``art`` whose FAKE QPC's JSON ``edit`` changes in place."""
    d = tmp_path / art.name
    shutil.copytree(art, d)
    f = d / "qpc" / "programqpc.bin"
    q = json.loads(f.read_text())
    edit(q)
    f.write_text(json.dumps(q))
    return d


def set_dims(name, fn):
    """An edit giving binding ``name`` the dims ``fn(dims)`` in every shape set."""
    def edit(q):
        i = [b["name"] for b in q["bindings"]].index(name)
        q["bindings"][i]["dims"] = fn(q["bindings"][i]["dims"])
        for a in q["allowed_shapes"]:
            a[i] = fn(a[i])
    return edit


def drop(name):
    def edit(q):
        i = [b["name"] for b in q["bindings"]].index(name)
        del q["bindings"][i]
        for a in q["allowed_shapes"]:
            del a[i]
    return edit


def add_input(q):       # an input the artifact does not have: the runtime would never write it
    q["bindings"].append({"name": "attention_mask", "dir": INP, "type": INT64_I_TYPE, "dims": [1, PL]})
    for a in q["allowed_shapes"]:
        a.append([1, a[0][1]])


def keep_one_column(q):     # a qeff TLM QPC whose decode specializations keep one logits column
    names = [b["name"] for b in q["bindings"]]
    for a in q["allowed_shapes"]:
        a[names.index("num_logits_to_keep")] = [1, 1]
        a[names.index("logits")][1] = 1


def test_a_qeff_target_qpc_keeping_fewer_columns_than_its_width_is_refused(arts, tmp_path):
    """Before: the verification's other columns came back NaN and the loop accepted token 0
    (generated [189, 0, 0, ...], exit 0); now the load names num_logits_to_keep."""
    d = edited(arts["tlmq"], tmp_path, keep_one_column)
    ev = []
    with pytest.raises(SpecdecError, match=r"num_logits_to_keep is \[1, 1\], the artifact's interface says \[4, 1\]"):
        SpecDecoder(backend(d, ev), backend(arts["dlmq"], ev)).generate(IDS, max_new_tokens=8)
    assert not [e for e in ev if e[0] == "setData"]


@pytest.mark.parametrize("name,edit,needle", [
    ("tlm", add_input, r"has \['attention_mask'\], not in the artifact's interface"),
    ("tlm", drop("past_value.1"), r"lacks \['past_value.1'\]"),
    ("tlm", drop("past_key.0_RetainedState"), r"lacks \['past_key.0_RetainedState'\]"),
    ("tlm", set_dims("past_key.0", lambda d: d[:2] + [2 * CL] + d[3:]), r"past_key.0 is \[1, 2, 128, 16\]"),
    ("tlm", set_dims("logits", lambda d: [d[0], 1, d[2]]), r"logits is \[1, 1, 211\], the artifact's interface says"),
    ("fd", set_dims("hidden_states", lambda d: d[:2] + [128]), r"hidden_states is \[1, \d+, 128\]"),
    ("fd", set_dims("draft_hidden_states", lambda d: d[:2] + [128]), r"draft_hidden_states is \[1, \d+, 128\]"),
])
def test_a_qpc_whose_io_is_not_the_artifacts_is_refused_at_load(arts, tmp_path, name, edit, needle):
    ev = []
    with pytest.raises(SpecdecError, match=needle):
        backend(edited(arts[name], tmp_path, edit), ev)
    assert not [e for e in ev if e[0] in ("program", "setData")]


def test_a_qpc_listing_no_allowed_shapes_is_checked_against_its_one_shape(arts, tmp_path):
    """A QPC of one specialization lists no allowed shapes (QEfficient's session allows for it):
    the selected set is then its only shape, so the artifact's other widths are refused at load
    (before: loaded, and the first call at another width failed on the device)."""
    def no_allowed(q):
        q["allowed_shapes"] = []
    with pytest.raises(SpecdecError, match=r"compiled for input_ids shapes \[\(1, 3\)\], not the artifact's"):
        backend(edited(arts["tlm"], tmp_path, no_allowed), [])


def raising(what):
    """A FAKE qaicrt whose ``what`` raises, as the SDK's bindings may besides returning a status."""
    rt = fake_qaicrt([])

    def boom(*a, **k):
        raise RuntimeError(f"FAKE {what} error: device 0 not ready")
    if what == "Context":
        rt.Context = boom
    elif what == "load":
        rt.Program.load = boom
    elif what == "wait":
        rt.ExecObj.waitForCompletion = boom
    elif what == "getData":
        rt.ExecObj.getData = boom
    return rt


@pytest.mark.parametrize("what,needle", [("Context", "qaicrt Context failed"), ("load", "qaicrt program load failed"),
                                         ("wait", r"qaicrt run \(waitForCompletion\) failed"),
                                         ("getData", "qaicrt getData failed")])
def test_an_exception_from_qaicrt_is_one_line(arts, what, needle):
    with pytest.raises(SpecdecError, match=f"{needle} .RuntimeError: FAKE {what} error: device 0 not ready"):
        b = QaicBackend(arts["tlm"], qaicrt_module=raising(what), aicapi_module=fake_aicapi())
        b.run(np.array([IDS[:PL]]), np.arange(PL)[None])


def test_an_unreadable_qpc_is_one_line_in_the_api_and_exit_2_in_the_cli(arts, tmp_path, monkeypatch, capsys):
    d = tmp_path / "t"
    shutil.copytree(arts["tlm"], d)
    (d / "qpc" / "programqpc.bin").write_bytes(b"\x00not a program")
    with pytest.raises(SpecdecError, match=r"qaicrt Qpc \(reading the program\) failed"):
        backend(d, [])
    monkeypatch.setitem(sys.modules, "qaicrt", fake_qaicrt([]))
    monkeypatch.setitem(sys.modules, "QAicApi_pb2", fake_aicapi())
    capsys.readouterr()
    assert run_cli.main(["--tlm", str(d), "--dlm", str(arts["dlm"]), "--prompt-ids", "1,5,9",
                         "--max-new-tokens", "4", "--backend", "qaic"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Qpc (reading the program) failed" in err[0]


def test_an_output_buffer_not_of_the_calls_size_is_refused(arts):
    """The logits are read from a buffer of exactly the call's [B, S, V]: a buffer holding more
    (another call's rows) is refused in one line, never reshaped (before: a ValueError)."""
    rt = fake_qaicrt([])
    get = rt.ExecObj.getData

    def longer(self):
        status, outs = get(self)
        i = [b["name"] for b in self.p.bindings].index("logits")
        outs[i] = rt.QBuffer(bytes(outs[i]) + bytes(4 * 211))
        return status, outs
    rt.ExecObj.getData = longer
    b = QaicBackend(arts["tlm"], qaicrt_module=rt, aicapi_module=fake_aicapi())
    with pytest.raises(SpecdecError, match=r"the device gave logits of \d+ bytes, not the \[1, 8, 211\] FLOAT_TYPE"):
        b.run(np.array([IDS[:PL]]), np.arange(PL)[None])


def test_expect_role_is_checked_with_a_program_already_loaded(arts):
    p = load_qaic(arts["tlm"], qaicrt_module=fake_qaicrt([]), aicapi_module=fake_aicapi())
    with pytest.raises(SpecdecError, match="is a TLM artifact, expected a DLM"):
        QaicBackend(p, expect_role="dlm")
    assert QaicBackend(p, expect_role="tlm").role == "tlm"


def test_a_reset_still_zeros_the_device_cache_when_the_next_call_failed(arts):
    """reset() uploads zero caches with the next call; when that call fails on the device the
    zeros go with the call after it (before: skipped, the last sequence's cache kept)."""
    ev = []
    rt = fake_qaicrt(ev)
    wait, fails = rt.ExecObj.waitForCompletion, [1]

    def flaky(self):
        if fails and fails.pop():
            return rt.QStatus.QS_ERROR
        return wait(self)
    b = QaicBackend(arts["tlm"], qaicrt_module=rt, aicapi_module=fake_aicapi())
    b.reset()
    rt.ExecObj.waitForCompletion = flaky
    ids, pos = np.array([IDS[:PL]]), np.arange(PL)[None]
    with pytest.raises(SpecdecError, match="waitForCompletion"):
        b.run(ids, pos)
    b.run(ids, pos)
    kv = [e[1]["past_key.0"] for e in ev if e[0] == "setData"]
    assert kv == [[1, 2, CL, 16], [1, 2, CL, 16]]
