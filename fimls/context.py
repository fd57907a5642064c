"""Context beyond the file: chunks of the other open buffers for the front of the prompt.

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

import builtins
import keyword
import logging
import re
import textwrap
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

log = logging.getLogger(__name__)

RING_SIZE = 16  # chunks, as llama.vim's ring_n_chunks
RING_CHUNK_LINES = 64  # as llama.vim's ring_chunk_size
RING_SIMILAR = 0.9  # a new chunk this similar to an old one replaces it
DEF_LINES = 10  # most lines kept of one definition
CLASS_EXTRA = 6  # more lines for a class: its methods' signatures
SIGNATURE_LINES = 16  # most lines of one signature
# A constructor's parameters are what a call of its class needs: jinja2's Environment takes
# 24, one per line.
INIT_SIGNATURE_LINES = 40
MIN_NAME = 3  # shorter names near the cursor are locals (i, e, it), not looked up
RECENT_LINES = 12  # lines around the last edit or request in another buffer
NEAR_BEFORE = 24  # lines before the cursor whose identifiers are looked up
NEAR_AFTER = 4
DISK_BUFFERS = 256  # workspace files whose definition index is kept
CHARS_PER_TOKEN = 3  # a safe guess for code; the engine counts exactly and trims

_DEF = re.compile(
    r"^(?P<indent>[ \t]*)(?:export\s+)?(?:pub(?:\([^)]*\))?\s+)?(?:async\s+)?"
    r"(?:def|class|function|func|fn|fun|interface|struct|trait|enum|type)\s+"
    r"(?:\([^)]*\)\s*)?(?P<name>[A-Za-z_]\w*)", re.M)
_ASSIGN = re.compile(
    r"^(?:export\s+)?(?:(?:const|let|var)\s+)?(?P<name>[A-Za-z_]\w*)\s*(?::[^=\n]*)?=(?!=)",
    re.M)
_IDENT = re.compile(r"[A-Za-z_]\w*")
_STRINGS = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'')
_HASH_COMMENT = (".py", ".pyi", ".sh", ".bash", ".rb", ".r", ".pl", ".yaml", ".yml", ".toml",
                 ".jl", ".ex", ".exs", ".nim", ".cmake", ".mk")
# Names a file imports: Python's ``from m import a, b`` (parenthesised over lines too) and
# JavaScript/TypeScript's ``import {a, b} from`` / ``import a from``.
_IMPORTS = re.compile(
    r"^[ \t]*from[ \t]+[\w.]+[ \t]+import[ \t]+(?:\(([^)]*)\)|([^\n]+))"
    r"|^[ \t]*import[ \t]*\{([^}]*)\}[ \t]*from"
    r"|^[ \t]*import[ \t]+(\w+)[ \t]+from", re.M)
_MODULE_IMPORT = re.compile(
    r"^[ \t]*import[ \t]+([\w.]+(?:[ \t]+as[ \t]+\w+)?(?:[ \t]*,[ \t]*[\w.]+"
    r"(?:[ \t]+as[ \t]+\w+)?)*)[ \t]*(?:#.*)?$"
    r"|^[ \t]*import[ \t]+(\*)[ \t]+as[ \t]+(\w+)", re.M)
# What a function binds for itself: a parameter list's opening, an assignment inside a
# block (indented; tuple targets too), a loop variable, ``with ... as x`` / ``except ... as x``.
_FUNC_OPEN = re.compile(r"\b(?:def|function|func|fn)\s+[A-Za-z_]\w*\s*\(")
_LOCAL_ASSIGN = re.compile(
    r"^[ \t]+(?:(?:const|let|var)\s+)?(?P<names>[A-Za-z_]\w*(?:[ \t]*,[ \t]*[A-Za-z_]\w*)*)"
    r"[ \t]*(?::[^=\n]*)?=(?!=)", re.M)
_LOCAL_BIND = re.compile(
    r"\bfor[ \t]+\(?(?P<loop>[A-Za-z_]\w*(?:[ \t]*,[ \t]*[A-Za-z_]\w*)*)\)?[ \t]+in\b"
    r"|\b(?:with|except)\b[^\n]*?\bas[ \t]+(?P<alias>[A-Za-z_]\w*)")
# The first name of the dotted chain that ends where a search stops (``a.b.`` -> ``a``).
_CHAIN_ROOT = re.compile(r"([A-Za-z_]\w*)(?:\.[A-Za-z_]\w*)*\.$")
_METHOD = re.compile(r"\s*(?:async\s+)?def\s+(\w+)|\s+(constructor)\s*\(")
# ``name: type`` in a class body: a dataclass's, NamedTuple's or TypeScript class's field.
_FIELD = re.compile(r"\s+[A-Za-z_]\w*\s*:\s*[^\s=:]")
IMPORTED_LINES = 6  # most lines kept of an imported name's definition
# How the other buffers call a definition shown: the keywords and argument order a
# signature does not say (``BadParameter(message, ctx=ctx, param=param)``).
USAGE_LINES = 2  # call lines per name
USAGE_NAMES = 4  # names whose calls are shown
USAGE_CALL_LINES = 6  # most lines of one call
_COMMON = frozenset(keyword.kwlist) | frozenset(keyword.softkwlist) | frozenset(
    dir(builtins)) | {
    "self", "cls", "this", "true", "false", "null", "nil", "const", "let", "var", "func",
    "function", "return", "fn", "pub", "int", "str", "bool", "float", "string", "void"}


@dataclass(frozen=True)
class ContextChunk:
    """Text of another buffer, where it is from and why it was chosen."""

    path: str  # shown to the model: relative to the workspace when possible
    text: str
    source: str  # "definition", "imported", "usage", "recent" or "ring"
    uri: str = ""
    line: int = 0

    @property
    def key(self) -> tuple[str, int, str]:
        """Identity within a set (the text may be refreshed, the place stays)."""
        return (self.uri, self.line, self.source)


def definitions(text: str) -> dict[str, list[int]]:
    """Identifier -> lines (0-based) where ``text`` defines it."""
    out: dict[str, list[int]] = {}
    starts = [0]
    for m in re.finditer("\n", text):
        starts.append(m.end())

    def line_of(pos: int) -> int:
        lo, hi = 0, len(starts) - 1
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if starts[mid] <= pos:
                lo = mid
            else:
                hi = mid - 1
        return lo

    for rx in (_DEF, _ASSIGN):
        for m in rx.finditer(text):
            name = m.group("name")
            if name in _COMMON:
                continue
            out.setdefault(name, []).append(line_of(m.start()))
    return out


def signature_end(lines: list[str], at: int, most: int = SIGNATURE_LINES) -> int:
    """The last line of the header starting at line ``at``: the line where its brackets
    close, or where a C-like body's brace opens, within ``most`` lines."""
    depth = 0
    for i in range(at, min(len(lines), at + most)):
        code = _STRINGS.sub("", lines[i].split("#", 1)[0])
        depth += sum(code.count(c) for c in "([{") - sum(code.count(c) for c in ")]}")
        if depth <= 0 or (code.rstrip().endswith("{") and depth <= 1):
            return i
    # Not closed within ``most`` lines: as many parameters as that, not none of them.
    return max(at, min(len(lines), at + most) - 1)


