"""``fimls tasks``: tasks from a tiny git history and from files reproduce the real file,
skip what is no task, and depend only on the seed."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from fimls.cli import main
from fimls.tools import tasks as T
from fimls.tools.harness import load_tasks

needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")

BASE = "".join(f"def function_{i}(x):\n    return x * {i}\n\n\n" for i in range(12))
# Line ends git does not count as line ends (form feed, U+2028, NEL) before the edits:
# splitting at them (str.splitlines) would put every task at the wrong line.
ODD = 'SEP = "a\u2028b\x85c"\n\x0c\n# page two\n'


@pytest.fixture(autouse=True)
def _plain_git(monkeypatch: pytest.MonkeyPatch) -> None:
    # Neither the user's nor the system's git settings (pagers, signing, external diffs).
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", os.devnull)
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")


def git(repo: Path, *args: str) -> str:
    """Run git in ``repo``; its output."""
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True,
                          text=True).stdout


def commit(repo: Path, files: dict[str, str | bytes | None], message: str) -> str:
    """Write (or, for None, delete) files and commit them; the commit id."""
    for name, content in files.items():
        path = repo / name
        if content is None:
            path.unlink()
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content, encoding="utf-8", newline="")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", message)
    return git(repo, "rev-parse", "HEAD").strip()


def init_repo(repo: Path) -> None:
    """An empty repository at ``repo`` with an author and no signing."""
    repo.mkdir()
    git(repo, "init", "-q")
    git(repo, "config", "user.name", "Test")
    git(repo, "config", "user.email", "test@example.com")
    git(repo, "config", "commit.gpgsign", "false")


def insert_after(text: str, anchor: str, new: str) -> str:
    """``text`` with ``new`` inserted after the line that is ``anchor``."""
    i = text.index(anchor + "\n") + len(anchor) + 1
    return text[:i] + new + text[i:]


@pytest.fixture
def history(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A repository with one commit per case; the case names by commit id."""
    repo = tmp_path / "proj"
    init_repo(repo)
    cases: dict[str, str] = {}
    app = ODD + BASE
    huge = "# a big file\n" + BASE * 60
    cases[commit(repo, {"app.py": app, "big.py": huge, "blob.py": b"x = 1\n\0\1\2" * 40,
                        "vendor/lib.py": BASE, "main.go": "package main\n\nfunc main() {\n}\n",
                        "notes.txt": "hello\n"}, "root")] = "root"
    app = insert_after(app, "def function_2(x):", "    y = helper(x) + 41\n")
    cases[commit(repo, {"app.py": app}, "single")] = "single"
    app = insert_after(app, "def function_5(x):",
                       "    if x < 0:\n        raise ValueError(x)\n    x = abs(x) * 2\n")
    cases[commit(repo, {"app.py": app}, "multi")] = "multi"
    cases[commit(repo, {"app.py": app.replace("    return x * 7\n", "    return  x * 7 \n")},
                 "whitespace")] = "whitespace"
    app = app.replace("    return  x * 7 \n", "    return x * 7\n")
    git(repo, "commit", "-q", "--allow-empty", "-m", "empty")
    cases[commit(repo, {"app.py": app}, "whitespace back")] = "whitespace back"
    app = insert_after(app, "def function_8(x):", "    pass\n")
    cases[commit(repo, {"app.py": app}, "trivial")] = "trivial"
    app = insert_after(app, "def function_9(x):", "    # a remark on the code below\n\n")
    cases[commit(repo, {"app.py": app}, "comment")] = "comment"
    app = app.replace("    return x * 10\n", "")
    cases[commit(repo, {"app.py": app}, "deletion")] = "deletion"
    app = insert_after(app, "def function_11(x):",
                       "".join(f"    x = x + value_{k}\n" for k in range(9)))
    cases[commit(repo, {"app.py": app}, "long")] = "long"
    cases[commit(repo, {"blob.py": b"x = 2\n\0\1\2" * 40}, "binary")] = "binary"
    cases[commit(repo, {"big.py": insert_after(huge, "def function_3(x):",
                                               "    total = compute(x) + 1\n")},
                 "huge")] = "huge"
    cases[commit(repo, {"vendor/lib.py": insert_after(BASE, "def function_3(x):",
                                                      "    total = compute(x) + 1\n")},
                 "vendored")] = "vendored"
    cases[commit(repo, {"notes.txt": "hello\nworld, not code at all\n"}, "text")] = "text"
    cases[commit(repo, {"main.go": "package main\n\nfunc main() {\n\tfmt.Println(\"hi\")\n}\n"},
                 "go")] = "go"
    crlf = "def f(x):\r\n    return x\r\n"
    cases[commit(repo, {"win.py": crlf}, "crlf file")] = "crlf file"
    cases[commit(repo, {"win.py": crlf.replace("    return x\r\n",
                                               "    x = normalize(x)\r\n    return x\r\n")},
                 "crlf")] = "crlf"
    cases[commit(repo, {"app.py": None}, "delete app")] = "delete app"
    return repo, cases


