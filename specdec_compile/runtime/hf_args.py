"""What ``generate`` / ``generate_many`` / ``stream`` accept, in the forms Hugging
Face users hold, turned into the loop's own terms (token-id lists, a max new
token count, ``SamplingParams``, stop strings).

Prompts (``prompt_inputs``): a string or a list of strings (encoded with the
tokenizer), a list of token ids or a list of such lists, a ``[n]`` or
``[batch, n]`` integer array (NumPy, or anything with ``__array__`` / ``.numpy()``:
a torch tensor is read without importing torch), a tokenizer's output
(``{"input_ids": ..., "attention_mask": ...}``: the masked positions are
dropped; a mask holds 0 and 1 only, and applies to any form, once encoded), or chat
``messages`` (a list of ``{"role", "content"}`` dicts, or a list of such lists)
through the tokenizer's chat template.

Keywords (``parse``): ``max_new_tokens``, ``max_length`` (prompt + new tokens, the
longest prompt counted with its padding, as HF counts a padded batch; ``max_new_tokens`` wins when
both are given), ``do_sample``, ``temperature``, ``top_k``, ``top_p``, ``seed``,
``stop_strings`` (or ``stop``), ``streamer``, ``tokenizer``, ``attention_mask``,
``input_ids``, ``messages``, ``pad_token_id`` (without an ``attention_mask``, as in HF:
that id is padding where the prompt holds it, unless it is an EOS id; outputs are not
padded), ``token_type_ids`` (a tokenizer's output; all 0, else refused), and the runtime's own ``sampling``, ``rng``, ``on_tokens``,
``prompt_index``. Any other keyword is a one-line ``SpecdecError`` naming it.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np

from ..errors import SpecdecError
from .sampling import SamplingParams

#: the HF generation keywords that mean something here
HF_KEYWORDS = ("max_new_tokens", "max_length", "do_sample", "temperature", "top_k", "top_p", "seed",
               "stop_strings", "stop", "streamer", "tokenizer", "attention_mask", "input_ids", "messages",
               "pad_token_id", "token_type_ids")
#: the runtime's own keywords
OWN_KEYWORDS = ("sampling", "rng", "on_tokens", "prompt_index")
#: HF's sampling defaults with do_sample=True (GenerationConfig): temperature 1.0, top_k 50, top_p 1.0
HF_SAMPLE_DEFAULTS = {"temperature": 1.0, "top_k": 50, "top_p": 1.0}
DEFAULT_MAX_NEW_TOKENS = 64


def resolve_tokenizer(tok):
    """A tokenizer object from a directory (str or PathLike: loaded locally); any other
    object is taken as a tokenizer (what a feature needs of it is used when needed:
    calling it to encode, ``decode``, ``apply_chat_template``); None stays None."""
    if tok is None:
        return None
    if isinstance(tok, (str, os.PathLike)):
        from .tokenizer import load_tokenizer
        return load_tokenizer(tok)
    if not any(hasattr(tok, a) for a in ("__call__", "__len__", "decode", "encode")):   # 5, 1.0, True
        raise SpecdecError(f"tokenizer must be a tokenizer object or a local directory (got {tok!r})")
    return tok


@dataclass
class Request:
    """One call's arguments in the loop's terms."""
    prompts: list[list[int]]
    single: bool                      # one prompt given (a string, an id list, a [1, n] array, one chat)
    max_new_tokens: int
    sampling: SamplingParams
    tokenizer: object = None
    stop: object = None               # streaming.StopStrings or None
    streamer: object = None           # an HF-style streamer (put / end) or None
    rng: object = None
    on_tokens: object = None
    prompt_index: int = 0
    extra: dict = field(default_factory=dict)


def parse(inputs, kwargs: dict, tokenizer=None, what: str = "generate", check_tokenizer=None,
          eos: frozenset = frozenset()) -> Request:
    """``inputs`` and the keywords of one ``what(...)`` call, checked; ``tokenizer``: the decoder's,
    ``eos``: its EOS ids (HF's rule for ``pad_token_id`` without a mask reads them).
    ``check_tokenizer(tok)``: the decoder's check of a ``tokenizer=`` given for this call (one that
    is not the decoder's own), run before the tokenizer encodes anything.
    A refused call ends its ``streamer=`` (``end()``): a consumer iterating a
    ``TextIteratorStreamer`` in another thread would otherwise wait for ever."""
    try:
        return _parse(inputs, kwargs, tokenizer, what, check_tokenizer, eos)
    except SpecdecError:
        end = getattr(kwargs.get("streamer"), "end", None)
        if callable(end):
            end()
        raise


def _parse(inputs, kwargs: dict, tokenizer, what: str, check_tokenizer, eos: frozenset) -> Request:
    unknown = sorted(set(kwargs) - set(HF_KEYWORDS) - set(OWN_KEYWORDS))
    if unknown:
        raise SpecdecError(f"{what}() does not support {', '.join(repr(k) for k in unknown)} (supported: "
                           f"{', '.join(HF_KEYWORDS + OWN_KEYWORDS)})")
    kw = dict(kwargs)
    tok = resolve_tokenizer(kw.pop("tokenizer", None))
    if tok is None:
        tok = tokenizer
    elif tok is not tokenizer and check_tokenizer is not None:
        check_tokenizer(tok)
    if isinstance(inputs, (list, tuple)) and not inputs and what != "generate":
        prompts, single, width = [], False, 0   # no prompts: no results
    else:
        prompts, single, width = prompt_rows(inputs, tok, input_ids=kw.pop("input_ids", None),
                                             attention_mask=kw.pop("attention_mask", None),
                                             messages=kw.pop("messages", None),
                                             pad=_pad_id(kw.pop("pad_token_id", None), eos))
    kw.pop("pad_token_id", None)
    _one_segment(kw.pop("token_type_ids", None))
    max_new = _max_new_tokens(kw.pop("max_new_tokens", None), kw.pop("max_length", None), width)
    sampling = _sampling(kw)
    stop = _stop(kw.pop("stop_strings", None), kw.pop("stop", None), tok)
    streamer = kw.pop("streamer", None)
    if streamer is not None:
        if not (callable(getattr(streamer, "put", None)) and callable(getattr(streamer, "end", None))):
            raise SpecdecError("streamer= must have put() and end() (a transformers streamer)")
        if what == "generate_many":
            raise SpecdecError("streamer= streams one prompt: use generate()")
        if not single:
            raise SpecdecError("streamer= streams one prompt; give one prompt, or use stream() for several")
    rng = kw.pop("rng", None)
    if rng is not None and not callable(getattr(rng, "integers", None)):
        raise SpecdecError(f"rng must be a numpy.random.Generator (got {type(rng).__name__})")
    on_tokens = kw.pop("on_tokens", None)
    _check_callback(on_tokens, 2 if single else 3)
    index = kw.pop("prompt_index", 0)
    if _bad_int(index) or index < 0:
        raise SpecdecError(f"prompt_index must be an integer >= 0 (got {index!r})")
    if index and not single:
        raise SpecdecError("prompt_index is for one prompt: prompt i of several samples as prompt_index=i")
    return Request(prompts, single, max_new, sampling, tok, stop, streamer, rng, on_tokens, int(index))


def _check_callback(fn, n: int) -> None:
    """``on_tokens`` must take ``n`` positional arguments ((ids, sources), or (index, ids, sources) for
    several prompts): checked before the run, not found mid-generation."""
    if fn is None:
        return
    if not callable(fn):
        raise SpecdecError(f"on_tokens must be callable (got {type(fn).__name__})")
    import inspect
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):   # some builtins have no signature: nothing to check
        return
    try:
        sig.bind(*([None] * n))
    except TypeError:
        args = "(index, ids, sources)" if n == 3 else "(ids, sources)"
        raise SpecdecError(f"on_tokens{sig} cannot be called as on_tokens{args}") from None


def _one_segment(token_type_ids) -> None:
    """A tokenizer's token_type_ids (``generate(**tok(text))``): all zero, one segment, means nothing here."""
    if token_type_ids is not None and np.any(as_array(token_type_ids, "token_type_ids") != 0):
        raise SpecdecError("token_type_ids other than 0 (several segments) mean nothing to a decoder LM")


def _pad_id(pad_token_id, eos: frozenset) -> int | None:
    """The id HF's generate reads as padding when no attention mask is given: ``pad_token_id``
    unless it is an EOS id (then HF masks nothing: the id is text, e.g. a chat's end of turn)."""
    if pad_token_id is None:
        return None
    if isinstance(pad_token_id, np.ndarray) and pad_token_id.ndim == 0:
        pad_token_id = pad_token_id.item()
    if _bad_int(pad_token_id) or pad_token_id < 0:
        raise SpecdecError(f"pad_token_id must be a token id, an integer >= 0 (got {pad_token_id!r})")
    return None if int(pad_token_id) in eos else int(pad_token_id)


def _max_new_tokens(max_new_tokens, max_length, width: int) -> int:
    """``width``: the prompt length HF counts in max_length (a padded batch's width, padding
    included; else the longest prompt)."""
    if max_new_tokens is not None:
        n = max_new_tokens
    elif max_length is not None:
        if _bad_int(max_length):
            raise SpecdecError(f"max_length must be an integer (got {max_length!r})")
        if max_length <= width:
            raise SpecdecError(f"max_length={max_length!r} leaves no room to generate after the "
                               f"{width}-token prompt (max_length counts the prompt)")
        n = max_length - width
    else:
        n = DEFAULT_MAX_NEW_TOKENS
    return check_max_new_tokens(n)


def check_max_new_tokens(n) -> int:
    """``max_new_tokens`` as an int: an integer >= 0 (a NumPy integer too; not a bool, a float or None),
    else a one-line SpecdecError. Every entry that takes it (generate, stream, BatchEngine) checks here."""
    if _bad_int(n) or n < 0:
        raise SpecdecError(f"max_new_tokens must be an integer >= 0 (got {n!r})")
    return int(n)


def _bad_int(v) -> bool:
    return isinstance(v, bool) or not isinstance(v, (int, np.integer))


def _sampling(kw: dict) -> SamplingParams:
    """``sampling=`` as given, or SamplingParams from HF's keywords. ``do_sample=False``:
    greedy whatever the temperature (HF ignores it); ``do_sample=True``: HF's defaults for
    what is not given (temperature 1, top_k 50); neither: sampling when temperature > 0."""
    hf = {k: kw.pop(k) for k in ("do_sample", "temperature", "top_k", "top_p", "seed") if k in kw}
    hf = {k: v for k, v in hf.items() if v is not None}
    given = kw.pop("sampling", None)
    if given is not None:
        if hf:
            raise SpecdecError(f"give either sampling= or {', '.join(sorted(hf))}, not both")
        if not isinstance(given, SamplingParams):
            raise SpecdecError(f"sampling= must be a SamplingParams (got {type(given).__name__})")
        return given
    do_sample = hf.pop("do_sample", None)
    if do_sample not in (None, True, False):
        raise SpecdecError(f"do_sample must be True or False (got {do_sample!r})")
    seed = hf.pop("seed", None)
    vals = hf
    if do_sample is False:
        return SamplingParams(seed=seed)
    if do_sample:
        vals = {**HF_SAMPLE_DEFAULTS, **vals}
        if not _real("temperature", vals["temperature"]) > 0:
            raise SpecdecError(f"do_sample=True needs temperature > 0 (got {vals['temperature']!r})")
    return SamplingParams(_real("temperature", vals.get("temperature", 0.0)), vals.get("top_k", 0),
                          _real("top_p", vals.get("top_p", 1.0)), seed)


def _real(name: str, v) -> float:
    """An HF sampling keyword as a float: a real number (a NumPy or torch scalar too); a bool or a
    string is refused, not read as 1.0 or parsed (``SamplingParams`` refuses them too)."""
    if not isinstance(v, (bool, np.bool_, str, bytes)):
        try:
            return float(v)
        except (TypeError, ValueError):
            pass
    raise SpecdecError(f"bad sampling keyword: {name} must be a number (got {v!r})")


def _stop(stop_strings, stop, tok):
    if stop_strings is not None and stop is not None:
        raise SpecdecError("give stop_strings= or stop=, not both (they mean the same)")
    strings = stop_strings if stop_strings is not None else stop
    if strings is None:
        return None
    if not isinstance(strings, str) and not isinstance(strings, (list, tuple)):
        raise SpecdecError(f"stop_strings must be a non-empty string or a list of them (got {strings!r})")
    strings = [strings] if isinstance(strings, str) else list(strings)
    if not strings or not all(isinstance(s, str) and s for s in strings):
        raise SpecdecError(f"stop_strings must be a non-empty string or a list of them (got {strings!r})")
    if tok is None:
        raise SpecdecError("stop_strings needs a tokenizer (tokenizer= on the decoder or the call)")
    if not callable(getattr(tok, "decode", None)):
        raise SpecdecError(f"stop_strings needs a tokenizer with decode(); {type(tok).__name__} has none")
    from .streaming import StopStrings
    return StopStrings(tok, strings)


# ----------------------------------------------------------------------------- prompts

def prompt_inputs(inputs, tok, *, input_ids=None, attention_mask=None, messages=None
                  ) -> tuple[list[list[int]], bool]:
    """(prompts as token-id lists, whether one prompt was given) from any accepted form."""
    prompts, single, _ = prompt_rows(inputs, tok, input_ids=input_ids, attention_mask=attention_mask,
                                     messages=messages)
    return prompts, single


def prompt_rows(inputs, tok, *, input_ids=None, attention_mask=None, messages=None, pad: int | None = None
                ) -> tuple[list[list[int]], bool, int]:
    """``prompt_inputs`` and the prompt length HF's ``max_length`` counts: the rows' width as
    given, padding included (a batch padded to 16 tokens counts 16), before the mask drops it.
    An ``attention_mask`` applies to every form (a string's or a chat's encoded ids too). ``pad``:
    without a mask, the id that is padding wherever it stands (HF's rule; padding between tokens is
    then refused, as a mask's is)."""
    if input_ids is not None:
        if inputs is not None:
            raise SpecdecError("give the prompt once: positionally or as input_ids=, not both")
        inputs = input_ids
    if messages is not None:
        if inputs is not None:
            raise SpecdecError("give either a prompt or messages=, not both")
        prompts, single = _chat(messages, tok)
    else:
        if _is_mapping(inputs):
            inputs, attention_mask = _from_mapping(inputs, attention_mask)
        if inputs is None:
            raise SpecdecError("no prompt given")
        if isinstance(inputs, str):
            prompts, single = [_encode(inputs, tok)], True
        elif isinstance(inputs, (list, tuple)):
            prompts, single = _from_list(inputs, tok)
        else:
            prompts, single = _from_array(as_array(inputs, "the prompt"))
    width = max((len(p) for p in prompts), default=0)
    if attention_mask is None and pad is not None and any(pad in p for p in prompts):
        attention_mask = _pad_mask(prompts, pad)
    if attention_mask is not None:
        prompts = _unmask(prompts, as_array(attention_mask, "attention_mask"))
    return prompts, single, width


def _pad_mask(prompts: list[list[int]], pad: int) -> np.ndarray:
    """The mask HF's generate builds from ``pad_token_id`` (1 where the id is not ``pad``), for rows of
    one width; rows of other widths hold no padding a mask could describe."""
    if len({len(p) for p in prompts}) != 1:
        raise SpecdecError(f"a prompt holds pad_token_id {pad}, but the prompts are of different lengths "
                           f"{[len(p) for p in prompts]}: give each prompt without its padding, or a padded "
                           f"batch with its attention_mask")
    return (np.asarray(prompts, np.int64) != pad).astype(np.int64)


def _from_mapping(enc, attention_mask):
    """(input_ids, attention_mask) of a tokenizer's output; its token_type_ids are checked as the
    keyword's are, and a second mask (the mapping's and ``attention_mask=``) is refused."""
    keys = set(enc.keys())
    if "input_ids" not in keys:
        raise SpecdecError(f"a mapping prompt needs 'input_ids' (got keys {sorted(keys, key=str)})")
    if "token_type_ids" in keys:
        _one_segment(enc["token_type_ids"])
    if "attention_mask" in keys and enc["attention_mask"] is not None:
        if attention_mask is not None:
            raise SpecdecError("give the attention mask once: in the prompt's mapping or as attention_mask=, "
                               "not both")
        attention_mask = enc["attention_mask"]
    return enc["input_ids"], attention_mask


def _is_mapping(x) -> bool:
    return hasattr(x, "keys") and hasattr(x, "__getitem__") and not isinstance(x, (str, list, tuple, np.ndarray))


def as_array(x, what: str) -> np.ndarray:
    """A NumPy array from an array-like: NumPy, a torch tensor (``.detach().cpu().numpy()``,
    duck-typed), anything with ``__array__``."""
    if isinstance(x, np.ndarray):
        return x
    if isinstance(x, (list, tuple)):
        try:
            return np.asarray(x)
        except (TypeError, ValueError):   # rows of different lengths ([[1, 1], [1]]), or worse
            raise SpecdecError(f"{what}: expected a list of integers or of equal-length rows of them") from None
    for step in ("detach", "cpu"):
        if callable(getattr(x, step, None)):
            x = getattr(x, step)()
    if callable(getattr(x, "numpy", None)):
        x = x.numpy()
    if not hasattr(x, "__array__"):
        raise SpecdecError(f"{what}: expected a string, token ids or an integer array, got {type(x).__name__}")
    return np.asarray(x)


def _from_array(arr: np.ndarray) -> tuple[list[list[int]], bool]:
    if not np.issubdtype(arr.dtype, np.integer):
        raise SpecdecError(f"the prompt array must hold integer token ids, got dtype {arr.dtype}")
    if arr.ndim == 1:
        return [arr.tolist()], True
    if arr.ndim == 2:
        if arr.shape[0] == 0:
            raise SpecdecError("the prompt array has no rows")
        return [r.tolist() for r in arr], arr.shape[0] == 1
    raise SpecdecError(f"the prompt array must be [n] or [batch, n], got shape {list(arr.shape)}")


def _from_list(items, tok) -> tuple[list[list[int]], bool]:
    if not items:
        raise SpecdecError("empty prompt: at least one token is needed")
    if all(isinstance(x, str) for x in items):
        return [_encode(x, tok) for x in items], False
    if all(_is_id(x) for x in items):
        return [[int(x) for x in items]], True
    if any(_is_id(x) for x in items):       # one id list with something else in it
        i, x = next((i, x) for i, x in enumerate(items) if not _is_id(x))
        raise SpecdecError(f"the prompt's item {i + 1} is {x!r}, not a token id (an integer)")
    out = []
    for i, x in enumerate(items):
        if isinstance(x, str):
            out.append(_encode(x, tok))
        elif isinstance(x, (list, tuple)) and all(_is_id(t) for t in x):   # huge ids too: the range check names them
            out.append([int(t) for t in x])
        elif isinstance(x, (list, tuple)) or hasattr(x, "__array__") or callable(getattr(x, "numpy", None)):
            arr = as_array(x, f"prompt {i + 1}")
            if (arr.ndim != 1 or (arr.size and not np.issubdtype(arr.dtype, np.integer))
                    or (isinstance(x, (list, tuple)) and not all(_is_id(t) for t in x))):   # [True, 2]: no ids
                raise SpecdecError(f"prompt {i + 1}: expected a list of integer token ids")
            out.append([int(t) for t in arr.tolist()])
        else:
            raise SpecdecError(f"prompt {i + 1}: expected a string or token ids, got {type(x).__name__}")
    return out, False


def _is_id(x) -> bool:
    """An integer token id (a bool is not one)."""
    return isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_))