def definition_chunk(lines: list[str], at: int, max_lines: int = DEF_LINES) -> str:
    """The definition starting at line ``at``: its whole signature (what a call needs),
    then for a function its docstring and first lines, for a class its docstring's first
    line, its fields (``name: type``, as a dataclass's) and its methods' signatures (the
    constructor's up to INIT_SIGNATURE_LINES), until the block ends or ``max_lines``
    lines (a class: ``max_lines + CLASS_EXTRA``).

    The chunk reads as code: a class's docstring is closed on its line, a Python method's
    signature ends in ``...`` (a stub's body), a string cut off is closed. An open
    docstring made the model read every method after it as the docstring's text."""
    head = lines[at]
    indent = len(head) - len(head.lstrip())
    is_class = bool(re.match(r"\s*(?:export\s+)?class\b", head))
    end = signature_end(lines, at)
    out = lines[at:end + 1]
    cap = max(len(out) + 1, max_lines + (CLASS_EXTRA if is_class else 0))
    i = end + 1
    body = -1  # the body's indentation, from its first line
    in_doc = False
    while i < len(lines) and len(out) < cap:
        ln = lines[i]
        text = ln.strip()
        ind = len(ln) - len(ln.lstrip())
        if text and ind <= indent and not text.startswith((")", "]", "}")):
            break  # the block ended
        if text and body < 0:
            body = ind
            quote = text[:3] if text[:3] in ('"""', "'''") else ""
            if is_class and quote:
                # Its first line of text, closed there; on after its closing quotes.
                last = i if quote in text[3:] else next(
                    (k for k in range(i + 1, len(lines)) if quote in lines[k]), len(lines) - 1)
                words = next((w for w in (d.replace(quote, "").strip()
                                          for d in lines[i:last + 1]) if w), "")
                out.append(" " * body + quote + words + quote)
                i = last + 1
                continue
        was_doc = in_doc
        in_doc ^= (text.count('"""') + text.count("'''")) % 2 == 1
        if is_class:
            # A class: its fields and its methods' whole signatures, not their bodies, nor
            # what is nested deeper.
            top = ind == body
            method = _METHOD.match(ln) if top and not was_doc else None
            if method:
                name = method.group(1) or method.group(2)
                last = signature_end(lines, i, INIT_SIGNATURE_LINES
                                     if name in ("__init__", "constructor") else SIGNATURE_LINES)
                out.extend(lines[i:last])
                out.append(_stub(lines[last]))
                i = last + 1
                continue
            if not (top and not was_doc and not in_doc
                    and (text.startswith("@") or _FIELD.match(ln))):
                i += 1
                continue
        out.append(ln)
        i += 1
    while is_class and len(out) > 1 and out[-1].strip().startswith("@"):
        out.pop()  # a decorator whose method did not fit
    chunk = "\n".join(out).rstrip()
    for quote in ('"""', "'''"):
        if chunk.count(quote) % 2:
            chunk += "\n" + " " * max(body, 0) + quote  # cut inside a string: closed
    return chunk + "\n"


