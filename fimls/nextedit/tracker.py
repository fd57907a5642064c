"""Which edit each document is in the middle of: the change the user made to one line,
kept while they apply the same change elsewhere, forgotten when they edit something else.

Fed every version of a document's text. The first version is the base; a later one that
differs from the base on one line is an edit of that line (recognised by
:func:`fimls.nextedit.change.recognize`). Lines the user then changes the same way (a
proposal applied) leave the edit standing; any other change starts a new base.
"""

from __future__ import annotations

from dataclasses import dataclass

from fimls.nextedit.apply import apply
from fimls.nextedit.change import Change, recognize


@dataclass(frozen=True)
class Pending:
    """The edit a document is in: ``change`` made at ``line``."""

    change: Change
    line: int


@dataclass
class _Doc:
    base: list[str]
    last: list[str]
    pending: Pending | None = None


class EditTracker:
    """The pending edit of each open document (see the module's docstring)."""

    def __init__(self) -> None:
        self._docs: dict[str, _Doc] = {}

    def opened(self, uri: str, text: str) -> None:
        lines = text.split("\n")
        self._docs[uri] = _Doc(lines, lines)

    def closed(self, uri: str) -> None:
        self._docs.pop(uri, None)

    def pending(self, uri: str) -> Pending | None:
        doc = self._docs.get(uri)
        return doc.pending if doc else None

    def dismiss(self, uri: str) -> None:
        """The user dismissed the proposals: the current text is the new base."""
        doc = self._docs.get(uri)
        if doc is not None:
            doc.base, doc.pending = doc.last, None

    def changed(self, uri: str, text: str) -> Pending | None:
        """Take the document's new text; the edit it is in now."""
        doc = self._docs.get(uri)
        lines = text.split("\n")
        if doc is None:
            self._docs[uri] = _Doc(lines, lines)
            return None
        prev, doc.last = doc.last, lines
        if len(lines) != len(doc.base):
            doc.base, doc.pending = lines, None  # lines added or removed: start afresh
            return None
        diff = [i for i, (a, b) in enumerate(zip(doc.base, lines, strict=True)) if a != b]
        if len(diff) > 1 and not self._applied_elsewhere(doc, diff):
            doc.base = prev  # something else is being edited: the text before it is the base
            diff = [i for i, (a, b) in enumerate(zip(prev, lines, strict=True)) if a != b]
        if len(diff) == 1:
            i = diff[0]
            change = recognize(doc.base[i], lines[i])
            doc.pending = Pending(change, i) if change is not None else None
        elif not diff:
            doc.pending = None
        return doc.pending

    @staticmethod
    def _applied_elsewhere(doc: _Doc, diff: list[int]) -> bool:
        """Whether every changed line but the edit's own got the edit's change."""
        p = doc.pending
        if p is None or p.line not in diff:
            return False
        for i in diff:
            if i == p.line:
                continue
            edit = apply(p.change, doc.base[i])
            if edit is None or edit.applied(doc.base[i]) != doc.last[i]:
                return False
        return True
