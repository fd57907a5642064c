"""Next-edit suggestions measured on repeated edits from real history
(:mod:`fimls.tools.edittasks`): for each task the user's edit is recognised, the places
where it is due are found, and the model scores each (the edited line against the
original, as the middle of a FIM prompt there). Precision and recall at each margin, and
the time to the first verified proposal.

    fimls bench --next-edits docs/measurements/nextedit-sets.toml --split tuning \\
        --quality-tasks 40 --out /tmp/ne
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
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


@dataclass
class Tally:
    """Every scored candidate, the places due, and the time to each task's first proposal."""

    rows: list[dict[str, Any]] = field(default_factory=list)
    due: int = 0
    firsts: list[float] = field(default_factory=list)

    def report(self, margin: float) -> str:
        out = summary(self.rows, self.due, sorted({-2.0, 0.0, 1.0, margin, 4.0, 8.0}))
        firsts = sorted(self.firsts)
        if firsts:
            out += (f"\nfirst proposal after the edit (nextEditMargin {margin}): p50 "
                    f"{firsts[len(firsts) // 2]:.0f} ms ({len(firsts)} tasks with one)")
        return out


def run_bench(sets_path: str, split: str, mirrors: Path, tasks: int, opts: Any,
              out: Path, repos: Sequence[str] = ()) -> Tally:
    """The next-edit tasks of ``split``'s repositories through an in-process engine of
    ``opts`` at its ``nextEditMargin``; every candidate written to ``out`` (JSON Lines)."""
    from dataclasses import replace

    from fimls.engine import make_engine
    from fimls.tools.edittasks import make_tasks
    from fimls.tools.quality_sets import load_sets, mirror_of

    sets = load_sets(sets_path)
    margin = opts.completion.next_edit_margin
    engine = make_engine(replace(opts, model=replace(opts.model, isolation="thread")),
                         isolation="thread")
    tally = Tally()
    with open(out, "w", encoding="utf-8") as f:
        for spec in sets.split(split, repos):
            made = make_tasks(mirror_of(mirrors, spec), spec.folder, tasks or sets.tasks,
                              [f".{e}" for e in spec.ext], seed=sets.seed, rev=spec.rev or "HEAD")
            for i, task in enumerate(made):
                scored, _n = run_task(engine, task, margin)
                tally.due += len(task.targets)
                tally.firsts += [s.ms for s in scored if s.margin > margin][:1]
                for s in scored:
                    tally.rows.append(s.to_json())
                    f.write(json.dumps({**s.to_json(), "repo": spec.repo}) + "\n")
                f.write(json.dumps({"task_id": task.task_id, "repo": spec.repo,
                                    "due": len(task.targets)}) + "\n")
                f.flush()
                print(f"\r{spec.repo} {i + 1}/{len(made)}", end="", file=sys.stderr)
    engine.close()
    print(file=sys.stderr)
    return tally
