"""Repeated-edit tasks from real history, for next-edit suggestions.

A task is a commit that made the same substitution on two or more lines of one file. The
first of those lines (in file order) is the user's edit: the document is the file before
the commit with that one line changed. The others are the targets, with the text the
commit gave them.

"The same substitution" is decided here without the recogniser under test
(:mod:`fimls.nextedit.change`): two changed lines make the same one when the tokens
between their common start and end were replaced by the same tokens, or when replacing
the first line's old tokens by its new ones wherever they stand in the second line's old
text gives its new text.
"""

from __future__ import annotations

import random
import re
import subprocess
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from fimls.nextedit.lexer import common_ends, texts, tokens

_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")
MAX_PLACES = 20  # more is a mass rename, not edits a user makes one by one
MAX_BYTES = 200_000

Key = tuple[tuple[str, ...], tuple[str, ...]]


@dataclass
class EditTask:
    """One repeated edit: the document after the user's edit, and the lines still due."""

    task_id: str
    path: str
    text: str  # the document, the user's line already edited
    edit_line: int  # 0-based
    before: str  # that line before the edit
    targets: dict[int, str] = field(default_factory=dict)  # line -> what the commit wrote

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "targets": {str(k): v for k, v in self.targets.items()}}

    @classmethod
    def from_json(cls, row: dict[str, Any]) -> EditTask:
        return cls(row["task_id"], row["path"], row["text"], int(row["edit_line"]),
                   row["before"], {int(k): v for k, v in row["targets"].items()})


def substitution(old: str, new: str) -> Key | None:
    """The tokens a changed line replaced, and by what (None: spacing only)."""
    a, b = texts(tokens(old)), texts(tokens(new))
    if a == b:
        return None
    p, s = common_ends(a, b)
    return tuple(a[p:len(a) - s]), tuple(b[p:len(b) - s])


def _replaced(key: Key, old: str, new: str) -> bool:
    """Whether replacing ``key``'s old tokens by its new ones in ``old`` gives ``new``."""
    src, dst = key
    if not src:
        return False
    seq, want = texts(tokens(old)), texts(tokens(new))
    out: list[str] = []
    i = 0
    while i < len(seq):
        if tuple(seq[i:i + len(src)]) == src:
            out += dst
            i += len(src)
        else:
            out.append(seq[i])
            i += 1
    return out == want


def same_change(first: tuple[str, str], other: tuple[str, str]) -> bool:
    """Whether ``other`` (old, new) makes the substitution ``first`` made."""
    key = substitution(*first)
    return key is not None and (substitution(*other) == key or _replaced(key, *other))


def changed_lines(diff: str) -> list[tuple[int, str, str]]:
    """(0-based old line, old, new) for each line a ``-U0`` diff changed in place: hunks
    that remove as many lines as they add, paired in order."""
    out: list[tuple[int, str, str]] = []
    lines = diff.split("\n")
    for i, line in enumerate(lines):
        m = _HUNK.match(line)
        if not m:
            continue
        n_old, n_new = int(m.group(2) or 1), int(m.group(4) or 1)
        if n_old != n_new or n_old == 0:
            continue
        body = lines[i + 1:i + 1 + 2 * n_old]
        removed = [x[1:] for x in body if x.startswith("-")]
        added = [x[1:] for x in body if x.startswith("+")]
        if len(removed) == len(added) == n_old:
            start = int(m.group(1)) - 1
            out += [(start + k, r, a) for k, (r, a) in enumerate(zip(removed, added,
                                                                      strict=True))]
    return out


def file_tasks(task_id: str, path: str, old_text: str,
               changed: list[tuple[int, str, str]]) -> list[EditTask]:
    """The repeated edits among one file's changed lines: each group's first line is the
    user's edit."""
    lines = old_text.split("\n")
    out: list[EditTask] = []
    used: set[int] = set()
    for k, (at, old, new) in enumerate(changed):
        if at in used or substitution(old, new) is None:
            continue
        group = [(j, o, n) for j, o, n in changed[k + 1:]
                 if j not in used and same_change((old, new), (o, n))]
        if not group or len(group) + 1 > MAX_PLACES or lines[at] != old:
            continue
        used.update([at, *(j for j, _, _ in group)])
        doc = [*lines[:at], new, *lines[at + 1:]]
        out.append(EditTask(f"{task_id}:{at + 1}", path, "\n".join(doc), at, old,
                            {j: n for j, _, n in group}))
    return out


def _git(repo: Path, *args: str) -> str:
    proc = subprocess.run(["git", "-C", str(repo), "-c", "core.quotepath=false", *args],
                          capture_output=True, check=False)
    return proc.stdout.decode("utf-8", "replace") if proc.returncode == 0 else ""


def commit_tasks(repo: Path, name: str, commit: str, exts: Iterable[str]) -> list[EditTask]:
    """The repeated edits of one commit, in files with one of ``exts``."""
    out: list[EditTask] = []
    names = _git(repo, "diff-tree", "-r", "--no-commit-id", "--name-only", "--no-renames",
                 "--diff-filter=M", commit).split("\n")
    for path in (p for p in names if p.endswith(tuple(exts))):
        diff = _git(repo, "diff-tree", "-p", "-U0", "--no-color", "--no-renames",
                    "--no-commit-id", commit, "--", path)
        changed = changed_lines(diff)
        if len(changed) < 2:
            continue
        old = _git(repo, "cat-file", "blob", f"{commit}^:{path}")
        if not old or len(old) > MAX_BYTES or "\0" in old:
            continue
        out += file_tasks(f"{name}/{commit[:10]}/{path}", path, old, changed)
    return out


def make_tasks(repo: Path, name: str, n: int, exts: Iterable[str], seed: int = 1,
               rev: str = "HEAD") -> list[EditTask]:
    """Up to ``n`` tasks from ``repo``'s history, at most two from a commit, commits in
    an order drawn from ``seed``."""
    commits = _git(repo, "rev-list", "--no-merges", rev, "--").split()
    random.Random(seed).shuffle(commits)
    out: list[EditTask] = []
    exts = tuple(exts)
    for c in commits:
        out += commit_tasks(repo, name, c, exts)[:2]
        if len(out) >= n:
            break
    return out[:n]

