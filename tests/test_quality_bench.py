"""The quality bench's parts that need no model: the sets file, the paired statistics,
reading confidences from a latency log, gating offline and the report's numbers."""

from __future__ import annotations

import json
import math
import subprocess
from pathlib import Path

import pytest

from fimls.tools.paired import bootstrap_diff, compare, sign_test
from fimls.tools.quality_bench import Outcome, confidences, format_gate_sweep, format_report
from fimls.tools.quality_sets import load_sets, parse_sets, repo_tasks

REPO_SETS = Path(__file__).resolve().parents[1] / "docs" / "measurements" / "quality-sets.toml"


def test_the_committed_sets_keep_the_report_set_apart_and_large_enough() -> None:
    sets = load_sets(REPO_SETS)
    report = sets.split("report")
    assert len(report) >= 12
    assert sum(1 for r in report if r.ext != ("py",)) >= 3
    assert len(report) * sets.tasks >= 480
    # Every measured repository is pinned, so its tasks are the same on every run.
    assert all(r.rev and len(r.rev) == 40 for r in report + sets.split("tuning"))
    tuned = {r.repo.lower() for r in sets.repos if r.split == "tuning"}
    assert not tuned & {r.repo.lower() for r in report}


def test_a_repository_in_both_splits_is_refused() -> None:
    with pytest.raises(ValueError, match="listed twice"):
        parse_sets({"tuning": [{"repo": "a/b"}], "report": [{"repo": "A/B", "rev": "x"}]})


def test_unpinned_repositories_are_listed_but_not_measured() -> None:
    sets = parse_sets({"defaults": {"tasks": 7, "seed": 3},
                       "tuning": [{"repo": "a/b"}, {"repo": "c/d", "rev": "f" * 40,
                                                    "ext": [".go"]}]})
    assert [r.repo for r in sets.split("tuning")] == ["c/d"]
    assert sets.split("tuning")[0].ext == ("go",)
    assert (sets.tasks, sets.seed) == (7, 3)
    with pytest.raises(ValueError, match="unknown split"):
        sets.split("all")


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True,
                          text=True, env={"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t",
                                          "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t",
                                          "HOME": str(repo)}).stdout


def test_tasks_come_from_the_pinned_revision_and_the_named_extensions(tmp_path: Path) -> None:
    repo = tmp_path / "mirrors" / "o+r" / "repo"
    repo.mkdir(parents=True)
    _git(repo, "init", "-q")
    (repo / "a.go").write_text("package a\n\nfunc A() int {\n\treturn 1\n}\n")
    (repo / "b.py").write_text("def b():\n    return 1\n")
    _git(repo, "add", ".")
    _git(repo, "commit", "-qm", "one")
    (repo / "a.go").write_text("package a\n\nfunc A() int {\n\tvalue := compute(41)\n"
                               "\treturn value + 1\n}\n")
    (repo / "b.py").write_text("def b():\n    value = compute(41)\n    return value + 1\n")
    _git(repo, "commit", "-qam", "two")
    pinned = _git(repo, "rev-parse", "HEAD").strip()
    (repo / "a.go").write_text("package a\n\nfunc A() int {\n\tother := later(1)\n"
                               "\treturn other\n}\n")
    _git(repo, "commit", "-qam", "three: after the pin")
    sets = parse_sets({"report": [{"repo": "o/r", "rev": pinned, "ext": ["go"]}]})
    tasks = repo_tasks(sets.split("report")[0], tmp_path / "mirrors", 10, 1,
                       cache=tmp_path / "cache")
    assert tasks and all(t.path == "a.go" for t in tasks)
    assert all("later" not in t.target + t.prefix + t.suffix for t in tasks)
    # Read back from the cache: the same tasks.
    again = repo_tasks(sets.split("report")[0], tmp_path / "mirrors", 10, 1,
                       cache=tmp_path / "cache")
    assert again == tasks


def test_sign_test_matches_the_binomial() -> None:
    assert sign_test(0, 0) == 1.0
    assert sign_test(5, 5) == 1.0
    # 1 won, 12 lost: 2 * (1 + 13) / 2**13.
    assert sign_test(1, 12) == pytest.approx(2 * 14 / 2 ** 13)
    assert sign_test(12, 1) == sign_test(1, 12)


def test_compare_counts_the_tasks_where_the_two_differ() -> None:
    a = [True, True, False, False, True]
    b = [True, False, True, False, False]
    d = compare(a, b)
    assert (d.n, d.right_a, d.right_b, d.won, d.lost) == (5, 3, 2, 2, 1)
    assert d.diff == pytest.approx(0.2)
    assert d.lo <= d.diff <= d.hi
    with pytest.raises(ValueError):
        compare(a, b[:3])