LIMITS = T.Limits(max_bytes=20_000)


def blob(repo: Path, rev: str, path: str) -> str:
    """A file's text at a commit, byte for byte."""
    data = subprocess.run(["git", "-C", str(repo), "cat-file", "blob", f"{rev}:{path}"],
                          check=True, capture_output=True).stdout
    return data.decode("utf-8")


@needs_git
def test_tasks_reproduce_the_file_after_the_commit(history: tuple[Path, dict[str, str]],
                                                   ) -> None:
    repo, cases = history
    made, _ = T.from_git(repo, n=100, seed=0, limits=LIMITS)
    by_case = {cases[t["commit"]]: t for t in made}
    assert set(by_case) == {"single", "multi", "go", "crlf"}
    for t in made:
        text = blob(repo, t["commit"], t["path"])
        assert t["prefix"] + t["target"] + t["suffix"] == text
        # The cursor sits on the target's first line: the file's line ``line`` is where the
        # prefix ends, and the hidden text runs to the end of a line.
        assert t["prefix"].count("\n") == t["line"] - 1
        assert t["target"].endswith("\n")
        assert t["task_id"] == f"proj/{t['commit'][:10]}/{t['path']}:{t['line']}"
        assert t["repo"] == "proj"
    single, multi = by_case["single"], by_case["multi"]
    assert single["kind"] == "single-line" and single["path"] == "app.py"
    assert "    y = helper(x) + 41\n".endswith(single["target"])
    assert multi["kind"] == "multi-line" and multi["target"].endswith(
        "raise ValueError(x)\n    x = abs(x) * 2\n")
    # ODD is three lines for git (six for str.splitlines): the task is where git says.
    assert single["line"] == ODD.count("\n") + 10
    assert by_case["go"]["language"] == "go" and "Println" in by_case["go"]["target"]
    assert by_case["crlf"]["target"].endswith("normalize(x)\r\n")


@needs_git
def test_what_is_no_task_is_skipped_and_counted(history: tuple[Path, dict[str, str]]) -> None:
    repo, _ = history
    _, skipped = T.from_git(repo, n=100, seed=0, limits=LIMITS)
    assert skipped["binary file"] == 1
    assert skipped["huge file"] == 1
    assert skipped["generated or vendored path"] == 1
    # Both the change to whitespace and its undoing.
    assert skipped["whitespace-only change"] == 2
    assert skipped["trivial hunk"] == 1
    assert skipped["blank or comment lines only"] == 1
    assert skipped["deletion only"] == 1
    assert skipped["hunk too long"] == 1
    # A deleted file has no "after", a new one no "before": neither is an edit (nor an error).
    assert skipped["deleted file"] == 1
    assert skipped["new file"] == 1


@needs_git
def test_same_seed_same_tasks(history: tuple[Path, dict[str, str]]) -> None:
    repo, _ = history
    runs = []
    for _ in range(2):
        buf = io.StringIO()
        T.write_jsonl(T.from_git(repo, n=100, seed=7, limits=LIMITS)[0], buf)
        runs.append(buf.getvalue())
    assert runs[0] == runs[1] and runs[0].count("\n") == 4
    # Another seed visits the history in another order (and may cut elsewhere), but finds
    # the same edits.
    other = T.from_git(repo, n=100, seed=8, limits=LIMITS)[0]
    assert {t["commit"] for t in other} == {json.loads(x)["commit"] for x in runs[0].split("\n")
                                            if x}
    assert len(T.from_git(repo, n=2, seed=7, limits=LIMITS)[0]) == 2


@needs_git
def test_history_can_be_narrowed(history: tuple[Path, dict[str, str]]) -> None:
    repo, cases = history
    made, _ = T.from_git(repo, n=100, seed=0, max_commits=3, limits=LIMITS)
    assert [cases[t["commit"]] for t in made] == ["crlf"]
    only_go = T.Limits(max_bytes=20_000, extensions=frozenset({".go"}))
    assert [cases[t["commit"]] for t in T.from_git(repo, n=100, limits=only_go)[0]] == ["go"]
    first = git(repo, "rev-list", "--max-parents=0", "HEAD").strip()
    assert T.from_git(repo, n=100, rev=first, limits=LIMITS)[0] == []


