"""Tests for fimls.documents: line ends, position encodings, edits and the store."""

from __future__ import annotations

import random

import pytest

from fimls.documents import (
    UTF8,
    UTF16,
    UTF32,
    DocumentStore,
    Pos,
    PositionEncoding,
    TextDocument,
    coerce_encoding,
    split_lines,
    workspace_relative_path,
)

ENCODINGS = [UTF8, UTF16, UTF32]


def doc(text: str) -> TextDocument:
    return TextDocument("file:///t.py", "python", 1, text)


# --- reference implementation: walks the text one character at a time ---------------


def ref_width(ch: str, enc: PositionEncoding) -> int:
    if enc is UTF32:
        return 1
    if enc is UTF16:
        return 2 if ord(ch) > 0xFFFF else 1
    return len(ch.encode("utf-8", "surrogatepass"))


def ref_lines(text: str) -> list[tuple[int, int]]:
    """(content start, content end) of every line, found character by character."""
    out: list[tuple[int, int]] = []
    start = 0
    i = 0
    while i < len(text):
        ch = text[i]
        if ch == "\r" and i + 1 < len(text) and text[i + 1] == "\n":
            out.append((start, i))
            i += 2
            start = i
        elif ch in "\r\n":
            out.append((start, i))
            i += 1
            start = i
        else:
            i += 1
    out.append((start, len(text)))
    return out


def ref_offset(text: str, pos: Pos, enc: PositionEncoding) -> int:
    line, char = max(pos.line, 0), max(pos.character, 0)
    lines = ref_lines(text)
    if line >= len(lines):
        return len(text)
    start, end = lines[line]
    units = 0
    i = start
    while i < end:
        w = ref_width(text[i], enc)
        if units + w > char:
            break
        units += w
        i += 1
    return i


def ref_position(text: str, offset: int, enc: PositionEncoding) -> Pos:
    offset = min(max(offset, 0), len(text))
    lines = ref_lines(text)
    for n, (start, end) in enumerate(lines):
        next_start = lines[n + 1][0] if n + 1 < len(lines) else len(text) + 1
        if start <= offset < next_start:
            offset = min(offset, end)
            return Pos(n, sum(ref_width(c, enc) for c in text[start:offset]))
    raise AssertionError("unreachable")


def ref_apply(text: str, rng: tuple[Pos, Pos] | None, new: str, enc: PositionEncoding) -> str:
    if rng is None:
        return new
    a, b = ref_offset(text, rng[0], enc), ref_offset(text, rng[1], enc)
    a, b = min(a, b), max(a, b)
    return text[:a] + new + text[b:]


# --- line ends ------------------------------------------------------------------------


def test_split_lines_lsp_line_ends_only() -> None:
    assert split_lines("a\r\nb") == ["a", "b"]
    assert split_lines("a\rb\nc\r\n") == ["a", "b", "c", ""]
    assert split_lines("") == [""]
    assert split_lines("\r\r\n\n") == ["", "", "", ""]
    text = "a\fb\u2028c\x85d\ve\x1cf\x1dg\x1eh\u2029i"
    assert split_lines(text) == [text]
    assert len(text.splitlines()) > 1  # the trap this module avoids


def test_crlf_lone_cr_and_mixed() -> None:
    d = doc("one\r\ntwo\rthree\nfour")
    assert d.line_count == 4
    assert [d.line_text(i) for i in range(4)] == ["one", "two", "three", "four"]
    assert d.offset_at(Pos(1, 0)) == 5
    assert d.offset_at(Pos(2, 0)) == 9
    assert d.offset_at(Pos(3, 0)) == 15
    # Past end of a CRLF line: stops before "\r", never between "\r" and "\n".
    assert d.offset_at(Pos(0, 99)) == 3
    assert d.position_at(4) == Pos(0, 3)  # between \r and \n
    assert d.position_at(5) == Pos(1, 0)
    assert d.position_at(8) == Pos(1, 3)  # on the lone \r


def test_other_separators_are_not_line_breaks() -> None:
    for sep in ["\f", "\u2028", "\u2029", "\x85", "\v", "\x1c", "\x1d", "\x1e"]:
        d = doc(f"ab{sep}cd\nx")
        assert d.line_count == 2, repr(sep)
        assert d.line_text(0) == f"ab{sep}cd"
        assert d.offset_at(Pos(0, 5), UTF32) == 5
        assert d.position_at(5, UTF32) == Pos(0, 5)
        assert d.offset_at(Pos(1, 0)) == 6


