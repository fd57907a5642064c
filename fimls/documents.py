"""An in-memory mirror of the text documents an LSP client has open.

This module is deliberately independent of pygls and lsprotocol: it works on plain
strings, plain ints and a tiny `Pos` dataclass, so it can be unit-tested exhaustively
and reused by any transport.

Conventions follow the LSP specification:

* A document is a Python ``str``; offsets returned here are indices into that string
  (i.e. counted in code points).
* Only ``"\\n"``, ``"\\r\\n"`` and ``"\\r"`` end a line. ``str.splitlines`` also splits
  on ``"\\f"``, ``"\\v"``, ``"\\x1c"``-``"\\x1e"``, ``"\\x85"``, U+2028 and U+2029, which
  would put us out of sync with the client, so it is never used.
* A position's ``character`` counts code units of the negotiated position encoding
  (UTF-16 unless the client agreed to something else).
* Out-of-range positions are clamped, never rejected: clients do send them (stale
  edits, races with typing) and a completion server must not crash on them.
"""

from __future__ import annotations

import bisect
import posixpath
import re
from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum
from typing import TypeAlias
from urllib.parse import unquote, urlparse

__all__ = [
    "UTF8",
    "UTF16",
    "UTF32",
    "Change",
    "DocumentStore",
    "Pos",
    "PositionEncoding",
    "Range",
    "TextDocument",
    "coerce_encoding",
    "file_path",
    "split_lines",
    "workspace_relative_path",
]


class PositionEncoding(str, Enum):
    """The unit in which an LSP position's ``character`` is counted."""

    UTF8 = "utf-8"
    UTF16 = "utf-16"
    UTF32 = "utf-32"


UTF8 = PositionEncoding.UTF8
UTF16 = PositionEncoding.UTF16
UTF32 = PositionEncoding.UTF32


@dataclass(frozen=True, order=True, slots=True)
class Pos:
    """A zero-based LSP position: ``character`` is in code units of some encoding."""

    line: int
    character: int


Range: TypeAlias = tuple[Pos, Pos]
"""An LSP range ``(start, end)``; end is exclusive."""

Change: TypeAlias = tuple[str, Range | None]
"""One content change: new text plus the replaced range, or ``None`` for the whole text."""

_EOL_RE = re.compile(r"\r\n|\r|\n")
# Astral code points are the only ones that take two UTF-16 code units.
_ASTRAL_RE = re.compile("[\U00010000-\U0010ffff]")
_HIGH_SURROGATE_BYTES = bytes(range(0xD8, 0xDC))
_UTF8_CONTINUATION_BYTES = bytes(range(0x80, 0xC0))


def coerce_encoding(encoding: PositionEncoding | str | None) -> PositionEncoding:
    """Return the `PositionEncoding` for ``encoding``.

    ``None`` and unknown names give UTF-16: it is the encoding every LSP client must
    support, so it is the safest guess and avoids crashing on a malformed value.
    """
    if isinstance(encoding, PositionEncoding):
        return encoding
    if encoding is None:
        return UTF16
    try:
        return PositionEncoding(str(encoding).lower())
    except ValueError:
        return UTF16


def split_lines(text: str) -> list[str]:
    """Split ``text`` into lines on LSP line ends only, dropping the terminators.

    ``"a\\r\\nb"`` gives ``["a", "b"]``; a trailing line end gives a final empty line,
    and ``""`` gives ``[""]``, matching how LSP counts lines.
    """
    return _EOL_RE.split(text)


def _line_starts(text: str) -> list[int]:
    return [0, *(m.end() for m in _EOL_RE.finditer(text))]