@needs_git
def test_cli_writes_what_bench_reads(history: tuple[Path, dict[str, str]], tmp_path: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    repo, _ = history
    out = tmp_path / "edits.jsonl"
    assert main(["tasks", "from-git", str(repo), "--out", str(out), "--n", "3",
                 "--max-bytes", "20000"]) == 0
    assert "3 tasks" in capsys.readouterr().err
    name, loaded = load_tasks(str(out), 10)
    assert name == "edits" and len(loaded) == 3
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert [(t.task_id, t.prefix, t.suffix, t.target) for t in loaded] == [
        (r["task_id"], r["prefix"], r["suffix"], r["target"]) for r in rows]


@needs_git
def test_not_a_repository(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.parent))
    with pytest.raises(T.TaskError):
        T.from_git(tmp_path, n=3)
    assert main(["tasks", "from-git", str(tmp_path), "--out", str(tmp_path / "x")]) == 2
    assert "fimls tasks:" in capsys.readouterr().err


def test_from_files(tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "pkg").mkdir(parents=True)
    (src / "vendor").mkdir()
    (src / "pkg" / "a.py").write_text(ODD + BASE, encoding="utf-8")
    (src / "pkg" / "b.py").write_text(BASE.replace("x", "y"), encoding="utf-8")
    (src / "pkg" / "model_pb2.py").write_text(BASE, encoding="utf-8")
    (src / "pkg" / "short.py").write_text("x = 1\n", encoding="utf-8")
    (src / "pkg" / "bin.py").write_bytes(b"\0" * 100)
    (src / "vendor" / "c.py").write_text(BASE, encoding="utf-8")
    (src / "README.md").write_text("# hi\n" * 50, encoding="utf-8")
    made, _ = T.from_files([src], n=2, seed=1)
    assert sorted(t["path"] for t in made) == ["src/pkg/a.py", "src/pkg/b.py"]
    # Fewer files than tasks asked for: more spans of the same files, never one twice.
    more, skipped = T.from_files([src], n=10, seed=1)
    assert len(more) == 10 and more[:2] == made
    assert len({(t["path"], t["line"]) for t in more}) == 10
    made = more
    for t in made:
        text = (tmp_path / t["path"]).read_text(encoding="utf-8")
        assert t["prefix"] + t["target"] + t["suffix"] == text
        assert t["prefix"].count("\n") == t["line"] - 1
        assert t["kind"] in ("single-line", "multi-line", "block")
    assert skipped["binary file"] == 1 and skipped["too few lines of code"] == 1
    assert T.from_files([src], n=10, seed=1)[0] == made
    assert T.from_files([src / "pkg" / "a.py"], n=5, seed=1)[0][0]["path"] == "a.py"
    # Seeds draw different spans.
    spans = {tuple((t["path"], t["line"], t["cursor"]) for t in T.from_files([src], seed=s)[0])
             for s in range(8)}
    assert len(spans) > 1


def test_split_lines_counts_as_git_does() -> None:
    assert T.split_lines("a\x0cb\u2028c\r\nd\n") == ["a\x0cb\u2028c\r\n", "d\n"]
    assert T.split_lines("a\nb") == ["a\n", "b"]
    assert T.split_lines("") == []


def test_parse_hunks() -> None:
    diff = ("diff --git a/f.py b/f.py\nindex 1..2 100644\n--- a/f.py\n+++ b/f.py\n"
            "@@ -3 +3,2 @@ def f():\n-    return 1\n+    y = 2\n+    return y\n"
            "@@ -9,0 +11 @@\n+--- not a header\n\\ No newline at end of file\n"
            "@@ -20,2 +22,0 @@\n-a\n-b\n")
    hunks = T.parse_hunks(diff)
    assert hunks == [
        T.Hunk(3, ("    y = 2\n", "    return y\n"), ("    return 1\n",)),
        T.Hunk(11, ("--- not a header\n",), ()),
        T.Hunk(22, (), ("a\n", "b\n")),
    ]


@pytest.mark.parametrize(("path", "generated"), [
    ("src/app.py", False), ("vendor/x.py", True), ("a/node_modules/b/c.js", True),
    ("proto/msg_pb2.py", True), ("web/app.min.js", True), ("lib/build_utils.py", False),
    ("build/lib/x.py", True), ("api_generated.go", True),
])
def test_generated_paths(path: str, generated: bool) -> None:
    assert T.is_generated_path(path) is generated


