"""Stop rules applied while decoding, and clean-up of the finished suggestion.

Plain string functions, no model and no LSP: the decode loop asks :class:`StopPolicy`
after every accepted token whether the text so far must end (and where), and
:func:`finalize` trims what repeats the suffix and normalises indentation.
"""

from __future__ import annotations

from dataclasses import dataclass

from fimls.config import CompletionOptions
from fimls.documents import split_lines

_CLOSERS = set(")]}>\"'`;,:")
_PAIRS = {")": "(", "]": "[", "}": "{"}


def _indent_of(line: str) -> str:
    return line[: len(line) - len(line.lstrip(" \t"))]


def _width(indent: str, tab: int = 4) -> int:
    return sum(tab if c == "\t" else 1 for c in indent)


def _first_nonblank_lines(text: str, n: int) -> list[str]:
    out: list[str] = []
    for line in split_lines(text):
        if line.strip():
            out.append(line)
            if len(out) == n:
                break
    return out


@dataclass(frozen=True, kw_only=True)
class CursorContext:
    """What the stop rules need to know about the cursor's surroundings."""

    line_prefix: str  # text of the cursor line before the cursor
    line_suffix: str  # text of the cursor line after the cursor
    next_lines: tuple[str, ...] = ()  # first non-blank lines after the cursor line

    @classmethod
    def from_text(cls, prefix: str, suffix: str) -> CursorContext:
        """Build from the document text before and after the cursor (only nearby text)."""
        head = prefix[-4096:]
        nl = max(head.rfind("\n"), head.rfind("\r"))
        line_prefix = head[nl + 1:]
        tail = suffix[:8192]
        cut = len(tail)
        for sep in ("\n", "\r"):
            i = tail.find(sep)
            if 0 <= i < cut:
                cut = i
        line_suffix = tail[:cut]
        rest = tail[cut + 1:] if cut < len(tail) else ""
        return cls(line_prefix=line_prefix, line_suffix=line_suffix,
                   next_lines=tuple(_first_nonblank_lines(rest, 3)))

    @property
    def mode(self) -> str:
        """How much to suggest, from the cursor line.

        ``line``: code on both sides of the cursor, complete to the end of this line only.
        ``insert``: only whitespace before the cursor but code after it: suggest whole lines
        to insert above that code. ``block``: nothing after the cursor: a line or a block.
        """
        if self.line_suffix.strip():
            return "line" if self.line_prefix.strip() else "insert"
        return "block"

    @property
    def single_line(self) -> bool:
        """Complete only to the end of the cursor line."""
        return self.mode == "line"

    @property
    def following(self) -> str:
        """The first line of code after the cursor, stripped (what a block must not repeat)."""
        if self.mode == "insert":
            return self.line_suffix.strip()
        return self.next_lines[0].strip() if self.next_lines else ""


@dataclass(kw_only=True)
class StopPolicy:
    """Decides, from the generated text so far, whether and where to stop."""

    ctx: CursorContext
    max_lines: int = CompletionOptions.max_lines

    def cut(self, text: str) -> int | None:
        """Index at which ``text`` must end, or None to keep generating."""
        if self.ctx.single_line:
            nl = text.find("\n")
            return nl if nl >= 0 else None
        lines = text.split("\n")
        cursor_has_code = bool(self.ctx.line_prefix.strip())
        following = self.ctx.following
        base: int | None = None
        if cursor_has_code:
            base = _width(_indent_of(self.ctx.line_prefix))
        offset = 0
        seen = 0  # non-blank lines so far
        for i, line in enumerate(lines):
            complete = i < len(lines) - 1
            if line.strip():
                full = self.ctx.line_prefix + line if i == 0 else line
                width = _width(_indent_of(full))
                if base is None:
                    # On a blank line the first line the model writes sets the block's level.
                    base = width
                elif i > 0 and width < base:
                    return max(0, offset - 1)
                if complete and following and line.strip() == following:
                    # The model reached the code that already follows the cursor.
                    return max(0, offset - 1)
                seen += 1
                if seen > self.max_lines:
                    return max(0, offset - 1)
            offset += len(line) + 1
        return None


def _closes_outside(text: str, tail: str) -> bool:
    """Whether the brackets and quotes that ``tail`` (the end of ``text``) closes are left
    open by ``text`` itself: then they repeat closers of the suffix, else ``text`` needs them.
    """
    for close, opener in _PAIRS.items():
        need = tail.count(close) - tail.count(opener)
        if need > 0 and text.count(close) - text.count(opener) < need:
            return False
    return all(not tail.count(q) % 2 or text.count(q) % 2 for q in "\"'`")