def _utf16_index(text: str, start: int, end: int, units: int) -> int:
    """String index of UTF-16 column ``units`` in ``text[start:end]`` (rounding down)."""
    # Every code point takes at least one unit, so the answer lies below start + units:
    # never touch more of a long line than the column requires.
    stop = min(end, start + units)
    segment = text[start:stop]
    if segment.isascii():
        return stop
    # Encoding runs at memcpy-like speed, far faster than scanning with a regex or a
    # Python loop; the strict codec also tells us when lone surrogates are present.
    try:
        raw = segment.encode("utf-16-le")
    except UnicodeEncodeError:
        return _utf16_index_exact(text, start, stop, units)
    if len(raw) == 2 * len(segment):
        return stop  # BMP only: units and code points coincide
    cut = min(units * 2, len(raw))
    if cut < len(raw) and 0xDC00 <= int.from_bytes(raw[cut : cut + 2], "little") <= 0xDFFF:
        cut -= 2  # the column splits a surrogate pair: round down to its start
    # Code points = units - pairs; a pair starts with a high surrogate, whose high byte
    # (little-endian: the odd one) is 0xD8-0xDB. Counting bytes beats decoding.
    high_bytes = raw[1:cut:2]
    pairs = len(high_bytes) - len(high_bytes.translate(None, _HIGH_SURROGATE_BYTES))
    return start + cut // 2 - pairs


def _utf16_index_exact(text: str, start: int, stop: int, units: int) -> int:
    """Like `_utf16_index` but correct even with lone surrogates in the text.

    A str may hold an unpaired high surrogate next to an unpaired low one; encoding them
    would fuse them into one code point, so this walks the astral characters instead.
    """
    extra = 0
    for match in _ASTRAL_RE.finditer(text, start, stop):
        # Each astral code point before the target costs one extra unit; a column
        # inside a pair lands, after that subtraction, on the pair's start.
        if units <= match.start() - start + extra:
            break
        extra += 1
    return min(start + units - extra, stop)


def _utf8_index(text: str, start: int, end: int, units: int) -> int:
    """String index of UTF-8 column ``units`` in ``text[start:end]`` (rounding down)."""
    stop = min(end, start + units)
    segment = text[start:stop]
    if segment.isascii():
        return stop
    # surrogatepass keeps lone surrogates (legal in a str) from raising; they count as
    # the three bytes their code point would take.
    raw = segment.encode("utf-8", "surrogatepass")
    if units >= len(raw):
        return stop
    cut = units
    while cut > 0 and raw[cut] & 0xC0 == 0x80:
        cut -= 1  # inside a multi-byte sequence: round down to its lead byte
    # Every code point has exactly one non-continuation byte; counting them beats decoding.
    return start + len(raw[:cut].translate(None, _UTF8_CONTINUATION_BYTES))


def _units(segment: str, encoding: PositionEncoding) -> int:
    """Length of ``segment`` in code units of ``encoding``."""
    if encoding is UTF32 or segment.isascii():
        return len(segment)
    if encoding is UTF16:
        return len(segment.encode("utf-16-le", "surrogatepass")) // 2
    return len(segment.encode("utf-8", "surrogatepass"))


