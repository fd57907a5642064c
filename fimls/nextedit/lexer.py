"""A small lexer for one line of code, in any of the languages fimls sees: identifiers,
numbers, quoted strings and single punctuation characters, with their columns.

Good enough to compare two versions of a line and to find the same form elsewhere: a
string is one token (a name inside it is not a use of that name), and ``rootNode`` is one
identifier, so ``rootNodeCount`` never matches it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum


class Kind(Enum):
    IDENT = "ident"
    NUMBER = "number"
    STRING = "string"
    PUNCT = "punct"


_TOKEN = re.compile(r"""
    (?P<ident>[^\W\d]\w*)
  | (?P<number>\d[\w.]*)
  | (?P<string>"(?:\\.|[^"\\])*"|'(?:\\.|[^'\\])*'|`(?:\\.|[^`\\])*`)
  | (?P<space>\s+)
  | (?P<punct>===|!==|==|!=|<=|>=|->|=>|::|\*\*|//|&&|\|\||<<|>>|[-+*/%&|^:]=|\.\.\.|.)
""", re.VERBOSE)


@dataclass(frozen=True)
class Token:
    """A token's text, kind and columns (code points) in its line."""

    text: str
    kind: Kind
    start: int
    end: int

    @property
    def is_ident(self) -> bool:
        return self.kind is Kind.IDENT

    @property
    def is_literal(self) -> bool:
        return self.kind in (Kind.NUMBER, Kind.STRING)


def tokens(line: str) -> list[Token]:
    """The line's tokens, spaces left out."""
    out = []
    for m in _TOKEN.finditer(line):
        group = m.lastgroup or "punct"
        if group != "space":
            out.append(Token(m.group(), Kind(group), m.start(), m.end()))
    return out


def texts(toks: list[Token]) -> list[str]:
    """The tokens' texts: what two forms are compared by (spacing aside)."""
    return [t.text for t in toks]


def common_ends(a: Sequence[str], b: Sequence[str]) -> tuple[int, int]:
    """How many items ``a`` and ``b`` share at their start, and then at their end (the two
    never overlap)."""
    p = 0
    while p < min(len(a), len(b)) and a[p] == b[p]:
        p += 1
    s = 0
    while s < min(len(a), len(b)) - p and a[-1 - s] == b[-1 - s]:
        s += 1
    return p, s


def closing_paren(toks: list[Token], open_at: int) -> int | None:
    """The index of the ``)`` that closes the ``(`` at ``open_at``, if it is on the line."""
    depth = 0
    for i in range(open_at, len(toks)):
        if toks[i].text in "([{":
            depth += 1
        elif toks[i].text in ")]}":
            depth -= 1
            if depth == 0:
                return i if toks[i].text == ")" else None
    return None


def opening_paren(toks: list[Token], before: int) -> int | None:
    """The index of the innermost ``(`` still open before token ``before``."""
    depth = 0
    for i in range(before - 1, -1, -1):
        if toks[i].text in ")]}":
            depth += 1
        elif toks[i].text in "([{":
            if depth == 0:
                return i if toks[i].text == "(" else None
            depth -= 1
    return None


def top_level_commas(toks: list[Token], open_at: int, close_at: int) -> list[int]:
    """Indices of the commas between a call's parentheses that separate its arguments."""
    depth, out = 0, []
    for i in range(open_at + 1, close_at):
        t = toks[i].text
        if t in "([{":
            depth += 1
        elif t in ")]}":
            depth -= 1
        elif t == "," and depth == 0:
            out.append(i)
    return out
