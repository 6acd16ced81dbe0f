"""Suffix drafts (SuffixDecoding, Oliaro et al.; Arctic Inference's suffix decoding;
vLLM's ``suffix`` method): no draft model. Two frequency-counting suffix tries
are consulted each round:

* a **per-request** trie over this request's prompt and output so far, and
* a **global** trie over earlier (and concurrent) requests' outputs, shared by
  every generation of one :class:`SuffixDraft` (all rows of a batch, all
  requests of a process that keep the decoder), with a memory cap.

The structure is a **bounded-depth suffix trie** (depth ``max_depth``, default
24 as vLLM's ``suffix_decoding_max_tree_depth``): the node for a string s (|s| <=
max_depth) counts the occurrences of s, ``cont`` how many of them continue, and
its children the next tokens. A trie rather than a suffix tree or automaton:
appending a token is O(depth) (the *frontier*, the nodes of the sequence's last
0..depth-1 tokens, each step down one child), whole requests can be removed again
(decrement the same counts; a suffix automaton cannot forget), and a lookup walks
O(depth + drafts) nodes, whatever the length of the history. The price is memory:
up to ``max_depth`` nodes per cached token, which is why the depth is bounded and
the global trie has a cap.

**Drafting.** Match the longest suffix of the sequence that the trie has seen
continued: the deepest node of the sequence's frontier with a continuation (in the
global trie, the frontier of this request's own entry: its output is added there
too, so those nodes are shared with every other request's same strings). From there, follow the most frequent child, token by
token; the estimated probability of the path is the product of
``child.count / node.cont``. Stop when it falls under ``min_prob`` (default 0.1),
when the path has ``spec_factor`` x the match length tokens (a one-token match
drafts one), or at the n the loop asks for. At the depth bound the walk
re-anchors on the last depth/2 tokens. Each trie proposes a path; the one with
the higher score (sum of the path probabilities: the expected accepted count)
wins. Proposals are single tokens (one-hot): a draft is accepted when it equals
the target's token, so greedy output is exactly target-only decoding and
sampling stays exact (sampling.py).

**Memory cap.** The global trie holds at most ``cache_tokens`` tokens (default
16384). Each request's output (led in by the prompt's last 8 tokens, the context an
answer starts from) is one entry, added token by token as the target accepts it; when the total passes the cap, whole entries are evicted oldest
first (FIFO by the request's start; an evicted request still decoding starts a
new entry with its following tokens, as does one decoding across ``SuffixDraft.clear()``; a
request that adds no token opens none). Nodes are at most ``max_depth`` per cached
token. When a generation ends (the protocol's ``finish``), its last round's
tokens are added too.
"""
from __future__ import annotations

from collections import OrderedDict

from ...errors import SpecdecError
from . import real_number, whole_number


class _Node:
    __slots__ = ("count", "cont", "kids", "best")

    def __init__(self):
        self.count = 0        # occurrences of this node's string
        self.cont = 0         # how many of them continue (the sum of the kids' counts)
        self.kids = None      # token -> _Node
        self.best = None      # the token of the most frequent kid


