"""Scoring instead of generating: how likely the model finds each of a few given middles
at a cursor (next-edit verification: the edited line against the original one there).

The prompt is the request's, evaluated as any other (what the cache holds is reused); each
middle is then read on a branch of the cache after it, one batch a middle, and its score
is the sum of its tokens' log-probabilities. Where the prompt healed its last token, the
middle is read from the healed text on.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from fimls.drafting import common_prefix_len
from fimls.engine.alternatives import BRANCH_SEQ, _log_softmax
from fimls.engine.api import CompletionRequest
from fimls.engine.kvmirror import Cancelled
from fimls.engine.parts import EngineParts
from fimls.latency import LatencyRecord

MAX_MIDDLE_TOKENS = 96  # a middle longer than this is scored on its first tokens


class Scoring(EngineParts):
    """Scoring middles (a part of :class:`fimls.engine.core.Engine`)."""

    def _score_middles(self, req: CompletionRequest, rec: LatencyRecord,
                       cancelled: Callable[[], bool]) -> list[float]:
        """The log-probability of each of ``req.score`` as the middle at the cursor."""
        prompt = self.build(req)
        toks = prompt.tokens
        common = common_prefix_len(toks, self.cache.tokens)
        rec.prompt_tokens, rec.reused_tokens = len(toks), min(common, len(toks))
        self._evaluate(toks, common)
        out = []
        try:
            for middle in req.score:
                if cancelled():
                    raise Cancelled
                out.append(self._middle_logp(toks, prompt.constraint + middle.encode(), rec))
        finally:
            self.model.kv_truncate(0, BRANCH_SEQ)
        return out

    def _middle_logp(self, toks: list[int], middle: bytes, rec: LatencyRecord) -> float:
        """``middle`` read after ``toks`` on the branch: the sum of its tokens'
        log-probabilities."""
        mid = self.vocab.tokenize(middle)[:MAX_MIDDLE_TOKENS]
        if not mid:
            return 0.0
        n0 = len(toks)
        self.model.branch(n0 - 1, BRANCH_SEQ)
        batch = [(toks[-1], n0 - 1, BRANCH_SEQ)]
        batch += [(t, n0 + i, BRANCH_SEQ) for i, t in enumerate(mid[:-1])]
        if not self.model.decode_at(batch, list(range(len(batch)))):
            raise Cancelled
        rec.alt_tokens += len(batch)
        return float(np.sum([_log_softmax(self.model.logits(i))[t]
                             for i, t in enumerate(mid)]))
