"""``fimls bench --quality SETS``: right first lines on real edits from many repositories,
fimls beside llama-server with the same model, in one run, per language and pooled.

fimls runs once per model, ungated (``--min-confidence 0``); each request's confidence
comes from its latency log, so the default gate's result (a hidden line counts as not
right) and any other threshold's are read from the same suggestions. The peer is
llama-server driven as llama.vim drives it (:func:`fimls.tools.peer.run_peer`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fimls.latency import percentile, read_records
from fimls.tools import peer
from fimls.tools.harness import Task
from fimls.tools.paired import compare
from fimls.tools.quality_sets import QualitySets, checkout, language_of_task, repo_tasks

GATE_SWEEP = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6)


@dataclass(frozen=True)
class Outcome:
    """One task's result for fimls and the peer."""

    repo: str
    language: str
    task_id: str
    fimls_right: bool  # the first line, ungated
    confidence: float | None  # None: nothing the gate could read (all forced text)
    fimls_text: str
    fimls_ms: float
    peer_right: bool
    peer_text: str
    peer_ms: float

    def shown(self, gate: float) -> bool:
        """Whether fimls shows its suggestion at threshold ``gate``."""
        return bool(self.fimls_text) and (self.confidence is None or self.confidence >= gate)

    def right(self, gate: float) -> bool:
        """Right, and shown at ``gate``."""
        return self.fimls_right and self.shown(gate)


def confidences(log: Path, count: int) -> list[float | None]:
    """Each request's confidence from a latency log, in request order (idle prefills left
    out); an error when the log does not hold ``count`` requests."""
    recs = [r for r in read_records(log) if not str(r.get("outcome", "")).startswith("prefill")]
    recs.sort(key=lambda r: float(r.get("ts", 0.0)))
    if len(recs) != count:
        raise RuntimeError(f"{log}: {len(recs)} requests logged for {count} tasks")
    out: list[float | None] = []
    for r in recs:
        c = r.get("confidence")
        out.append(None if c is None or (isinstance(c, float) and math.isnan(c)) else float(c))
    return out


def _row(right: bool, text: str, ms: float) -> dict[str, Any]:
    """A task's row as the editor harness reports it (see fimls.tools.peer)."""
    return {"line_exact": right, "completion": text, "latency_ms": [ms]}


_NOT_RUN = _row(False, "", math.nan)

Row = dict[str, Any]
Side = list[tuple[Row, float | None]]  # each task's row and fimls's confidence


def _known(paths: Sequence[Path], fimls: bool) -> dict[str, tuple[Row, float | None]]:
    """One side's rows from earlier runs' outcome files, by task (a later file wins)."""
    known: dict[str, tuple[Row, float | None]] = {}
    for path in paths:
        for o in load_outcomes(path):
            known[o.task_id] = ((_row(o.fimls_right, o.fimls_text, o.fimls_ms), o.confidence)
                                if fimls else (_row(o.peer_right, o.peer_text, o.peer_ms), None))
    return known


def _side(tasks: Sequence[Task], known: dict[str, tuple[Row, float | None]],
          run: Callable[[list[Task]], Side] | None, name: str) -> Side:
    """One side's rows for ``tasks``: the ``known`` ones, and ``run`` for the rest (a
    resumed run). Without ``run`` the side is not measured, unless it is partly known."""
    todo = [t for t in tasks if t.task_id not in known]
    fresh: dict[str, tuple[Row, float | None]] = {}
    if todo and run is None:
        if known:
            raise SystemExit(f"{name}: no earlier result for {len(todo)} tasks "
                             f"({todo[0].task_id}, ...)")
        return [(_NOT_RUN, None)] * len(tasks)
    if todo and run is not None:
        fresh = dict(zip((t.task_id for t in todo), run(todo), strict=True))
    return [known[t.task_id] if t.task_id in known else fresh[t.task_id] for t in tasks]


def _fimls_runner(serve_flags: list[str], model: str, log: Path,
                  progress: Callable[[str], None] | None,
                  roots: Callable[[Task], str] | None) -> Callable[[list[Task]], Side]:
    def run(todo: list[Task]) -> Side:
        log.unlink(missing_ok=True)
        serve = [*serve_flags, "--model", model, "--min-confidence", "0"]
        rows = peer.run_fimls(serve, todo, typing=0, latency_log=log, in_repo=True,
                              progress=progress, roots=roots)
        return list(zip(rows, confidences(log, len(todo)), strict=True))
    return run


def _peer_runner(binary: Path, model_path: Path, max_tokens: int, threads: int,
                 progress: Callable[[str], None] | None) -> Callable[[list[Task]], Side]:
    def run(todo: list[Task]) -> Side:
        rows = peer.run_peer(binary, model_path, todo, typing=0, max_tokens=max_tokens,
                             threads=threads, progress=progress)
        return [(r, None) for r in rows]
    return run


