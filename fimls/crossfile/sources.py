"""Where a context set's chunks come from, one source per function, and the budget they
share. :meth:`fimls.crossfile.store.ContextStore.select` asks them in order of use: the
definitions of the names near the cursor, of the names the file imports, of a test's
fixtures, how the other files call those, the methods named after a dot, the places the
user last worked at in each other buffer, and the ring of chunks."""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from fimls.crossfile.chunks import (
    IMPORTED_LINES,
    USAGE_LINES,
    ContextChunk,
    call_lines,
    definition_chunk,
)
from fimls.crossfile.names import comment_mark, indented, is_fixture

RECENT_LINES = 12  # lines around the last edit or request in another buffer


@dataclass(frozen=True)
class Other:
    """Another file a set may take chunks of: an open buffer, or a file read from disk."""

    uri: str
    path: str
    lines: list[str]
    defs: dict[str, list[int]]
    last_line: int | None = None  # its last edit or request (open buffers only)


@dataclass
class Budget:
    """The chunks chosen so far and the characters they take."""

    chars: int
    chosen: list[ContextChunk] = field(default_factory=list)
    used: int = 0

    def take(self, chunk: ContextChunk) -> bool:
        """Add ``chunk`` if it is new and fits; True also when it is there already."""
        # The same place, text already inside a chosen chunk of that buffer, or the very
        # same text from another buffer (copies teach the model nothing new).
        if any(c.key == chunk.key or c.text == chunk.text
               or (c.uri == chunk.uri and c.text in chunk.text) for c in self.chosen):
            return True
        # A long definition (a constructor of 24 parameters) is cut at a line end: its
        # first lines beat none of it. The first (most useful) chunk may fill the budget,
        # any later one half of it.
        room = self.chars - self.used if not self.chosen else min(self.chars - self.used,
                                                                  self.chars // 2)
        if len(chunk.text) > room:
            cut = chunk.text.rfind("\n", 0, room)
            if cut < self.chars // 8:
                return False
            chunk = replace(chunk, text=chunk.text[:cut + 1])
        self.chosen.append(chunk)
        self.used += len(chunk.text)
        return True


def top_level(lines: list[str], at: list[int]) -> list[int]:
    """The module-level ones of the definitions at ``at``: a bare or imported name means
    one of those, since a method of that name is reached through an object (``x.name``)."""
    return [a for a in at if a < len(lines) and not indented(lines[a])]


def definitions_of(names: Sequence[str], others: Sequence[Other], budget: Budget) -> list[str]:
    """The module-level definitions of ``names`` (two per file at most); the names shown."""
    shown = []
    for name in names:
        for o in others:
            for at in top_level(o.lines, o.defs.get(name, []))[:2]:
                if budget.take(ContextChunk(path=o.path, text=definition_chunk(o.lines, at),
                                            source="definition", uri=o.uri, line=at)):
                    shown.append(name)
    return shown


def imported_definitions(names: Sequence[str], others: Sequence[Other],
                         budget: Budget) -> list[str]:
    """The definitions of what the file imports, shorter; the names shown."""
    shown = []
    for name in names:
        for o in others:
            for at in top_level(o.lines, o.defs.get(name, []))[:1]:
                if budget.take(ContextChunk(path=o.path,
                                            text=definition_chunk(o.lines, at, IMPORTED_LINES),
                                            source="imported", uri=o.uri, line=at)):
                    shown.append(name)
    return shown


def fixtures(names: Sequence[str], others: Sequence[Other], budget: Budget) -> list[str]:
    """In a test module, the pytest fixtures named as the file's own parameters: pytest
    passes conftest.py's fixtures as parameters of that name there, and nowhere else (a
    parameter or local with another file's name is that name by chance elsewhere)."""
    shown = []
    for name in names:
        for o in others:
            for at in [a for a in top_level(o.lines, o.defs.get(name, []))
                       if is_fixture(o.lines, a)][:1]:
                if budget.take(ContextChunk(path=o.path, text=definition_chunk(o.lines, at),
                                            source="definition", uri=o.uri, line=at)):
                    shown.append(name)
    return shown


def usages(names: Sequence[str], others: Sequence[Other], budget: Budget) -> None:
    """How the first file that calls each of ``names`` calls it: the keywords and the
    argument order a signature does not say. Calls inside a chosen chunk are shown."""
    for name in names:
        for o in others:
            inside = [(c.line, c.line + c.text.count("\n")) for c in budget.chosen
                      if c.uri == o.uri]
            calls = [(a, b) for a, b in call_lines(o.lines, name, comment_mark(o.path))
                     if not any(lo <= a < hi for lo, hi in inside)][:USAGE_LINES]
            if calls:
                text = "".join(textwrap.dedent("\n".join(o.lines[a:b + 1])) + "\n"
                               for a, b in calls)
                budget.take(ContextChunk(path=o.path, text=text, source="usage", uri=o.uri,
                                         line=calls[0][0]))
                break


def methods(attrs: Sequence[str], others: Sequence[Other], budget: Budget) -> None:
    """The definitions of names after a dot: a method first, a module's function
    (``pkg.name``) when there is none."""
    for name in attrs:
        for o in others:
            places = [a for a in o.defs.get(name, []) if a < len(o.lines)]
            methods_first = sorted(places, key=lambda a: not indented(o.lines[a]))
            for at in methods_first[:1]:
                budget.take(ContextChunk(path=o.path, text=definition_chunk(o.lines, at),
                                         source="definition", uri=o.uri, line=at))


def recent(others: Sequence[Other], budget: Budget) -> None:
    """The lines around where the user last edited or asked in each other buffer."""
    for o in others:
        if o.last_line is not None and o.lines:
            lo = max(0, min(o.last_line, len(o.lines) - 1) - RECENT_LINES // 2)
            text = "\n".join(o.lines[lo:lo + RECENT_LINES]).strip("\n")
            if text.strip():
                budget.take(ContextChunk(path=o.path, text=text + "\n", source="recent",
                                         uri=o.uri, line=lo))


def ring(chunks: Sequence[ContextChunk], uri: str, others: Sequence[Other],
         budget: Budget) -> None:
    """The ring's chunks of the other open buffers, newest first."""
    open_uris = {o.uri for o in others}
    for c in reversed(chunks):
        if c.uri != uri and c.uri in open_uris:
            budget.take(c)
