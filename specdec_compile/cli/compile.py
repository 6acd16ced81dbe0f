"""``specdec-compile MODEL --role tlm|dlm ... -o OUT``: the compile subtool.

Order of work: parse, check every option that does not need the model (fast
failures), check OUT, read the model, rewrite, write the artifact atomically,
print a summary (or JSON), then optionally run the Cloud AI 100 compiler.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

from .. import __version__
from ..artifact.writer import (COMPILE_SCRIPT, DTYPES, HW_VERSIONS, PRECISIONS, ROLES, TARGETS, WrittenArtifact as Artifact,
                        Options, check_out, find_compiler, hw_version_for)
from ..options import MAX_BATCH_SIZE, MAX_CORES, MAX_CTX_LEN, MAX_DEVICES
from ..contract import INTERFACES
from ..errors import SpecdecError
from .common import Parser, add_progress_flags, start_progress
from .qeff_words import add_qeff_compile_flags, resolve_qeff_compile_flags

EPILOG = """\
example: a draft (DLM) and target (TLM) pair for speculative decoding, k = 7

  specdec-compile draft.onnx  --role dlm --prefill-len 32 --ctx-len 256 -o out/dlm
  specdec-compile target.onnx --role tlm --k 7 --prefill-len 32 --ctx-len 256 -o out/tlm

  out/dlm gets specializations seq_len 32/2/1, out/tlm gets 32/7/8 (add --k-list 3,5
  for extra verification widths 4 and 6). Each directory holds model.onnx,
  specializations.json, custom_io.yaml, compile.sh and manifest.json. Compile on a
  machine with the Cloud AI 100 SDK with out/tlm/compile.sh, or here with --compile.

  specdec-compile target.onnx --role tlm --k 7 --precision mx6 --num-devices 4 -o out/tlm4
      MXFP6 matmuls, partitioned over 4 devices (adds mdp_partition.json)
  specdec-compile target.onnx --role tlm --k 7 --target ort -o out/tlm-ort
      for the ONNX Runtime backend (opset 24 TensorScatter; no compile.sh, no custom_io.yaml)
  specdec-compile target.onnx --role tlm --k 3 --k-list 0 --interface qeff -o out/tlm-qeff
      QEfficient's SpD interface (num_logits_to_keep), for its runtime (docs/serving.md)
  specdec-compile target.onnx --role tlm --k 3 --k-list 0 --full-batch-size 4 -o out/tlm-cb
      its continuous-batching one (batch_index; full_batch_size 4), as vLLM's qaic backend uses
  specdec-compile target.onnx --role tlm --k 7 --mxfp6-matmul --mxint8-kv-cache --mos 1 --aic-enable-depth-first -o out/t
      QEfficient's compile options under its names (docs/qefficient.md)
  specdec-compile target.onnx --role tlm --k 7 --qaic-flag -allow-mxint8-mdp-io -o out/t
      a compiler flag passed through to compile.sh

