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
    if args.max_new_tokens is None:
        args.max_new_tokens = args.generation_len if args.generation_len is not None else DEFAULT_MAX_NEW_TOKENS
    if args.device_group is not None:
        if args.tlm_device_ids is not None:
            raise SpecdecError("give --tlm-device-ids or --device-group (QEfficient's name for it), not both")
        text = args.device_group.strip()
        if text.startswith("[") != text.endswith("]"):
            raise SpecdecError(f"--device-group: unbalanced brackets in {args.device_group!r} "
                               f"(expected [0] or [0,1])")
        args.tlm_device_ids = text[1:-1] if text.startswith("[") else text
    if args.full_batch_size is not None and args.full_batch_size < 1:
        raise SpecdecError(f"--full-batch-size must be >= 1 (got {args.full_batch_size})")


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
    """A prompt file's text; one line on a missing or non-UTF-8 file."""
    try:
        with open(path, encoding="utf-8") as f:
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
