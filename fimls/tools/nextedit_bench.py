"""Next-edit suggestions measured on repeated edits from real history
(:mod:`fimls.tools.edittasks`): for each task the user's edit is recognised, the places
where it is due are found, and the model scores each (the edited line against the
original, as the middle of a FIM prompt there). Precision and recall at each margin, and
the time to the first verified proposal.

    python -m fimls.tools.nextedit_bench --repos docs/measurements/nextedit-sets.toml \\
        --split tuning --mirrors /work/.mirror --tasks 40 --out /tmp/ne.jsonl
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fimls.nextedit.service import NextEdits, scoring_request
from fimls.nextedit.targets import Target
from fimls.tools.edittasks import EditTask

MAX_CHARS = 8192  # text on each side of a candidate (the window cuts it further)


@dataclass
class Scored:
    """One candidate of one task: was it due (the commit made it), the model's margin
    (log-probability of the edited line minus the original's), and when it was known."""

    task_id: str
    line: int
    due: bool
    margin: float
    ms: float  # since the task's start

    def to_json(self) -> dict[str, Any]:
        return {"task_id": self.task_id, "line": self.line, "due": self.due,
                "margin": round(self.margin, 4), "ms": round(self.ms, 1)}


def run_task(engine: Any, task: EditTask, margin: float) -> tuple[list[Scored], int]:
    """The task through :class:`fimls.nextedit.service.NextEdits` as the server runs it:
    every candidate it scored, and how many it proposed."""
    from fimls.config import CompletionOptions

    uri = f"file:///ne/{task.path}"
    lines = task.text.split("\n")
    ne = NextEdits(margin)
    ne.tracker.opened(uri, "\n".join([*lines[:task.edit_line], task.before,
                                      *lines[task.edit_line + 1:]]))
    ne.tracker.changed(uri, task.text)
    scored: list[Scored] = []
    t0 = time.monotonic()
    options = CompletionOptions()

    async def score(t: Target, world: Sequence[str]) -> float | None:
        req = scoring_request(t, world, options, version=0, repo_name=None,
                              rel_path=task.path, max_chars=MAX_CHARS)
        res = engine.complete(req, lambda: False)
        m = res.scores[1] - res.scores[0]
        due = task.targets.get(t.line, "").rstrip() == t.new_line.rstrip()
        scored.append(Scored(task.task_id, t.line, due, m, (time.monotonic() - t0) * 1000.0))
        return float(m)

    proposed = asyncio.run(ne.propose(uri, {uri: lines}, score))
    return scored, len(proposed)


def summary(rows: list[dict[str, Any]], due_total: int, margins: list[float]) -> str:
    """Precision and recall at each margin (recall over every place the commits made the
    change, scored or not)."""
    out = [f"{'margin':>7} {'offered':>8} {'right':>6} {'precision':>9} {'recall':>7}"]
    for m in margins:
        offered = [r for r in rows if r["margin"] > m]
        right = sum(1 for r in offered if r["due"])
        prec = right / len(offered) if offered else 0.0
        out.append(f"{m:>7.1f} {len(offered):>8} {right:>6} {prec:>9.3f} "
                   f"{right / max(due_total, 1):>7.3f}")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    """Run the tasks of the given repositories and print the table."""
    from fimls.config import Options, apply_dict
    from fimls.engine import make_engine
    from fimls.tools.edittasks import make_tasks
    from fimls.tools.quality_sets import load_sets, mirror_of

    p = argparse.ArgumentParser(prog="nextedit_bench", description=__doc__.split("\n")[0])
    p.add_argument("--repos", required=True, help="a sets file (TOML, as quality-sets.toml)")
    p.add_argument("--split", default="tuning", choices=["tuning", "report"])
    p.add_argument("--mirrors", type=Path, required=True)
    p.add_argument("--tasks", type=int, default=40, help="tasks per repository")
    p.add_argument("--model", default="qwen2.5-coder-1.5b")
    p.add_argument("--margin", type=float, default=2.0,
                   help="the nextEditMargin the tasks run at (default 2.0)")
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args(argv)
    sets = load_sets(a.repos)
    specs = sets.split(a.split)
    opts, _ = apply_dict(Options(), {"isolation": "thread", "model": a.model})
    engine = make_engine(opts, isolation="thread")
    rows: list[dict[str, Any]] = []
    firsts: list[float] = []  # per task with a proposal: ms to its first
    due_total = 0
    with open(a.out, "w", encoding="utf-8") as out:
        for spec in specs:
            tasks = make_tasks(mirror_of(a.mirrors, spec), spec.folder, a.tasks,
                               [f".{e}" for e in spec.ext], seed=sets.seed,
                               rev=spec.rev or "HEAD")
            for i, task in enumerate(tasks):
                scored, _n = run_task(engine, task, a.margin)
                due_total += len(task.targets)
                firsts += [s.ms for s in scored if s.margin > a.margin][:1]
                for s in scored:
                    rows.append(s.to_json())
                    out.write(json.dumps({**s.to_json(), "repo": spec.folder}) + "\n")
                out.write(json.dumps({"task_id": task.task_id, "repo": spec.folder,
                                      "due": len(task.targets)}) + "\n")
                out.flush()
                print(f"\r{spec.folder} {i + 1}/{len(tasks)}", end="", file=sys.stderr)
    engine.close()
    print(file=sys.stderr)
    print(summary(rows, due_total, [-2.0, 0.0, 1.0, 2.0, 4.0, 8.0]))
    firsts.sort()
    if firsts:
        print(f"first proposal after the edit: p50 {firsts[len(firsts) // 2]:.0f} ms "
              f"({len(firsts)} tasks with one)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
