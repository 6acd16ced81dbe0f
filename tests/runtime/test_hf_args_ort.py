"""The HF-style generate API on real tiny models in ONNX Runtime: text, tokenizer
outputs (NumPy and torch) and HF keywords give transformers' own greedy tokens."""
from __future__ import annotations

import numpy as np
import pytest
from runtime_helpers import hf_greedy_of, make_tokenizer

from models import build_hf_model
from specdec_compile import cli as compile_cli
from specdec_compile.runtime import OrtBackend, SpecDecoder, TargetOnlyDecoder
from specdec_compile.runtime.tokenizer import load_tokenizer

TEXTS = ["w5 w9 w33 w7 w100 w42 w17 w3 w8 w55", "w150 w20", "w4 w5 w6 w7 w8 w9 w10 w11"]


@pytest.fixture(scope="module")
def pair(fixture_path, tmp_path_factory):
    root = tmp_path_factory.mktemp("hf_ort")
    dirs = []
    for name, role, extra in (("llama_gqa", "tlm", ["--k", "3"]), ("gpt2", "dlm", [])):
        out = root / role
        assert compile_cli.main([str(fixture_path(name)), "--role", role, "--target", "ort", "--ctx-len", "64",
                                 "--prefill-len", "8", "-o", str(out), *extra]) == 0
        dirs.append(out)
    tok = load_tokenizer(make_tokenizer(root / "tok", n=211))
    tlm, dlm = OrtBackend(dirs[0]), OrtBackend(dirs[1])
    return SpecDecoder(tlm, dlm, tokenizer=tok), TargetOnlyDecoder(tlm, tokenizer=tok), tok


def test_hf_forms_give_transformers_tokens(pair):
    torch = pytest.importorskip("torch")
    spec, base, tok = pair
    hf = hf_greedy_of(build_hf_model("llama_gqa"))
    want = [hf(tok(t)["input_ids"], 12) for t in TEXTS]
    for dec in (spec, base):
        assert [r.generated_ids for r in dec.generate(TEXTS, max_new_tokens=12, do_sample=False)] == want
        one = dec.generate(**tok(TEXTS[0], return_tensors="pt"), max_length=len(tok(TEXTS[0])["input_ids"]) + 12)
        assert one.generated_ids == want[0]
        assert "".join(dec.stream(torch.tensor([tok(TEXTS[1])["input_ids"]]), max_new_tokens=12)).strip() == \
            tok.decode(want[1], skip_special_tokens=True)
    tok.pad_token, tok.padding_side = "<unk>", "left"
    enc = tok(TEXTS, return_tensors="np", padding=True)
    assert enc["input_ids"].shape[0] == 3 and np.any(enc["attention_mask"] == 0)
    assert [r.generated_ids for r in spec.generate_many(**enc, max_new_tokens=12)] == want