def test_generated_header() -> None:
    assert T.decode_source(b"// Code generated by protoc. DO NOT EDIT.\nx\n", T.Limits()) == (
        None, "generated file")
    assert T.decode_source("x = 'é'\n".encode(), T.Limits()) == ("x = 'é'\n", "")
    assert T.decode_source(b"\xff\xfe\x00", T.Limits())[1] == "binary file"
    assert T.decode_source(b"x" * 11, T.Limits(max_bytes=10))[1] == "huge file"


def test_bench_and_readme_name_only_what_is_in_the_repository(
        capsys: pytest.CaptureFixture[str]) -> None:
    # The bench and the README used to send readers to task scripts outside the repository.
    root = Path(__file__).resolve().parents[1]
    outside = ("make_" + "edit_tasks", "make_" + "span_tasks", "../" + "shared", "shared/tools")
    files = [root / "README.md", *sorted((root / "fimls").rglob("*.py")),
             *(p for p in sorted((root / "tests").glob("*.py")) if p.name != Path(__file__).name)]
    for path in files:
        text = path.read_text(encoding="utf-8")
        for name in outside:
            assert name not in text, f"{path.relative_to(root)} mentions {name}"
    with pytest.raises(SystemExit):
        main(["bench", "--help"])
    assert "fimls tasks from-git" in " ".join(capsys.readouterr().out.split())
    assert "fimls tasks from-git" in (root / "README.md").read_text(encoding="utf-8")


@needs_git
def test_cross_file_tasks(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A call of a function defined in exactly one other file: the cursor before the name,
    the defining file and unrelated ones listed to open; same-file and ambiguous names are
    no task, nor is a second call of the same name in one file."""
    repo = tmp_path / "proj"
    init_repo(repo)
    commit(repo, {
        "pkg/money.py": "def convert_amount(value, rate):\n    return value * rate\n",
        "pkg/dup_a.py": "def shared_name():\n    pass\n",
        "pkg/dup_b.py": "def shared_name():\n    pass\n",
        "pkg/app.py": ("from pkg.money import convert_amount\n\n"
                       "def local_helper():\n    return 1\n\n"
                       "def run(v):\n    x = local_helper()\n    y = shared_name()\n"
                       "    total = convert_amount(v, rate=0.5)\n"
                       "    again = convert_amount(v, rate=2)\n    return total\n"),
        "pkg/misc.py": "A = 1\n",
        "pkg/more.py": "B = 2\n",
    }, "files")
    made, skipped = T.cross_file(repo, n=10, seed=0)
    assert [t["target"] for t in made] == ["convert_amount(v, rate=0.5)"]
    assert skipped["defined in the same file"] == 1  # local_helper
    t = made[0]
    assert t["prefix"].endswith("    total = ") and t["suffix"].startswith("\n    again")
    assert t["defined_in"] == "pkg/money.py" and t["path"] == "pkg/app.py"
    opened = [o["path"] for o in t["open"]]
    assert opened[0] == "pkg/money.py" and len(opened) == 3
    assert "pkg/app.py" not in opened[1:] and "pkg/money.py" not in opened[1:]
    out = tmp_path / "cross.jsonl"
    assert main(["tasks", "cross-file", str(repo), "--out", str(out)]) == 0
    _, loaded = load_tasks(str(out), 10)
    assert loaded[0].path == "pkg/app.py" and loaded[0].open[0][0] == "pkg/money.py"
    assert "def convert_amount" in loaded[0].open[0][1]


def test_a_commit_whose_objects_are_missing_is_passed_over(tmp_path: Path) -> None:
    # A partial mirror can lack an object some commit needs: that commit is skipped and
    # counted, the others still give tasks.
    repo = tmp_path / "partial"
    init_repo(repo)
    app = ODD + BASE
    commit(repo, {"app.py": app}, "root")
    app = insert_after(app, "def function_2(x):", "    y = helper(x) + 41\n")
    commit(repo, {"app.py": app}, "one")
    app = insert_after(app, "def function_5(x):", "    z = compute(x) * 3\n")
    lost = commit(repo, {"app.py": app, "other.py": "VALUE = compute(1)\n"}, "two")
    tree = git(repo, "rev-parse", f"{lost}^{{tree}}").strip()
    (repo / ".git" / "objects" / tree[:2] / tree[2:]).unlink()
    made, skipped = T.from_git(repo, n=10, seed=0)
    assert skipped["unreadable commit"] == 1
    # The one readable edit (the cursor at its line's start or part-way in).
    assert len(made) == 1 and "y = helper(x) + 41\n".endswith(made[0]["target"])