other subtools: specdec-compile verify ORIGINAL REWRITTEN, specdec-compile diff A B,
specdec-compile import-head CKPT --tlm TLM -o OUT (a speculators EAGLE-3 head as a feature draft),
specdec-compile pair --tlm T --dlm D -o OUT (export, compile and verify a pair in one command)
"""


def _positive_list(text: str) -> tuple[int, ...]:
    from ..layer_lists import parse_ints
    return parse_ints(text, "--k-list", "3,5,7")


def build_parser(prog: str) -> argparse.ArgumentParser:
    p = Parser(prog=prog, help_hint=f" (see {prog} --help)",
               formatter_class=argparse.RawDescriptionHelpFormatter, epilog=EPILOG,
               description="Rewrite a stock ONNX export of a decoder LM into a retained-state graph for "
                           "speculative decoding on Qualcomm Cloud AI 100, and write the artifact "
                           "directory (model, specializations, custom IO, compile script, manifest).")
    p.add_argument("model", metavar="MODEL", help="ONNX export with a KV cache (optimum or torch dynamo), or "
                                                  "an optimum export folder (its model.onnx)")
    p.add_argument("--role", required=True, choices=ROLES, help="dlm: draft model; tlm: target model")
    p.add_argument("--k", type=int, default=None,
                   help="TLM only, required: drafted tokens per round; adds seq_len k and k+1")
    p.add_argument("--k-list", default=None, metavar="K1,K2,...",
                   help="TLM only: extra verification widths j, one seq_len j+1 each")
    p.add_argument("--hidden-states", default=None, metavar="LAYERS",
                   help="TLM only: also output the residual stream after these decoder layers (0-based, "
                        "negative from the end; -1: the last, before the final norm), e.g. -1 or 2,5,-1")
    p.add_argument("--feature-layers", default=None, metavar="LAYERS",
                   help="DLM only: the model is a feature draft reading these layers of its target "
                        "(as the target's --hidden-states); needs --k")
    p.add_argument("--feature-target", default=None, metavar="TARGET",
                   help="with --feature-layers: the target the draft was trained for, its export (.onnx) or "
                        "its compiled TLM directory; recorded (file name, sha256) so that specdec-run refuses "
                        "another target")
    p.add_argument("--prefill-len", type=int, default=32, help="prompt chunk length (default 32)")
    p.add_argument("--ctx-len", type=int, default=256,
                   help=f"context length / KV slots (default 256, at most {MAX_CTX_LEN})")
    p.add_argument("--batch-size", type=int, default=None,
                   help=f"default 1, at most {MAX_BATCH_SIZE} (with --interface qeff: QEfficient's batch_size, "
                        f"every call at this many rows)")
    p.add_argument("--target", choices=TARGETS, default="qaic",
                   help="qaic: Cloud AI 100 (CtxScatter, opset 17); ort: ONNX Runtime (TensorScatter, opset 24); "
                        "openvino: OpenVINO (ScatterElements, opset 17; run with specdec-run --backend openvino)")
    p.add_argument("--kv-dtype", choices=DTYPES, default=None,
                   help="qaic: KV cache precision in custom_io.yaml (default float16)")
    p.add_argument("--logits-dtype", choices=DTYPES, default=None,
                   help="qaic: also list logits in custom_io.yaml at this precision")
    p.add_argument("--precision", choices=PRECISIONS, default=None,
                   help="qaic: fp16 (default) or mx6, which adds -mxfp6-matmul (MXFP6 weights for matmuls)")
    p.add_argument("--num-cores", type=int, default=None, help=f"qaic: AI 100 cores per device (default {MAX_CORES})")
    p.add_argument("--num-devices", type=int, default=None,
                   help=f"qaic: devices to partition the model over (>1 writes mdp_partition.json; at most "
                        f"{MAX_DEVICES}; default 1)")
    p.add_argument("--hw-version", choices=HW_VERSIONS, default=None,
                   help="qaic: -aic-hw-version; default: ai100 with qaic-compile, 2.0 with qaic-exec")
    p.add_argument("--interface", choices=INTERFACES, default=None,
                   help="qeff: QEfficient's SpD interface (TLM: the input num_logits_to_keep), for QEfficient's "
                        "runtime and vLLM's qaic backend; with --full-batch-size N its continuous-batching one "
                        "(the input batch_index, a cache of N rows). Default: default")
    add_qeff_compile_flags(p)
    p.add_argument("--mxint8-kv-cache", action="store_true",
                   help="qaic: the KV cache's custom IO precision is mxint8 (MXINT8-compressed on the device)")
    p.add_argument("--qaic-flag", action="append", default=[], metavar="FLAG",
                   help="qaic, repeatable: one more compiler flag, passed as given (e.g. -allow-mxint8-mdp-io); a "
                        "flag one of our options sets is refused")
    p.add_argument("-o", "--output", required=True, metavar="OUT", help="artifact directory to write")
    p.add_argument("--force", action="store_true", help="replace an existing artifact directory OUT")
    p.add_argument("--link-weights", action="store_true",
                   help="hard-link the export's weight files into OUT instead of copying them (no copy of a "
                        "large model; onnx.load and onnx.checker >= 1.23 refuse hard-linked data, ONNX Runtime "
                        "and this tool read it)")
    p.add_argument("--compile", action="store_true",
                   help="then run the Cloud AI 100 compiler (OUT/compile.sh) and return its exit code")
    p.add_argument("--supported-ops", default=None, metavar="FILE",
                   help="qaic: the operator list of `qaic-exec -operators-supported=onnx`; refuse (exit 2, "
                        "nothing written) when the emitted graph uses an op it lacks")
    p.add_argument("--verify", action="store_true",
                   help="check the rewrite against the export (specdec-compile verify at the artifact's shapes) "
                        "before OUT is written: a difference exits 1 and writes nothing")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.add_argument("--explain", action="store_true", help="print what each pass changed in the graph")
    p.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    add_progress_flags(p)
    return p


def _qaic_only(a: argparse.Namespace) -> dict:
    """The qaic-only options as given, their defaults where not; given with --target ort: refused."""
    given = {"kv_dtype": a.kv_dtype, "logits_dtype": a.logits_dtype, "precision": a.precision,
             "num_cores": a.num_cores, "num_devices": a.num_devices, "hw_version": a.hw_version}
    if a.target != "qaic":
        for key, value in given.items():
            if value is not None:
                raise SpecdecError(f"--{key.replace('_', '-')} {value} is an option of the Cloud AI 100 compiler: "
                                   f"it needs --target qaic (the {a.target} graph would not be what the manifest "
                                   f"and summary say)")
    defaults = {"kv_dtype": "float16", "precision": "fp16", "num_cores": MAX_CORES, "num_devices": 1}
    return {key: defaults.get(key) if value is None else value for key, value in given.items()}


def options_from_args(a: argparse.Namespace) -> Options:
    resolve_qeff_compile_flags(a)
    return Options(role=a.role, k=a.k, k_list=_positive_list(a.k_list) if a.k_list is not None else (),
                   prefill_len=a.prefill_len, ctx_len=a.ctx_len, batch_size=a.batch_size, target=a.target,
                   **_qaic_only(a),
                   hidden_states=_layers(a.hidden_states, "--hidden-states"),
                   feature_layers=_layers(a.feature_layers, "--feature-layers"),
                   feature_target=_feature_target(a.feature_target) if a.feature_target is not None else None,
                   interface=a.interface, continuous_batching=a.continuous_batching,
                   mxint8_kv_cache=a.mxint8_kv_cache, qaic_flags=tuple(a.qaic_flag), mos=a.mos,
                   aic_enable_depth_first=a.aic_enable_depth_first,
                   link_weights=a.link_weights)


def _feature_target(path: str) -> tuple[str, str]:
    """(file name, sha256) of a feature draft's target: its export, or the source a compiled TLM
    directory's manifest records (the same pair a TLM's manifest ``source`` holds)."""
    from ..model_io import sha256_file
    from ..contract import MANIFEST_FILE
    from ..artifact.manifest import Manifest
    p = Path(path)
    if p.is_dir():
        if not (p / MANIFEST_FILE).is_file():
            raise SpecdecError(f"--feature-target {p}: a directory without {MANIFEST_FILE} (give the target's "
                               f"export or its compiled TLM directory)")
        m = Manifest.read(p)
        if m.role != "tlm" or not m.source_file or not m.source_sha256:
            raise SpecdecError(f"--feature-target {p}: not a TLM artifact that records its source export")
        return m.source_file, m.source_sha256
    if not p.is_file():
        raise SpecdecError(f"--feature-target {p}: no such file or directory")
    return p.name, sha256_file(p)


def _layers(text: str | None, option: str) -> tuple[int, ...]:
    from ..layer_lists import parse_layers
    return parse_layers(text, option) if text is not None else ()


def _layer_values(argv: list[str]) -> list[str]:
    """``--hidden-states -1,0`` as ``--hidden-states=-1,0`` and ``--qaic-flag -mos=1`` as
    ``--qaic-flag=-mos=1`` (argparse takes a value starting with '-' that is not a plain
    number for an option). A layer list starts with a digit or -digit: ``--hidden-states -o OUT``
    leaves -o to be -o (argparse then says --hidden-states lacks its value)."""
    out, i = [], 0
    while i < len(argv):
        x, nxt = argv[i], argv[i + 1] if i + 1 < len(argv) else None
        if nxt is not None and (x == "--qaic-flag" or (x in ("--hidden-states", "--feature-layers")
                                                       and re.match(r"\s*-?[0-9]", nxt))):
            out.append(f"{x}={nxt}")
            i += 2
        else:
            out.append(x)
            i += 1
    return out


def main(argv: list[str], prog: str = "specdec-compile") -> int:
    a = build_parser(prog).parse_args(_layer_values(argv))
    start_progress(prog, a)
    opts = options_from_args(a)   # checked where it is built
    if a.compile and opts.target != "qaic":
        raise SpecdecError("--compile runs the Cloud AI 100 compiler: it needs --target qaic")
    supported = None
    if a.supported_ops is not None:
        if opts.target != "qaic":
            raise SpecdecError("--supported-ops checks against the Cloud AI 100 compiler's list: it needs --target qaic")
        from ..artifact.qaic_ops import read_supported_ops

        supported = read_supported_ops(a.supported_ops)
    from ..pair.inputs import compile_input
    model_path = compile_input(a.model)   # an .onnx file, or an optimum export folder's model.onnx
    check_out(Path(a.output), a.force, model_path)

    from .. import pipeline
    from ..artifact.writer import write_artifact
    from ..model_io import load_model

    original = load_model(model_path)   # parsed once: the rewrite starts from it, the summary compares with it
    res = pipeline.rewrite(original, opts, record=a.explain, source=model_path)
    if supported is not None:
        check_supported(res.model, supported, a.supported_ops, prog)
    checked = {} if a.verify else None   # --verify: the report's numbers
    art = write_artifact(res, opts, a.output, force=a.force, original=original,
                         check=_verifier(model_path, checked) if checked is not None else None)

    compiler = find_compiler()
    shown_compiler = compiler.name if compiler else "qaic-compile"
    hw = hw_version_for(compiler, opts.hw_version)
    command = ([shown_compiler, "-aic-hw", f"-aic-hw-version={hw}", *art.compile_flags]
               if art.compile_flags else None)

    explanation = None
    if a.explain:
        from ..explain import explain_result

        explanation = explain_result(res)
    if a.json:
        print(json.dumps(_summary_dict(art, opts, command, explanation, checked), indent=2, sort_keys=True))
    else:
        _print_summary(art, opts, command, compile_now=a.compile, explanation=explanation,
                       checked=checked)

    if not a.compile:
        return 0
    script = Path(a.output) / COMPILE_SCRIPT
    if compiler is None:
        raise SpecdecError(f"--compile: no Cloud AI 100 compiler here (neither qaic-compile nor qaic-exec on "
                           f"PATH or in /opt/qti-aic/exec/); the artifact is written: copy {a.output} to a "
                           f"machine with the Cloud AI 100 SDK and run {script}")
    return run_compile(Path(a.output), compiler, to_stderr=a.json)


def _verifier(model_path: Path, checked: dict):
    """``write_artifact``'s check for ``--verify``: the finished directory against the export at its
    own shapes (``specdec-compile verify``); a difference is exit 1 with nothing written. The
    report's numbers go into ``checked``."""
    def check(directory: Path) -> None:
        from ..verify.artifact_check import VerifyFailed, verify_artifact
        try:
            checked.update(verify_artifact(Path(model_path), Path(directory), "model", "nothing written (--verify)"))
        except VerifyFailed:
            raise
        except SpecdecError as e:   # a scenario verify cannot run: said as --verify's, nothing written
            raise SpecdecError(f"--verify: {e}; nothing written") from None
    return check