class TextDocument:
    """One open document: its identity, version and current text.

    The line-start index is built lazily and kept up to date incrementally by
    `apply_change`, so per-keystroke edits and position conversions stay cheap even for
    multi-megabyte documents.
    """

    __slots__ = ("_starts", "_text", "language_id", "uri", "version")

    def __init__(self, uri: str, language_id: str, version: int, text: str) -> None:
        """Create a document; ``text`` is taken verbatim (no line-end normalisation)."""
        self.uri = uri
        self.language_id = language_id
        self.version = version
        self._text = text
        self._starts: list[int] | None = None

    def __repr__(self) -> str:
        """Short representation that does not dump the whole text."""
        return (
            f"TextDocument(uri={self.uri!r}, language_id={self.language_id!r}, "
            f"version={self.version}, len={len(self._text)})"
        )

    @property
    def text(self) -> str:
        """The full current text."""
        return self._text

    @text.setter
    def text(self, value: str) -> None:
        self._text = value
        self._starts = None

    @property
    def line_count(self) -> int:
        """Number of lines; an empty document or a trailing line end still counts one."""
        return len(self._index())

    def _index(self) -> list[int]:
        if self._starts is None:
            self._starts = _line_starts(self._text)
        return self._starts

    def _line_bounds(self, line: int) -> tuple[int, int]:
        """``(start, end)`` of ``line``'s content, excluding its terminator."""
        starts = self._index()
        start = starts[line]
        if line + 1 >= len(starts):
            return start, len(self._text)
        end = starts[line + 1] - 1
        if end > start and self._text[end] == "\n" and self._text[end - 1] == "\r":
            end -= 1
        return start, end

    def line_text(self, line: int) -> str:
        """Text of ``line`` without its terminator; ``""`` when out of range."""
        if line < 0 or line >= self.line_count:
            return ""
        start, end = self._line_bounds(line)
        return self._text[start:end]

    def offset_at(self, pos: Pos, encoding: PositionEncoding | str = UTF16) -> int:
        """Convert ``pos`` to an index into `text`, clamping instead of raising.

        A line past the end maps to the end of the document, a character past the end
        of its line to the end of that line (before its terminator), negative values to
        0. A character inside a surrogate pair (UTF-16) or a multi-byte sequence (UTF-8)
        rounds down to the start of that code point.
        """
        enc = coerce_encoding(encoding)
        line = max(pos.line, 0)
        character = max(pos.character, 0)
        if line >= self.line_count:
            return len(self._text)
        start, end = self._line_bounds(line)
        if enc is UTF32:
            return min(start + character, end)
        if enc is UTF16:
            return _utf16_index(self._text, start, end, character)
        return _utf8_index(self._text, start, end, character)

    def position_at(self, offset: int, encoding: PositionEncoding | str = UTF16) -> Pos:
        """Convert a string index to a position; the inverse of `offset_at`.

        The offset is clamped to the document; one that falls inside a line terminator
        (e.g. between ``"\\r"`` and ``"\\n"``) maps to the end of that line.
        """
        enc = coerce_encoding(encoding)
        offset = min(max(offset, 0), len(self._text))
        line = bisect.bisect_right(self._index(), offset) - 1
        start, end = self._line_bounds(line)
        offset = min(offset, end)
        return Pos(line, _units(self._text[start:offset], enc))

    def apply_change(
        self,
        text: str,
        range: Range | None = None,
        encoding: PositionEncoding | str = UTF16,
    ) -> None:
        """Apply one content change: replace ``range`` with ``text``, or all if ``None``.

        A range whose start lies after its end is treated as if it were swapped.
        """
        if range is None:
            self.text = text
            return
        begin = self.offset_at(range[0], encoding)
        end = self.offset_at(range[1], encoding)
        if begin > end:
            begin, end = end, begin
        old = self._text
        new = f"{old[:begin]}{text}{old[end:]}"
        if self._starts is not None:
            self._starts = _splice_starts(self._starts, new, begin, end, len(text))
        self._text = new

    def prefix_suffix(
        self,
        pos: Pos,
        encoding: PositionEncoding | str = UTF16,
        *,
        max_prefix: int | None = None,
        max_suffix: int | None = None,
    ) -> tuple[str, str]:
        """Return the text before and after the cursor at ``pos``.

        ``max_prefix`` / ``max_suffix`` cap the lengths (keeping the characters nearest
        the cursor), which avoids copying a whole large document on every keystroke.
        """
        offset = self.offset_at(pos, encoding)
        lo = 0 if max_prefix is None else max(offset - max(max_prefix, 0), 0)
        hi = len(self._text) if max_suffix is None else offset + max(max_suffix, 0)
        return self._text[lo:offset], self._text[offset:hi]


