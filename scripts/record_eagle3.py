"""Record tiny EAGLE-3 checkpoints made with ``speculators``' own API, and its forward on fixed inputs.

Run in a venv with ``speculators`` (0.9; it needs transformers >= 5, so not the
project's venv, which pins 4.57 for optimum)::

    python -m venv /work/scratch/speculators-venv     # torch 2.13 CPU, then
    pip install speculators==0.9.0 --no-deps ...      # and its imports (see docs/import-head.md)
    /work/scratch/speculators-venv/bin/python -m scripts.record_eagle3 tests/eagle3_data
    /work/scratch/speculators-venv/bin/python -m scripts.record_eagle3 --check tests/eagle3_data
    /work/scratch/speculators-venv/bin/python -m scripts.record_eagle3 --load-head workshop/heads/smollm2-eagle3 build/demo/hf/tlm

For each case (tests/eagle3_data/cases.json: the tiny target fixture each head
is for, the head's family, aux layer ids, draft vocabulary and norm flags) it
builds an ``Eagle3DraftModel`` with random weights (seeded), saves it with
``save_pretrained`` (config.json + model.safetensors: the checkpoint the tests
import), and records ``forward`` on fixed inputs with two training-time-test
steps: step 1 reads fc(target features) at every row; step 2 reads the head's
own step-1 output, one position later (a drafted row). Forward hooks on the
decoder layer and the LM head give each step's ``h`` (the layer's output) and
the draft logits. The recording (reference.npz) is what tests/test_eagle3_import.py
compares the compiled draft with, without speculators installed. ``--check``
loads the committed checkpoints with ``from_pretrained`` and reruns the forward.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

SEQ = 9


def _layer_config(case: dict):
    from transformers import LlamaConfig, Qwen3Config
    common = dict(vocab_size=case["vocab"], hidden_size=case["hidden"], intermediate_size=96, num_hidden_layers=1,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-5,
                  max_position_embeddings=512)
    if "rope" in case:                    # a scaled rope, as transformers 5 writes it
        common["rope_parameters"] = dict(case["rope"])
    cls = LlamaConfig if case["family"] == "llama" else Qwen3Config
    cfg = cls(**common)
    cfg._attn_implementation = "sdpa"     # bool masks: the training-time-test mask extension is exact
    return cfg


def _model(case: dict):
    import torch
    from speculators.config import SpeculatorsConfig, VerifierConfig
    from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig
    from speculators.proposals.greedy import GreedyTokenProposalConfig

    cfg = Eagle3SpeculatorConfig(
        transformer_layer_config=_layer_config(case), draft_vocab_size=case["draft_vocab"],
        eagle_aux_hidden_state_layer_ids=case["aux_ids"],
        speculators_config=SpeculatorsConfig(
            algorithm="eagle3", proposal_methods=[GreedyTokenProposalConfig(speculative_tokens=3)],
            default_proposal_method="greedy",
            verifier=VerifierConfig(name_or_path=case["verifier"], architectures=[case["architecture"]])),
        **case["flags"])
    torch.manual_seed(case["seed"])
    m = Eagle3DraftModel(cfg).float().eval()
    with torch.no_grad():
        for name, p in m.named_parameters():
            if name.startswith("verifier_"):
                continue
            if name.endswith("norm.weight") or ".norm." in name or "layernorm" in name:
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            else:
                p.copy_(0.05 * torch.randn_like(p))
    if case["draft_vocab"] < case["vocab"]:
        rng = np.random.default_rng(case["seed"])
        ids = np.sort(rng.choice(case["vocab"], case["draft_vocab"], replace=False))
        t2d = torch.zeros(case["vocab"], dtype=torch.bool)
        t2d[torch.from_numpy(ids)] = True
        d2t = torch.from_numpy(ids - np.arange(case["draft_vocab"])).long()
        m.load_vocab_mappings(t2d, d2t)
    return m


def _record(m, case: dict) -> dict:
    rng = np.random.default_rng(case["seed"] + 1)
    n, H = len(case["aux_ids"]), case["hidden"]
    ids = rng.integers(0, case["vocab"], SEQ)
    feats = rng.standard_normal((SEQ, n * H)).astype(np.float32)
    return _forward(m, ids, feats)


def _forward(m, ids, feats) -> dict:
    """Two training-time-test steps of ``m.forward``: each step's layer output h and draft logits."""
    import torch
    got = {"h": [], "logits": []}
    hooks = [m.layers[0].register_forward_hook(lambda mod, a, o: got["h"].append(o[0].detach().clone())),
             m.lm_head.register_forward_hook(lambda mod, a, o: got["logits"].append(o[0].detach().clone()))]
    with torch.no_grad():
        m(hidden_states=torch.from_numpy(feats)[None], input_ids=torch.from_numpy(ids)[None],
          document_ids=torch.zeros(1, SEQ, dtype=torch.long),
          position_ids=torch.arange(1, SEQ + 1)[None], ttt_steps=2)
    for h in hooks:
        h.remove()
    out = {"input_ids": ids, "positions": np.arange(1, SEQ + 1), "features": feats}
    for step in range(2):
        out[f"h_{step + 1}"] = got["h"][step].numpy()
        out[f"logits_{step + 1}"] = got["logits"][step].numpy()
    return out


