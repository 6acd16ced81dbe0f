"""``pairing.check_compile_pair``: the compile-time check a pair's options get before anything is
compiled (``specdec-compile pair`` calls it). Every combination of interfaces is supported when the
shapes match; whatever it refuses, the runtime's ``check_pair`` refuses too, and whatever it
accepts, ``check_pair`` accepts (a pair is never refused at run time)."""
from __future__ import annotations

import itertools

import pytest

from specdec_compile.errors import SpecdecError
from specdec_compile.options import Options
from specdec_compile.runtime.pairing import check_compile_pair, check_pair
from specdec_compile.runtime.testing import fake_artifact

INTERFACES = {"default": {}, "qeff": {"interface": "qeff"},
              "cb": {"interface": "qeff", "continuous_batching": True}}


def _opts(role, iface, **kw):
    base = {"prefill_len": 8, "ctx_len": 64, "target": "ort", **INTERFACES[iface], **kw}
    return Options(role=role, k=3, **base) if role == "tlm" else Options(role="dlm", **base)


def _runtime_agrees(t: Options, d: Options) -> bool:
    """What check_pair says of two artifacts of these shapes."""
    arts = [fake_artifact(o.role, batch_size=o.batch_size, ctx_len=o.ctx_len, prefill_len=o.prefill_len, k=3)
            for o in (t, d)]
    try:
        check_pair(*arts)
        return True
    except SpecdecError:
        return False


@pytest.mark.parametrize("ti,di", list(itertools.product(INTERFACES, INTERFACES)))
def test_every_interface_pair_with_equal_rows_is_supported(ti, di):
    t, d = _opts("tlm", ti, batch_size=4), _opts("dlm", di, batch_size=4)
    check_compile_pair(t, d)
    assert _runtime_agrees(t, d)


@pytest.mark.parametrize("ti", list(INTERFACES))
def test_a_default_dlm_of_other_rows_is_refused_at_compile_time(ti):
    """A batch-4 TLM (any interface) and a batch-1 default DLM: refused here, naming the option."""
    t, d = _opts("tlm", ti, batch_size=4), _opts("dlm", "default")
    with pytest.raises(SpecdecError, match="compile the draft with --batch-size 4") as e:
        check_compile_pair(t, d)
    assert "\n" not in str(e.value)
    assert not _runtime_agrees(t, d)


@pytest.mark.parametrize("tlm_kw,dlm_kw,message", [
    ({"ctx_len": 128}, {}, "--ctx-len 128 and the draft --ctx-len 64"),
    ({"prefill_len": 16}, {}, "--prefill-len 16 and the draft --prefill-len 8"),
])
def test_other_shapes_are_refused_as_the_runtime_does(tlm_kw, dlm_kw, message):
    t, d = _opts("tlm", "default", **tlm_kw), _opts("dlm", "default", **dlm_kw)
    with pytest.raises(SpecdecError, match=message):
        check_compile_pair(t, d)
    assert not _runtime_agrees(t, d)


def test_targets_roles_and_feature_drafts():
    with pytest.raises(SpecdecError, match="one backend runs both"):
        check_compile_pair(_opts("tlm", "default"), Options(role="dlm", prefill_len=8, ctx_len=64, target="qaic"))
    with pytest.raises(SpecdecError, match="a pair is a TLM and a DLM"):
        check_compile_pair(_opts("dlm", "default"), _opts("dlm", "default"))
    feature = Options(role="dlm", k=3, feature_layers=(-1,), prefill_len=8, ctx_len=64, target="ort")
    with pytest.raises(SpecdecError, match="compile the TLM with --hidden-states -1"):
        check_compile_pair(_opts("tlm", "default"), feature)
    check_compile_pair(_opts("tlm", "default", hidden_states=(-1,)), feature)