def check_supported(model, supported: set[str], list_file: str, prog: str) -> None:
    """One line per op of ``model`` that ``supported`` lacks (naming its node), then refuse."""
    from ..artifact.qaic_ops import not_supported

    missing = not_supported(model, supported)
    if not missing:
        return
    for use in missing:
        print(f"{prog}: error: op {use.describe()} is not in {list_file}", file=sys.stderr)
    raise SpecdecError(f"the emitted graph uses {len(missing)} op(s) that --supported-ops {list_file} lacks "
                       f"({', '.join(sorted({u.op for u in missing}))}); nothing written")


def run_compile(out: Path, compiler: Path, to_stderr: bool = False) -> int:
    """Run OUT/compile.sh with ``compiler``, streaming its output; return its exit code."""
    env = dict(os.environ, QAIC_COMPILER=str(compiler))
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        proc = subprocess.run(["bash", str(Path(os.path.abspath(out)) / COMPILE_SCRIPT)], env=env,
                              stdout=sys.stderr.fileno() if to_stderr else None)
    except OSError as e:
        raise SpecdecError(f"--compile: cannot run {out / COMPILE_SCRIPT}: {e.strerror or e}") from None
    return proc.returncode


# --------------------------------------------------------------------------- reporting

def _summary_dict(art: Artifact, opts: Options, command, explanation=None, checked=None) -> dict:
    m = art.manifest
    d = {
        "out": str(art.out),
        "role": m["role"],
        "k": m["k"],
        "k_list": m["k_list"],
        "target": m["target"],
        "batch_size": m["batch_size"],
        "ctx_len": m["ctx_len"],
        "prefill_len": m["prefill_len"],
        "specializations": m["specializations"],
        "model": {k: m[k] for k in ("family", "exporter", "num_layers", "num_heads", "num_kv_heads",
                                    "head_dim", "vocab_size", "dtype")},
        "passes": m["passes"],
        "interface": m["interface"],
        "io_changes": art.io_changes,
        "files": art.files,
        "compile_command": command,
        "verify": checked,   # --verify: the report's numbers; None: not run
    }
    if explanation is not None:
        d["explain"] = explanation
    return d