def check(out_dir: str) -> int:
    """Load each committed checkpoint with speculators' own ``from_pretrained`` and rerun its forward on
    the recorded inputs: 0 when every output equals the recording (to 1e-6)."""
    from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig
    out, bad = Path(out_dir), 0
    # the verifier named is a test fixture (tests/eagle3_models.py), not a model on the hub: nothing to
    # fetch from it, every weight the head needs is in the checkpoint
    import speculators.models.eagle3.core as core
    Eagle3DraftModel.load_verifier_weights = lambda self: None
    core.resolve_target_layer_ids = lambda ids, path, **kw: ids     # (it reads the verifier's config)
    for name in json.loads((out / "cases.json").read_text()):
        cfg = Eagle3SpeculatorConfig.from_pretrained(str(out / name))
        cfg.transformer_layer_config._attn_implementation = "sdpa"
        m = Eagle3DraftModel.from_pretrained(str(out / name), config=cfg).float().eval()
        ref = np.load(out / name / "reference.npz")
        got = _forward(m, ref["input_ids"], ref["features"])
        err = max(float(np.abs(got[k] - ref[k]).max()) for k in ("h_1", "logits_1", "h_2", "logits_2"))
        print(name, "loaded by speculators; max |diff| to the recording", err)
        bad += err > 1e-6
    return 1 if bad else 0


def main(out_dir: str) -> None:
    import speculators
    out = Path(out_dir)
    cases = json.loads((out / "cases.json").read_text())
    for name, case in cases.items():
        m = _model(case)
        m.save_pretrained(str(out / name))
        (out / name / "config.py").unlink(missing_ok=True)   # speculators' own source, not ours to ship
        rec = _record(m, case)
        np.savez_compressed(out / name / "reference.npz", **rec)
        print(name, {k: v.shape for k, v in rec.items()}, "speculators", speculators.__version__
              if hasattr(speculators, "__version__") else "")


def load_head(head_dir: str, verifier: str) -> int:
    """Load a trained head (the demo's, workshop/heads/smollm2-eagle3) with speculators'
    ``from_pretrained``, its verifier pointed at a local folder (offline; the checkpoint names the
    hub's), and run one forward step on random features: 0 when it loads and computes."""
    import shutil
    import tempfile

    import torch
    from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig
    tmp = Path(tempfile.mkdtemp())
    shutil.copytree(head_dir, tmp / "head")
    cfg = json.loads((tmp / "head" / "config.json").read_text())
    cfg["speculators_config"]["verifier"]["name_or_path"] = str(Path(verifier).resolve())
    (tmp / "head" / "config.json").write_text(json.dumps(cfg))
    conf = Eagle3SpeculatorConfig.from_pretrained(str(tmp / "head"))
    conf.transformer_layer_config._attn_implementation = "sdpa"       # flex attention wants 128-row blocks
    m = Eagle3DraftModel.from_pretrained(str(tmp / "head"), config=conf).float().eval()
    shutil.rmtree(tmp)
    H, n = cfg["transformer_layer_config"]["hidden_size"], len(m.config.eagle_aux_hidden_state_layer_ids)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, cfg["transformer_layer_config"]["vocab_size"], (1, SEQ), generator=g)
    with torch.no_grad():
        toks = m(hidden_states=torch.randn(1, SEQ, n * H, generator=g), input_ids=ids,
                 document_ids=torch.zeros(1, SEQ, dtype=torch.long), ttt_steps=2)
    ok = len(toks) == 2 and bool(torch.isfinite(m.fc.weight).all()) and int(m.t2d.sum()) == cfg["draft_vocab_size"]
    print(head_dir, "loaded by speculators:", type(m).__name__, "aux", m.config.eagle_aux_hidden_state_layer_ids,
          "draft vocabulary", cfg["draft_vocab_size"], "drafts", [t.shape[-1] for t in toks], "ok" if ok else "BAD")
    return 0 if ok else 1


if __name__ == "__main__":
    args = sys.argv[1:]
    if args[:1] == ["--load-head"]:
        sys.exit(load_head(args[1], args[2]))
    if args[:1] == ["--check"]:
        sys.exit(check(args[1] if len(args) > 1 else "tests/eagle3_data"))
    main(args[0] if args else "tests/eagle3_data")