def _splice_starts(starts: list[int], new: str, begin: int, end: int, inserted: int) -> list[int]:
    """Update the line starts of a text whose ``[begin, end)`` became ``inserted`` chars.

    A line start ``q`` depends only on the characters at ``q - 1`` and ``q`` (a CR only
    ends a line when no LF follows). So starts below ``begin`` and old starts above
    ``end`` survive (the latter shifted); only those in between are recomputed, from a
    scan that begins one character early to see a CR that the edit may pair with an LF.
    """
    head = bisect.bisect_left(starts, begin)
    tail = bisect.bisect_right(starts, end)
    stop = begin + inserted
    middle = [
        m.end()
        for m in _EOL_RE.finditer(new, max(begin - 1, 0), stop + 1)
        if begin <= m.end() <= stop
    ]
    delta = inserted - (end - begin)
    rest = starts[tail:] if delta == 0 else [q + delta for q in starts[tail:]]
    return [*(starts[:head] or [0]), *middle, *rest]


class DocumentStore:
    """The set of open documents, keyed by URI."""

    def __init__(self) -> None:
        """Create an empty store."""
        self._docs: dict[str, TextDocument] = {}

    def open(self, uri: str, language_id: str, version: int, text: str) -> TextDocument:
        """Open (or re-open, replacing) a document and return it."""
        doc = TextDocument(uri, language_id, version, text)
        self._docs[uri] = doc
        return doc

    def change(
        self,
        uri: str,
        version: int,
        changes: Iterable[Change],
        encoding: PositionEncoding | str = UTF16,
    ) -> TextDocument | None:
        """Apply ``changes`` in order and set ``version``.

        Returns ``None`` (rather than raising) when ``uri`` is not open, since a client
        may race a change against a close.
        """
        doc = self._docs.get(uri)
        if doc is None:
            return None
        for text, range_ in changes:
            doc.apply_change(text, range_, encoding)
        doc.version = version
        return doc

    def close(self, uri: str) -> None:
        """Forget ``uri``; closing an unknown document is a no-op."""
        self._docs.pop(uri, None)

    def get(self, uri: str) -> TextDocument | None:
        """The open document for ``uri``, or ``None``."""
        return self._docs.get(uri)

    def __contains__(self, uri: object) -> bool:
        """Whether ``uri`` is open."""
        return uri in self._docs

    def __len__(self) -> int:
        """Number of open documents."""
        return len(self._docs)

    def uris(self) -> list[str]:
        """URIs of all open documents, in opening order."""
        return list(self._docs)


_DRIVE_RE = re.compile(r"^/[A-Za-z]:")


def _file_uri_path(uri: str) -> str | None:
    """Decoded ``netloc + path`` of a file URI, or ``None`` for other schemes."""
    parsed = urlparse(uri)
    if parsed.scheme.lower() != "file":
        return None
    path = unquote(parsed.path)
    if _DRIVE_RE.match(path):
        # Clients disagree on drive-letter case ("C:" vs "c:"); compare them lower-cased.
        path = path[:1] + path[1].lower() + path[2:]
    netloc = unquote(parsed.netloc)
    if netloc.lower() == "localhost":
        netloc = ""
    return f"//{netloc}{path}" if netloc else path


def file_path(uri: str) -> str | None:
    """The file system path of a ``file:`` URI; None for other schemes."""
    return _file_uri_path(uri)


def workspace_relative_path(uri: str, roots: list[str]) -> tuple[str | None, str]:
    """Locate ``uri`` within the workspace folders ``roots`` (all URIs).

    Returns ``(workspace name, relative path)`` where the name is the basename of the
    innermost matching root and the path uses ``/`` separators. Without a matching root
    the result is ``(None, basename)``; non-file URIs such as ``untitled:Untitled-1``
    give ``(None, last path segment)``.
    """
    path = _file_uri_path(uri)
    if path is None:
        raw = urlparse(uri).path or uri
        return None, unquote(raw.rstrip("/").rsplit("/", 1)[-1])
    best: tuple[str, str] | None = None
    for root_uri in roots:
        root = _file_uri_path(root_uri)
        if root is None:
            continue
        root = root.rstrip("/")
        if not path.startswith(root + "/"):
            continue
        # Nested workspace folders: the innermost (longest) root wins.
        if best is None or len(root) > len(best[0]):
            best = (root, path[len(root) + 1 :])
    if best is None:
        return None, posixpath.basename(path)
    root, rel = best
    return posixpath.basename(root), rel
