"""Context beyond the file: chunks of other files for the front of the prompt.

A completion that calls code from another file needs that file's signatures. This module
keeps, for the open buffers only, what is needed to choose such chunks:

* a definition index (``def``/``class``/functions/top-level assignments) per buffer,
  rebuilt lazily after an edit;
* where the user last edited or asked for a completion in each buffer;
* a ring of chunks (64 lines around the places the user worked at), in the manner of
  llama.vim's ring buffer: at most 16, a new chunk replaces a very similar old one.

:meth:`ContextStore.select` picks a bounded set for a cursor: the module-level definitions
of the identifiers near it (not in comments, strings or import lines) that live in other
buffers first, then those of the names the file imports (unused ones first), then how the
other buffers call the first of those (usage), then methods named after a dot, then the
recently edited regions of other buffers, then ring chunks.
The server decides *when* a set changes (at idle, or for a request at a place no set was
chosen for), so typing never changes the prompt's front and the KV cache keeps it.
Closing a buffer removes everything this module holds of it. No lsprotocol here: the
server feeds plain text and line numbers.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from fimls.crossfile import sources
from fimls.crossfile.chunks import USAGE_NAMES, ContextChunk, definitions
from fimls.crossfile.names import (
    NEAR_AFTER,
    NEAR_BEFORE,
    imported_names,
    is_test_path,
    local_names,
    module_aliases,
    names_near,
)

RING_SIZE = 16  # chunks, as llama.vim's ring_n_chunks
RING_CHUNK_LINES = 64  # as llama.vim's ring_chunk_size
RING_SIMILAR = 0.9  # a new chunk this similar to an old one replaces it
DISK_BUFFERS = 256  # workspace files whose definition index is kept
CHARS_PER_TOKEN = 3  # a safe guess for code; the engine counts exactly and trims


def _similarity(a: str, b: str) -> float:
    """Share of lines in common (llama.vim evicts ring chunks by this measure)."""
    la, lb = a.splitlines(), b.splitlines()
    if not la or not lb:
        return 0.0
    common = len(set(la) & set(lb))
    return 2.0 * common / (len(la) + len(lb))


@dataclass
class _Buffer:
    path: str
    text_of: Callable[[], str | None]
    defs: dict[str, list[int]] | None = None  # None: rebuild on next use
    local: set[str] | None = None  # its local_names less its imports; None: rebuild
    last_line: int | None = None  # last edit or request
    ring_line: int | None = None  # where its last ring chunk was taken


@dataclass
class ContextStore:
    """What the server knows of its open buffers, for choosing context chunks."""

    ring_size: int = RING_SIZE
    _buffers: dict[str, _Buffer] = field(default_factory=dict)
    _ring: list[ContextChunk] = field(default_factory=list)
    _disk: dict[str, _Buffer] = field(default_factory=dict)

    def open(self, uri: str, path: str, text_of: Callable[[], str | None]) -> None:
        """A buffer was opened; ``text_of`` reads its current text (no copy is kept)."""
        self._buffers[uri] = _Buffer(path=path, text_of=text_of)

    def changed(self, uri: str, line: int | None) -> None:
        """The buffer changed (at ``line`` when known)."""
        buf = self._buffers.get(uri)
        if buf is not None:
            buf.defs = buf.local = None
            if line is not None:
                buf.last_line = line

    def asked(self, uri: str, line: int) -> None:
        """A completion was asked at ``line``: a recent place, and a ring chunk."""
        buf = self._buffers.get(uri)
        if buf is None:
            return
        buf.last_line = line
        if buf.ring_line is not None and abs(buf.ring_line - line) < RING_CHUNK_LINES // 4:
            return  # typing on: the chunk taken here still stands
        text = buf.text_of()
        if text is None:
            return
        buf.ring_line = line
        lines = text.splitlines()
        lo = max(0, line - RING_CHUNK_LINES // 2)
        chunk = "\n".join(lines[lo:lo + RING_CHUNK_LINES]).strip("\n")
        if chunk.strip():
            self._add_ring(ContextChunk(path=buf.path, text=chunk + "\n", source="ring",
                                        uri=uri, line=lo))

    def close(self, uri: str) -> None:
        """Forget the buffer: its index, its places and its ring chunks."""
        self._buffers.pop(uri, None)
        self._ring = [c for c in self._ring if c.uri != uri]

    def uris(self) -> list[str]:
        """The open buffers this store knows."""
        return list(self._buffers)

    def _add_ring(self, chunk: ContextChunk) -> None:
        self._ring = [c for c in self._ring
                      if not (c.uri == chunk.uri and _similarity(c.text, chunk.text)
                              > RING_SIMILAR)]
        self._ring.append(chunk)
        del self._ring[:-self.ring_size]

    def _defs(self, buf: _Buffer, text: str) -> dict[str, list[int]]:
        if buf.defs is None:
            buf.defs = definitions(text)
        return buf.defs

    def _disk_buffer(self, uri: str, path: str, text: str) -> _Buffer:
        """A file read from disk as a closed buffer (indexed once per text)."""
        buf = self._disk.get(uri)
        if buf is None or buf.text_of() is not text:
            buf = _Buffer(path=path, text_of=lambda: text)
            self._disk.pop(uri, None)
            self._disk[uri] = buf
            while len(self._disk) > DISK_BUFFERS:
                self._disk.pop(next(iter(self._disk)))
        return buf

    def _local(self, cur: _Buffer | None, text: str | None, whole: str) -> set[str]:
        """What the file binds for itself, unless it also imports that name (cached per
        text of an open buffer)."""
        local = cur.local if cur is not None and text is not None else None
        if local is None:
            local = local_names(whole) - set(imported_names(whole, ""))
            if cur is not None and text is not None:
                cur.local = local
        return local

    def _others(self, uri: str, disk: Sequence[tuple[str, str, str]]) -> list[sources.Other]:
        """The other open buffers, then the files from disk that are not open."""
        others: dict[str, sources.Other] = {}
        for u, buf in self._buffers.items():
            text = buf.text_of() if u != uri else None
            if text is not None:
                others[u] = sources.Other(u, buf.path, text.splitlines(), self._defs(buf, text),
                                          buf.last_line)
        for u, rel, text in disk:
            if u not in others and u != uri:
                buf = self._disk_buffer(u, rel, text)
                others[u] = sources.Other(u, rel, text.splitlines(), self._defs(buf, text))
        return list(others.values())

    def select(self, uri: str, prefix: str, suffix: str, char_budget: int, *,
               near: tuple[int, int] = (NEAR_BEFORE, NEAR_AFTER),
               disk: Sequence[tuple[str, str, str]] = ()) -> list[ContextChunk]:
        """The chunks for a cursor between ``prefix`` and ``suffix`` of ``uri``, most
        useful first, within about ``char_budget`` characters; identifiers are looked up
        from ``near`` lines before and after the cursor. ``disk``: files the document
        imports that are not open, as (uri, path, text); they give definitions, after the
        open buffers, and never recent regions or ring chunks."""
        if char_budget <= 0:
            return []
        cur = self._buffers.get(uri)
        text = cur.text_of() if cur is not None else None
        whole = text if text is not None else prefix + suffix
        own = self._defs(cur, text) if cur is not None and text is not None else definitions(
            prefix[-20000:] + suffix[:20000])
        path = cur.path if cur is not None else uri
        near_names = names_near(prefix, suffix, near, own=own,
                                local=self._local(cur, text, whole),
                                modules=module_aliases(whole), path=path)
        others = self._others(uri, disk)
        budget = sources.Budget(char_budget)
        shown = sources.definitions_of(near_names.names, others, budget)
        # What is imported and unused before the cursor is likely what comes next.
        shown += sources.imported_definitions(
            imported_names(whole, prefix, exclude=set(near_names.names)), others, budget)
        if is_test_path(path):
            shown += sources.fixtures(near_names.bound, others, budget)
        sources.usages(list(dict.fromkeys(shown))[:USAGE_NAMES], others, budget)
        sources.methods(near_names.attrs, others, budget)
        sources.recent(others, budget)
        sources.ring(self._ring, uri, others, budget)
        return budget.chosen
