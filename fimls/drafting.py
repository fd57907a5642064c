"""Draft proposers for speculative decoding, and the cost model that decides when to use them.

A drafter proposes the next few tokens cheaply; the main model verifies them all in one
batched forward pass and keeps the longest prefix it agrees with. Drafts that are rarely
right cost more than they save (on a CPU a verify batch of 5 costs about 2 single steps
for a 262k-token vocabulary), so :class:`DraftPolicy` sizes every draft from measured batch
costs and the recent acceptance of each source, and drafts nothing when the expected gain
is not positive.

Sources, best first: the unaccepted tail of the previous suggestion for the document (the
model's own words: accepted almost always when the user types what was suggested), the
text around the cursor including the suffix (FIM models often re-emit what follows the
cursor), other open buffers, and optionally a small draft model with the same vocabulary.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar, Protocol

import numpy as np
import numpy.typing as npt

IntArray = npt.NDArray[np.int32]


def common_prefix_len(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens ``a`` and ``b`` share (how much of a cache serves a prompt)."""
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


@dataclass(frozen=True)
class Draft:
    """Proposed tokens, which source proposed them, and how long the matched key was."""

    tokens: list[int]
    source: str
    match_len: int = 0


class DraftModel(Protocol):
    """Anything that proposes up to ``n`` next tokens for a token history."""

    def propose(self, history: Sequence[int], n: int) -> Draft | None: ...


def _as_array(tokens: Sequence[int] | IntArray) -> IntArray:
    return np.asarray(tokens, dtype=np.int32)


def find_continuation(source: IntArray, key: IntArray, n: int,
                      exclude_tail: bool = False, near: int | None = None) -> list[int] | None:
    """Tokens following an occurrence of ``key`` in ``source`` (at most ``n``): the last
    one, or with ``near``, the one whose continuation starts closest to that index.

    Vectorised: candidate positions come from one comparison on the key's last token, then
    the remaining key tokens filter them. Well under a millisecond for 8k-token sources.
    """
    k = len(key)
    m = len(source)
    if k == 0 or m <= k:
        return None
    limit = m - k if not exclude_tail else m - k - 1
    if limit <= 0:
        return None
    # Positions where the key could end (its last token) with at least one token after.
    cand = np.flatnonzero(source[k - 1:k - 1 + limit] == key[-1])
    for j in range(k - 1):
        if cand.size == 0:
            return None
        cand = cand[source[cand + j] == key[j]]
    if cand.size == 0:
        return None
    if near is None:
        start = int(cand[-1]) + k  # the nearest (latest) occurrence predicts best
    else:
        # A source that runs alongside the output (the previous suggestion): repeated
        # lines occur many times in it, and the one at the same place is the one meant.
        start = int(cand[int(np.argmin(np.abs(cand + k - near)))]) + k
    out = source[start:start + n]
    return [int(t) for t in out] if out.size else None


@dataclass
class PromptLookupDraft:
    """Prompt-lookup decoding: find the last k tokens earlier in known text, propose what
    followed. Longer keys are tried first (a longer match predicts acceptance better)."""

    max_ngram_size: int = 3
    num_pred_tokens: int = 8
    min_ngram_size: int = 1
    sources: dict[str, IntArray] = field(default_factory=dict)

    def set_source(self, name: str, tokens: Sequence[int] | IntArray) -> None:
        """Replace one named source (e.g. "tail", "suffix", "context", "buffers")."""
        self.sources[name] = _as_array(tokens)

    def clear(self) -> None:
        """Forget all sources."""
        self.sources.clear()

    def propose(self, history: Sequence[int], n: int, *,
                tail_pos: int | None = None) -> Draft | None:
        """Draft from the source order given by insertion, longest key first.

        ``tail_pos``: how many tokens this request generated so far; in the "tail" source
        (the previous suggestion) the match nearest that index is taken, not the last.
        """
        n = min(n, self.num_pred_tokens)
        if n <= 0 or not history:
            return None
        hist = _as_array(history[-self.max_ngram_size:])
        for k in range(min(self.max_ngram_size, len(hist)), self.min_ngram_size - 1, -1):
            key = hist[-k:]
            for name, src in self.sources.items():
                # The "context" source is the prompt itself: its own end trivially matches.
                got = find_continuation(src, key, n, exclude_tail=(name == "context"),
                                        near=tail_pos if name == "tail" else None)
                if got:
                    return Draft(got, name, k)
        return None


