"""QEfficient's run-side spellings as real options of ``specdec-run`` (docs/qefficient.md).

- ``--generation-len N``: the same as ``--max-new-tokens N``;
- ``--prompt "a|b"``: two prompts, split at ``|`` as QEfficient's ``--prompt`` does; ``\\|``
  is a literal ``|``; ``--prompt`` may still be repeated;
- ``--prompts-txt-file-path FILE``: one prompt a line (blank lines skipped);
- ``--device-group [0,1]``: the same as ``--tlm-device-ids 0,1`` (brackets optional);
- ``--full-batch-size N``: at run time, a check that the TLM was compiled for N rows (our
  batch-N artifacts decode with continuous batching, as QEfficient's full_batch_size does).
"""
from __future__ import annotations

import re

from ..errors import SpecdecError

DEFAULT_MAX_NEW_TOKENS = 128
#: an unescaped | separates prompts; \| is a literal |
_PIPE = re.compile(r"(?<!\\)\|")
#: a device id: ASCII digits only (int() would also take "+1" and other scripts' digits)
_DIGITS = re.compile(r"[0-9]+")


def add_qeff_run_flags(p, prompt_group) -> None:
    """QEfficient's options: ``--prompts-txt-file-path`` joins the prompt sources' group."""
    prompt_group.add_argument("--prompts-txt-file-path", metavar="FILE",
                              help="QEfficient's prompt file: one prompt a line (blank lines skipped)")
    p.add_argument("--generation-len", type=int, default=None, metavar="N",
                   help="QEfficient's name for --max-new-tokens")
    p.add_argument("--device-group", metavar="IDS",
                   help="QEfficient's name for --tlm-device-ids: [0] or [0,1] (brackets optional)")
    p.add_argument("--full-batch-size", type=int, default=None, metavar="N",
                   help="QEfficient's continuous-batching size; at run time a check that the TLM was "
                        "compiled with --batch-size N (every batch-N artifact decodes its rows with "
                        "continuous batching)")


def resolve_qeff_run_flags(args) -> None:
    """Fold QEfficient's spellings into ours (--generation-len, --device-group); a clash is an error."""
    if args.generation_len is not None and args.max_new_tokens is not None:
        raise SpecdecError("give --max-new-tokens or --generation-len (QEfficient's name for it), not both")
    for flag, v in (("--max-new-tokens", args.max_new_tokens), ("--generation-len", args.generation_len)):
        if v is not None and v < 0:     # named as the user spelled it
            raise SpecdecError(f"{flag} must be >= 0 (got {v})")
    if args.max_new_tokens is None:
        args.max_new_tokens = args.generation_len if args.generation_len is not None else DEFAULT_MAX_NEW_TOKENS
    if args.device_group is not None:
        if args.tlm_device_ids is not None:
            raise SpecdecError("give --tlm-device-ids or --device-group (QEfficient's name for it), not both")
        # checked under its own name ([] or [a] named --tlm-device-ids, a flag the user did not give)
        args.tlm_device_ids = ",".join(str(i) for i in device_group(args.device_group))
    if args.full_batch_size is not None and args.full_batch_size < 1:
        raise SpecdecError(f"--full-batch-size must be >= 1 (got {args.full_batch_size})")


def device_group_text(value: str) -> str:
    """``[0,1]`` (QEfficient's --device-group) as ``0,1`` (brackets optional; unbalanced: refused)."""
    text = value.strip()
    if text.startswith("[") != text.endswith("]"):
        raise SpecdecError(f"--device-group: unbalanced brackets in {value!r} (expected [0] or [0,1])")
    return text[1:-1] if text.startswith("[") else text


def device_group(value: str) -> tuple[int, ...]:
    """--device-group as device ids: distinct integers >= 0, at least one, separated by commas or spaces
    (as specdec-run's device ids; "[0 1]" is two devices, not the digits joined)."""
    parts = re.split(r"\s*,\s*|\s+", device_group_text(value).strip())
    if not all(_DIGITS.fullmatch(x) for x in parts):
        raise SpecdecError(f"--device-group: expected device ids like [0] or [0,1], got {value!r}")
    ids = tuple(int(x) for x in parts)
    if len(set(ids)) != len(ids):
        raise SpecdecError(f"--device-group: expected distinct device ids >= 0 like [0,1], got {value!r}")
    return ids