def test_trailing_newline_and_empty_document() -> None:
    d = doc("")
    assert d.line_count == 1
    assert d.line_text(0) == ""
    assert d.line_text(1) == ""
    assert d.line_text(-1) == ""
    for enc in ENCODINGS:
        assert d.offset_at(Pos(0, 0), enc) == 0
        assert d.offset_at(Pos(5, 5), enc) == 0
        assert d.position_at(0, enc) == Pos(0, 0)
        assert d.position_at(10, enc) == Pos(0, 0)
    assert d.prefix_suffix(Pos(0, 0)) == ("", "")
    d = doc("x\n")
    assert d.line_count == 2
    assert d.offset_at(Pos(1, 0)) == 2
    assert d.position_at(2) == Pos(1, 0)


# --- encodings ------------------------------------------------------------------------


def test_non_bmp_units_per_encoding() -> None:
    d = doc("a😀b𝄞c")
    assert d.position_at(2, UTF16) == Pos(0, 3)
    assert d.position_at(2, UTF8) == Pos(0, 5)
    assert d.position_at(2, UTF32) == Pos(0, 2)
    assert d.position_at(5, UTF16) == Pos(0, 7)
    assert d.position_at(5, UTF8) == Pos(0, 11)
    assert d.position_at(5, UTF32) == Pos(0, 5)
    assert d.offset_at(Pos(0, 3), UTF16) == 2
    assert d.offset_at(Pos(0, 5), UTF8) == 2
    assert d.offset_at(Pos(0, 2), UTF32) == 2
    assert d.offset_at(Pos(0, 4), UTF16) == 3  # 𝄞 occupies columns 4 and 5
    assert d.offset_at(Pos(0, 6), UTF16) == 4
    assert d.offset_at(Pos(0, 7), UTF16) == 5


def test_mid_code_point_rounds_down() -> None:
    d = doc("a😀b")
    assert d.offset_at(Pos(0, 2), UTF16) == 1  # inside the surrogate pair
    for col in (2, 3, 4):
        assert d.offset_at(Pos(0, col), UTF8) == 1  # inside the 4-byte sequence
    d = doc("é€x")  # 2-byte and 3-byte UTF-8 sequences
    assert d.offset_at(Pos(0, 1), UTF8) == 0
    assert d.offset_at(Pos(0, 2), UTF8) == 1
    assert d.offset_at(Pos(0, 3), UTF8) == 1
    assert d.offset_at(Pos(0, 4), UTF8) == 1
    assert d.offset_at(Pos(0, 5), UTF8) == 2
    assert d.offset_at(Pos(0, 6), UTF8) == 3
    d = doc("¿¿x")  # "¿" is C2 BF: the highest continuation byte value
    assert d.offset_at(Pos(0, 4), UTF8) == 2
    assert d.offset_at(Pos(0, 3), UTF8) == 1
    assert d.position_at(2, UTF8) == Pos(0, 4)


def test_encoding_accepts_strings() -> None:
    d = doc("😀x")
    assert d.offset_at(Pos(0, 2), "utf-16") == 1
    assert d.offset_at(Pos(0, 4), "utf-8") == 1
    assert d.offset_at(Pos(0, 1), "utf-32") == 1
    assert coerce_encoding("UTF-8") is UTF8
    assert coerce_encoding(None) is UTF16
    assert coerce_encoding("bogus") is UTF16


def test_lone_surrogates_do_not_crash() -> None:
    # "\ud83d\ude00" below is two separate code points, not the emoji they would encode.
    d = doc("a\ud83db\ude00c😀d\ud83d\ude00e😀")
    assert len(d.text) == 11
    for enc in ENCODINGS:
        for off in range(len(d.text) + 1):
            pos = d.position_at(off, enc)
            assert pos == ref_position(d.text, off, enc)
            assert d.offset_at(pos, enc) == off
        for col in range(25):
            assert d.offset_at(Pos(0, col), enc) == ref_offset(d.text, Pos(0, col), enc)


# --- clamping ---------------------------------------------------------------------------


def test_clamping() -> None:
    d = doc("abc\ndef")
    assert d.offset_at(Pos(0, 99)) == 3
    assert d.offset_at(Pos(1, 99)) == 7
    assert d.offset_at(Pos(99, 0)) == 7
    assert d.offset_at(Pos(99, 99)) == 7
    assert d.offset_at(Pos(-1, 2)) == 2
    assert d.offset_at(Pos(1, -5)) == 4
    assert d.offset_at(Pos(-3, -3)) == 0
    assert d.position_at(-10) == Pos(0, 0)
    assert d.position_at(100) == Pos(1, 3)


# --- edits ------------------------------------------------------------------------------


