"""Smoke test of the demo's training script on its micro configuration (seconds, no export)."""
from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

from workshop import cache, train_pair  # noqa: E402


@pytest.mark.slow
def test_train_pair_micro_builds_and_reuses(tmp_path):
    cfg = train_pair.deep_update(train_pair.CONFIG, train_pair.MICRO)
    out = tmp_path / "demo"
    res = train_pair.run(cfg, out, do_export=False, threads=2, quiet=True)
    assert not res["reused"]
    for d in ("tokenizer", "hf/tlm", "hf/dlm"):
        assert (out / d / cache.STAMP).exists(), d
    # a transformers-loadable tokenizer with an EOS, and two Llama models
    from transformers import AutoConfig, AutoTokenizer
    tok = AutoTokenizer.from_pretrained(str(out / "tokenizer"))
    assert tok.eos_token == "<|endoftext|>"
    assert tok.decode(tok("def f(x):\n    return x")["input_ids"]) == "def f(x):\n    return x"
    t, d = AutoConfig.from_pretrained(str(out / "hf/tlm")), AutoConfig.from_pretrained(str(out / "hf/dlm"))
    assert t.model_type == d.model_type == "llama"
    assert d.num_hidden_layers == 1 and t.num_hidden_layers == cfg["tlm"]["layers"]
    assert t.vocab_size == d.vocab_size == len(tok)
    m = res["metrics"]
    for key in ("tlm_loss", "dlm_loss", "agreement_held_out_text", "agreement_tlm_continuations"):
        assert key in m
    assert json.loads((out / "pair.json").read_text())["key"] == res["key"]

    # same configuration: everything reused; a changed DLM config retrains the DLM only
    again = train_pair.run(cfg, out, do_export=False, threads=2, quiet=True)
    assert again["reused"] and again["key"] == res["key"]
    stamp_tlm = (out / "hf/tlm" / cache.STAMP).read_text()
    cfg2 = train_pair.apply_sets(cfg, ["dlm.steps=4"])
    res2 = train_pair.run(cfg2, out, do_export=False, threads=2, quiet=True)
    assert res2["key"] != res["key"] and res2["train"]["dlm"]["tokens"] > 0
    assert (out / "hf/tlm" / cache.STAMP).read_text() == stamp_tlm


def test_config_keys_are_stable():
    a = cache.h("tlm", {"x": 1, "y": [1, 2]})
    b = cache.h("tlm", {"y": [1, 2], "x": 1})
    assert a == b and len(a) == 16
    with pytest.raises(SystemExit):
        train_pair.apply_sets(train_pair.CONFIG, ["tlm.nonexistent=1"])
