"""The tiny targets of the recorded EAGLE-3 heads (tests/eagle3_data, scripts/record_eagle3.py):
4-layer Llama and Qwen2 decoders of hidden size 64 over tests/models.py's vocabulary, exported
by optimum like the other fixtures (cached). EAGLE-3 reads three layers, so the targets need
more than the usual fixtures' two."""
from __future__ import annotations

import json
from pathlib import Path

from models import VOCAB, export_spec

DATA = Path(__file__).resolve().parent / "eagle3_data"

_COMMON = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=4,
               num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
               tie_word_embeddings=False, bos_token_id=1, eos_token_id=2)
TARGETS = {
    "eagle3_llama": dict(kind="llama", exporter="optimum", config=dict(rms_norm_eps=1e-5, **_COMMON)),
    "eagle3_qwen2": dict(kind="qwen2", exporter="optimum", config=dict(**_COMMON)),
}


def cases() -> dict:
    """The recorded heads: name -> {"target": fixture name, ...} (tests/eagle3_data/cases.json)."""
    return json.loads((DATA / "cases.json").read_text())


def target_export(name: str) -> Path:
    return export_spec(name, TARGETS[name])


def import_case(case: str, out: Path, *, target: str = "ort", k: int = 3, prefill_len: int = 8,
                ctx_len: int = 64, extra=()) -> Path:
    """``specdec-compile import-head`` of the recorded head ``case`` for its target's export."""
    from specdec_compile import cli
    tlm = target_export(cases()[case]["target"])
    argv = ["import-head", str(DATA / case), "--tlm", str(tlm), "--target", target, "--k", str(k),
            "--prefill-len", str(prefill_len), "--ctx-len", str(ctx_len), "-o", str(out), "--quiet", *extra]
    assert cli.main(argv) == 0
    return out


def compile_target(case: str, out: Path, *, target: str = "ort", k: int = 3, prefill_len: int = 8,
                   ctx_len: int = 64, batch_size: int = 1) -> Path:
    """The recorded head's target compiled as a TLM exposing the layers the head reads (aux id i: i-1)."""
    from specdec_compile import cli
    c = cases()[case]
    layers = ",".join(str(i - 1) for i in c["aux_ids"])
    assert cli.main([str(target_export(c["target"])), "--role", "tlm", "--k", str(k), "--hidden-states", layers,
                     "--target", target, "--prefill-len", str(prefill_len), "--ctx-len", str(ctx_len),
                     "--batch-size", str(batch_size), "-o", str(out), "--quiet"]) == 0
    return out


def copy_case(tmp_path: Path, case: str = "llama") -> Path:
    """A test checkpoint copied to ``tmp_path/ckpt`` for a test to damage (its reference outputs left out)."""
    import shutil
    d = tmp_path / "ckpt"
    shutil.copytree(DATA / case, d)
    (d / "reference.npz").unlink()
    return d


def edit_config(d: Path, **changes) -> dict:
    """``d/config.json`` with ``changes`` applied (``layer=``: to transformer_layer_config); returns it."""
    cfg = json.loads((d / "config.json").read_text())
    layer = changes.pop("layer", {})
    cfg.update(changes)
    cfg["transformer_layer_config"].update(layer)
    (d / "config.json").write_text(json.dumps(cfg))
    return cfg


def refused_import(tmp_path: Path, capsys, ckpt, *needles, out=None, tlm=None) -> None:
    """``import-head CKPT`` refused: exit 2, one line holding every needle, nothing written in ``tmp_path``."""
    from specdec_compile import cli
    out = out or tmp_path / "out"
    before = sorted(p.name for p in tmp_path.iterdir())
    capsys.readouterr()
    code = cli.main(["import-head", str(ckpt), "--tlm", str(tlm or target_export("eagle3_llama")), "--target",
                     "ort", "-o", str(out), "--quiet"])
    err = capsys.readouterr().err
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("specdec-compile: error: "), err
    for n in needles:
        assert n in lines[0], lines[0]
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == before