@dataclass
class SourceStats:
    """Exponentially weighted acceptance of one draft source."""

    prior: float
    rate: float = -1.0
    weight: float = 0.0

    def estimate(self) -> float:
        """Per-token acceptance probability, shrunk towards the prior while data is scarce."""
        if self.weight <= 0:
            return self.prior
        w = min(self.weight, 20.0) / 20.0
        return w * self.rate + (1 - w) * self.prior

    def update(self, drafted: int, accepted: int) -> None:
        """Account one verification: ``accepted`` of ``drafted`` tokens were kept."""
        if drafted <= 0:
            return
        # Per-token probability p from a geometric run: accepted / (accepted + 1 miss).
        miss = 0 if accepted == drafted else 1
        p = accepted / (accepted + miss) if accepted + miss else 0.0
        if self.rate < 0:
            self.rate = p
        else:
            self.rate = 0.85 * self.rate + 0.15 * p
        self.weight += 1


def monotone(costs: dict[int, float]) -> dict[int, float]:
    """The closest non-decreasing cost table (pool adjacent violators), floored at 1.

    A longer verify batch never really costs less than a shorter one; a table that says
    so was measured on a busy machine, and averaging the violators keeps its information
    instead of trusting either outlier.
    """
    keys = sorted(costs)
    blocks: list[list[float]] = []  # [sum, count] per pooled block
    for k in keys:
        blocks.append([max(1.0, costs[k]), 1.0])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] > blocks[-1][0] / blocks[-1][1]:
            s, c = blocks.pop()
            blocks[-1][0] += s
            blocks[-1][1] += c
    out: list[float] = []
    for s, c in blocks:
        out += [s / c] * int(c)
    return dict(zip(keys, out, strict=True))


@dataclass
class Timing:
    """A running estimate of one operation's wall time, robust to a busy machine.

    Each sample moves the estimate by ``alpha`` of the way, after clipping it to
    [0.5x, 2x] of the estimate: a stall (another process, a page fault) cannot swing it.
    """

    seconds: float = 0.0
    samples: int = 0
    alpha: float = 0.2

    def add(self, seconds: float) -> None:
        """Account one measurement."""
        if seconds <= 0:
            return
        if self.samples == 0:
            self.seconds = seconds
        else:
            clipped = min(max(seconds, 0.5 * self.seconds), 2.0 * self.seconds)
            self.seconds += self.alpha * (clipped - self.seconds)
        self.samples += 1


