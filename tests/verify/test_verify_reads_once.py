"""verify reads the rewrite once: its cache-write check and what it compares (hidden states,
a feature input) look at the same loaded model (it was read twice)."""
from __future__ import annotations

from pathlib import Path

from specdec_compile import cli
from specdec_compile.verify import hidden, replay, verify


def test_the_rewrite_is_loaded_once(fixture_path, tmp_path, monkeypatch, capsys):
    src = fixture_path("llama_gqa")
    out = tmp_path / "tlm"
    assert cli.main([str(src), "--role", "tlm", "--k", "3", "--target", "ort", "--prefill-len", "8",
                     "--ctx-len", "64", "-o", str(out), "-q"]) == 0
    capsys.readouterr()
    rewritten = out / "model.onnx"
    reads = []

    def counting(module):
        real = module.load_model

        def load_model(path, *a, **kw):
            reads.append(Path(path).resolve())
            return real(path, *a, **kw)
        monkeypatch.setattr(module, "load_model", load_model)

    counting(replay)
    counting(hidden)
    report = verify(src, rewritten, k=3, prefill_len=8, ctx_len=64)
    assert report.ok
    assert reads.count(rewritten.resolve()) == 1, reads
