"""What a one-line edit did, in a form that can be looked for elsewhere: a renamed
identifier, a renamed attribute, a changed literal, an argument added or removed at the
start or the end of a call, or some other edited expression.

The two versions of the line are compared token by token (spacing aside); what lies
between their common start and common end is the change.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from fimls.nextedit.lexer import (
    Kind,
    Token,
    closing_paren,
    common_ends,
    opening_paren,
    texts,
    tokens,
)


class ChangeKind(Enum):
    RENAME = "rename"
    ATTRIBUTE = "attribute"
    LITERAL = "literal"
    ARGUMENT_ADDED = "argument added"
    ARGUMENT_REMOVED = "argument removed"
    EXPRESSION = "expression"


@dataclass(frozen=True)
class Change:
    """A recognised edit.

    ``old`` is the old form's tokens and ``new`` the text that replaces it (for a rename
    or an attribute, the old and new name). ``anchor`` is tokens that must come right
    before the old form (a literal's key: ``timeout =``). For arguments, ``call`` is the
    function's name, ``at_end`` where the argument goes, ``new`` the argument's text and
    ``sep`` what separates it from its neighbour.
    """

    kind: ChangeKind
    old: tuple[str, ...]
    new: str
    anchor: tuple[str, ...] = ()
    call: str = ""
    at_end: bool = True
    sep: str = ", "


def recognize(old_line: str, new_line: str) -> Change | None:
    """The change that turned ``old_line`` into ``new_line`` (None when only spacing or
    nothing changed, or the change has nothing to look for)."""
    a, b = tokens(old_line), tokens(new_line)
    ta, tb = texts(a), texts(b)
    if ta == tb:
        return None
    p, s = common_ends(ta, tb)
    oa, nb = a[p:len(a) - s], b[p:len(b) - s]
    return (_renamed(a, p, oa, nb) or _literal(a, p, oa, nb)
            or _argument(a, p, oa, nb, new_line)
            or _expression(a, b, p, s, new_line))


def _renamed(a: list[Token], p: int, oa: list[Token], nb: list[Token]) -> Change | None:
    """One identifier replaced by another, wherever it differs."""
    if not oa or len(oa) != len(nb):
        return None
    pairs = {(x.text, y.text) for x, y in zip(oa, nb, strict=True) if x.text != y.text}
    if len(pairs) != 1:
        return None
    i = next(k for k, (x, y) in enumerate(zip(oa, nb, strict=True)) if x.text != y.text)
    if not (oa[i].is_ident and nb[i].is_ident):
        return None
    after_dot = p + i > 0 and a[p + i - 1].text == "."
    kind = ChangeKind.ATTRIBUTE if after_dot else ChangeKind.RENAME
    return Change(kind, (oa[i].text,), nb[i].text)


def _literal(a: list[Token], p: int, oa: list[Token], nb: list[Token]) -> Change | None:
    """One literal replaced by another, keyed by the name before it (``timeout=30``)."""
    if len(oa) != 1 or len(nb) != 1 or not (oa[0].is_literal and nb[0].is_literal):
        return None
    anchor = tuple(t.text for t in a[max(0, p - 2):p])
    if not any(t.is_ident for t in a[max(0, p - 2):p]):
        return None
    return Change(ChangeKind.LITERAL, (oa[0].text,), nb[0].text, anchor=anchor)


def _argument(a: list[Token], p: int, oa: list[Token], nb: list[Token],
              new_line: str) -> Change | None:
    """An argument added or removed at the start or the end of a call."""
    if bool(oa) == bool(nb):
        return None
    op = opening_paren(a, p)
    if op is None or op == 0 or not a[op - 1].is_ident:
        return None
    cl = closing_paren(a, op)
    if cl is None:
        return None
    moved = nb or oa
    at_end = p + len(oa) == cl
    at_start = p == op + 1
    if not (at_end or at_start):
        return None
    body = texts(moved)
    # The argument itself, without the comma that joins it to its neighbour.
    if at_end and body[0] == ",":
        arg, sep_tok = moved[1:], moved[:1]
    elif at_start and body[-1] == ",":
        arg, sep_tok = moved[:-1], moved[-1:]
    elif cl == op + 1 + len(oa):  # the only argument
        arg, sep_tok = moved, []
    else:
        return None
    if not arg:
        return None
    sep = _sep_text(sep_tok[0] if sep_tok and nb else None, new_line)
    if nb:
        text = new_line[arg[0].start:arg[-1].end]
        return Change(ChangeKind.ARGUMENT_ADDED, (), text, call=a[op - 1].text,
                      at_end=at_end, sep=sep)
    return Change(ChangeKind.ARGUMENT_REMOVED, tuple(texts(arg)), "", call=a[op - 1].text,
                  at_end=at_end, sep=sep)


def _sep_text(comma: Token | None, line: str) -> str:
    """The comma that joins an added argument to its neighbour, with the space after it
    as the edit wrote it."""
    if comma is None or not line[comma.end:comma.end + 1].isspace():
        return ", " if comma is None else ","
    return ", "


def _expression(a: list[Token], b: list[Token], p: int, s: int,
                new_line: str) -> Change | None:
    """Any other edit: the old tokens between the common start and end, widened by a
    token on each side until they hold a name or a string to look for (a number alone
    is everywhere)."""
    right = True  # widen to the right first: ``fetch`` -> ``await fetch``
    while not any(t.is_ident or t.kind is Kind.STRING for t in a[p:len(a) - s]):
        if p == 0 and s == 0:
            return None
        if (right and s > 0) or p == 0:
            s -= 1
        else:
            p -= 1
        right = not right
    oa = a[p:len(a) - s]
    nb = b[p:len(b) - s]
    new = new_line[nb[0].start:nb[-1].end] if nb else ""
    return Change(ChangeKind.EXPRESSION, tuple(texts(oa)), new)
