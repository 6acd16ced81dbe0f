"""What the runtime tests share: a greedy reference decoder, sampling statistics, and the
``specdec-run`` CLI's tokenizer, runner and one-line-error check. Imported by its bare name
(``from runtime_helpers import ...``), like ``pass_helpers`` and ``detect_helpers``."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from specdec_compile.cli import run as run_cli
from specdec_compile.runtime.sampling import probs

PROMPT = [3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 1]   # 11 tokens: two prefill chunks of 8


def reference_greedy(lm, prompt, max_new, ctx_len=None, eos=()):
    """Greedy decoding computed from the whole token list each step, without any cache:
    up to ``max_new`` tokens, stopping at ``ctx_len`` tokens in all (when given) or after
    a token in ``eos``."""
    seq, out = list(prompt), []
    while len(out) < max_new and (ctx_len is None or len(seq) < ctx_len):
        t = int(np.argmax(lm(seq)))
        out.append(t)
        seq.append(t)
        if t in eos:
            break
    return out


def hf_greedy_of(model):
    """``get(prompt, n)``: transformers' greedy ``generate()`` of ``n`` tokens (no EOS), memoized."""
    import torch

    cache = {}

    def get(prompt, n):
        key = (tuple(prompt), n)
        if key not in cache:
            with torch.no_grad():
                out = model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                                     max_new_tokens=n, do_sample=False, eos_token_id=None, pad_token_id=0)
            cache[key] = out[0, len(prompt):].tolist()
        return cache[key]

    return get


# ----------------------------------------------------------------------------- sampling statistics

def chi2_crit(df, z=3.09):   # Wilson-Hilferty, upper 0.001 quantile
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


def sample_counts(dec, prompt, n: int, params, rng, N: int) -> tuple[dict, list]:
    """N sampled continuations of ``prompt``: how often each came out, and each run's
    acceptance rate (None for target-only decoding)."""
    counts: dict = {}
    acc = []
    for _ in range(N):
        r = dec.generate(prompt, max_new_tokens=n, sampling=params, rng=rng)
        counts[tuple(r.generated_ids)] = counts.get(tuple(r.generated_ids), 0) + 1
        acc.append(r.metrics.get("acceptance_rate"))
    return counts, acc


def chi2(counts: dict, expect: dict, N: int):
    """Chi-square statistic, pooling cells whose expected count is < 5."""
    stat, pool_o, pool_e, cells = 0.0, 0.0, 0.0, 0
    for key, e in expect.items():
        o = counts.get(key, 0)
        if e * N < 5:
            pool_o += o
            pool_e += e * N
            continue
        stat += (o - e * N) ** 2 / (e * N)
        cells += 1
    if pool_e > 0:
        stat += (pool_o - pool_e) ** 2 / max(pool_e, 1e-9)
        cells += 1
    assert sum(counts.get(k, 0) for k in counts if k not in expect) == 0
    return stat, cells - 1


def sequence_dist(lm, prompt, n, params):
    """Exact probability of every n-token continuation under the processed target."""
    dist = {(): 1.0}
    for _ in range(n):
        nxt = {}
        for seq, pr in dist.items():
            p = probs(lm(list(prompt) + list(seq)), params)
            for t in np.nonzero(p)[0]:
                nxt[seq + (int(t),)] = pr * p[t]
        dist = nxt
    return dist


def chi2_p(stat: float, df: int) -> float:
    """Upper tail of chi-square(df) at ``stat`` (Wilson-Hilferty; good to a few % here)."""
    z = ((stat / df) ** (1 / 3) - (1 - 2 / (9 * df))) / math.sqrt(2 / (9 * df))
    return 0.5 * math.erfc(z / math.sqrt(2))


# ----------------------------------------------------------------------------- the specdec-run CLI

def make_tokenizer(path: Path, n: int = 211, swap: bool = False, eos: str = "</s>") -> Path:
    """A word-level tokenizer: "<unk>", "<s>", "</s>", then w3 .. w{n-1}."""
    from tokenizers import Tokenizer, models as tm, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for i in range(3, n):
        vocab[f"w{i}"] = i
    if swap:  # same size, two ids exchanged: a different tokenizer
        vocab["w3"], vocab["w4"] = 4, 3
    t = Tokenizer(tm.WordLevel(vocab, unk_token="<unk>"))
    t.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=t, bos_token="<s>", eos_token=eos,
                            unk_token="<unk>").save_pretrained(str(path))
    return path


def run(argv, capsys):
    capsys.readouterr()          # drop what building the artifacts printed
    code = run_cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def one_line_error(code, err, *needles):
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("specdec-run: error: "), err
    for n in needles:
        assert n in lines[0], (n, lines[0])


def same_as_target(spec, base, prompts, n=25, **kw):
    """generate_many through the speculative decoder ``spec`` and the target-only ``base``: every
    prompt's output must be the same; returns the speculative results."""
    s = spec.generate_many(prompts, max_new_tokens=n, **kw)
    b = base.generate_many(prompts, max_new_tokens=n, **kw)
    for p, x, y in zip(prompts, s, b):
        assert x.generated_ids == y.generated_ids, p
    return s


class ProposeDraft:
    """A draft source of one's own (the protocol's minimum): ``make()`` is called once a generation
    and returns its ``propose(seq, q, n)``, each round's drafts; the first draft (from the prefill's
    logits) is ``first(prompt)``."""

    kind = "custom"

    def __init__(self, make, first=lambda prompt: None):
        self.make, self.first = make, first

    def bind(self, tlm):
        pass

    def backends(self):
        return []

    def drafter(self, ctx):
        first, propose = self.first, self.make()

        class D:
            def first(self, prompt):
                return first(prompt)

            def draft(self, seq, q, n):
                return propose(seq, q, n)

            def verified(self, step):
                pass

            def rollback(self, valid):
                pass

            def finish(self, seq):
                pass
        return D()
