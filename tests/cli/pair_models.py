"""Hugging Face folders of tiny random models for ``specdec-compile pair`` (tests/cli/test_pair*.py).

The target is the 4-layer Llama the recorded EAGLE-3 heads were made for (tests/eagle3_models.py),
so one target serves all three drafts; the draft is the 2-layer Llama of tests/models.py. Both
share tests/runtime's word-level tokenizer. Saved with ``save_pretrained`` (config.json,
model.safetensors) under SPECDEC_FIXTURE_CACHE, once, atomically."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

from eagle3_models import TARGETS
from models import CACHE, CONFIGS, _key, build_hf_model
from runtime_helpers import make_tokenizer

TLM_SPEC = TARGETS["eagle3_llama"]
DLM_SPEC = CONFIGS["llama_gqa"]
#: a draft whose vocabulary is another size (and no tokenizer files): another tokenizer
OTHER_VOCAB_SPEC = {**DLM_SPEC, "config": {**DLM_SPEC["config"], "vocab_size": 199}}


def hf_folder(name: str, spec: dict, tokenizer: str | None = "plain", seed: int = 0) -> Path:
    """The folder of ``spec``'s random model (seed ``seed``) with tokenizer ``plain``, ``swap``
    (two ids exchanged: another tokenizer of the same size) or None (no tokenizer files)."""
    final = CACHE / f"hf-{name}-{_key(spec)}-{tokenizer or 'notok'}-s{seed}"
    if (final / "config.json").is_file():
        return final
    work = CACHE / f".tmp-hf-{name}-{os.getpid()}"
    shutil.rmtree(work, ignore_errors=True)
    build_hf_model(spec, seed=seed).save_pretrained(work)
    if tokenizer is not None:
        make_tokenizer(work, n=spec["config"]["vocab_size"], swap=tokenizer == "swap")
    try:
        work.rename(final)
    except OSError:   # another process made it first
        shutil.rmtree(work, ignore_errors=True)
    return final


def tlm_folder() -> Path:
    return hf_folder("pair-tlm", TLM_SPEC)


def dlm_folder(tokenizer: str | None = "plain") -> Path:
    return hf_folder("pair-dlm", DLM_SPEC, tokenizer, seed=1)


def pair(argv, capsys):
    """``specdec-compile pair ARGV``: (exit code, stdout, stderr)."""
    from specdec_compile import cli
    capsys.readouterr()
    code = cli.main(["pair", *(str(a) for a in argv)])
    out, err = capsys.readouterr()
    return code, out, err


def run(argv, capsys):
    """``specdec-run ARGV``: (exit code, stdout, stderr)."""
    from specdec_compile.cli import run as run_cli
    capsys.readouterr()
    code = run_cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err