def _unmask(prompts: list[list[int]], mask: np.ndarray) -> list[list[int]]:
    """Drop the positions a tokenizer's attention_mask marks as padding (left or right)."""
    mask = mask.reshape(len(prompts), -1) if mask.ndim == 1 and len(prompts) == 1 else mask
    if mask.ndim != 2 or mask.shape[0] != len(prompts) or any(mask.shape[1] != len(p) for p in prompts):
        raise SpecdecError(f"attention_mask has shape {list(mask.shape)}, the prompts "
                           f"{[len(p) for p in prompts]} tokens")
    odd = mask.ravel()[:1] if mask.dtype == object else mask[~np.isin(mask, (0, 1))]
    if odd.size:   # 2, -1, 0.5, NaN, None: no tokenizer's mask, and no meaning to guess
        v = odd.flat[0]
        raise SpecdecError(f"attention_mask must hold 1 (token) and 0 (padding) only (got "
                           f"{v.item() if isinstance(v, np.generic) else v!r}, dtype {mask.dtype})")
    out = []
    for i, (p, m) in enumerate(zip(prompts, mask)):
        keep = np.flatnonzero(m != 0)
        if keep.size and keep[-1] - keep[0] + 1 != keep.size:
            raise SpecdecError(f"prompt {i + 1}: attention_mask has padding between tokens; only left or "
                               f"right padding is understood")
        out.append([p[j] for j in keep])
    return out


