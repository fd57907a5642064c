"""Next-edit proposals for one document: its pending edit's targets in the open documents,
each verified by the model, nearest first.

The model's verdict on a target is the margin: the log-probability of the edited line
against the original one, as the middle of a FIM prompt at that line (see
:mod:`fimls.engine.scoring`). A target is proposed when the margin is above the
``nextEditMargin`` option. Verdicts are kept per place and edit: asking again does not
score the same candidate twice.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass

from fimls.config import CompletionOptions
from fimls.engine.api import CompletionRequest
from fimls.nextedit.targets import Target, find_targets
from fimls.nextedit.tracker import EditTracker

MAX_SCORED = 8  # candidates verified for one request, nearest first
MAX_VERDICTS = 1024
WINDOW = 512  # prompt tokens for verifying one candidate

# (target, the lines of its document to score it in) -> the margin, or None when the
# engine cannot score (a remote engine).
ScoreFn = Callable[[Target, Sequence[str]], Awaitable[float | None]]


@dataclass(frozen=True)
class Proposal:
    """Replace columns ``start`` to ``end`` (code points) of ``line`` in ``uri`` with
    ``text``; ``confidence`` is the model's preference for it over the line as it is."""

    uri: str
    line: int
    start: int
    end: int
    text: str
    confidence: float


class NextEdits:
    """The tracker of pending edits and the verdicts on their targets."""

    def __init__(self, margin: float) -> None:
        self.tracker = EditTracker()
        self.margin = margin
        self._verdicts: dict[tuple[str, int, str, int], float] = {}

    async def propose(self, uri: str, docs: Mapping[str, Sequence[str]],
                      score: ScoreFn) -> list[Proposal]:
        """The verified targets of ``uri``'s pending edit (``docs``: uri -> lines of every
        open document).

        Each target is scored in its document as it would be with the targets proposed
        before it applied: the user takes them one after another, and a line after an
        applied one reads its new form (``return size`` is likelier once the line above
        says ``print(total)``).
        """
        pending = self.tracker.pending(uri)
        if pending is None:
            return []
        out: list[Proposal] = []
        world = {u: list(lines) for u, lines in docs.items()}
        for t in find_targets(pending.change, docs, uri, pending.line)[:MAX_SCORED]:
            margin = await self._verdict(t, world[t.uri], score)
            if margin is not None and margin > self.margin:
                out.append(Proposal(t.uri, t.line, t.edit.start, t.edit.end, t.edit.text,
                                    round(1.0 / (1.0 + math.exp(-margin)), 4)))
                world[t.uri][t.line] = t.new_line
        return out

    async def _verdict(self, t: Target, lines: Sequence[str], score: ScoreFn) -> float | None:
        key = (t.uri, t.line, t.new_line, hash(tuple(lines)))
        if key in self._verdicts:
            return self._verdicts[key]
        margin = await score(t, lines)
        if margin is not None:
            if len(self._verdicts) >= MAX_VERDICTS:
                self._verdicts.clear()
            self._verdicts[key] = margin
        return margin


def scoring_request(t: Target, lines: Sequence[str], options: CompletionOptions, *,
                    version: int | None, repo_name: str | None, rel_path: str,
                    max_chars: int) -> CompletionRequest:
    """The engine request that scores ``t`` (the original line, then the edited one) as
    the middle at its line of ``lines`` (at most ``max_chars`` of text on each side)."""
    before = "".join(x + "\n" for x in lines[:t.line])
    prefix = before[-max_chars:]
    return CompletionRequest.from_options(
        options, uri=t.uri, version=version, prefix=prefix,
        suffix="\n".join(lines[t.line + 1:])[:max_chars], prefix_offset=len(before) - len(prefix),
        repo_name=repo_name, rel_path=rel_path, score=[t.old_line + "\n", t.new_line + "\n"],
        window=WINDOW)
