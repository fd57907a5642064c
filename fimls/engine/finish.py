"""What every engine does to a raw generation before it is shown, written once for the
local engine and the remote one: the first line's confidence, post-processing, the memo
(a suggestion the gate hides is remembered too: typing it anyway then finds it), the
gate and the outcome."""

from __future__ import annotations

from collections.abc import Sequence

from fimls.engine.api import CompletionRequest, gate
from fimls.latency import LatencyRecord, Outcome
from fimls.memo import SuggestionMemo
from fimls.postprocess import CursorContext, finalize


def record_confidence(rec: LatencyRecord, probs: Sequence[float]) -> None:
    """The first line's confidence: its least likely greedy token, and their mean."""
    if probs:
        rec.confidence = round(min(probs), 4)
        rec.confidence_mean = round(sum(probs) / len(probs), 4)


def finish(raw: str, ctx: CursorContext, req: CompletionRequest, rec: LatencyRecord,
           memo: SuggestionMemo | None, *, keep: bool = False) -> str:
    """The suggestion to show for ``raw``: post-processed, remembered in ``memo`` (kept
    past the next request with ``keep``: a prefetch), then gated ("" when hidden)."""
    text = finalize(raw, ctx)
    if memo is not None:
        memo.remember(req.uri, req.prefix, req.prefix_offset, req.suffix, text, keep=keep)
    return gate(text, rec, req.min_confidence)


def set_outcome(rec: LatencyRecord, text: str) -> None:
    """``returned`` or ``empty``, unless the request already has its outcome."""
    if rec.outcome not in ("cancelled", "gated"):
        rec.outcome = Outcome.RETURNED if text else Outcome.EMPTY