def check_full_batch_size(args, tlm_batch_size: int) -> None:
    """--full-batch-size N names the rows the TLM was compiled with; it cannot change them."""
    n = args.full_batch_size
    if n is not None and n != tlm_batch_size:
        raise SpecdecError(f"--full-batch-size {n}: the TLM {args.tlm} was compiled with batch size "
                           f"{tlm_batch_size}; the batch is fixed at compile time (specdec-compile "
                           f"--batch-size {n})")


def split_prompts(values: list[str]) -> list[str]:
    """Each --prompt value split at unescaped ``|`` (``\\|`` is a literal ``|``), in order."""
    out = []
    for text in values:
        parts = _PIPE.split(text)
        if len(parts) > 1 and not all(p.strip() for p in parts):
            raise SpecdecError(f"--prompt: an empty prompt in {text!r} (prompts are separated by |; "
                               f"write a literal | as \\|)")
        out.extend(p.replace("\\|", "|") for p in parts)
    return out


def read_text(path: str) -> str:
    """A prompt file's text; one line on a missing or non-UTF-8 file. A UTF-8 byte-order mark (as
    Windows editors write) is not text: it would become part of the first prompt's first token."""
    try:
        with open(path, encoding="utf-8-sig") as f:
            return f.read()
    except OSError as e:
        raise SpecdecError(f"{path}: cannot read: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise SpecdecError(f"{path}: not UTF-8 text") from None


def read_prompt_lines(path: str) -> list[str]:
    """--prompts-txt-file-path: one prompt a line, stripped; blank lines skipped."""
    texts = [line.strip() for line in read_text(path).splitlines()]
    texts = [t for t in texts if t]
    if not texts:
        raise SpecdecError(f"{path}: no prompts in it (one prompt a line)")
    return texts


# --------------------------------------------------------------------------- compile side

def add_qeff_compile_flags(p) -> None:
    """QEfficient's compile options as options of ``specdec-compile`` (docs/qefficient.md)."""
    p.add_argument("--mxfp6-matmul", action="store_true",
                   help="qaic: QEfficient's name for --precision mx6 (adds -mxfp6-matmul)")
    p.add_argument("--mos", type=int, default=None, metavar="N",
                   help="qaic: the compiler's -mos=N (effort to reduce on-chip memory), as QEfficient's --mos "
                        "(not passed unless given; QEfficient's infer passes 1)")
    p.add_argument("--aic-enable-depth-first", action="store_true",
                   help="qaic: the compiler's -aic-enable-depth-first (depth-first scheduling), as QEfficient's")
    p.add_argument("--full-batch-size", type=int, default=None, metavar="N",
                   help="QEfficient's continuous batching: --interface qeff with a cache of N rows and the "
                        "input batch_index (prefill at batch 1 into one row, decode of all N rows)")


def resolve_qeff_compile_flags(a) -> None:
    """Fold QEfficient's compile spellings into ours; a contradiction is an error (one line)."""
    if a.mxfp6_matmul:
        if a.precision == "fp16":
            raise SpecdecError("--mxfp6-matmul is --precision mx6: drop --precision fp16")
        if a.target != "qaic":
            raise SpecdecError(f"--mxfp6-matmul is an option of the Cloud AI 100 compiler: it needs --target qaic "
                               f"(the {a.target} graph would not be what the manifest says)")
        a.precision = "mx6"
    fbs = a.full_batch_size
    a.continuous_batching = fbs is not None
    if fbs is not None:
        if isinstance(fbs, bool) or not isinstance(fbs, int) or fbs < 1:    # named as given, not as --batch-size
            raise SpecdecError(f"--full-batch-size must be >= 1 (got {fbs})")
        if a.interface == "default":
            raise SpecdecError(f"--full-batch-size {fbs} is QEfficient's continuous batching (--interface qeff): "
                               f"drop --interface default")
        if a.batch_size is not None and a.batch_size != fbs:
            raise SpecdecError(f"--full-batch-size {fbs} sets the batch (the cache's rows); --batch-size "
                               f"{a.batch_size} contradicts it: give one of them")
        a.interface, a.batch_size = "qeff", fbs
    if a.interface is None:
        a.interface = "default"
    if a.batch_size is None:
        a.batch_size = 1