def _trim_suffix_overlap(text: str, line_suffix: str) -> str:
    """Drop the end of a one-line completion that repeats the text after the cursor."""
    rest = line_suffix.rstrip()
    if not rest or not text:
        return text
    stripped = text.rstrip()
    if stripped.endswith(rest.strip()) and rest.strip() and _closes_outside(
            stripped, rest.strip()):
        return stripped[: len(stripped) - len(rest.strip())].rstrip() or ""
    # Partial overlap: the completion ends with the start of the suffix, e.g. "foo(x)"
    # before ")": closing brackets and quotes may overlap by one character, words need 3.
    for k in range(min(len(stripped), len(rest)), 0, -1):
        head = rest[:k]
        if (stripped.endswith(head) and (k >= 3 or all(c in _CLOSERS for c in head))
                and _closes_outside(stripped, head)):
            return stripped[: len(stripped) - k]
    return text


def _trim_next_lines(text: str, next_lines: tuple[str, ...]) -> str:
    """Drop trailing lines of a block completion that repeat the lines after the cursor."""
    if not next_lines or "\n" not in text:
        return text
    lines = text.split("\n")
    want = next_lines[0].strip()
    for i in range(1, len(lines)):
        if lines[i].strip() == want and want:
            return "\n".join(lines[:i]).rstrip()
    return text


def _match_indent_style(text: str, line_prefix: str) -> str:
    """Use tabs for new lines when the cursor line is indented with tabs."""
    indent = _indent_of(line_prefix)
    if "\t" not in indent or "\n" not in text:
        return text
    out = []
    for j, line in enumerate(text.split("\n")):
        if j and line.startswith("    "):
            lead = _indent_of(line)
            line = "\t" * (len(lead) // 4) + " " * (len(lead) % 4) + line[len(lead):]
        out.append(line)
    return "\n".join(out)


def cut_to_budget(text: str) -> str | None:
    """What of an unfinished suggestion to show once its time is up (``maxTimeMs``): its
    complete lines, or None to keep going until one line is complete. As llama-server's
    ``t_max_predict_ms``: the time limit shortens a block, it never cuts the first line
    (half a statement is worse than waiting for the rest of it)."""
    nl = text.rfind("\n")
    if nl >= 0 and text[:nl].strip():
        return text[:nl]
    return None


def finalize(text: str, ctx: CursorContext) -> str:
    """Clean a finished suggestion; an empty string means "no suggestion"."""
    mode = ctx.mode
    if mode == "line":
        text = text.split("\n", 1)[0]
        text = _trim_suffix_overlap(text, ctx.line_suffix)
        text = text.rstrip(" \t")
    else:
        if mode == "block":
            text = _trim_next_lines(text, ctx.next_lines)
        if not ctx.line_prefix.strip():
            # On a blank line a leading newline would show ghost text one line down. The
            # line after it is indented from column 0 but goes in after the cursor's indent.
            body = text.lstrip("\r\n")
            if body != text and ctx.line_prefix and body.startswith(ctx.line_prefix):
                body = body[len(ctx.line_prefix):]
            text = body
        text = text.rstrip()
    text = _match_indent_style(text, ctx.line_prefix)
    if not text.strip():
        return ""
    if mode == "insert":
        # Whole lines go in above the existing code, which must keep its indentation: when
        # the text after the cursor starts with whitespace it carries its own, and what
        # was typed before the cursor belongs to the first inserted line; otherwise the
        # indentation before the cursor is the code's and is repeated for it.
        following = ctx.following
        lines = text.split("\n")
        if following and lines[-1].strip() == following:
            lines = lines[:-1]
        text = "\n".join(lines).rstrip()
        if not text.strip():
            return ""
        carries_indent = ctx.line_suffix[:1] in (" ", "\t")
        return text + "\n" + ("" if carries_indent else ctx.line_prefix)
    return text


def banned_first_bytes(mode: str, line_prefix: str) -> bytes:
    """The bytes a suggestion may not start with, for a cursor after ``line_prefix``.

    On a blank line a multi-line suggestion never starts with a newline (it would be
    invisible ghost text). Ruled out while decoding, rather than trimmed afterwards, so that
    the shown text stays the model's token path and typing it reuses it. (More indentation
    after indentation is not ruled out: a user typing an accepted suggestion's indentation
    stands in the middle of it.)
    """
    return b"\n\r" if not line_prefix.strip() and mode != "line" else b""