def _summary_lines(art: Artifact, command, compile_now: bool) -> list[tuple[str, list[tuple[str, str]]]]:
    """(label, [(text, style), ...]) rows of the human summary."""
    m = art.manifest
    rows: list[tuple[str, list[tuple[str, str]]]] = []
    fam = m.get("family") or "decoder"
    rows.append(("model", [(f"{fam}, {m['num_layers']} layers, {m['num_heads']} heads ({m['num_kv_heads']} kv), "
                            f"head_dim {m['head_dim']}, vocab {m['vocab_size']}, {m['dtype']}", "")]))
    # qaic: the custom IO's cache precision; ort/openvino: the graph's own cache dtype
    kv = "mxint8" if (m.get("compile_options") or {}).get("mxint8_kv_cache") else m["kv_dtype"]
    batch = (f"full_batch_size {m['batch_size']} (--interface qeff, continuous batching)"
             if (m.get("qeff") or {}).get("full_batch_size") else
             f"batch {m['batch_size']}" + (" (--interface qeff)" if m.get("qeff") else ""))
    shapes = (f"{batch}, ctx_len {m['ctx_len']}, seq_len "
              f"{'/'.join(str(s) for s in m['specializations'])}; KV {kv}")
    if m["logits_dtype"]:
        shapes += f", logits {m['logits_dtype']}"
    if m["target"] == "qaic":
        shapes += f"; {m['precision']}, {m['num_cores']} cores"
        if m["num_devices"] > 1:
            shapes += f" x {m['num_devices']} devices"
    rows.append(("shapes", [(shapes, "")]))
    if m["passes"]:
        rows.append(("passes", [(", ".join(m["passes"]), "")]))
    marks = {"removed": ("-", "red"), "added": ("+", "green"), "changed": ("~", "yellow")}
    for n, c in enumerate(art.io_changes):
        mark, style = marks[c["change"]]
        parts = [(f"{mark} {c['kind']:<6} {c['name']}", style)]
        if c["layers"]:
            parts.append((f" (i={c['layers']})", "dim"))
        if c["change"] != "removed":
            parts.append((f"  {c['after']}", "dim"))
        rows.append(("I/O" if n == 0 else "", parts))
    rows.append(("files", [(", ".join(art.files), "")]))
    if command:
        script = Path(art.out) / COMPILE_SCRIPT
        if compile_now:
            rows.append(("compile", [(f"running {script}", "")]))
        else:
            rows.append(("compile", [(f"{script}  (on a machine with the Cloud AI 100 SDK, or add --compile)", "")]))
            rows.append(("", [(f"cd {shlex.quote(str(art.out))} && " + " ".join(command), "dim")]))
    return rows