def _encode(text: str, tok) -> list[int]:
    if tok is None:
        raise SpecdecError("a text prompt needs a tokenizer (tokenizer= on the decoder or the call)")
    if not callable(tok):
        raise SpecdecError(f"a text prompt needs a tokenizer that encodes (tokenizer(text)); "
                           f"{type(tok).__name__} does not")
    enc = tok(text)
    if not (_is_mapping(enc) and "input_ids" in enc):
        raise SpecdecError(f"the tokenizer's output for {text[:40]!r} is no mapping with 'input_ids' "
                           f"(got {type(enc).__name__})")
    ids = token_ids(enc["input_ids"], f"the tokenizer's input_ids for {text[:40]!r}")
    if not ids:
        raise SpecdecError(f"prompt {text[:40]!r} encodes to no tokens")
    return ids


def token_ids(value, what: str) -> list[int]:
    """A tokenizer's ids for one text as a list of ints: a list or ``[n]`` / ``[1, n]`` array of integers;
    anything else (a float, a string, several rows) is refused, not truncated by ``int()``."""
    if isinstance(value, (list, tuple)) and all(_is_id(i) for i in value):
        return [int(i) for i in value]
    try:
        arr = as_array(value, what)
    except SpecdecError:
        arr = None
    if arr is not None and arr.ndim == 2 and arr.shape[0] == 1:
        arr = arr[0]
    if arr is None or arr.ndim != 1 or (arr.size and not np.issubdtype(arr.dtype, np.integer)):
        raise SpecdecError(f"{what}: expected a list of integer token ids (got {str(value)[:60]})")
    return [int(i) for i in arr.tolist()]