@dataclass
class DraftPolicy:
    """Chooses the draft length that maximises expected tokens per unit of compute.

    ``cost(k)`` is what verifying k drafted tokens (k+1 positions) costs relative to one
    single-token step. It starts from ``prior`` (measured at the first start and cached,
    or the previous session's learned table) and then learns from every real step and
    verify batch the engine times (:meth:`observe`): no single measurement on a busy
    machine decides drafting for good. With per-token acceptance p, a draft of k yields
    1 + p(1-p^k)/(1-p) tokens for ``cost(k)``; plain decoding yields 1 for 1. Drafting
    happens only when the best k beats plain decoding by ``margin``; every
    ``explore_every``-th refusal verifies anyway, so lengths the prior priced out still
    get measured.
    """

    prior: dict[int, float] = field(default_factory=lambda: {0: 1.0})
    max_draft: int = 16
    margin: float = 1.05
    explore_every: int = 16
    stats: dict[str, SourceStats] = field(default_factory=dict)
    timings: dict[int, Timing] = field(default_factory=dict)
    draft_step: Timing = field(default_factory=Timing)
    draft_step_prior: float = 1.0
    _refusals: int = 0

    PRIORS: ClassVar[dict[str, float]] = {"tail": 0.9, "model": 0.7, "suffix": 0.45,
                                          "context": 0.4, "buffers": 0.35}
    # Learned samples of a length before they outweigh the prior entirely.
    FULL_WEIGHT: ClassVar[int] = 8

    def source(self, name: str) -> SourceStats:
        """The statistics of one source (created with its prior on first use)."""
        st = self.stats.get(name)
        if st is None:
            st = self.stats[name] = SourceStats(prior=self.PRIORS.get(name, 0.4))
        return st

    # -- costs --------------------------------------------------------------------------

    def observe(self, k: int, seconds: float) -> None:
        """Account one timed evaluation: a plain step (k=0) or a verify of k drafts."""
        self.timings.setdefault(k, Timing()).add(seconds)

    def observe_draft(self, seconds: float, steps: int) -> None:
        """Account one draft model proposal of ``steps`` tokens."""
        if steps > 0:
            self.draft_step.add(seconds / steps)

    @property
    def batch_cost(self) -> dict[int, float]:
        """The current cost table: the prior, moved towards what was measured."""
        step = self.timings.get(0)
        table = dict(self.prior)
        table.setdefault(0, 1.0)
        if step is not None and step.samples:
            for k, t in self.timings.items():
                if k == 0 or not t.samples:
                    continue
                w = min(t.samples, self.FULL_WEIGHT) / self.FULL_WEIGHT
                w *= min(step.samples, self.FULL_WEIGHT) / self.FULL_WEIGHT
                learned = t.seconds / step.seconds
                table[k] = w * learned + (1 - w) * table.get(k, self._extrapolate(table, k))
        table[0] = 1.0
        return monotone(table)

    @property
    def draft_step_cost(self) -> float:
        """A draft model's step relative to the main model's, learned like batch costs."""
        step = self.timings.get(0)
        if step is None or not step.samples or not self.draft_step.samples:
            return self.draft_step_prior
        w = min(self.draft_step.samples, self.FULL_WEIGHT) / self.FULL_WEIGHT
        return w * self.draft_step.seconds / step.seconds + (1 - w) * self.draft_step_prior

    @staticmethod
    def _extrapolate(table: dict[int, float], k: int) -> float:
        keys = sorted(table)
        lo = max((x for x in keys if x <= k), default=keys[0])
        hi = min((x for x in keys if x >= k), default=keys[-1])
        if hi == lo:
            # Beyond the known range: extrapolate linearly from the last two points.
            if len(keys) >= 2 and k > keys[-1]:
                a, b = keys[-2], keys[-1]
                slope = (table[b] - table[a]) / max(1, b - a)
                return table[b] + slope * (k - b)
            return table[lo] * (k + 1) / (lo + 1)
        t = (k - lo) / (hi - lo)
        return table[lo] * (1 - t) + table[hi] * t

    def cost(self, k: int) -> float:
        """Cost of verifying k drafted tokens (k+1 positions), interpolated."""
        return self._extrapolate(self.batch_cost, k)

    # -- choice -------------------------------------------------------------------------

    @staticmethod
    def expected_tokens(p: float, k: int) -> float:
        """Tokens one verification of a k-token draft yields, acceptance p per token."""
        if p >= 1.0:
            return 1.0 + k
        return 1.0 + p * (1 - p ** k) / (1 - p)

    def choose(self, source: str, available: int, match_len: int = 0, *,
               extra_cost: float = 0.0, force: bool = False) -> int:
        """How many of ``available`` drafted tokens to verify (0: decode plainly).

        ``extra_cost`` is the cost of producing each drafted token (a draft model's step,
        relative to the main model's). ``force`` (the user asked for this drafter) picks
        the best length even when it does not beat plain decoding.
        """
        p = self.source(source).estimate()
        if match_len >= 3 and source != "tail":
            p = min(0.95, p + 0.1)  # a long matched key predicts agreement
        table = self.batch_cost
        best_k, best = 0, 1.0
        forced_k, forced = 0, -1.0
        for k in range(1, min(available, self.max_draft) + 1):
            gain = self.expected_tokens(p, k) / (self._extrapolate(table, k)
                                                 + extra_cost * k)
            if gain > best:
                best_k, best = k, gain
            if gain > forced:
                forced_k, forced = k, gain
        if force:
            return best_k or forced_k
        if best >= self.margin:
            return best_k
        self._refusals += 1
        if forced_k and self.explore_every and self._refusals % self.explore_every == 0:
            return forced_k
        return 0

    def record(self, source: str, drafted: int, accepted: int) -> None:
        """Feed back one verification's outcome."""
        self.source(source).update(drafted, accepted)


def check_vocab_compatible(a_name: str, a_texts: Sequence[bytes], b_name: str,
                           b_texts: Sequence[bytes]) -> str | None:
    """Why two vocabularies cannot share drafts, or None if they can.

    Draft tokens are passed to the main model by id, so ids must mean the same text.
    """
    if len(a_texts) != len(b_texts):
        return (f"draft model {b_name} has {len(b_texts)} tokens but {a_name} has "
                f"{len(a_texts)}: the vocabularies differ")
    for i, (x, y) in enumerate(zip(a_texts, b_texts, strict=True)):
        if x != y:
            return (f"draft model {b_name} and {a_name} disagree on token {i} "
                    f"({y!r} vs {x!r}): the tokenizers differ")
    return None


def top_probability(logits: npt.NDArray[np.float32]) -> tuple[int, float]:
    """The argmax token and its softmax probability."""
    i = int(np.argmax(logits))
    m = float(logits[i])
    z = float(np.exp(logits - m).sum())
    return i, 1.0 / z if z > 0 and math.isfinite(z) else 0.0
