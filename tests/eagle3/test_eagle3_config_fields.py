"""Config fields of a speculators EAGLE-3 checkpoint that change what the library computes but that
``import-head`` ignored (exit 0, a draft that silently differs from speculators 0.9's forward): each is
refused now in one line (exit 2, nothing written). Every refused case below was run through
speculators 0.9 (transformers 5.19) on the recorded inputs: the library's output moved away from the
recording (or it raised) while our importer read the config as the unmutated one. Fields the library
does not read are accepted and read as the recorded head."""
from __future__ import annotations

import json
from dataclasses import asdict

import numpy as np
import pytest

from eagle3_models import copy_case, edit_config, refused_import, target_export
from specdec_compile.eagle3.checkpoint import read_checkpoint
from specdec_compile.eagle3.safetensors import read_safetensors, write_safetensors

DROP = "<drop>"     # a layer config key left out
LLAMA3 = {"factor": 8.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0, "original_max_position_embeddings": 8,
          "rope_theta": 500000.0, "rope_type": "llama3"}

# name -> (case, layer config changes, needles); the library's max |diff| to the recording in the comment
REFUSED = {
    # speculators builds a sliding-window mask for a "sliding_attention" layer, llama included (0.73)
    "llama sliding layer": ("llama", {"layer_types": ["sliding_attention"], "sliding_window": 3},
                            ["layer_types ['sliding_attention']", "only full attention"]),
    # transformers 5 refuses a layer_types list of another length than the layers
    "two layer types": ("llama", {"layer_types": ["full_attention", "sliding_attention"], "sliding_window": 3},
                        ["is not a list of the head's 1 layer"]),
    # transformers reads rope_scaling over rope_parameters (0.138 and 0.102); we read rope_parameters
    "rope_scaling beside rope_parameters": ("llama", {"rope_scaling": {"rope_type": "linear", "factor": 4.0}},
                                            ["both rope_parameters", "rope_scaling", "disagree"]),
    "rope_scaling theta beside rope_parameters": ("llama", {"rope_scaling": {"rope_type": "default",
                                                                             "rope_theta": 100.0}},
                                                  ["disagree"]),
    # a partial rotary inside the rope's parameters was dropped, and a top-level 0 read as 1: we rotated
    # the whole head, the library (llama3 rope) rotates a part of it and raises
    "partial rotary in rope_parameters": ("llama_rope_llama3",
                                          {"rope_parameters": {**LLAMA3, "partial_rotary_factor": 0.5}},
                                          ["partial_rotary_factor 0.5 is not supported"]),
    "partial rotary 0": ("llama_rope_llama3", {"partial_rotary_factor": 0},
                         ["partial_rotary_factor 0 is not supported"]),
    # transformers 5 takes the top-level original_max_position_embeddings over the rope's (0.084)
    "llama3 top-level original positions": ("llama_rope_llama3", {"original_max_position_embeddings": 64},
                                            ["original_max_position_embeddings 64 disagrees with the rope's 8"]),
    # rope per layer type: speculators takes the sliding_attention one (0.102); we read theta 10000
    "rope per layer type": ("llama", {"rope_parameters": {
        "sliding_attention": {"rope_type": "default", "rope_theta": 100.0},
        "full_attention": {"rope_type": "default", "rope_theta": 10000.0}}},
        ["rope parameters per layer type (full_attention, sliding_attention)"]),
    # absent, transformers builds 32 layers (31 of them untrained: 0.375); we built 1
    "num_hidden_layers absent": ("llama", {"num_hidden_layers": DROP}, ["has no num_hidden_layers"]),
}


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_a_field_the_library_reads_differently_is_refused(tmp_path, capsys, name):
    case, layer, needles = REFUSED[name]
    d = copy_case(tmp_path, case)
    cfg = edit_config(d, layer={k: v for k, v in layer.items() if v != DROP})
    for k in [k for k, v in layer.items() if v == DROP]:
        del cfg["transformer_layer_config"][k]
    (d / "config.json").write_text(json.dumps(cfg))
    refused_import(tmp_path, capsys, d, *needles)


def test_d2t_with_equal_vocabularies_is_refused(tmp_path, capsys):
    """draft_vocab_size equal to the target's: speculators drops d2t/t2d (draft index i is target id i);
    we spread the logits through d2t, a permutation of the target's ids (exit 0, other tokens)."""
    d = copy_case(tmp_path, "qwen")
    t = {k: np.array(v) for k, v in read_safetensors(d / "model.safetensors").items()}
    v = 211
    t["d2t"] = (np.arange(v)[::-1] - np.arange(v)).astype(np.int64)
    t["t2d"] = np.ones(v, bool)
    write_safetensors(d / "model.safetensors", t)
    refused_import(tmp_path, capsys, d, "d2t maps draft index 0 to target id 210", tlm=target_export("eagle3_qwen2"))


def _fields(d):
    return {k: v for k, v in asdict(read_checkpoint(d)).items() if k not in ("path", "tensors")}


@pytest.mark.parametrize("case,layer", [
    ("qwen", {"mlp_bias": True}),                    # Qwen3's MLP has no bias: speculators ignores it
    ("llama", {"sliding_window": 3}),                # without a sliding layer type: not read
    ("llama", {"layer_types": ["full_attention"]}),
    ("llama", {"rope_scaling": {"rope_type": "default"}}),                # agrees with rope_parameters
    ("llama", {"rope_scaling": {}}),                                      # empty: transformers ignores it
    ("llama_rope_llama3", {"original_max_position_embeddings": 8}),      # the rope's own value
    ("llama", {"partial_rotary_factor": 1.0}),
])
def test_a_field_the_library_does_not_change_is_read_as_the_recorded_head(tmp_path, case, layer):
    """Accepted and read exactly as the unmutated checkpoint (whose draft equals the recording:
    test_eagle3_import.py); qwen3 with mlp_bias true was refused as 'mlp bias tensors missing'."""
    d = copy_case(tmp_path, case)
    want = _fields(d)
    edit_config(d, layer=layer)
    assert _fields(d) == want
