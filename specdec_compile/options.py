"""The compile options and their one validator.

``Options`` is the one way into the compiler: the CLI, ``pipeline.rewrite``/``prepare``/
``compile_model`` and ``artifact.writer.write_artifact`` all take one, and it is checked once,
where it is built (``Options.__post_init__``); every later stage trusts it.
``check_options`` is the single place a role, target, speculation length k and the shape
options (prefill length, context length, batch size) are checked; ``Options``, a
``PassContext`` built by hand and ``verify`` call it, so a bad value reads the same wherever
it comes in. Every failure is one ``SpecdecError`` line naming the command-line flag.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from .contract import INTERFACES, ROLES, TARGETS
from .errors import SpecdecError

DTYPES = ("float16", "float32")
PRECISIONS = ("fp16", "mx6")
#: -aic-hw-version values: ai100 / ai200 (qaic-compile, QEfficient's two), 2.0 (older SDKs' qaic-exec)
HW_VERSIONS = ("ai100", "ai200", "2.0")
MAX_CORES = 16
#: upper bounds on sizes that come from the command line (each error says its bound): the context a
#: graph is compiled for (qaic rotary tables hold ctx_len rows), the batch, devices to partition over
MAX_CTX_LEN = 2 ** 18
MAX_BATCH_SIZE = 1024
MAX_DEVICES = 64
#: options only the Cloud AI 100 compiler reads: refused with --target ort (the ORT graph ignores them)
QAIC_ONLY = (("--precision", "precision", "fp16"), ("--num-cores", "num_cores", MAX_CORES),
             ("--num-devices", "num_devices", 1), ("--hw-version", "hw_version", None),
             ("--kv-dtype", "kv_dtype", "float16"), ("--logits-dtype", "logits_dtype", None))


def is_int(v) -> bool:
    """An integer, not a bool (True is not a count)."""
    return isinstance(v, int) and not isinstance(v, bool)


def _at_least_one(flag: str, value, most: int | None = None) -> None:
    if value is not None and (not is_int(value) or value < 1):
        raise SpecdecError(f"{flag} must be at least 1, got {value!r}")
    if value is not None and most is not None and value > most:
        raise SpecdecError(f"{flag} {value} is over the limit of {most}")


def check_num_cores(value, flag: str = "--num-cores") -> None:
    """A core count of one model: 1 to MAX_CORES (``flag``: the option as the user gave it)."""
    if not is_int(value) or not 1 <= value <= MAX_CORES:
        raise SpecdecError(f"{flag} must be between 1 and {MAX_CORES}, got {value!r}")


def check_options(role: str | None = None, target: str | None = None, k: int | None = None, *,
                  optional: bool = False, prefill_len: int | None = None, ctx_len: int | None = None,
                  batch_size: int | None = None, k_list: tuple[int, ...] = ()) -> None:
    """Refuse an unknown role or target (None accepted with ``optional``), a k that is
    not an integer >= 1, shapes below 1, a prefill length or a width longer than the context."""
    if not (optional and role is None) and role not in ROLES:
        raise SpecdecError(f"unknown role {role!r} (choose from {', '.join(ROLES)})")
    if not (optional and target is None) and target not in TARGETS:
        raise SpecdecError(f"unknown target {target!r} (choose from {', '.join(TARGETS)})")
    if k is not None and (not is_int(k) or k < 1):
        # two spellings callers have always matched: the rule, and the flag's range
        raise SpecdecError(f"k must be an integer >= 1, got {k!r} (--k: k must be at least 1)")
    _at_least_one("--batch-size", batch_size, MAX_BATCH_SIZE)
    _at_least_one("--ctx-len", ctx_len, MAX_CTX_LEN)
    _at_least_one("--prefill-len", prefill_len)
    if prefill_len is not None and ctx_len is not None and prefill_len > ctx_len:
        raise SpecdecError(f"--prefill-len {prefill_len} is larger than --ctx-len {ctx_len}")
    for j in (*([k] if k is not None else []), *k_list):
        if not is_int(j):
            raise SpecdecError(f"--k-list entries must be integers, got {j!r}")
        if j < 0:   # k_list may hold 0: a width-1 TLM call (no drafts, the fallback)
            raise SpecdecError(f"--k-list entries must be at least 0, got {j}")
        if ctx_len is not None and j + 1 > ctx_len:
            raise SpecdecError(f"k={j} needs seq_len {j + 1}, larger than --ctx-len {ctx_len}")


@dataclass(frozen=True)
class Options:
    """Everything besides the model that decides the artifact's contents."""

    role: str
    k: int | None = None
    k_list: tuple[int, ...] = ()
    prefill_len: int = 32
    ctx_len: int = 256
    batch_size: int = 1
    target: str = "qaic"
    kv_dtype: str = "float16"
    logits_dtype: str | None = None
    precision: str = "fp16"
    num_cores: int = MAX_CORES
    num_devices: int = 1
    hw_version: str | None = None  # None: chosen by compile.sh from the compiler it finds
    #: TLM: layers whose outputs the graph outputs as hidden_states; DLM: a feature draft's target layers
    hidden_states: tuple[int, ...] = ()
    feature_layers: tuple[int, ...] = ()
    #: a feature draft's target, (file name, sha256) of its export (--feature-target); None: not named
    feature_target: tuple[str, str] | None = None
    #: "default" (ours) or "qeff" (QEfficient's: batch_index, num_logits_to_keep; batch_size is
    #: then the cache's full_batch_size; contract section 7)
    interface: str = "default"
    #: --interface qeff only: QEfficient's continuous batching (--full-batch-size N): the cache holds
    #: batch_size = full_batch_size rows, routed by the input batch_index; False: its plain SpD
    #: interface (no batch_index, every call at batch_size rows)
    continuous_batching: bool = False
    mxint8_kv_cache: bool = False
    #: qaic compiler options under QEfficient's names: -mos=N (None: not passed), -aic-enable-depth-first
    mos: int | None = None
    aic_enable_depth_first: bool = False
    #: extra compiler flags, passed through to compile.sh as given (qaic_flags.check_flags)
    qaic_flags: tuple[str, ...] = ()
    #: hard-link the export's weight files into the artifact instead of copying them (no copy of a
    #: large model; onnx >= 1.23's loader and checker refuse a data file with several hard links)
    link_weights: bool = False

    def __post_init__(self):
        """Checked once, here: raise SpecdecError (one line) for options no artifact can
        satisfy. Layer lists given as lists are kept as tuples (None: none)."""
        for name in ("k_list", "hidden_states", "feature_layers", "qaic_flags", "feature_target"):
            value = getattr(self, name)
            if (value is None and name != "feature_target") or isinstance(value, list):
                object.__setattr__(self, name, tuple(value or ()))
        self._check_types()
        self._check()

    def _check_types(self) -> None:
        """Layer lists and widths: sequences of integers (not a string, 1.5 or True); switches: bools."""
        for name, flag in (("k_list", "--k-list"), ("hidden_states", "--hidden-states"),
                           ("feature_layers", "--feature-layers")):
            value = getattr(self, name)
            if not isinstance(value, tuple) or not all(is_int(v) for v in value):
                raise SpecdecError(f"{flag} must be a list of integers, got {value!r}")
        # sizes every artifact has (check_options takes None as "not given" for its other callers;
        # here None would be written as the seq_len or batch "None" in specializations.json)
        for name, flag in (("prefill_len", "--prefill-len"), ("ctx_len", "--ctx-len"),
                           ("batch_size", "--batch-size"), ("num_devices", "--num-devices")):
            if not is_int(getattr(self, name)):
                raise SpecdecError(f"{flag} must be an integer, got {getattr(self, name)!r}")
        ft = self.feature_target   # recorded as the manifest's target {file, sha256}: "ab" would be a, b
        if ft is not None and not (isinstance(ft, tuple) and len(ft) == 2 and isinstance(ft[0], str) and ft[0]
                                   and isinstance(ft[1], str) and re.fullmatch(r"[0-9a-f]{64}", ft[1])):
            raise SpecdecError(f"--feature-target: feature_target must be (file name, sha256 hex digest), got {ft!r}")
        if not isinstance(self.qaic_flags, tuple) or not all(isinstance(f, str) for f in self.qaic_flags):
            raise SpecdecError(f"--qaic-flag: qaic_flags must be a list of flags (strings), got {self.qaic_flags!r}")
        for name in ("continuous_batching", "mxint8_kv_cache", "aic_enable_depth_first", "link_weights"):
            if not isinstance(getattr(self, name), bool):
                raise SpecdecError(f"Options.{name} must be True or False, got {getattr(self, name)!r}")

    def _check(self) -> None:
        if self.role == "dlm" and not self.feature_layers:
            if self.k is not None:
                raise SpecdecError("--k is for the target model only: a DLM (--role dlm) has the fixed "
                                   "specializations prefill/2/1; give --k to the TLM")
            if self.k_list:
                raise SpecdecError("--k-list is for the target model only (--role tlm)")
        check_options(self.role, self.target, self.k, batch_size=self.batch_size, ctx_len=self.ctx_len,
                      prefill_len=self.prefill_len, k_list=self.k_list)
        if self.target != "qaic":
            for flag, name, default in QAIC_ONLY:
                if getattr(self, name) != default:
                    raise SpecdecError(f"{flag} {getattr(self, name)} is an option of the Cloud AI 100 compiler: it "
                                       f"needs --target qaic (the {self.target} graph would not be what the "
                                       f"manifest says)")
        if self.interface not in INTERFACES:
            raise SpecdecError(f"--interface {self.interface!r} is not one of {', '.join(INTERFACES)}")
        if self.interface == "qeff" and self.target == "openvino":   # named as given: --full-batch-size sets qeff
            given = "--full-batch-size (--interface qeff)" if self.continuous_batching else "--interface qeff"
            raise SpecdecError(f"{given} is for --target qaic or ort; the openvino target has the "
                               f"default interface only")
        if self.continuous_batching and self.interface != "qeff":
            raise SpecdecError("continuous batching (--full-batch-size) is QEfficient's interface: it needs "
                               "--interface qeff (or no --interface)")
        if self.interface == "qeff":
            from .artifact.qeff import check_qeff_options
            check_qeff_options(self)
        if self.qaic_flags or self.mxint8_kv_cache or self.mos is not None or self.aic_enable_depth_first:
            from .artifact.qaic_flags import check_flags
            check_flags(self)
        for name, value, allowed in (("--kv-dtype", self.kv_dtype, DTYPES),
                                     ("--precision", self.precision, PRECISIONS)):
            if value not in allowed:
                raise SpecdecError(f"{name} {value!r} is not one of {', '.join(allowed)}")
        if self.logits_dtype is not None and self.logits_dtype not in DTYPES:
            raise SpecdecError(f"--logits-dtype {self.logits_dtype!r} is not one of {', '.join(DTYPES)}")
        if self.hw_version is not None and self.hw_version not in HW_VERSIONS:
            raise SpecdecError(f"--hw-version {self.hw_version!r} is not one of {', '.join(HW_VERSIONS)}")
        check_num_cores(self.num_cores)
        _at_least_one("--num-devices", self.num_devices, MAX_DEVICES)
        if self.role == "dlm" and self.hidden_states:
            raise SpecdecError("--hidden-states is for the target model (--role tlm); a feature draft "
                               "(--feature-layers) outputs its own features by itself")
        if self.role == "tlm" and self.feature_layers:
            raise SpecdecError("--feature-layers is for a feature draft (--role dlm)")
        if self.feature_target is not None and not self.feature_layers:
            raise SpecdecError("--feature-target names the target a feature draft reads: it needs "
                               "--role dlm --feature-layers")
        if self.role == "dlm" and not self.feature_layers:
            if self.ctx_len < 2:
                raise SpecdecError(f"--ctx-len {self.ctx_len} is too small for a DLM (needs seq_len 2)")
            return
        if self.k is None:
            if self.role == "dlm":
                raise SpecdecError("--k is required for a feature draft (--feature-layers): it ingests the "
                                   "target's features of up to k+1 accepted tokens in one call (seq_len k+1)")
            raise SpecdecError("--k is required for --role tlm (the number of drafted tokens per round, e.g. --k 7)")

    def seq_lens(self) -> list[int]:
        """seq_len of each specialization, in file order (contract sections 3 and 7)."""
        if self.interface == "qeff":  # QEfficient's: prefill, then one decode per K (TLM: K+1); its plain
            decodes = [1] if self.role == "dlm" else [j + 1 for j in self.widths()]   # one drops the prefill's twin
            return [self.prefill_len] + [s for s in decodes if self.continuous_batching or s != self.prefill_len]
        if self.role == "dlm" and self.feature_layers:  # feature draft: prompt, a round's accepted tokens, one draft
            wanted = [self.prefill_len, self.k + 1, 1] + [j + 1 for j in sorted(set(self.k_list))]
        elif self.role == "dlm":
            wanted = [self.prefill_len, 2, 1]
        else:
            wanted = [self.prefill_len, self.k, self.k + 1] + [j + 1 for j in sorted(set(self.k_list))]
        seen: list[int] = []
        for s in wanted:  # a width equal to an earlier one is the same specialization
            if s not in seen:
                seen.append(s)
        return seen

    def widths(self) -> list[int] | None:
        """Every verification width k this TLM artifact serves (None for a DLM); a feature
        draft: every k whose k+1 accepted tokens it ingests in one call."""
        if self.role == "dlm" and not self.feature_layers:
            return None
        return sorted({self.k, *self.k_list})