def test_the_bootstrap_interval_is_narrow_when_the_two_agree() -> None:
    same = [i % 3 == 0 for i in range(300)]
    assert bootstrap_diff(same, same) == (0.0, 0.0)
    lo, hi = bootstrap_diff([True] * 300, [i % 2 == 0 for i in range(300)])
    assert 0.4 < lo < 0.5 < hi < 0.6


def _outcome(right: bool, conf: float | None, text: str = "x", peer: bool = False,
             lang: str = "python", repo: str = "o/r", i: int = 0) -> Outcome:
    return Outcome(repo, lang, f"t{i}", right, conf, text, 100.0, peer, "y" if peer else "",
                   200.0)


def test_the_gate_is_applied_offline_as_the_server_applies_it() -> None:
    o = _outcome(True, 0.4)
    assert o.right(0.0) and not o.right(0.5) and not o.shown(0.5)
    assert _outcome(True, None).right(0.9)  # nothing for the gate to read: shown
    assert not _outcome(False, 0.9, text="").shown(0.0)


def test_confidences_come_from_the_requests_in_order(tmp_path: Path) -> None:
    log = tmp_path / "log.jsonl"
    recs = [{"ts": 3.0, "outcome": "returned", "confidence": 0.7},
            {"ts": 1.0, "outcome": "returned", "confidence": 0.2},
            {"ts": 2.0, "outcome": "prefill_open"},
            {"ts": 4.0, "outcome": "empty", "confidence": None}]
    log.write_text("".join(json.dumps(r) + "\n" for r in recs))
    assert confidences(log, 3) == [0.2, 0.7, None]
    with pytest.raises(RuntimeError):
        confidences(log, 4)


def test_the_report_pools_languages_and_gives_the_paired_difference() -> None:
    rows = ([_outcome(True, 0.9, peer=False, i=i) for i in range(3)]
            + [_outcome(True, 0.3, peer=True, lang="go", i=10 + i) for i in range(2)]
            + [_outcome(False, 0.9, peer=True, lang="go", i=20)])
    text = format_report(rows, 0.5, "title")
    pooled = next(ln for ln in text.splitlines() if ln.startswith("all"))
    # 6 tasks; fimls right 3 at the gate (the two 0.3 lines are hidden), 5 ungated; the
    # peer 3; won 3, lost 3.
    assert pooled.split()[1:7] == ["6", "3", "4", "5", "3", "3"]
    assert "won 3 lost 3" in pooled
    assert "go" in text and "python" in text
    sweep = format_gate_sweep(rows)
    assert sweep.splitlines()[1].split()[:3] == ["0.00", "5", "6"]
    assert not math.isnan(float(sweep.splitlines()[-1].split()[-1]))



def test_earlier_outcomes_are_matched_by_task_and_the_rest_is_run(tmp_path: Path) -> None:
    from fimls.tools.harness import Task
    from fimls.tools.quality_bench import _known, _side, load_outcomes

    path = tmp_path / "out.jsonl"
    rows = [_outcome(True, 0.8, i=1), _outcome(False, None, text="", peer=True, i=2)]
    path.write_text("".join(json.dumps(o.__dict__) + "\n" for o in rows))
    assert load_outcomes(path) == rows
    mine = _known([path], True)
    tasks = [Task("t2", "", "", ""), Task("t1", "", "", "")]
    assert [c for _, c in _side(tasks, mine, None, "fimls")] == [None, 0.8]
    assert [r["line_exact"] for r, _ in _side(tasks, _known([path], False), None, "peer")] \
        == [True, False]
    with pytest.raises(SystemExit, match="no earlier result for 1 tasks"):
        _side([Task("t3", "", "", "")], mine, None, "fimls")
    asked: list[str] = []

    def run(todo: list[Task]) -> list[tuple[dict[str, object], float | None]]:
        asked.extend(t.task_id for t in todo)
        return [({"line_exact": True, "completion": "x", "latency_ms": [1.0]}, 0.3)
                for _ in todo]

    got = _side([Task("t3", "", "", ""), *tasks], mine, run, "fimls")
    assert asked == ["t3"]
    assert [c for _, c in got] == [0.3, None, 0.8]
    assert _side(tasks, {}, None, "peer")[0][0]["completion"] == ""


def test_a_split_can_be_narrowed_to_some_repositories() -> None:
    sets = load_sets(REPO_SETS)
    some = sets.split("report", ["Textualize/rich", "go-chi/CHI"])
    assert [s.repo for s in some] == ["Textualize/rich", "go-chi/chi"]
    with pytest.raises(ValueError, match="pallets/click"):
        sets.split("report", ["pallets/click"])