@dataclass(frozen=True)
class Sources:
    """Where each side's lines come from: earlier runs' outcome files (``*_from``) and,
    for the tasks those lack, a run (fimls unless ``fimls`` is off; the peer with
    ``peer_binary``)."""

    fimls: bool = True
    peer_binary: Path | None = None
    fimls_from: tuple[Path, ...] = ()
    peer_from: tuple[Path, ...] = ()
    checkouts: Path | None = None  # fimls's workspace: each task's repository, extracted here


def run_model(sets: QualitySets, split: str, mirrors: Path, out: Path, *, model: str,
              serve_flags: list[str], model_path: Path, n: int, threads: int,
              max_tokens: int, sources: Sources, repos: Sequence[str] = (),
              progress: Callable[[str], None] | None = None) -> list[Outcome]:
    """Every task of ``split`` (or of its ``repos`` only) through fimls serve and
    llama-server, as ``sources`` says; the outcomes are written to ``out``."""
    labelled = [(spec.repo, task) for spec in sets.split(split, repos)
                for task in repo_tasks(spec, mirrors, n, sets.seed, cache=out / "tasks")]
    tasks = [t for _, t in labelled]
    log = out / f"quality-{model}-{split}.log.jsonl"
    roots: Callable[[Task], str] | None = None
    if sources.checkouts is not None:
        specs = {spec.repo: spec for spec in sets.split(split, repos)}
        where = {t.task_id: checkout(specs[repo], mirrors, t, sources.checkouts).as_uri()
                 for repo, t in labelled}

        def roots(task: Task) -> str:
            return where[task.task_id]
    mine = _side(tasks, _known(sources.fimls_from, True),
                 _fimls_runner(serve_flags, model, log, progress, roots) if sources.fimls
                 else None, "fimls")
    theirs = _side(tasks, _known(sources.peer_from, False),
                   _peer_runner(sources.peer_binary, model_path, max_tokens, threads, progress)
                   if sources.peer_binary else None, "llama-server")
    outcomes = [Outcome(repo, language_of_task(t), t.task_id, bool(f["line_exact"]), c,
                        f["completion"], f["latency_ms"][0], bool(p["line_exact"]),
                        p["completion"], p["latency_ms"][0])
                for (repo, t), (f, c), (p, _) in zip(labelled, mine, theirs, strict=True)]
    with open(out / f"quality-{model}-{split}.jsonl", "w", encoding="utf-8") as f:
        for o in outcomes:
            f.write(json.dumps(o.__dict__) + "\n")
    return outcomes


@dataclass(frozen=True)
class LatencyCheck:
    """What an editor waits for, on a subset of the tasks, fimls beside the peer."""

    tasks: int
    rest_s: float
    first_rest_p50_ms: float  # fimls, the first request after the cursor rested
    peer_first_p50_ms: float  # the peer's first request on the same tasks
    key_p50_ms: float  # fimls, per typed character
    peer_key_p50_ms: float

    def describe(self) -> str:
        """Two lines with the ratios the acceptance reads."""
        return (f"latency on {self.tasks} tasks: first request after a {self.rest_s:g} s "
                f"cursor rest p50 {self.first_rest_p50_ms:.0f} ms against llama-server's "
                f"first {self.peer_first_p50_ms:.0f} ms "
                f"({self.first_rest_p50_ms / self.peer_first_p50_ms:.2f}x)\n"
                f"per typed character p50 {self.key_p50_ms:.1f} ms against "
                f"{self.peer_key_p50_ms:.1f} ms "
                f"({self.key_p50_ms / self.peer_key_p50_ms:.2f}x)")