def _stub(line: str) -> str:
    """A Python signature's last line with ``...`` for its body (``def f(x): ...``), so
    that the next method does not read as its body; other lines as they are."""
    code, hash_, comment = line.partition("  #")
    if code.rstrip().endswith(":"):
        return code.rstrip() + " ..." + hash_ + comment
    return line


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
        before = prefix.splitlines()[-near[0]:] if near[0] else []
        # Import statements name what the file may use, not what it uses here: their names
        # come with the imported ones below, unused first.
        before = _IMPORTS.sub(lambda m: "\n" * m.group().count("\n"),
                              "\n".join(before)).split("\n") if before else []
        after = suffix.splitlines()[:near[1] + 1]
        # Closest to the cursor first: the current line's, then upwards, then below. A name
        # after a dot (``f.close``) is some object's attribute: a method of that name in
        # another file is a guess, so it comes after the bare names and what is imported
        # (``Type::name`` likewise).
        names: list[str] = []
        bound: list[str] = []  # bare, but bound by the file itself (see local_names)
        attrs: list[str] = []
        modules = module_aliases(whole)
        # What the file binds for itself, unless it also imports that name.
        local = cur.local if cur is not None and text is not None else None
        if local is None:
            local = local_names(whole) - set(imported_names(whole, ""))
            if cur is not None and text is not None:
                cur.local = local
        # (Python's ``//`` divides.)
        path = cur.path if cur is not None else uri
        comment = re.compile(re.escape(comment_mark(path)) + ".*")
        for ln in [*reversed(before), *after]:
            # Words in comments and strings name nothing the code uses.
            ln = comment.sub("", _STRINGS.sub('""', ln))
            for m in reversed(list(_IDENT.finditer(ln))):
                name = m.group()
                if (len(name) < MIN_NAME or name in _COMMON or name in own or name in names
                        or name in bound):
                    continue
                attr = m.start() > 0 and ln[m.start() - 1] in ".:"
                if attr:
                    # ``httpx.Client``: a module's name, as good as bare.
                    root = _CHAIN_ROOT.search(ln, 0, m.start())
                    attr = root is None or root.group(1) not in modules
                if attr:
                    if name not in attrs:
                        attrs.append(name)
                else:
                    if name in attrs:
                        attrs.remove(name)
                    (bound if name in local else names).append(name)
        others: dict[str, tuple[_Buffer, list[str], dict[str, list[int]]]] = {}
        for u, buf in self._buffers.items():
            if u == uri:
                continue
            text = buf.text_of()
            if text is None:
                continue
            others[u] = (buf, text.splitlines(), self._defs(buf, text))
        for u, rel, text in disk:
            if u not in others and u != uri:
                buf = self._disk_buffer(u, rel, text)
                others[u] = (buf, text.splitlines(), self._defs(buf, text))
        chosen: list[ContextChunk] = []
        used = 0

        def take(chunk: ContextChunk) -> bool:
            nonlocal used
            # The same place, text already inside a chosen chunk of that buffer, or the very
            # same text from another buffer (copies teach the model nothing new).
            if any(c.key == chunk.key or c.text == chunk.text
                   or (c.uri == chunk.uri and c.text in chunk.text) for c in chosen):
                return True
            # A long definition (a constructor of 24 parameters) is cut at a line end: its
            # first lines beat none of it. The first (most useful) chunk may fill the
            # budget, any later one half of it.
            room = char_budget - used if not chosen else min(char_budget - used,
                                                             char_budget // 2)
            if len(chunk.text) > room:
                cut = chunk.text.rfind("\n", 0, room)
                if cut < char_budget // 8:
                    return False
                chunk = replace(chunk, text=chunk.text[:cut + 1])
            chosen.append(chunk)
            used += len(chunk.text)
            return True

        def top_level(lines: list[str], at: list[int]) -> list[int]:
            # A bare or imported name means a module-level definition: a method of that name
            # is reached through an object (``x.name``), never bare.
            return [a for a in at if a < len(lines) and not _indented(lines[a])]

        shown: list[str] = []  # names whose definition was taken, in order
        for name in names:
            for u, (buf, lines, defs) in others.items():
                for at in top_level(lines, defs.get(name, []))[:2]:
                    if take(ContextChunk(path=buf.path, text=definition_chunk(lines, at),
                                         source="definition", uri=u, line=at)):
                        shown.append(name)
        # What the file imports from the others, the names it has not used yet before the
        # cursor first: what is imported and unused is likely what comes next.
        for name in imported_names(whole, prefix, exclude=set(names)):
            for u, (buf, lines, defs) in others.items():
                for at in top_level(lines, defs.get(name, []))[:1]:
                    if take(ContextChunk(path=buf.path,
                                         text=definition_chunk(lines, at, IMPORTED_LINES),
                                         source="imported", uri=u, line=at)):
                        shown.append(name)
        # A parameter or local with another file's name is that name by chance (an ``app``
        # parameter, a test's ``app = Starlette(...)``), except a pytest fixture in a test
        # module: pytest passes conftest.py's fixtures as parameters of that name there, and
        # nowhere else. After what the file surely uses.
        for name in bound if is_test_path(path) else []:
            for u, (buf, lines, defs) in others.items():
                for at in [a for a in top_level(lines, defs.get(name, []))
                           if _is_fixture(lines, a)][:1]:
                    if take(ContextChunk(path=buf.path, text=definition_chunk(lines, at),
                                         source="definition", uri=u, line=at)):
                        shown.append(name)
        for name in list(dict.fromkeys(shown))[:USAGE_NAMES]:
            for u, (buf, lines, _defs) in others.items():
                # Calls inside a chunk already chosen (a function's body) are shown.
                inside = [(c.line, c.line + c.text.count("\n")) for c in chosen if c.uri == u]
                calls = [(a, b) for a, b in call_lines(lines, name, comment_mark(buf.path))
                         if not any(lo <= a < hi for lo, hi in inside)][:USAGE_LINES]
                if calls:
                    text = "".join(textwrap.dedent("\n".join(lines[a:b + 1])) + "\n"
                                   for a, b in calls)
                    take(ContextChunk(path=buf.path, text=text, source="usage", uri=u,
                                      line=calls[0][0]))
                    break
        for name in attrs:
            for u, (buf, lines, defs) in others.items():
                # A method first; a module's function (``pkg.name``) when there is none.
                places = [a for a in defs.get(name, []) if a < len(lines)]
                for at in sorted(places, key=lambda a: not _indented(lines[a]))[:1]:
                    take(ContextChunk(path=buf.path, text=definition_chunk(lines, at),
                                      source="definition", uri=u, line=at))
        for u, (buf, lines, _defs) in others.items():
            if buf.last_line is not None and lines:
                lo = max(0, min(buf.last_line, len(lines) - 1) - RECENT_LINES // 2)
                text = "\n".join(lines[lo:lo + RECENT_LINES]).strip("\n")
                if text.strip():
                    take(ContextChunk(path=buf.path, text=text + "\n", source="recent",
                                      uri=u, line=lo))
        for c in reversed(self._ring):
            if c.uri != uri and c.uri in others:
                take(c)
        return chosen


def imported_names(text: str, prefix: str, exclude: set[str] | None = None) -> list[str]:
    """The names ``text`` imports (see _IMPORTS), those not used in ``prefix`` outside
    import lines first, each once, without ``exclude``."""
    names: list[str] = []
    for m in _IMPORTS.finditer(text[:200_000]):
        group = next(g for g in m.groups() if g is not None)
        for part in group.replace("\n", ",").split(","):
            words = _IDENT.findall(part)
            # ``a as b``: the definition is under ``a``.
            if words and words[0] not in names and words[0] not in _COMMON:
                names.append(words[0])
    if exclude:
        names = [n for n in names if n not in exclude]
    used = set(_IDENT.findall(_IMPORTS.sub("", prefix[-200_000:])))
    return [n for n in names if n not in used] + [n for n in names if n in used]


def is_test_path(path: str) -> bool:
    """Whether pytest collects ``path`` as a test module or conftest (``test_*.py``,
    ``*_test.py``, ``conftest.py``): only there are parameters filled with fixtures."""
    base = path.replace("\\", "/").rsplit("/", 1)[-1]
    return base == "conftest.py" or (base.endswith(".py") and (
        base.startswith("test_") or base.endswith("_test.py")))


def _is_fixture(lines: list[str], at: int) -> bool:
    """Whether the definition at ``at`` is decorated as a pytest fixture."""
    i = at - 1
    while i >= 0 and at - i <= 6:
        line = lines[i].strip()
        if line.startswith("@") and "fixture" in line:
            return True
        # A decorator's own continuation lines, or another decorator above it.
        if not line or not (line.startswith("@") or _indented(lines[i]) or line[0] in ")]"):
            return False
        i -= 1
    return False


def local_names(text: str) -> set[str]:
    """The names ``text`` binds inside its functions: parameters, assignments in a block,
    loop variables, ``as`` targets.

    A bare name near the cursor that the file binds itself (and does not import) is one of
    its locals: a definition of that name in another file (a test module's
    ``app = Starlette(...)`` for an ``app`` parameter) is a different thing, and showing
    it misleads the model. Regular expressions, as the definition index: a parameter list
    is read to its closing bracket; a generic or a receiver (``fn f<T>(``, Go's
    ``func (r T) f(``) is not matched, so its parameters are not taken for locals.
    """
    out: set[str] = set()
    text = text[:200_000]
    for m in _FUNC_OPEN.finditer(text):
        # One pass to the closing bracket, split at the commas of the outermost level.
        depth = 1
        part: list[str] = []
        params: list[str] = []
        for ch in text[m.end():m.end() + 2000]:
            if ch in "([{":
                depth += 1
            elif ch in ")]}":
                depth -= 1
                if depth == 0:
                    break
            if ch == "," and depth == 1:
                params.append("".join(part))
                part = []
            else:
                part.append(ch)
        params.append("".join(part))
        for p in params:
            words = _IDENT.findall(p.split(":", 1)[0].split("=", 1)[0])
            if words:
                out.add(words[-1] if len(words) > 1 and words[0] in ("const", "mut") else words[0])
    for m in _LOCAL_ASSIGN.finditer(text):
        out.update(_IDENT.findall(m.group("names")))
    for m in _LOCAL_BIND.finditer(text):
        out.update(_IDENT.findall(m.group("loop") or m.group("alias") or ""))
    return out


def call_lines(lines: list[str], name: str, mark: str = "#") -> list[tuple[int, int]]:
    """The calls of ``name`` in ``lines`` (``name(`` not after a dot; neither its definition
    nor a comment, by the file's comment ``mark``), each as its first and last line (where
    its brackets close, at most USAGE_CALL_LINES), each different text once."""
    call = re.compile(r"(?<![\w.])" + re.escape(name) + r"\(")
    out: list[tuple[int, int]] = []
    seen: set[str] = set()
    for i, ln in enumerate(lines):
        if name not in ln or not call.search(ln):
            continue
        body = ln.strip()
        if _DEF.match(ln) or body.startswith(mark) or body in seen:
            continue
        seen.add(body)
        out.append((i, signature_end(lines, i, USAGE_CALL_LINES)))
    return out


def _indented(line: str) -> bool:
    return line[:1] in (" ", "\t")


def module_aliases(text: str) -> set[str]:
    """The names ``text`` binds to whole modules: ``import a.b`` (``a``), ``import a as
    b`` (``b``), JavaScript's ``import * as b from``."""
    out: set[str] = set()
    for m in _MODULE_IMPORT.finditer(text[:200_000]):
        if m.group(3):
            out.add(m.group(3))
            continue
        for part in m.group(1).split(","):
            words = part.split()
            if len(words) == 3 and words[1] == "as":
                out.add(words[2])
            elif words:
                out.add(words[0].split(".")[0])
    return out


def comment_mark(path: str) -> str:
    """The line-comment mark of ``path``'s language (``#`` when unknown)."""
    if "." not in path.rsplit("/", 1)[-1]:
        return "#"
    return "#" if path.lower().endswith(_HASH_COMMENT) else "//"


def sources_of(chunks: list[ContextChunk]) -> str:
    """``definition:2,recent:1``: which sources a set used, for the latency log."""
    counts: dict[str, int] = {}
    for c in chunks:
        counts[c.source] = counts.get(c.source, 0) + 1
    return ",".join(f"{k}:{v}" for k, v in counts.items())