def _chat(messages, tok) -> tuple[list[list[int]], bool]:
    """Chat messages through the tokenizer's chat template (with the generation prompt)."""
    if tok is None:
        raise SpecdecError("messages= needs a tokenizer (tokenizer= on the decoder or the call)")
    if not getattr(tok, "chat_template", None):
        raise SpecdecError("the tokenizer has no chat template (its tokenizer_config.json sets no "
                           "chat_template); give a plain prompt instead")
    if isinstance(messages, (list, tuple)) and messages and all(isinstance(m, dict) for m in messages):
        chats, single = [messages], True
    elif isinstance(messages, (list, tuple)) and messages and all(isinstance(c, (list, tuple)) for c in messages):
        chats, single = list(messages), False
    else:
        raise SpecdecError("messages= must be a list of {'role': ..., 'content': ...} dicts, or a list of such lists")
    out = []
    for c in chats:
        try:
            ids = tok.apply_chat_template(list(c), add_generation_prompt=True, tokenize=True)
        except Exception as e:  # jinja and transformers raise many kinds
            raise SpecdecError(f"the chat template failed: {type(e).__name__}: {' '.join(str(e).split())[:200]}") \
                from None
        if _is_mapping(ids) and "input_ids" in ids:
            ids = ids["input_ids"]
        out.append(token_ids(ids, "the chat template's token ids"))
    return out, single
