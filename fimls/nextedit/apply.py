"""A recognised change made again on another line: where the old form still stands, the
same edit, as one replacement of the line's changed span."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from itertools import pairwise

from fimls.nextedit.change import Change, ChangeKind
from fimls.nextedit.lexer import Token, closing_paren, texts, tokens, top_level_commas

Splice = tuple[int, int, str]  # replace columns [start, end) of the line with the text


@dataclass(frozen=True)
class LineEdit:
    """Replace columns ``start`` to ``end`` (code points) of a line with ``text``."""

    start: int
    end: int
    text: str

    def applied(self, line: str) -> str:
        return line[:self.start] + self.text + line[self.end:]


def apply(change: Change, line: str) -> LineEdit | None:
    """The same change on ``line``, or None where its old form does not stand there."""
    toks = tokens(line)
    splices = _APPLIERS[change.kind](change, toks, line)
    return _combined(line, splices) if splices else None


def _combined(line: str, splices: list[Splice]) -> LineEdit | None:
    splices.sort()
    start, end = splices[0][0], max(e for _, e, _ in splices)
    out, at = [], start
    for s, e, text in splices:
        if s < at:
            continue  # overlapping occurrences: the first wins
        out += [line[at:s], text]
        at = e
    out.append(line[at:end])
    new = "".join(out)
    return None if new == line[start:end] else LineEdit(start, end, new)


def _renamed(change: Change, toks: list[Token], line: str) -> list[Splice]:
    after_dot = change.kind is ChangeKind.ATTRIBUTE
    return [(t.start, t.end, change.new) for i, t in enumerate(toks)
            if t.is_ident and t.text == change.old[0]
            and (i > 0 and toks[i - 1].text == ".") == after_dot]


def _literal(change: Change, toks: list[Token], line: str) -> list[Splice]:
    k = len(change.anchor)
    return [(t.start, t.end, change.new) for i, t in enumerate(toks)
            if i >= k and t.text == change.old[0]
            and tuple(texts(toks[i - k:i])) == change.anchor]


def _calls(change: Change, toks: list[Token]) -> list[tuple[int, int]]:
    """(opening, closing) token indices of each call of ``change.call`` on the line."""
    out = []
    for i in range(len(toks) - 1):
        if toks[i].is_ident and toks[i].text == change.call and toks[i + 1].text == "(":
            cl = closing_paren(toks, i + 1)
            if cl is not None:
                out.append((i + 1, cl))
    return out


def _arguments(toks: list[Token], op: int, cl: int) -> list[tuple[int, int]]:
    """Each argument's [first, last] token indices."""
    if cl == op + 1:
        return []
    bounds = [op, *top_level_commas(toks, op, cl), cl]
    return [(a + 1, b - 1) for a, b in pairwise(bounds)]


def _added(change: Change, toks: list[Token], line: str) -> list[Splice]:
    want = texts(tokens(change.new))
    out: list[Splice] = []
    for op, cl in _calls(change, toks):
        args = _arguments(toks, op, cl)
        if not args:
            out.append((toks[op].end, toks[op].end, change.new))
            continue
        first, last = args[0] if not change.at_end else args[-1]
        if texts(toks[first:last + 1]) == want:
            continue  # already there
        if change.at_end:
            out.append((toks[last].end, toks[last].end, change.sep + change.new))
        else:
            out.append((toks[first].start, toks[first].start, change.new + change.sep))
    return out


def _removed(change: Change, toks: list[Token], line: str) -> list[Splice]:
    out: list[Splice] = []
    for op, cl in _calls(change, toks):
        args = _arguments(toks, op, cl)
        if not args:
            continue
        k = len(args) - 1 if change.at_end else 0
        first, last = args[k]
        if tuple(texts(toks[first:last + 1])) != change.old:
            continue
        if len(args) == 1:
            out.append((toks[first].start, toks[last].end, ""))
        elif change.at_end:
            out.append((toks[args[k - 1][1]].end, toks[last].end, ""))
        else:
            out.append((toks[first].start, toks[args[1][0]].start, ""))
    return out


def _expression(change: Change, toks: list[Token], line: str) -> list[Splice]:
    n = len(change.old)
    new = tuple(texts(tokens(change.new)))
    # Where the old form sits inside the new one (``fetch`` in ``await fetch``), a line
    # that already holds the new form must not get it twice.
    inner = next((k for k in range(len(new) - n + 1) if new[k:k + n] == change.old), None)
    out: list[Splice] = []
    seq = texts(toks)
    for i in range(len(toks) - n + 1):
        if tuple(seq[i:i + n]) != change.old:
            continue
        if inner is not None and i >= inner and tuple(seq[i - inner:i - inner + len(new)]) == new:
            continue
        out.append((toks[i].start, toks[i + n - 1].end, change.new))
    return out


_APPLIERS: dict[ChangeKind, Callable[[Change, list[Token], str], list[Splice]]] = {
    ChangeKind.RENAME: _renamed,
    ChangeKind.ATTRIBUTE: _renamed,
    ChangeKind.LITERAL: _literal,
    ChangeKind.ARGUMENT_ADDED: _added,
    ChangeKind.ARGUMENT_REMOVED: _removed,
    ChangeKind.EXPRESSION: _expression,
}
