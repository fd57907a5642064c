"""The client harness that bench, soak and the end-to-end tests share: task loading and
UTF-16 positions (the LSP client itself is exercised by every end-to-end test)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fimls.documents import Pos, TextDocument
from fimls.tools.harness import BUILTIN_SETS, Task, load_tasks, utf16_len, utf16_position


@pytest.mark.parametrize("text", [
    "", "abc", "a\nb", "a\r\nbc", "a\rb", "x\n\n", "é😀\n😀x", "a\u2028b\x85c\x0cd",
    "line\r\n\r\n\rlast 😀", "tail\r",
])
def test_utf16_position_agrees_with_the_servers_document(text: str) -> None:
    # The server's text mirror is the reference: it is what the positions are sent to.
    doc = TextDocument(uri="file:///x.py", language_id="python", version=1,
                       text=text + "Z\nmore")
    line, col = utf16_position(text)
    assert doc.offset_at(Pos(line, col), "utf-16") == len(text)


def test_utf16_len() -> None:
    assert utf16_len("") == 0
    assert utf16_len("abc") == 3
    assert utf16_len("é") == 1
    assert utf16_len("😀") == 2


def test_builtin_sets_load() -> None:
    for name in BUILTIN_SETS:
        got, tasks = load_tasks(name, 5)
        assert got == name and len(tasks) == 5
        assert all(t.prefix and t.target for t in tasks)


def test_jsonl_sets_spread_or_stride(tmp_path: Path) -> None:
    path = tmp_path / "mine.v1.jsonl"
    rows = [{"task_id": f"t{i}", "prefix": f"p{i}", "suffix": "s", "target": "x"}
            for i in range(10)]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n", encoding="utf-8")
    name, tasks = load_tasks(str(path), 3)
    assert name == "mine"
    assert [t.task_id for t in tasks] == ["t0", "t3", "t6"]
    assert [t.task_id for t in load_tasks(str(path), 3, stride=2)[1]] == ["t0", "t2", "t4"]
    assert tasks[0] == Task("t0", "p0", "s", "x")


def test_jsonl_set_errors(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"prefix": "a"}) + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match="needs prefix"):
        load_tasks(str(bad), 1)
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n", encoding="utf-8")
    with pytest.raises(ValueError, match="no tasks"):
        load_tasks(str(empty), 1)
