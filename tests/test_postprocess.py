"""Tests for fimls.postprocess: cursor modes, stop rules while decoding, and finalize."""

from __future__ import annotations

import pytest

from fimls.postprocess import (
    CursorContext,
    StopPolicy,
    banned_first_bytes,
    cut_to_budget,
    finalize,
)


def ctx(prefix: str, suffix: str = "") -> CursorContext:
    """The context for a cursor between ``prefix`` and ``suffix``."""
    return CursorContext.from_text(prefix, suffix)


def stopped(policy: StopPolicy, text: str) -> str | None:
    """``text`` cut where the policy says, or None when generation would go on."""
    cut = policy.cut(text)
    return None if cut is None else text[:cut]


# --- CursorContext ----------------------------------------------------------------------


def test_line_mode_code_on_both_sides() -> None:
    c = ctx("def f():\n    x = foo(", ")\n    return x\n")
    assert (c.line_prefix, c.line_suffix) == ("    x = foo(", ")")
    assert c.mode == "line"
    assert c.single_line
    assert c.next_lines == ("    return x",)
    assert c.following == "return x"


def test_insert_mode_blank_before_code_after() -> None:
    c = ctx("def f():\n    ", "return 1\n")
    assert c.mode == "insert"
    assert not c.single_line
    assert c.following == "return 1"


def test_block_mode_nothing_after_cursor() -> None:
    c = ctx("def f(x):\n    ", "   \n\n    return x\n\n    a\n    b\n    c\n")
    assert c.mode == "block"
    assert c.line_suffix == "   "
    assert c.next_lines == ("    return x", "    a", "    b")  # first three non-blank
    assert c.following == "return x"


def test_block_mode_at_end_of_code_line() -> None:
    c = ctx("x = 1", "")
    assert c.mode == "block"
    assert c.following == ""


def test_crlf_line_ends() -> None:
    c = ctx("a = 1\r\n    b = f(", ")\r\n\r\n    c = 2\r\n")
    assert (c.line_prefix, c.line_suffix) == ("    b = f(", ")")
    assert c.next_lines == ("    c = 2",)


def test_only_lsp_line_ends_split_lines() -> None:
    """Form feed, NEL and U+2028 inside a line are text, as LSP counts lines; splitting on
    them (str.splitlines) made the line after the cursor look like just its first piece."""
    line = "    x = 1\f\x85\u2028y"
    c = ctx("def f():\n    ", "\n" + line + "\n    z\n")
    assert c.next_lines == (line, "    z")
    assert c.following == line.strip()
    # A suggestion that reaches that line, odd characters and all, stops before it...
    assert finalize("a = 0\n" + line, c) == "a = 0"
    assert stopped(StopPolicy(ctx=c), "a = 0\n" + line + "\n") == "a = 0"
    # ...and one that only shares the line's first piece is kept.
    assert finalize("a = 0\n    x = 1", c) == "a = 0\n    x = 1"


# --- StopPolicy -------------------------------------------------------------------------


def test_single_line_stops_at_newline() -> None:
    p = StopPolicy(ctx=ctx("x = foo(", ")\n"))
    assert p.cut("a, b") is None
    assert p.cut("a, b\nc") == 4
    assert p.cut("\n") == 0


def test_block_stops_at_dedent_below_cursor_level() -> None:
    p = StopPolicy(ctx=ctx("def f(x):\n    if x:\n        ", ""))
    assert p.cut("return 1\n        ") is None
    assert stopped(p, "return 1\n    return 2\n") == "return 1"


def test_block_from_code_line_uses_its_indent() -> None:
    p = StopPolicy(ctx=ctx("def f():\n    x = 1", ""))
    assert p.cut("\n    y = 2\n") is None
    assert stopped(p, "\n    y = 2\nz = 3\n") == "\n    y = 2"


def test_block_on_blank_line_first_line_sets_level() -> None:
    p = StopPolicy(ctx=ctx("class A:\n", ""))
    assert p.cut("    def f(self):\n        pass\n") is None
    assert stopped(p, "    def f(self):\n        pass\nx = 1\n") == "    def f(self):\n        pass"


def test_block_stops_at_next_existing_line() -> None:
    p = StopPolicy(ctx=ctx("def f(x):\n    ", "\n    return x\n"))
    assert p.cut("y = x + 1\n    return x") is None  # that line is not complete yet
    assert stopped(p, "y = x + 1\n    return x\n") == "y = x + 1"


def test_insert_stops_at_the_code_after_cursor() -> None:
    p = StopPolicy(ctx=ctx("def f():\n    ", "return 1\n"))
    assert stopped(p, "x = 2\n    return 1\n") == "x = 2"


@pytest.mark.parametrize("max_lines", [1, 2, 3])
def test_max_lines(max_lines: int) -> None:
    p = StopPolicy(ctx=ctx("", ""), max_lines=max_lines)
    lines = [f"a{i} = {i}" for i in range(5)]
    assert stopped(p, "\n".join(lines) + "\n") == "\n".join(lines[:max_lines])
    assert p.cut("\n".join(lines[:max_lines]) + "\n") is None


