"""The TLM's ``hidden_states`` output against transformers itself, not against the tensors our
layers finder picks in the export (which is what verify and the coverage matrix compare with):
each listed layer's output, taken by a forward hook on the torch model's own decoder layer,
for families with a sequential and with a parallel residual, both exporters."""
from __future__ import annotations

import numpy as np
import pytest

from models import build_hf_model
from specdec_compile import cli

torch = pytest.importorskip("torch")
PL, CL = 16, 64


def _decoder_layers(model):
    """The torch model's decoder layers: its ModuleList as long as num_hidden_layers."""
    n = model.config.num_hidden_layers
    found = [m for m in model.modules() if isinstance(m, torch.nn.ModuleList) and len(m) == n]
    assert found, "no decoder layer list"
    return found[0]


@pytest.mark.parametrize("name", ["llama_gqa", "llama_dynamo", "gpt2", "gpt_neox", "phi3"])
def test_hidden_states_are_the_torch_layers_outputs(fixture_path, tmp_path, capsys, name):
    from specdec_compile.runtime import OrtBackend
    out = tmp_path / "tlm"
    assert cli.main([str(fixture_path(name)), "--role", "tlm", "--k", "3", "--hidden-states", "0,-1",
                     "--target", "ort", "--prefill-len", str(PL), "--ctx-len", str(CL), "-o", str(out)]) == 0
    model = build_hf_model(name)
    layers = _decoder_layers(model)
    n = len(layers)
    got = {}
    hooks = [layers[i].register_forward_hook(
        lambda m, a, o, i=i: got.__setitem__(i, (o[0] if isinstance(o, tuple) else o).detach()))
        for i in (0, n - 1)]
    ids = np.random.default_rng(0).integers(0, model.config.vocab_size, size=11)
    with torch.inference_mode():
        model(input_ids=torch.tensor(ids)[None])
    for h in hooks:
        h.remove()
    want = np.concatenate([got[0][0].numpy(), got[n - 1][0].numpy()], -1)       # [11, 2 * hidden]

    b = OrtBackend(out)
    call_ids = np.zeros((1, PL), np.int64)
    pos = np.full((1, PL), -1, np.int64)
    call_ids[0, :11], pos[0, :11] = ids, np.arange(11)
    hs = b.run_outputs(call_ids, pos)["hidden_states"][0, :11]
    b.close()
    assert hs.shape == want.shape
    scale = float(np.abs(want).max())
    assert np.max(np.abs(hs - want)) <= 1e-4 * max(1.0, scale), np.max(np.abs(hs - want))