def test_incremental_edits_across_lines() -> None:
    d = doc("line one\nline two\nline three")
    d.apply_change("X\nY", (Pos(0, 5), Pos(1, 4)))
    assert d.text == "line X\nY two\nline three"
    assert d.line_count == 3
    d.apply_change("", (Pos(1, 1), Pos(2, 4)))
    assert d.text == "line X\nY three"
    assert d.line_text(1) == "Y three"
    d.apply_change("!", (Pos(9, 0), Pos(9, 0)))  # past the end: appends
    assert d.text.endswith("three!")
    d.apply_change("Z", (Pos(1, 1), Pos(0, 4)))  # reversed range
    assert d.text == "lineZ three!"
    assert d.line_count == 1


def test_edit_creates_crlf_from_lone_cr() -> None:
    d = doc("a\rb")
    assert d.line_count == 2
    d.apply_change("\n", (Pos(1, 0), Pos(1, 0)))
    assert d.text == "a\r\nb"
    assert d.line_count == 2
    assert d.line_text(0) == "a"
    assert d.line_text(1) == "b"
    assert d.offset_at(Pos(1, 0)) == 3


def test_edit_joins_cr_and_lf_by_deletion() -> None:
    d = doc("a\rX\nb")
    assert d.line_count == 3
    d.apply_change("", (Pos(1, 0), Pos(1, 1)))
    assert d.text == "a\r\nb"
    assert d.line_count == 2
    assert d.line_text(1) == "b"


def test_edit_splits_crlf_and_inserts_cr() -> None:
    d = doc("a\r\nb")
    d.apply_change("\r", (Pos(0, 1), Pos(0, 1)))  # "a\r" + "\r\n": three lines now
    assert d.text == "a\r\r\nb"
    assert d.line_count == 3
    assert [d.line_text(i) for i in range(3)] == ["a", "", "b"]
    d.apply_change("q", (Pos(0, 9), Pos(1, 0)))  # replace the lone CR
    assert d.text == "aq\r\nb"
    assert d.line_count == 2
    d.apply_change("", (Pos(0, 2), Pos(1, 0)))  # delete the CRLF
    assert d.text == "aqb"
    assert d.line_count == 1


def test_edit_inside_surrogate_pair_rounds_down() -> None:
    d = doc("x😀y")
    d.apply_change("Q", (Pos(0, 2), Pos(0, 2)), UTF16)  # mid pair -> before the emoji
    assert d.text == "xQ😀y"
    d.apply_change("", (Pos(0, 2), Pos(0, 3)), UTF16)  # both ends at the pair: no-op
    assert d.text == "xQ😀y"
    d.apply_change("", (Pos(0, 1), Pos(0, 3)), UTF16)  # end rounds down to the pair
    assert d.text == "x😀y"
    d = doc("x😀y")
    d.apply_change("", (Pos(0, 1), Pos(0, 3)), UTF16)
    assert d.text == "xy"
    d = doc("x😀y")
    d.apply_change("", (Pos(0, 1), Pos(0, 2)), UTF16)  # end mid pair rounds down: no-op
    assert d.text == "x😀y"
    d.apply_change("", (Pos(0, 1), Pos(0, 4)), UTF8)  # end mid sequence rounds down
    assert d.text == "x😀y"
    d.apply_change("", (Pos(0, 1), Pos(0, 5)), UTF8)
    assert d.text == "xy"


def test_full_replacement() -> None:
    d = doc("old\ntext")
    assert d.line_count == 2
    d.apply_change("brand\r\nnew\rtext\n", None)
    assert d.text == "brand\r\nnew\rtext\n"
    assert d.line_count == 4
    assert d.line_text(2) == "text"
    d.text = "z"
    assert d.line_count == 1


def test_prefix_suffix() -> None:
    d = doc("def f():\r\n    return 1\n")
    assert d.prefix_suffix(Pos(1, 4)) == ("def f():\r\n    ", "return 1\n")
    assert d.prefix_suffix(Pos(0, 99)) == ("def f():", "\r\n    return 1\n")
    assert d.prefix_suffix(Pos(1, 4), max_prefix=3, max_suffix=2) == ("   ", "re")
    assert d.prefix_suffix(Pos(9, 0)) == (d.text, "")


# --- randomized differential test ---------------------------------------------------------

ALPHABET = [
    "a",
    "b",
    " ",
    "\n",
    "\r",
    "\r\n",
    "\f",
    "\v",
    "\x85",
    "\u2028",
    "\u2029",
    "\x1c",
    "😀",
    "𝄞",
    "é",
    "€",
    "中",
    "¿",
]


def random_text(rnd: random.Random, max_len: int) -> str:
    return "".join(rnd.choice(ALPHABET) for _ in range(rnd.randint(0, max_len)))


