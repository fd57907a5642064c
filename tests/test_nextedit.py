"""Next-edit recognition and matching: what a one-line edit did, and where else it is due."""

from __future__ import annotations

import pytest

from fimls.nextedit.apply import apply
from fimls.nextedit.change import ChangeKind, recognize
from fimls.nextedit.targets import find_targets


def again(old: str, new: str, line: str) -> str | None:
    """``line`` with the change that turned ``old`` into ``new`` (None: not due there)."""
    change = recognize(old, new)
    assert change is not None
    edit = apply(change, line)
    return None if edit is None else edit.applied(line)


def test_a_rename_is_due_at_whole_words_only() -> None:
    change = recognize("total = rootNode.size", "total = rootNodes.size")
    assert change is not None and change.kind is ChangeKind.RENAME
    assert again("total = rootNode.size", "total = rootNodes.size",
                 "walk(rootNode, rootNode.left)") == "walk(rootNodes, rootNodes.left)"
    # Partial words are other names, and an attribute of that name is another role.
    for other in ("rootNodeCount += 1", "myrootNode = 1", "self.rootNode = x",
                  'print("rootNode")', "rootNodes.clear()"):
        assert again("total = rootNode.size", "total = rootNodes.size", other) is None


def test_an_attribute_rename_follows_attributes_only() -> None:
    change = recognize("self.count = 0", "self.total = 0")
    assert change is not None and change.kind is ChangeKind.ATTRIBUTE
    assert again("self.count = 0", "self.total = 0",
                 "return self.count + other.count") == "return self.total + other.total"
    assert again("self.count = 0", "self.total = 0", "count = len(xs)") is None


def test_an_argument_added_at_the_end_of_calls() -> None:
    old, new = "x = parse(text, strict)", "x = parse(text, strict, encoding=enc)"
    change = recognize(old, new)
    assert change is not None and change.kind is ChangeKind.ARGUMENT_ADDED
    assert again(old, new, "    y = parse(other)") == "    y = parse(other, encoding=enc)"
    assert again(old, new, "parse()") == "parse(encoding=enc)"
    assert again(old, new, "z = parse(a, f(b, c))") == "z = parse(a, f(b, c), encoding=enc)"
    # Already there, another function, or a call that goes on past the line.
    assert again(old, new, "parse(a, encoding=enc)") is None
    assert again(old, new, "reparse(a)") is None
    assert again(old, new, "parse(a,") is None


def test_an_argument_added_first_and_one_removed() -> None:
    assert again("g(a, b)", "g(ctx, a, b)", "  g(x)") == "  g(ctx, x)"
    old, new = "log(msg, level, stacklevel=2)", "log(msg, level)"
    change = recognize(old, new)
    assert change is not None and change.kind is ChangeKind.ARGUMENT_REMOVED
    assert again(old, new, "log(m, stacklevel=2)") == "log(m)"
    assert again(old, new, "log(stacklevel=2)") == "log()"
    assert again(old, new, "log(m, stacklevel=3)") is None


def test_a_literal_is_keyed_by_its_name() -> None:
    old, new = "open(p, encoding='utf-8')", "open(p, encoding='utf-8-sig')"
    change = recognize(old, new)
    assert change is not None and change.kind is ChangeKind.LITERAL
    assert again(old, new, "read(q, encoding='utf-8')") == "read(q, encoding='utf-8-sig')"
    assert again(old, new, "name = 'utf-8'") is None


def test_an_edited_expression_is_not_made_twice() -> None:
    old, new = "data = fetch(url)", "data = await fetch(url)"
    assert again(old, new, "    more = fetch(other)") == "    more = await fetch(other)"
    assert again(old, new, "    more = await fetch(other)") is None
    assert again(old, new, "prefetch(url)") is None


@pytest.mark.parametrize(("old", "new"), [
    ("x = 1", "x = 1"), ("a  =  b", "a = b"), ("", ""),
])
def test_nothing_to_propagate(old: str, new: str) -> None:
    assert recognize(old, new) is None