def spread(tasks: Sequence[Task], k: int) -> list[Task]:
    """``k`` tasks spread evenly over ``tasks`` (so over its repositories)."""
    if k >= len(tasks):
        return list(tasks)
    return [tasks[i * len(tasks) // k] for i in range(k)]


def latency_check(tasks: Sequence[Task], *, serve: list[str], peer_binary: Path,
                  model_path: Path, rest_s: float, typing: int, max_tokens: int,
                  threads: int, progress: Callable[[str], None] | None = None,
                  ) -> LatencyCheck:
    """First-request latency after a cursor rest (``fimls/cursor``, as fimls's plugins
    send it) and per-keystroke latency typing ``typing`` characters of the real text, for
    fimls and llama-server on the same tasks."""
    rested = peer.run_fimls(serve, tasks, typing=0, open_wait=rest_s, cursor_hint=True,
                            in_repo=True, progress=progress)
    typed = peer.run_fimls(serve, tasks, typing=typing, in_repo=True, progress=progress)
    theirs = peer.run_peer(peer_binary, model_path, tasks, typing=typing,
                           max_tokens=max_tokens, threads=threads, progress=progress)
    keys = [x for r in typed for x in r["latency_ms"][1:]]
    peer_keys = [x for r in theirs for x in r["latency_ms"][1:]]
    return LatencyCheck(len(tasks), rest_s,
                        percentile([r["latency_ms"][0] for r in rested], 50),
                        percentile([r["latency_ms"][0] for r in theirs], 50),
                        percentile(keys, 50) if keys else math.nan,
                        percentile(peer_keys, 50) if peer_keys else math.nan)


def load_outcomes(path: Path) -> list[Outcome]:
    """Outcomes written by :func:`run_model`, to report them again."""
    with open(path, encoding="utf-8") as f:
        return [Outcome(**json.loads(line)) for line in f if line.strip()]


def _group_row(label: str, rows: Sequence[Outcome], gate: float) -> str:
    n = len(rows)
    d = compare([o.right(gate) for o in rows], [o.peer_right for o in rows])
    u = sum(o.fimls_right for o in rows)
    shown = sum(o.shown(gate) for o in rows)
    peer_shown = sum(bool(o.peer_text) for o in rows)
    prec = d.right_a / shown if shown else math.nan
    peer_prec = d.right_b / peer_shown if peer_shown else math.nan
    return (f"{label:<22}{n:>5} {d.right_a:>5} {shown:>5} {u:>5} {d.right_b:>5} {peer_shown:>5}"
            f"  {prec:5.2f} {peer_prec:5.2f}  {d.describe()}")


def format_report(outcomes: Sequence[Outcome], gate: float, title: str) -> str:
    """Per language, per repository and pooled: right first lines of fimls at ``gate``
    and ungated beside the peer's, precision of what was shown, the paired difference
    (fimls at ``gate`` minus the peer) with its interval and sign test."""
    head = (f"{title}\n{'':<22}{'tasks':>5} {'fimls':>5} {'shown':>5} {'ungat':>5} "
            f"{'peer':>5} {'shown':>5}  {'prec':>5} {'peer':>5}  fimls - peer [95% CI]")
    lines = [head]
    for key in ("language", "repo"):
        for value in sorted({getattr(o, key) for o in outcomes}):
            lines.append(_group_row(value, [o for o in outcomes if getattr(o, key) == value],
                                    gate))
        lines.append("")
    lines.append(_group_row("all", list(outcomes), gate))
    first = [o.fimls_ms for o in outcomes]
    peer_first = [o.peer_ms for o in outcomes if not math.isnan(o.peer_ms)]
    lines.append(f"first request p50: fimls {percentile(first, 50):.0f} ms, llama-server "
                 f"{percentile(peer_first, 50) if peer_first else math.nan:.0f} ms")
    return "\n".join(lines)


def format_gate_sweep(outcomes: Sequence[Outcome]) -> str:
    """Right lines, shown and precision at each threshold, beside the peer's."""
    peer_right = sum(o.peer_right for o in outcomes)
    peer_shown = sum(bool(o.peer_text) for o in outcomes)
    lines = [f"gate   right  shown  precision   (llama-server: right {peer_right}, shown "
             f"{peer_shown}, precision {peer_right / max(1, peer_shown):.3f})"]
    for g in GATE_SWEEP:
        right = sum(o.right(g) for o in outcomes)
        shown = sum(o.shown(g) for o in outcomes)
        lines.append(f"{g:4.2f} {right:7} {shown:6}  {right / max(1, shown):9.3f}")
    return "\n".join(lines)


def main(args: Any, serve_flags: list[str], *, model_names: list[str], max_tokens: int,
         gate: float, threads: int) -> int:
    """``fimls bench --quality``: run every model over the split, print and save tables."""
    from fimls.models import catalogue_name, resolve_model
    from fimls.tools.bench import Progress
    from fimls.tools.quality_sets import load_sets

    sets = load_sets(args.quality)
    n = args.quality_tasks or sets.tasks
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    repos = [r for r in args.repos.split(",") if r] if args.repos else []
    specs = sets.split(args.split, repos)
    peer_binary = Path(args.peer) if args.peer else None
    sources = Sources(fimls=not args.peer_only, peer_binary=peer_binary,
                      fimls_from=tuple(Path(p) for p in args.fimls_from),
                      peer_from=tuple(Path(p) for p in args.peer_from),
                      checkouts=Path(args.checkouts) if args.checkouts else None)
    bar = Progress(len(specs) * n * len(model_names) * (1 + bool(peer_binary)), "quality")
    for name in model_names:
        path = resolve_model(name)
        label = catalogue_name(path) or path.stem
        outcomes = run_model(sets, args.split, Path(args.mirrors), out, model=name,
                             serve_flags=serve_flags, model_path=path, n=n, threads=threads,
                             max_tokens=max_tokens, sources=sources, repos=repos,
                             progress=bar.step)
        print(format_report(outcomes, gate, f"{label}, {args.split} set, first line right "
                            f"(fimls at --min-confidence {gate:g}; ungat: at 0), max tokens "
                            f"{max_tokens}"))
        print(format_gate_sweep(outcomes))
        if args.latency_tasks and peer_binary is not None:
            tasks = spread([t for spec in specs for t in repo_tasks(
                spec, Path(args.mirrors), n, sets.seed, cache=out / "tasks")],
                args.latency_tasks)
            check = latency_check(tasks, serve=[*serve_flags, "--model", name],
                                  peer_binary=peer_binary, model_path=path,
                                  rest_s=args.cursor_rest, typing=args.typing,
                                  max_tokens=max_tokens, threads=threads)
            print(check.describe())
    return 0
