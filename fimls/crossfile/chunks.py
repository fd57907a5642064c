"""Chunks of another file's text for the front of the prompt: the definition index
(``def``/``class``/functions/top-level assignments, by regular expressions), a definition
as a chunk that reads as code (a stub's signatures), and the calls of a name."""

from __future__ import annotations

import builtins
import keyword
import re
from dataclasses import dataclass

DEF_LINES = 10  # most lines kept of one definition
CLASS_EXTRA = 6  # more lines for a class: its methods' signatures
SIGNATURE_LINES = 16  # most lines of one signature
# A constructor's parameters are what a call of its class needs: jinja2's Environment takes
# 24, one per line.
INIT_SIGNATURE_LINES = 40

_DEF = re.compile(
    r"^(?P<indent>[ \t]*)(?:export\s+)?(?:pub(?:\([^)]*\))?\s+)?(?:async\s+)?"
    r"(?:def|class|function|func|fn|fun|interface|struct|trait|enum|type)\s+"
    r"(?:\([^)]*\)\s*)?(?P<name>[A-Za-z_]\w*)", re.M)
_ASSIGN = re.compile(
    r"^(?:export\s+)?(?:(?:const|let|var)\s+)?(?P<name>[A-Za-z_]\w*)\s*(?::[^=\n]*)?=(?!=)",
    re.M)
_IDENT = re.compile(r"[A-Za-z_]\w*")
_STRINGS = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'')

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
                line, i = _docstring_line(lines, i, body, quote)
                out.append(line)
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


def _docstring_line(lines: list[str], at: int, indent: int, quote: str) -> tuple[str, int]:
    """A docstring opening at line ``at`` as its first line of text, closed there, and the
    line after its closing quotes."""
    last = at if quote in lines[at].strip()[3:] else next(
        (k for k in range(at + 1, len(lines)) if quote in lines[k]), len(lines) - 1)
    words = next((w for w in (d.replace(quote, "").strip() for d in lines[at:last + 1]) if w),
                 "")
    return " " * indent + quote + words + quote, last + 1


def _stub(line: str) -> str:
    """A Python signature's last line with ``...`` for its body (``def f(x): ...``), so
    that the next method does not read as its body; other lines as they are."""
    code, hash_, comment = line.partition("  #")
    if code.rstrip().endswith(":"):
        return code.rstrip() + " ..." + hash_ + comment
    return line


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


def sources_of(chunks: list[ContextChunk]) -> str:
    """``definition:2,recent:1``: which sources a set used, for the latency log."""
    counts: dict[str, int] = {}
    for c in chunks:
        counts[c.source] = counts.get(c.source, 0) + 1
    return ",".join(f"{k}:{v}" for k, v in counts.items())