class SuffixTrie:
    """A bounded-depth suffix trie with counts. ``nodes``: live nodes (the root
    excluded); ``visits``: nodes touched so far (lookups and updates): what the
    tests read to see that a lookup's cost does not grow with the history."""

    def __init__(self, max_depth: int):
        self.depth = int(max_depth)
        self.root = _Node()
        self.nodes = 0
        self.visits = 0

    # -- updates ---------------------------------------------------------------
    def extend(self, frontier: list, t: int) -> list:
        """Append token ``t`` to a sequence whose frontier (frontier[d]: the node of
        its last d tokens, frontier[0] the root) is given; returns the new frontier."""
        root = self.root
        new = [root]
        for node in frontier[: self.depth]:       # (inlined: this loop is the per-token cost)
            kids = node.kids
            if kids is None:
                kids = node.kids = {}
            kid = kids.get(t)
            if kid is None:
                kid = kids[t] = _Node()
                self.nodes += 1
            kid.count += 1
            node.cont += 1
            b = node.best
            if b != t and node is not root and (b is None or kid.count > kids[b].count):
                node.best = t
            new.append(kid)
        self.visits += len(new)
        return new

    def remove(self, tokens: list) -> None:
        """Forget a sequence added with :meth:`extend` (the same counts, decremented)."""
        D = self.depth
        for j in range(len(tokens)):
            node = self.root
            for t in tokens[j:j + D]:
                kid = node.kids[t]
                kid.count -= 1
                node.cont -= 1
                if kid.count == 0:
                    self.nodes -= 1
                    del node.kids[t]
                if node.best == t:
                    node.best = max(node.kids, key=lambda x: node.kids[x].count) if node.kids else None
                node = kid
                self.visits += 1

    # -- lookups ---------------------------------------------------------------
    def find(self, tokens) -> _Node | None:
        """The node of a string (len <= depth), or None."""
        node = self.root
        for t in tokens:
            self.visits += 1
            if node.kids is None or t not in node.kids:
                return None
            node = node.kids[t]
        return node

    def longest_match(self, seq: list) -> tuple[_Node | None, int]:
        """The node of the longest suffix of ``seq`` (up to depth - 1 tokens) seen
        continued, and its length; (None, 0) when none is."""
        for m in range(min(self.depth - 1, len(seq)), 0, -1):
            node = self.find(seq[len(seq) - m:])
            if node is not None and node.cont > 0:
                return node, m
        return None, 0

    def walk(self, node: _Node, m: int, context: list, n: int, min_prob: float) -> tuple[list, float]:
        """Up to ``n`` tokens down the most frequent children from ``node`` (the
        string of ``context``'s last m tokens) while the path's probability stays
        >= min_prob; returns (tokens, score: the sum of the path's probabilities)."""
        out, p, score, depth = [], 1.0, 0.0, m
        while len(out) < n:
            if depth >= self.depth:              # the depth bound: re-anchor on a shorter suffix
                r = self.depth // 2
                node = self.find((list(context[-r:]) + out)[-r:])
                depth = r
                if node is None:
                    break
            if node.cont == 0 or node.best is None:
                break
            kid = node.kids[node.best]
            self.visits += 1
            p *= kid.count / node.cont
            if p < min_prob:
                break
            out.append(node.best)
            score += p
            node, depth = kid, depth + 1
        return out, score


class SuffixCache:
    """The global trie over requests' outputs, at most ``cap`` tokens: whole
    requests evicted oldest first."""

    def __init__(self, max_depth: int, cap: int):
        self.trie = SuffixTrie(max_depth)
        self.cap = int(cap)
        self.entries: OrderedDict = OrderedDict()   # id -> _Entry, oldest first
        self.tokens = 0
        self.evicted = 0
        self._next = 0

    def open(self) -> "_Entry":
        e = _Entry(self._next, self.trie.root)
        self._next += 1
        self.entries[e.id] = e
        return e

    def append(self, entry: "_Entry | None", t: int) -> "_Entry":
        """Add one token to a request's entry (a new entry if it has none yet, was evicted, or is
        another cache's: one from before ``SuffixDraft.clear()``); returns the entry."""
        if entry is None or self.entries.get(entry.id) is not entry:
            entry = self.open()
        entry.frontier = self.trie.extend(entry.frontier, t)
        entry.tokens.append(t)
        self.tokens += 1
        while self.tokens > self.cap and self.entries:
            _, old = self.entries.popitem(last=False)
            self.trie.remove(old.tokens)
            self.tokens -= len(old.tokens)
            self.evicted += 1
            old.tokens, old.frontier = [], [self.trie.root]
        return entry


class _Entry:
    __slots__ = ("id", "tokens", "frontier")

    def __init__(self, id_: int, root: _Node):
        self.id, self.tokens, self.frontier = id_, [], [root]


class SuffixDraft:
    """Suffix drafts (see the module doc): ``max_depth`` the tries' depth,
    ``cache_tokens`` the global trie's cap in tokens, ``min_prob`` the path
    probability under which drafting stops, ``spec_factor`` the most drafts per
    matched token. The global trie lives as long as this object: share one
    SuffixDraft between decoders to share it."""

    kind = "suffix"
    MAX_DEPTH = 256

    def __init__(self, max_depth: int = 24, cache_tokens: int = 16384, min_prob: float = 0.1,
                 spec_factor: float = 1.0):
        max_depth, cache_tokens = whole_number(max_depth, "suffix depth"), whole_number(cache_tokens, "suffix cache size")
        min_prob, spec_factor = real_number(min_prob, "suffix min_prob"), real_number(spec_factor, "suffix spec_factor")
        if not 2 <= max_depth <= self.MAX_DEPTH:
            raise SpecdecError(f"suffix depth must be an integer in [2, {self.MAX_DEPTH}] (got {max_depth})")
        if cache_tokens < 1:
            raise SpecdecError(f"suffix cache size must be a positive number of tokens (got {cache_tokens})")
        if not 0.0 <= min_prob <= 1.0:
            raise SpecdecError(f"suffix min_prob must be in [0, 1] (got {min_prob})")
        if not spec_factor > 0:
            raise SpecdecError(f"suffix spec_factor must be > 0 (got {spec_factor})")
        self.max_depth, self.cache_tokens = max_depth, cache_tokens
        self.min_prob, self.spec_factor = min_prob, spec_factor
        self.cache = SuffixCache(self.max_depth, self.cache_tokens)

    def clear(self) -> None:
        """Forget earlier requests (a new, empty global trie); a generation still running goes on
        in a new entry there (SuffixCache.append)."""
        self.cache = SuffixCache(self.max_depth, self.cache_tokens)

    def bind(self, tlm) -> None:
        pass   # any target: drafts are the target's own tokens

    def backends(self) -> list:
        return []

    def drafter(self, ctx) -> "SuffixDrafter":
        return SuffixDrafter(self, ctx.target_vocab)

    def __repr__(self):
        return f"SuffixDraft(max_depth={self.max_depth}, cache_tokens={self.cache_tokens})"