def test_blank_lines_do_not_count_towards_max_lines() -> None:
    p = StopPolicy(ctx=ctx("", ""), max_lines=2)
    assert p.cut("a = 1\n\n\nb = 2\n") is None
    assert stopped(p, "a = 1\n\n\nb = 2\n\nc = 3\n") == "a = 1\n\n\nb = 2\n"


# --- finalize ---------------------------------------------------------------------------


@pytest.mark.parametrize(("completion", "expected"), [
    ("x)", "x"),
    ("a, b)", "a, b"),
    ("foo(1))", "foo(1)"),
    ("foo(1)", "foo(1)"),  # balanced: the ")" closes the completion's own "("
    ("bar()", "bar()"),
    ("x)  ", "x"),
    ("x)\nprint(2)", "x"),  # line mode: one line only
])
def test_duplicated_closer_removed(completion: str, expected: str) -> None:
    assert finalize(completion, ctx("    print(", ")\n")) == expected


def test_duplicated_quote_and_bracket_removed() -> None:
    c = ctx('print("', '")\n')
    assert finalize('abc")', c) == "abc"
    assert finalize('abc"', c) == "abc"


def test_repeated_line_suffix_removed() -> None:
    assert finalize("a + 1", ctx("x = ", " + 1\n")) == "a"


def test_duplicated_next_line_removed() -> None:
    c = ctx("def f(x):\n    ", "\n    return x\n")
    assert finalize("y = x + 1\n    return x", c) == "y = x + 1"
    assert finalize("y = x + 1\n    z = y", c) == "y = x + 1\n    z = y"


@pytest.mark.parametrize(("prefix", "suffix"), [
    ("x = foo(", ")\n"),  # line
    ("def f():\n    ", "return 1\n"),  # insert
    ("def f():\n    ", ""),  # block
])
def test_whitespace_only_is_no_suggestion(prefix: str, suffix: str) -> None:
    assert finalize("  \n \t\n", ctx(prefix, suffix)) == ""
    assert finalize("", ctx(prefix, suffix)) == ""


def test_insert_mode_ends_with_cursor_indent() -> None:
    c = ctx("def f():\n    ", "return 1\n")
    assert finalize("x = 2", c) == "x = 2\n    "
    assert finalize("x = 2\n    y = 3\n", c) == "x = 2\n    y = 3\n    "
    assert finalize("x = 2\n    return 1", c) == "x = 2\n    "  # repeats the code after
    assert finalize("return 1", c) == ""
    # The code after the cursor carries its own indentation: what was typed before the
    # cursor starts the inserted line, and the code keeps its indentation unchanged.
    own = ctx("def f():\n ", "       return 1\n")
    assert finalize("   x = 2", own) == "   x = 2\n"


def test_tabs_kept_when_cursor_line_uses_tabs() -> None:
    ins = ctx("def f():\n\t", "return 1\n")
    assert finalize("x = 2\n    y = 3", ins) == "x = 2\n\ty = 3\n\t"
    block = ctx("def f(x):\n\tif x:\n\t\t", "")
    assert finalize("a()\n        b()\n      c()", block) == "a()\n\t\tb()\n\t  c()"
    spaces = ctx("def f(x):\n    if x:\n        ", "")
    assert finalize("a()\n        b()", spaces) == "a()\n        b()"


def test_leading_newline_dropped_on_blank_line() -> None:
    assert finalize("\nx = 1", ctx("def f():\n    pass\n", "")) == "x = 1"
    assert finalize("\r\n\nx = 1\ny = 2", ctx("", "")) == "x = 1\ny = 2"
    # The cursor's indentation is already on the line: the suggestion must not repeat it.
    assert finalize("\n    return 1", ctx("def f():\n    ", "")) == "return 1"
    assert finalize("\n    return 1\n    x", ctx("def f():\n    ", "")) == "return 1\n    x"


def test_leading_newline_kept_after_code() -> None:
    assert finalize("\ny = 2\n", ctx("x = 1", "")) == "\ny = 2"


def test_a_suggestion_cut_by_time_keeps_whole_lines_only() -> None:
    assert cut_to_budget("\n        if n > 1:\n            out.app") == "\n        if n > 1:"
    assert cut_to_budget("return total\n    x = 1\n") == "return total\n    x = 1"
    # The first line is always finished: keep going.
    assert cut_to_budget("\n        if n > 1") is None
    assert cut_to_budget("return tot") is None
    assert cut_to_budget("\n") is None


@pytest.mark.parametrize(("mode", "line_prefix", "ban"), [
    ("block", "", b"\n\r"),  # a blank line: no invisible leading newline
    ("block", "    ", b"\n\r"),  # more indentation may follow (typing an accepted one)
    ("line", "\t", b""),
    ("line", "", b""),
    ("block", "    x = ", b""),  # code before the cursor: the model may write anything
])
def test_what_a_suggestion_may_not_start_with(mode: str, line_prefix: str, ban: bytes) -> None:
    assert banned_first_bytes(mode, line_prefix) == ban
