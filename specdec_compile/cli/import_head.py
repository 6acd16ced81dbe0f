"""``specdec-compile import-head CKPT --tlm TLM -o OUT``: a speculators EAGLE-3 checkpoint as a feature draft."""
from __future__ import annotations

import argparse
import json

from ..artifact.writer import TARGETS
from ..eagle3.quantize import WEIGHTS
from ..errors import SpecdecError
from .common import Parser, add_progress_flags, start_progress

EPILOG = """\
example: a speculators EAGLE-3 head for the target exported as target.onnx, k = 4

  specdec-compile import-head heads/eagle3 --tlm target.onnx --k 4 --target ort -o out/eagle3
  specdec-compile target.onnx --role tlm --k 4 --hidden-states 1,15,28 --target ort -o out/tlm
  specdec-run --tlm out/tlm --dlm out/eagle3 --prompt "..."

  CKPT holds config.json (speculators_model_type "eagle3") and model.safetensors. Aux layer
  id i is the hidden state entering the target's decoder layer i, the output of layer i-1:
  the target is compiled with --hidden-states i-1 for each (the command prints them). TLM is
  the target's export or its compiled TLM directory; a compiled TLM must already expose
  exactly those layers. Anything that does not fit is refused in one line (exit 2), nothing
  written. docs/import-head.md.
"""


def build_parser(prog: str) -> argparse.ArgumentParser:
    p = Parser(prog=prog, help_hint=f" (see {prog} --help)", formatter_class=argparse.RawDescriptionHelpFormatter,
               epilog=EPILOG,
               description="Turn a speculators EAGLE-3 checkpoint into a compiled feature-draft (DLM) artifact "
                           "for a given target: the head is exported by torch.onnx and compiled by our passes.")
    p.add_argument("checkpoint", metavar="CKPT", help="speculators EAGLE-3 checkpoint directory "
                                                      "(config.json, model.safetensors)")
    p.add_argument("--tlm", required=True, metavar="TLM",
                   help="the target: its ONNX export, or its compiled TLM directory (then compiled with "
                        "--hidden-states of exactly the head's layers)")
    p.add_argument("-o", "--output", required=True, metavar="OUT", help="artifact directory to write")
    p.add_argument("--target", choices=TARGETS, default=None,
                   help="lowering target (default: a compiled TLM's, else qaic)")
    p.add_argument("--k", type=int, default=None, help="drafted tokens per round: the draft's catch-up widths "
                                                       "(default: a compiled TLM's --k, else 4)")
    p.add_argument("--prefill-len", type=int, default=None,
                   help="prompt chunk length (default: a compiled TLM's, else 32; another is refused)")
    p.add_argument("--ctx-len", type=int, default=None,
                   help="context length / KV slots (default: a compiled TLM's, else 256; another is refused)")
    p.add_argument("--batch-size", type=int, default=None,
                   help="rows per call (default: a compiled TLM's, else 1; another is refused)")
    p.add_argument("--weights", choices=WEIGHTS, default="float",
                   help="the head's MatMul weights: float (the checkpoint's, in float32; default) or int8/int4 "
                        "(weight-only MatMulNBits: cheaper drafts on a CPU, the same output, since every draft "
                        "is verified; ort and openvino targets)")
    p.add_argument("--force", action="store_true", help="replace an existing artifact directory OUT")
    p.add_argument("--json", action="store_true", help="print the manifest's eagle3 record as JSON")
    add_progress_flags(p)
    return p


def main(argv: list[str], prog: str = "specdec-compile import-head") -> int:
    a = build_parser(prog).parse_args(argv)
    start_progress(prog, a)
    if a.k is not None and a.k < 1:
        raise SpecdecError(f"--k must be at least 1, got {a.k}")
    from ..eagle3.importer import hidden_states_hint, import_head
    m = import_head(a.checkpoint, a.tlm, a.output, target=a.target, k=a.k, prefill_len=a.prefill_len,
                    ctx_len=a.ctx_len, force=a.force, batch_size=a.batch_size, weights=a.weights)
    fd = m["feature_draft"]
    rec = fd["eagle3"]
    if a.json:
        print(json.dumps({"out": a.output, "target": m["target"], "eagle3": rec,
                          "hidden_states": hidden_states_hint(m)}, indent=2, sort_keys=True))
        return 0
    ck = rec["checkpoint"]
    print(f"EAGLE-3 head ({rec['family']}, hidden {rec['hidden_size']}, draft vocabulary {rec['draft_vocab_size']} "
          f"of {rec['target_vocab_size']}) -> {a.output} ({m['target']})")
    print(f"  checkpoint  {ck['path']} (sha256 {ck['sha256'][:12]}, verifier {ck['verifier'].get('name_or_path')})")
    print(f"  target      {rec['paired_target']['file']} (sha256 {rec['paired_target']['sha256'][:12]})")
    print(f"  layers      aux ids {rec['aux_hidden_state_layer_ids']} = outputs of target layers "
          f"{hidden_states_hint(m)}: compile the target with --hidden-states {hidden_states_hint(m)}")
    print(f"  shapes      seq_len {'/'.join(str(s) for s in m['specializations'])}, ctx_len {m['ctx_len']}")
    w = rec.get("weights")
    print("  weights     float32 (the checkpoint's)" if not w else
          f"  weights     {w['format']} ({w['op']}, blocks of {w['block_size']}, {w['matmuls']} MatMuls)")
    return 0