def _print_summary(art: Artifact, opts: Options, command, compile_now: bool, explanation=None,
                   checked=None) -> None:
    from rich.console import Console
    from rich.text import Text

    con = Console(file=sys.stdout, highlight=False, markup=False, emoji=False, soft_wrap=True)
    m = art.manifest
    role = m["role"].upper() + (f" k={m['k']}" if m["k"] is not None else "")
    if m["k_list"] and len(m["k_list"]) > 1:
        role += f" (widths {','.join(str(j) for j in m['k_list'])})"
    where = {"qaic": "Cloud AI 100 (qaic)", "openvino": "OpenVINO (openvino)"}.get(m["target"], "ONNX Runtime (ort)")
    head = Text()
    head.append(role, style="bold")
    head.append(f" for {where} -> {art.out}")
    con.print(head)
    rows = _summary_lines(art, command, compile_now)
    if checked:
        rows.insert(-2 if command and not compile_now else (-1 if command else len(rows)),
                    ("verify", [(f"PASS, the rewrite against its export on this host: max |Δ logits| "
                                 f"{checked['max_logits_diff']:.3e}, max |Δ cache| {checked['max_cache_diff']:.3e} "
                                 f"(tolerance {checked['tol']:g})", "")]))
    for label, parts in rows:
        t = Text(f"  {label:<8} ", style="cyan")
        for text, style in parts:
            t.append(text, style=style)
        con.print(t)
    if explanation is not None:
        from ..diff import print_report

        sys.stdout.flush()
        print_report(explanation, file=sys.stdout)