class SuffixDrafter:
    """One generation: its own trie (prompt + output) and its entry in the shared cache
    (its output, after the prompt's last ``LEAD`` tokens: the context an answer starts from)."""

    LEAD = 8

    def __init__(self, source: SuffixDraft, vocab: int | None):
        self.src = source
        self.vocab = vocab
        self.local = SuffixTrie(source.max_depth)
        self.frontier = [self.local.root]
        self.entry = None        # its entry in the shared cache, opened with its first token there
        self.seq: list[int] = []
        self.prompt_len = None

    def _catch_up(self, seq: list[int], q: int) -> None:
        """Index seq[len(indexed):q], the tokens not seen yet (final text: the loop's seq[:q])."""
        n = len(self.seq)
        if q < n or (n and seq[n - 1] != self.seq[-1]):
            raise AssertionError("a suffix drafter follows one growing sequence")
        cache = self.src.cache
        for i in range(n, q):
            t = int(seq[i])
            self.frontier = self.local.extend(self.frontier, t)
            self.seq.append(t)
            if i >= self.prompt_len - self.LEAD:      # the output, led in by the prompt's last tokens
                self.entry = cache.append(self.entry, t)

    def propose(self, n: int) -> list[int]:
        """Up to ``n`` drafts for the sequence indexed so far: the more confident
        of the two tries' paths."""
        if n <= 0 or not self.seq:
            return []
        src, seq = self.src, self.seq
        best, best_score = [], 0.0
        cands = []
        # the longest suffix seen continued: the deepest frontier node with a continuation. The
        # global trie holds this request's own text too, so its entry's frontier is the same
        # walk there, and it sees every other request's continuations of those strings.
        e = self.entry                           # (none yet, or one from before clear(): the root)
        shared = e.frontier if e is not None and src.cache.entries.get(e.id) is e else [src.cache.trie.root]
        for trie, f in ((self.local, self.frontier), (src.cache.trie, shared)):
            m = next((d for d in range(len(f) - 1, 0, -1) if f[d].cont > 0), 0)
            trie.visits += len(f) - m
            if m:
                cands.append((trie, f[m], m))
        for trie, node, m in cands:
            span = src.spec_factor * m           # may overflow to inf (spec_factor near 1e308)
            cap = n if span >= n else max(1, int(span))
            toks, score = trie.walk(node, m, seq, cap, src.min_prob)
            if score > best_score:
                best, best_score = toks, score
        return best

    # -- the drafter interface ----------------------------------------------
    def first(self, prompt: list[int]):
        self.prompt_len = len(prompt)
        self._catch_up(prompt, len(prompt))
        d = self.propose(1)
        return d[0] if d else None

    def draft(self, seq: list[int], q: int, n: int) -> list[int]:
        if self.prompt_len is None:      # first() not called (--k 0): the prompt is what came before
            self.prompt_len = q - 1
        self._catch_up(seq, q)
        d = self.propose(n)[:n]
        if self.vocab is not None:      # the shared trie may hold another target's ids: stop at the first
            d = d[:next((i for i, t in enumerate(d) if not 0 <= t < self.vocab), len(d))]
        return d

    def verified(self, step) -> None:
        pass   # the tries read the text itself

    def rollback(self, valid: int) -> None:
        pass   # the tries only hold accepted text

    def finish(self, seq) -> None:
        """The last round's tokens (after the last draft call) reach both tries too, so
        the next request sees this one's whole answer."""
        if self.prompt_len is None:
            return
        self._catch_up(seq, len(seq))