def random_pos(rnd: random.Random, text: str) -> Pos:
    lines = split_lines(text)
    line = rnd.randint(-1, len(lines))
    width = 4 * len(lines[line]) if 0 <= line < len(lines) else 3
    return Pos(line, rnd.randint(-1, width + 2))


def check_consistent(d: TextDocument, rnd: random.Random, enc: PositionEncoding) -> None:
    text = d.text
    expected_lines = [text[s:e] for s, e in ref_lines(text)]
    assert d.line_count == len(expected_lines)
    assert split_lines(text) == expected_lines
    assert [d.line_text(i) for i in range(d.line_count)] == expected_lines
    for _ in range(5):
        pos = random_pos(rnd, text)
        off = d.offset_at(pos, enc)
        assert off == ref_offset(text, pos, enc), (text, pos, enc)
        back = d.position_at(off, enc)
        assert back == ref_position(text, off, enc)
        assert d.offset_at(back, enc) == off
        probe = rnd.randint(-2, len(text) + 2)
        assert d.position_at(probe, enc) == ref_position(text, probe, enc), (text, probe)


def test_randomized_against_reference() -> None:
    rnd = random.Random(20240611)
    edits = 0
    for _ in range(300):
        text = random_text(rnd, 30)
        d = doc(text)
        if rnd.random() < 0.5:
            assert d.line_count >= 1  # builds the index so edits exercise the splice
        for _ in range(20):
            enc = rnd.choice(ENCODINGS)
            new = random_text(rnd, 6)
            rng = None if rnd.random() < 0.03 else (random_pos(rnd, text), random_pos(rnd, text))
            text = ref_apply(text, rng, new, enc)
            d.apply_change(new, rng, enc)
            edits += 1
            assert d.text == text, (rng, new, enc)
            if rnd.random() < 0.5:
                check_consistent(d, rnd, enc)
        check_consistent(d, rnd, rnd.choice(ENCODINGS))
    assert edits == 6000


def test_long_line_with_astral_characters() -> None:
    line = ("ab😀中" * 2000) + "\n"
    d = doc(line * 3)
    for enc in ENCODINGS:
        for col in (0, 1, 2, 3, 4, 5, 999, 5000, 10001, 20000, 10**9):
            pos = Pos(1, col)
            assert d.offset_at(pos, enc) == ref_offset(d.text, pos, enc)
        off = len(line) + 4001
        assert d.position_at(off, enc) == ref_position(d.text, off, enc)


# --- store ------------------------------------------------------------------------------


def test_store_lifecycle_and_unknown_uris() -> None:
    store = DocumentStore()
    assert store.get("file:///nope.py") is None
    assert store.change("file:///nope.py", 2, [("x", None)]) is None
    store.close("file:///nope.py")  # must not raise
    assert "file:///nope.py" not in store

    opened = store.open("file:///a.py", "python", 1, "print(1)\n")
    assert "file:///a.py" in store
    assert store.get("file:///a.py") is opened
    assert store.uris() == ["file:///a.py"]
    changed = store.change(
        "file:///a.py",
        5,
        [("2", (Pos(0, 6), Pos(0, 7))), ("# hi\n", (Pos(0, 0), Pos(0, 0)))],
        UTF16,
    )
    assert changed is opened
    assert opened.version == 5
    assert opened.text == "# hi\nprint(2)\n"
    store.close("file:///a.py")
    assert store.get("file:///a.py") is None
    assert store.uris() == []


# --- workspace paths --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("uri", "roots", "expected"),
    [
        ("file:///home/u/proj/src/a.py", ["file:///home/u/proj"], ("proj", "src/a.py")),
        ("file:///home/u/proj/src/a.py", ["file:///home/u/proj/"], ("proj", "src/a.py")),
        ("file:///home/u/my%20proj/a%23b.py", ["file:///home/u/my%20proj"], ("my proj", "a#b.py")),
        ("file:///home/u/proj2/a.py", ["file:///home/u/proj"], (None, "a.py")),
        ("file:///home/u/other/x/y.rs", [], (None, "y.rs")),
        (
            "file:///w/outer/inner/m.go",
            ["file:///w/outer", "file:///w/outer/inner"],
            ("inner", "m.go"),
        ),
        ("file:///c%3A/Users/p/f.ts", ["file:///C:/Users/p"], ("p", "f.ts")),
        ("untitled:Untitled-1", ["file:///home/u/proj"], (None, "Untitled-1")),
        ("vscode-notebook-cell:/home/u/nb.ipynb", [], (None, "nb.ipynb")),
    ],
)
def test_workspace_relative_path(
    uri: str, roots: list[str], expected: tuple[str | None, str]
) -> None:
    assert workspace_relative_path(uri, roots) == expected
