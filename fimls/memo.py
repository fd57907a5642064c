"""Typing what was suggested costs nothing: the rest of the shown suggestion, from memory.

With a FIM model every typed character changes the tokens before the suffix, so the KV
path that serves this in continuation mode (see ``fimls.engine.core``) does not exist. The
text does: when the user types the start of the suggestion last shown for a document, the
cursor moved forward by exactly that text and the suffix is unchanged, so the rest of that
suggestion is the answer, with no model work. Plain strings in, plain strings out.
"""

from __future__ import annotations

from dataclasses import dataclass

_TAIL = 256  # characters of text before the cursor that must be unchanged
_HEAD = 1024  # characters of text after the cursor that must be unchanged
_MAX_DOCS = 64
_PER_DOC = 2  # the suggestion shown, and the one prefetched for after accepting it


@dataclass(frozen=True, kw_only=True)
class _Shown:
    cursor: int  # the cursor's offset in the document (prefix_offset + len(prefix))
    before: str  # the last _TAIL characters before the cursor
    after: str  # the first _HEAD characters after it
    text: str  # the suggestion as shown (finalized)


class SuggestionMemo:
    """The last suggestion shown per document (and the one prefetched for after it), and
    what remains of it after typing."""

    def __init__(self) -> None:
        self._shown: dict[str, list[_Shown]] = {}

    def remember(self, uri: str, prefix: str, prefix_offset: int, suffix: str,
                 text: str, *, keep: bool = False) -> None:
        """Keep ``text``, suggested at the cursor between ``prefix`` and ``suffix``; an
        empty suggestion forgets the document's. ``keep``: keep the earlier one too (a
        prefetched suggestion for after accepting the shown one)."""
        entries = self._shown.pop(uri, [])
        if not keep:
            entries = []
        if text.strip():
            entries.append(_Shown(cursor=prefix_offset + len(prefix), before=prefix[-_TAIL:],
                                  after=suffix[:_HEAD], text=text))
        if entries:
            self._shown[uri] = entries[-_PER_DOC:]
        while len(self._shown) > _MAX_DOCS:
            self._shown.pop(next(iter(self._shown)))

    def forget(self, uri: str) -> None:
        """Drop the document's suggestions (closed, or its text replaced)."""
        self._shown.pop(uri, None)

    def recall(self, uri: str, prefix: str, prefix_offset: int, suffix: str) -> str | None:
        """The rest of a remembered suggestion of the document when the text typed since
        is its start (and nothing else around the cursor changed), else None."""
        for shown in reversed(self._shown.get(uri, [])):
            rest = self._rest(shown, prefix, prefix_offset, suffix)
            if rest is not None:
                return rest
        return None

    @staticmethod
    def _rest(shown: _Shown, prefix: str, prefix_offset: int, suffix: str) -> str | None:
        typed_len = prefix_offset + len(prefix) - shown.cursor
        if typed_len < 0 or typed_len > len(prefix) or typed_len >= len(shown.text):
            return None
        typed = prefix[len(prefix) - typed_len:]
        rest = shown.text[typed_len:]
        if not shown.text.startswith(typed) or not rest.strip():
            return None
        if suffix[:_HEAD] != shown.after:
            return None
        head = prefix[:len(prefix) - typed_len]
        n = min(len(head), len(shown.before))
        if head[len(head) - n:] != shown.before[len(shown.before) - n:]:
            return None
        return rest