def test_targets_nearest_first_then_other_documents() -> None:
    change = recognize("n = count(items)", "n = tally(items)")
    assert change is not None
    doc = ["count(a)", "x = 1", "n = tally(items)", "y = count(b)", "", "count(c)"]
    other = ["from m import count", "count(d)"]
    found = find_targets(change, {"file:///a.py": doc, "file:///b.py": other},
                         "file:///a.py", 2)
    assert [(t.uri[-4:], t.line) for t in found] == [
        ("a.py", 3), ("a.py", 0), ("a.py", 5), ("b.py", 0), ("b.py", 1)]
    assert found[0].new_line == "y = tally(b)"
    assert (found[0].edit.start, found[0].edit.end) == (4, 9)


def test_columns_are_code_points_with_non_ascii_text() -> None:
    change = recognize("größe = maß(x)", "größe = maße(x)")
    assert change is not None and change.kind is ChangeKind.RENAME
    edit = apply(change, "😀 = maß(ü)")
    assert edit is not None and (edit.start, edit.end, edit.text) == (4, 7, "maße")


def test_the_tracker_keeps_an_edit_while_it_is_applied_elsewhere() -> None:
    from fimls.nextedit.tracker import EditTracker

    t = EditTracker()
    t.opened("u", "a = count(x)\nb = count(y)\nc = count(z)")
    # Typing the new name, one keystroke at a time: the edit follows the line.
    assert t.changed("u", "a = coun(x)\nb = count(y)\nc = count(z)") is not None
    got = t.changed("u", "a = tally(x)\nb = count(y)\nc = count(z)")
    assert got is not None and got.line == 0 and got.change.new == "tally"
    # A proposal applied: the same edit still stands for the rest.
    got = t.changed("u", "a = tally(x)\nb = tally(y)\nc = count(z)")
    assert got is not None and got.line == 0 and got.change.new == "tally"
    # Another edit elsewhere starts a new one, from the text before it.
    got = t.changed("u", "a = tally(x)\nb = tally(y)\nc = count(w)")
    assert got is not None and got.line == 2 and got.change.kind is ChangeKind.RENAME
    assert got.change.old == ("z",)


def test_the_tracker_forgets_on_new_lines_and_on_dismissal() -> None:
    from fimls.nextedit.tracker import EditTracker

    t = EditTracker()
    t.opened("u", "x = old\ny = old")
    assert t.changed("u", "x = new\ny = old") is not None
    assert t.changed("u", "x = new\n\ny = old") is None  # a line added: typing, not an edit
    assert t.changed("u", "x = new\nz = 1\ny = old") is None  # a new line typed
    assert t.changed("u", "x = newer\nz = 1\ny = old") is not None
    t.dismiss("u")
    assert t.pending("u") is None


def test_repeated_edit_tasks_from_a_diff() -> None:
    from fimls.tools.edittasks import changed_lines, file_tasks, same_change

    assert same_change(("f(a)", "f(a, b)"), ("f(x)", "f(x, b)"))
    assert same_change(("x = size", "x = total"), ("g(size, size)", "g(total, total)"))
    assert not same_change(("x = size", "x = total"), ("y = size", "y = sum"))
    diff = ("@@ -2 +2 @@\n-a = size\n+a = total\n"
            "@@ -4,2 +4,2 @@\n-b = size\n-c = 1\n+b = total\n+c = 2\n"
            "@@ -9,0 +10 @@\n+new = size\n")
    changed = changed_lines(diff)
    assert changed == [(1, "a = size", "a = total"), (3, "b = size", "b = total"),
                       (4, "c = 1", "c = 2")]
    old = "x\na = size\nz\nb = size\nc = 1\n"
    (task,) = file_tasks("r/abc/f.py", "f.py", old, changed)
    assert task.edit_line == 1 and task.before == "a = size"
    assert task.text.split("\n")[1] == "a = total" and task.targets == {3: "b = total"}


def test_the_bench_counts_precision_and_recall_at_each_margin() -> None:
    from fimls.tools.nextedit_bench import Tally

    rows = [{"margin": 5.0, "due": True}, {"margin": 3.0, "due": False},
            {"margin": 0.5, "due": True}, {"margin": -1.0, "due": False}]
    text = Tally(rows=rows, due=4, firsts=[120.0, 80.0, 300.0]).report(2.0)
    lines = {ln.split()[0]: ln.split()[1:] for ln in text.splitlines()[1:] if ln[:1] == " "}
    assert lines["2.0"] == ["2", "1", "0.500", "0.250"]
    assert lines["0.0"] == ["3", "2", "0.667", "0.500"]
    assert "p50 120 ms (3 tasks with one)" in text
