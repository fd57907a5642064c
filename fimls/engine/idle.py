"""Work done before a request needs it: evaluating at idle the prompt the next request
most likely reads (the file's opening, the cursor's prompt), and, after an edit before the
cursor, moving the cached suffix instead of recomputing it."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from fimls.drafting import common_prefix_len
from fimls.engine.api import CompletionRequest, Prefill
from fimls.engine.kvmirror import Cancelled
from fimls.engine.parts import EngineParts
from fimls.latency import LatencyRecord
from fimls.prompt import PromptInput, opening_prompt

log = logging.getLogger(__name__)

# The suffix's first tokens (<suf> and about a line) are evaluated again after an edit
# before the cursor: they say most about what the gap holds, and kept from the cache they
# would still describe the old gap. Only the rest of the suffix is moved.
SUFFIX_FRESH_TOKENS = 16
# Idle prefill evaluates this many tokens per batch: a real request aborts the batch in
# flight, so smaller batches waste less; much smaller ones prefill slower.
IDLE_PREFILL_CHUNK = 128


class IdleWork(EngineParts):
    """Idle prefill and suffix reuse (a part of :class:`fimls.engine.core.Engine`)."""

    def _reuse_suffix(self, tokens: list[int], common: int, rec: LatencyRecord,
                      cancelled: Callable[[], bool]) -> int:
        """After an edit before the cursor, move the cached suffix instead of recomputing it.

        A PSM prompt is ``... <pre> prefix <suf> suffix <mid>``: typing changes the prefix's
        last tokens, so the cache agrees with the new prompt only up to the cursor, yet the
        suffix's entries are there, at positions off by the edit's length. Everything from
        the first difference on is parked aside (llama.cpp evaluates a sequence only after
        its last position), the new prefix and the suffix's first ``SUFFIX_FRESH_TOKENS``
        are evaluated in the gap, the rest of the suffix is moved back to its new
        positions, and ``<mid>`` is evaluated for its logits. Stopped in the gap, the cache
        is put back as it was. Returns how many leading prompt tokens the cache now holds.
        The moved entries attended to the old prefix: an approximation, off with
        ``reuseSuffix: false``.
        """
        span = self._suffix_span(tokens, common)
        if span is None:
            return common
        new_at, old_at, length = span
        n, mid = len(tokens), self.template.mid
        fresh = min(length, SUFFIX_FRESH_TOKENS)
        if cancelled():
            raise Cancelled
        self.cache.truncate(old_at + length)
        self.model.park(common, old_at + length)
        todo = tokens[common:new_at + fresh]
        t0 = time.perf_counter()
        try:
            done = self.model.prefill(todo, common, logits_last=False)
        except BaseException:
            self.model.drop_parked()
            self.cache.truncate(common)
            raise
        if done < len(todo):
            # Stopped in the gap: the cache as it was (nothing was moved yet).
            self.model.kv_truncate(common)
            self.model.unpark(0)
            raise Cancelled
        self.cache.evaluated += done
        self._observe_prefill(done, time.perf_counter() - t0)
        self.model.drop_parked(common, old_at + fresh)  # replaced by what was just evaluated
        self.model.unpark(new_at - old_at)
        # llama.cpp applies the move in the next decode, re-rotating the keys layer by
        # layer in place: aborted half-way, some layers would be rotated twice on the next
        # try. So this one decode (one token) cannot be aborted.
        with self.model.unabortable():
            ok = self.model.decode([mid], n - 1, [0])
        if not ok:
            self.model.kv_truncate(common)
            self.cache.truncate(common)
            raise Cancelled
        self.cache.adopt_moved(tokens, common)
        rec.shifted_tokens = length - fresh
        rec.prompt_ms = (time.perf_counter() - t0) * 1000.0
        return n

    def _suffix_span(self, tokens: list[int], common: int) -> tuple[int, int, int] | None:
        """Where the suffix (``<suf>`` on, before ``<mid>``) starts in ``tokens`` and in the
        cache, and its length; None when there is little to keep or it changed."""
        suf, mid = self.template.suf, self.template.mid
        try:
            new_at = tokens.index(suf, common)
            old_at = self.cache.tokens.index(suf, common)
        except ValueError:
            return None
        if mid < 0 or tokens[-1] != mid:
            return None
        length = len(tokens) - 1 - new_at  # <suf> and the suffix; <mid> is evaluated again
        fresh = min(length, SUFFIX_FRESH_TOKENS)
        if (length - fresh < SUFFIX_FRESH_TOKENS
                or self.cache.tokens[old_at:old_at + length] != tokens[new_at:new_at + length]):
            return None
        return new_at, old_at, length

    def _prefill_idle(self, req: CompletionRequest, rec: LatencyRecord,
                      cancelled: Callable[[], bool]) -> None:
        """Evaluate, while the user is idle, the prompt the next request most likely needs.

        ``open``: the file's opening (the cursor is not known yet); ``cursor``: the whole
        prompt at the cursor. Small batches, each kept as soon as it is done: a real request
        stops this at once (mid-batch, through the abort callback) and loses only the batch
        in flight, and reuses whatever was evaluated before it.
        """
        if req.prefill == Prefill.CURSOR:
            self._prefill_cursor(req, rec, cancelled)
            return
        tokens, alt = self._opening(req)
        common = common_prefix_len(tokens, self.cache.tokens)
        rec.prompt_tokens = len(tokens)
        rec.reused_tokens = common
        self.cache.evaluated = 0
        if common < len(tokens):
            self.cache.truncate(common)
            t0 = time.perf_counter()
            done = self.model.prefill(tokens[common:], common, logits_last=False,
                                      chunk=IDLE_PREFILL_CHUNK)
            dt = time.perf_counter() - t0
            self.cache.extend(tokens[common:common + done])
            rec.evaluated_tokens = done
            rec.prompt_ms = dt * 1000.0
            if done < len(tokens) - common:
                raise Cancelled
            self._observe_prefill(done, dt)
        if alt is not None:
            rec.second_tokens += self._evaluate_alt(alt, chunk=IDLE_PREFILL_CHUNK)
        self._catch_up_draft(req, tokens, cancelled)

    def _opening(self, req: CompletionRequest) -> tuple[list[int], list[int] | None]:
        """The file's opening as a prompt, and the second reading's opening when that is
        to be read too (see _second_plan)."""
        inp = PromptInput(prefix=req.prefix, suffix="", repo_name=req.repo_name,
                          rel_path=req.rel_path, context=tuple(req.context),
                          context_tokens=req.context_tokens)
        tokens = self._sized(
            lambda budget: opening_prompt(self.template, self.vocab, inp, budget),
            lambda t: t, req.max_tokens)
        room = self.model.n_ctx - 2 * req.max_tokens - 16
        if len(tokens) + len(self.cache.alt) > room:
            self.cache.truncate_alt(0)  # (as in _second_plan)
        if (req.second_reading and self.template.kind == "fim" and req.context
                and 2 * len(tokens) <= room):
            # Read once the first's is read.
            return tokens, opening_prompt(self.template, self.vocab, inp,
                                          self.prompt_budget(req.max_tokens),
                                          without_context=True)
        return tokens, None

    def _prefill_cursor(self, req: CompletionRequest, rec: LatencyRecord,
                        cancelled: Callable[[], bool]) -> None:
        """The whole prompt at the cursor, and the greedy choice after it: the request
        then starts decoding."""
        st = self._start(req, rec, cancelled)
        if st is None:
            return
        tokens, common, alt = st.seq, st.common, st.alt
        rec.evaluated_tokens = self.cache.evaluated  # (moving the suffix evaluates the gap)
        t0 = time.perf_counter()
        try:
            if common < len(tokens):
                self._evaluate(tokens, common, chunk=IDLE_PREFILL_CHUNK)
            if alt is not None:
                # The second reading too, so that the request here finds both read.
                rec.second_tokens += self._evaluate_alt(alt, chunk=IDLE_PREFILL_CHUNK)
        finally:
            rec.evaluated_tokens = self.cache.evaluated
            rec.prompt_ms = (time.perf_counter() - t0) * 1000.0
        self._catch_up_draft(req, tokens, cancelled)

    def _catch_up_draft(self, req: CompletionRequest, tokens: list[int],
                        cancelled: Callable[[], bool]) -> None:
        """After the main model's idle work, the draft model evaluates the same tokens
        (stopped by a request like the rest), so the next request may draft with it."""
        dm = self.draft_model
        if dm is None or req.speculative not in ("auto", "model") or not tokens:
            return
        try:
            dm.catch_up(tokens, cancelled, IDLE_PREFILL_CHUNK)
        except Exception:
            log.exception("the draft model's idle catch-up failed")
            dm.reset()
