"""Where else a recognised change is due: every line of the open documents where its old
form still stands, nearest to the edit first."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from fimls.nextedit.apply import LineEdit, apply
from fimls.nextedit.change import Change

MAX_TARGETS = 64  # candidates looked at for one edit: the model verifies each


@dataclass(frozen=True)
class Target:
    """The change made again at ``line`` of ``uri``."""

    uri: str
    line: int
    edit: LineEdit
    old_line: str

    @property
    def new_line(self) -> str:
        return self.edit.applied(self.old_line)


def find_targets(change: Change, docs: Mapping[str, Sequence[str]], origin: str,
                 origin_line: int, limit: int = MAX_TARGETS) -> list[Target]:
    """Lines of ``docs`` (uri -> lines) where ``change`` applies: in the edited document
    (``origin``) by distance from the edited line, then the others'."""
    out: list[Target] = []
    for uri, order in _scan_order(docs, origin, origin_line):
        lines = docs[uri]
        for i in order:
            edit = apply(change, lines[i])
            if edit is not None:
                out.append(Target(uri, i, edit, lines[i]))
                if len(out) >= limit:
                    return out
    return out


def _scan_order(docs: Mapping[str, Sequence[str]], origin: str,
                origin_line: int) -> Iterable[tuple[str, list[int]]]:
    if origin in docs:
        n = len(docs[origin])
        near = sorted((i for i in range(n) if i != origin_line),
                      key=lambda i: (abs(i - origin_line), i))
        yield origin, near
    for uri, lines in docs.items():
        if uri != origin:
            yield uri, list(range(len(lines)))
