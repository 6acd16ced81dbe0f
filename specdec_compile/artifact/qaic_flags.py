"""``--qaic-flag FLAG`` and ``--mxint8-kv-cache``: compiler options beyond the ones we set.

A ``--qaic-flag`` is passed to the Cloud AI 100 compiler as given, after the
flags of templates/qaic_flags.j2 (so ``compile.sh``, ``--compile`` and the
manifest's ``compile_options`` carry it). Flags the compiler knows but we do
not (``-aic-enable-depth-first``, ``-mos=1``, ``-allow-mxint8-mdp-io``, ...)
pass unchanged. Refused, in one line: a flag that sets what an option of ours
sets (it would contradict or duplicate it: the option is named), a flag that
would compile another program than the manifest describes (``-onnx-define-symbol``:
the shapes are the specializations'; the quantization flags: the precision is
``--precision``'s), and a flag with characters a shell would read (compile.sh
lists flags unquoted).

``--mxint8-kv-cache`` (QEfficient's option of the same name) gives the KV cache
the custom IO precision ``mxint8``: the device keeps it MXINT8-compressed.

``--mos N`` and ``--aic-enable-depth-first`` (QEfficient's ``--mos``,
``--aic-enable-depth-first``) add ``-mos=N`` and ``-aic-enable-depth-first``, the
flags QEfficient's ``_compile`` writes for them; the same flag given again by
``--qaic-flag`` is refused (given twice).
"""
from __future__ import annotations

import re

from ..errors import SpecdecError

#: flag name (without leading dashes) -> the option that sets it
OURS = {
    "m": "the model (model.onnx)", "aic-hw": "compile.sh itself", "aic-hw-version": "--hw-version",
    "network-specialization-config": "the specializations (specializations.json)",
    "retained-state": "the artifact (always set)", "convert-to-fp16": "the artifact (always set)",
    "custom-IO-list-file": "--kv-dtype / --logits-dtype / --mxint8-kv-cache (custom_io.yaml)",
    "compile-only": "the artifact (always set)", "aic-binary-dir": "compile.sh (./qpc)",
    "aic-num-cores": "--num-cores", "mxfp6-matmul": "--precision mx6",
    "mdp-load-partition-config": "--num-devices", "mdp-dump-partition-config": "--num-devices",
}
#: flags that would make the compiled program another than the manifest says: symbol values (the
#: shapes are the specializations') and quantization (every artifact compiles with -convert-to-fp16,
#: under which the compiler quantizes nothing; the precision is --precision's)
_SHAPES = "the specializations (specializations.json: batch_size, seq_len, ctx_len)"
_QUANT = "--precision (the artifact compiles with -convert-to-fp16: fp16, or mx6 matmuls; no quantization)"
OURS.update({"onnx-define-symbol": _SHAPES, "onnx-define-symbol-batch-size": _SHAPES})
OURS.update({name: _QUANT for name in (
    "quantization-precision", "quantization-precision-bias", "quantization-schema-activations",
    "quantization-schema-constants", "quantization-calibration", "percentile-calibration-value",
    "num-histogram-bins", "external-quantization")})
#: one flag, matched whole (``fullmatch``: a trailing newline is not "the end", as ``$`` would take it)
_SAFE = re.compile(r"-[A-Za-z0-9][A-Za-z0-9_.,:/=+@%-]*")


def flag_name(flag: str) -> str:
    return flag.lstrip("-").split("=", 1)[0]


#: QEfficient's compiler options we have as options: (flag name, option) (``option_flags``)
NAMED = (("mos", "--mos"), ("aic-enable-depth-first", "--aic-enable-depth-first"))


def option_flags(options) -> list[str]:
    """The compiler flags of ``--mos`` and ``--aic-enable-depth-first``, as QEfficient writes them."""
    flags = [f"-mos={options.mos}"] if options.mos is not None else []
    return flags + (["-aic-enable-depth-first"] if options.aic_enable_depth_first else [])


def check_flags(options) -> None:
    """One-line SpecdecError for a flag we cannot pass, or options that contradict the flags."""
    if options.target != "qaic":
        what = ("--qaic-flag" if options.qaic_flags else "--mxint8-kv-cache" if options.mxint8_kv_cache
                else f"--mos {options.mos}" if options.mos is not None else "--aic-enable-depth-first")
        raise SpecdecError(f"{what} is an option of the Cloud AI 100 compiler: it needs --target qaic")
    if options.mos is not None and (not isinstance(options.mos, int) or isinstance(options.mos, bool)
                                    or options.mos < 0):
        raise SpecdecError(f"--mos must be an integer >= 0 (the compiler's effort to reduce on-chip memory, "
                           f"passed as -mos=N), got {options.mos!r}")
    if options.mxint8_kv_cache and options.kv_dtype != "float16":
        raise SpecdecError(f"--mxint8-kv-cache sets the KV cache's custom IO precision (mxint8); "
                           f"drop --kv-dtype {options.kv_dtype}")
    named = {flag_name(f) for f in option_flags(options)}   # set by --mos / --aic-enable-depth-first
    seen: set[str] = set()
    for flag in options.qaic_flags:
        if not isinstance(flag, str) or not _SAFE.fullmatch(flag):
            raise SpecdecError(f"--qaic-flag {flag!r}: expected one compiler flag like -mos=1 (a dash, then "
                               f"letters, digits and _.,:/=+@%- only)")
        name = flag_name(flag)
        if name in OURS:
            raise SpecdecError(f"--qaic-flag {flag}: {flag.split('=', 1)[0]} is set by {OURS[name]}; "
                               f"use that instead")
        if name in named:
            raise SpecdecError(f"--qaic-flag {flag}: {name} is set by {dict(NAMED)[name]} too; give it once")
        if name in seen:
            raise SpecdecError(f"--qaic-flag {flag}: {name} given twice")
        seen.add(name)


def manifest_record(options) -> dict | None:
    """The manifest's ``compile_options`` object (None when no such option is used); ``mos`` and
    ``aic_enable_depth_first`` only when given."""
    if not (options.qaic_flags or options.mxint8_kv_cache or options.mos is not None
            or options.aic_enable_depth_first):
        return None
    record = {"mxint8_kv_cache": options.mxint8_kv_cache, "qaic_flags": list(options.qaic_flags)}
    if options.mos is not None:
        record["mos"] = options.mos
    if options.aic_enable_depth_first:
        record["aic_enable_depth_first"] = True
    return record
