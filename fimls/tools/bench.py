"""``fimls bench``: does speculation help on this machine, with this model? Measure it.

Methodology (the same for every configuration, so only speculation differs):

* the very same prompts, model, context settings, max tokens, greedy decoding, threads and
  GPU offload for the baseline (``off``) and every speculative configuration;
* every measured request is cold: the KV cache and the remembered suggestions are cleared
  before it, so no configuration profits from another's work;
* warm-up requests first, then at least 10 measured requests per configuration and task
  set, interleaved (the order of configurations rotates from task to task) so that machine
  drift hits all of them alike;
* per configuration and task set: TTFT, total latency and decode tokens/s (p50, p95),
  acceptance rate, mean accepted length, the gain against the baseline
  (baseline − speculative) / baseline × 100 per task (median and interquartile spread), and
  whether the outputs were identical to the baseline's.

The ``keystroke`` scenario drives ``fimls serve`` over stdio the way an editor does when
the user accepts a suggestion character by character, and compares follow-up latency.
"""

from __future__ import annotations

import asyncio
import json
import logging
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fimls import quality
from fimls.latency import percentile
from fimls.tools.harness import (
    Task,
    close_doc,
    inline,
    insert,
    open_doc,
    start_client,
    stop_client,
    utf16_len,
    utf16_position,
)

log = logging.getLogger(__name__)

class Progress:
    """A one-line progress bar on stderr."""

    def __init__(self, total: int, label: str = "") -> None:
        self.total = max(1, total)
        self.done = 0
        self.label = label
        self.t0 = time.monotonic()
        self.tty = sys.stderr.isatty()

    def step(self, note: str = "") -> None:
        """One more unit done."""
        self.done += 1
        if not self.tty and self.done % max(1, self.total // 20) and self.done != self.total:
            return
        frac = self.done / self.total
        bar = "#" * int(frac * 30)
        eta = (time.monotonic() - self.t0) / frac * (1 - frac)
        end = "" if self.tty else "\n"
        sys.stderr.write(f"\r{self.label} [{bar:<30}] {self.done}/{self.total} "
                         f"eta {eta:5.0f}s {note[:30]:<30}{end}")
        if self.done == self.total and self.tty:
            sys.stderr.write("\n")
        sys.stderr.flush()


@dataclass
class Run:
    """One measured request."""

    kind: str
    config: str
    task_id: str
    text: str
    record: dict[str, Any]
    target: str = ""


@dataclass
class BenchResult:
    """Everything a bench run measured, and its summary."""

    runs: list[Run] = field(default_factory=list)
    setup: dict[str, Any] = field(default_factory=dict)
    summary: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)
    keystroke: dict[str, Any] = field(default_factory=dict)
    editor: dict[str, Any] = field(default_factory=dict)
    suffix: dict[str, Any] = field(default_factory=dict)  # per model: run_suffix_bench
    cross: dict[str, Any] = field(default_factory=dict)  # per model: alone / others open


def _stats(values: Sequence[float]) -> dict[str, float]:
    vals = [v for v in values if v == v]
    return {"p50": percentile(vals, 50), "p95": percentile(vals, 95),
            "mean": statistics.fmean(vals) if vals else float("nan")}


def summarize_runs(runs: list[Run], baseline: str = "off") -> dict[str, dict[str, dict[str, Any]]]:
    """Per kind and configuration: latency, tokens/s, acceptance, gain, identical outputs."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    kinds = sorted({r.kind for r in runs})
    for kind in kinds:
        by_cfg: dict[str, list[Run]] = {}
        for r in runs:
            if r.kind == kind:
                by_cfg.setdefault(r.config, []).append(r)
        base = {r.task_id: r for r in by_cfg.get(baseline, [])}
        out[kind] = {}
        for cfg, rs in by_cfg.items():
            recs = [r.record for r in rs]
            gen = sum(int(x["generated_tokens"]) for x in recs)
            dec = sum(float(x["decode_ms"]) for x in recs)
            drafted = sum(int(x["drafted_tokens"]) for x in recs)
            accepted = sum(int(x["accepted_tokens"]) for x in recs)
            batches = sum(int(x.get("draft_batches", 0)) for x in recs)
            per_tps = [x["generated_tokens"] / (x["decode_ms"] / 1000.0) for x in recs
                       if x["decode_ms"] > 0 and x["generated_tokens"] > 1]
            gains, same = [], 0
            for r in rs:
                b = base.get(r.task_id)
                if b is None:
                    continue
                bt = float(b.record["total_ms"])
                if bt > 0:
                    gains.append((bt - float(r.record["total_ms"])) / bt * 100.0)
                same += r.text == b.text
            base_tps = out[kind].get(baseline, {}).get("tokens_per_s")
            tps = gen / (dec / 1000.0) if dec > 0 else float("nan")
            out[kind][cfg] = {
                "runs": len(rs),
                "ttft_ms": _stats([float(x["ttft_ms"]) for x in recs]),
                "total_ms": _stats([float(x["total_ms"]) for x in recs]),
                "tokens_per_s": tps,
                "tokens_per_s_runs": _stats(per_tps),
                "acceptance_rate": accepted / drafted if drafted else 0.0,
                "mean_accepted_len": accepted / batches if batches else 0.0,
                "drafted_tokens": drafted,
                "accepted_tokens": accepted,
                "gain_pct": {"median": percentile(gains, 50), "p25": percentile(gains, 25),
                             "p75": percentile(gains, 75)},
                "identical": f"{same}/{len(rs)}" if base else "n/a",
                "identical_count": same,
                "quality": quality.summarize(quality.score(r.text, r.target) for r in rs),
            }
            if base_tps:
                out[kind][cfg]["tps_ratio"] = tps / base_tps
        if baseline in out[kind]:
            bt = out[kind][baseline]["tokens_per_s"]
            for row in out[kind].values():
                row["tps_ratio"] = row["tokens_per_s"] / bt if bt else float("nan")
    return out


def format_table(summary: dict[str, dict[str, dict[str, Any]]]) -> str:
    """The terminal table."""
    w = max([18, *(len(k) + 2 for k in summary)])
    head = (f"{'task set':<{w}}{'config':<8}{'runs':>5}{'ttft p50':>10}{'total p50':>10}"
            f"{'p95':>8}{'tok/s':>8}{'x off':>7}{'accept':>8}{'acc.len':>8}{'gain% (IQR)':>20}"
            f"{'same':>8}")
    lines = [head, "-" * len(head)]
    for kind, rows in summary.items():
        for cfg, r in rows.items():
            g = r["gain_pct"]
            gain = (f"{g['median']:+.1f} ({g['p25']:+.0f}..{g['p75']:+.0f})"
                    if g["median"] == g["median"] else "")
            lines.append(
                f"{kind:<{w}}{cfg:<8}{r['runs']:>5}{r['ttft_ms']['p50']:>10.0f}"
                f"{r['total_ms']['p50']:>10.0f}{r['total_ms']['p95']:>8.0f}"
                f"{r['tokens_per_s']:>8.1f}{r.get('tps_ratio', float('nan')):>7.2f}"
                f"{r['acceptance_rate']:>8.0%}{r['mean_accepted_len']:>8.2f}{gain:>20}"
                f"{r['identical']:>8}")
    return "\n".join(lines)


def format_quality_table(summary: dict[str, dict[str, dict[str, Any]]]) -> str:
    """The quality table: how often the suggestion is the text the user really wrote."""
    w = max([18, *(len(k) + 2 for k in summary)])
    head = (f"{'task set':<{w}}{'config':<8}{'tasks':>6}{'line-exact':>11}{'exact':>7}"
            f"{'prefix':>8}{'edit sim':>9}{'empty':>7}{'ttft p50':>10}{'total p50':>10}")
    lines = [head, "-" * len(head)]
    for kind, rows in summary.items():
        for cfg, r in rows.items():
            q = r["quality"]
            lines.append(
                f"{kind:<{w}}{cfg:<8}{int(q['tasks']):>6}{q['line_exact']:>11.3f}"
                f"{q['exact']:>7.3f}{q['prefix_ratio']:>8.3f}{q['edit_similarity']:>9.3f}"
                f"{q['empty_rate']:>7.2f}{r['ttft_ms']['p50']:>10.0f}{r['total_ms']['p50']:>10.0f}")
    return "\n".join(lines)


GATE_THRESHOLDS = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8)


def gate_table(runs: list[Run], config: str = "off",
               thresholds: Sequence[float] = GATE_THRESHOLDS) -> dict[str, list[dict[str, Any]]]:
    """The confidence gate per task set and threshold, on the runs of one configuration.

    For each threshold and each measure (``confidence``: the first line's least likely
    token; ``confidence_mean``: their mean): how many non-empty suggestions would be
    shown, the precision of those (first line right) and the recall (right ones still
    shown, of all right ones).
    """
    out: dict[str, list[dict[str, Any]]] = {}
    for kind in sorted({r.kind for r in runs}):
        rows = [r for r in runs if r.kind == kind and r.config == config and r.text]
        right = [quality.score(r.text, r.target).line_exact for r in rows]
        n_right = sum(right)
        table = []
        for t in thresholds:
            row: dict[str, Any] = {"threshold": t, "suggestions": len(rows)}
            for measure in ("confidence", "confidence_mean"):
                # No confidence (memo, forced text only): never gated.
                conf = [1.0 if r.record.get(measure) is None else float(r.record[measure])
                        for r in rows]
                shown = [ok for c, ok in zip(conf, right, strict=True) if c >= t]
                row[measure] = {"shown": len(shown),
                                "precision": sum(shown) / len(shown) if shown else float("nan"),
                                "recall": sum(shown) / n_right if n_right else float("nan")}
            table.append(row)
        out[kind] = table
    return out


def format_gate_table(gates: dict[str, list[dict[str, Any]]]) -> str:
    """Shown / precision / recall per threshold, for both confidence measures."""
    w = max([18, *(len(k) + 2 for k in gates)])
    head = (f"{'task set':<{w}}{'min conf':>9}{'shown':>7}{'precision':>10}{'recall':>8}   "
            f"{'shown':>7}{'precision':>10}{'recall':>8}  (least likely token | mean)")
    lines = [head, "-" * len(head)]
    for kind, table in gates.items():
        for row in table:
            a, b = row["confidence"], row["confidence_mean"]
            lines.append(f"{kind:<{w}}{row['threshold']:>9.2f}"
                         f"{a['shown']:>4}/{row['suggestions']:<3}{a['precision']:>9.3f}"
                         f"{a['recall']:>8.3f}   {b['shown']:>4}/{row['suggestions']:<3}"
                         f"{b['precision']:>9.3f}{b['recall']:>8.3f}")
    return "\n".join(lines)


def run_engine_bench(engine: Any, sets: list[tuple[str, list[Task]]], configs: list[str], *,
                     warmup: int, repeats: int, max_tokens: int, max_lines: int,
                     progress: Callable[[str], None] | None = None) -> list[Run]:
    """Cold, interleaved requests of every configuration on every task."""
    from fimls.engine.api import CompletionRequest

    def one(kind: str, task: Task, cfg: str, index: int) -> Run:
        engine.reset()
        engine.prev_gen.clear()
        req = CompletionRequest(uri=f"bench://{kind}/{task.task_id}", version=1,
                                prefix=task.prefix, suffix=task.suffix,
                                max_tokens=max_tokens, max_lines=max_lines, speculative=cfg)
        res = engine.complete(req, lambda: False)
        d = json.loads(res.record.to_json())
        # Task ids need not be unique in a user's file: runs pair up by position.
        return Run(kind, cfg, f"{index}:{task.task_id}", res.text, d, task.target)

    runs: list[Run] = []
    for kind, tasks in sets:
        for i in range(warmup):
            for cfg in configs:
                one(kind, tasks[i % len(tasks)], cfg, i % len(tasks))
                if progress:
                    progress(f"{kind} warm-up")
        for rep in range(repeats):
            for ti, task in enumerate(tasks):
                shift = (ti + rep) % len(configs)
                for cfg in configs[shift:] + configs[:shift]:
                    runs.append(one(kind, task, cfg, ti))
                    if progress:
                        progress(f"{kind} {cfg}")
    return runs


async def _keystroke_session(cmd: list[str], tasks: list[Task], chars: int, typed: str,
                             progress: Callable[[str], None] | None) -> list[dict[str, Any]]:
    """Drive one ``fimls serve``: ask, then type the suggestion one character at a time."""
    from lsprotocol import types

    client = await start_client(cmd, "fimls-bench")
    out: list[dict[str, Any]] = []

    async def ask(uri: str, line: int, col: int) -> tuple[str, float]:
        t0 = time.perf_counter()
        res = await inline(client, uri, line, col)
        ms = (time.perf_counter() - t0) * 1000.0
        items = (res.items if isinstance(res, types.InlineCompletionList)
                 else list(res or []))
        text = items[0].insert_text if items else ""
        return (text if isinstance(text, str) else ""), ms

    for ti, task in enumerate(tasks):
        uri = f"file:///bench/keystroke/{ti}.py"
        open_doc(client, uri, task.prefix + task.suffix)
        line, col = utf16_position(task.prefix)
        shown, first_ms = await ask(uri, line, col)
        follow: list[float] = []
        version = 1
        # Type what was shown (the user accepts it letter by letter), asking after each.
        # The user types what was shown, or (typed="target") what the task expects.
        for ch in (shown if typed == "shown" else task.target)[:chars]:
            version += 1
            insert(client, uri, version, line, col, ch)
            if ch == "\n":
                line, col = line + 1, 0
            else:
                col += utf16_len(ch)
            _, ms = await ask(uri, line, col)
            follow.append(ms)
        out.append({"task_id": task.task_id, "first_ms": first_ms, "follow_ms": follow,
                    "shown": shown})
        close_doc(client, uri)
        if progress:
            progress("keystroke")
    await stop_client(client)
    return out


def run_keystroke_bench(serve_args: list[str], tasks: list[Task], chars: int, out_dir: Path,
                        typed: str = "shown",
                        configs: Sequence[str] = ("off", "auto"),
                        progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Follow-up latency when typing the suggestion, per speculative mode, via stdio.

    Each server writes its own latency log; the summary reads it back to tell which
    follow-ups needed the model at all, and how their drafts fared.
    """
    from fimls.latency import read_records

    results: dict[str, Any] = {}
    logs: dict[str, Path] = {}
    for cfg in configs:
        logs[cfg] = out_dir / f"keystroke-{cfg}.jsonl"
        logs[cfg].unlink(missing_ok=True)
        cmd = [sys.executable, "-m", "fimls", "serve", *serve_args, "--speculative", cfg,
               "--log-level", "WARNING", "--latency-log", str(logs[cfg])]
        results[cfg] = asyncio.run(_keystroke_session(cmd, tasks, chars, typed, progress))
    summary: dict[str, Any] = {}
    for cfg, rows in results.items():
        follow = [ms for r in rows for ms in r["follow_ms"]]
        records = [r for r in read_records(logs[cfg])
                   if not str(r.get("outcome", "")).startswith("prefill")]
        recs = [r for r in records if (r.get("version") or 0) > 1]
        through = [r for r in recs if r.get("evaluated_tokens", 1) > 0]
        tail = [r for r in through if r.get("draft") == "tail"]
        drafted = sum(int(r.get("drafted_tokens", 0)) for r in through)
        accepted = sum(int(r.get("accepted_tokens", 0)) for r in through)
        # Time spent crossing to the engine worker process and back (0 in thread mode).
        hops = [float(r.get("hop_ms", 0.0)) for r in records
                if r.get("outcome") in ("returned", "empty")]
        summary[cfg] = {"requests": len(follow), "follow_p50_ms": percentile(follow, 50),
                        "hop_p50_ms": percentile(hops, 50), "hop_p95_ms": percentile(hops, 95),
                        "non_empty_first": sum(bool(r["shown"]) for r in rows),
                        "reuse_ge_90pct": sum(int(r.get("reused_tokens", 0))
                                              >= 0.9 * int(r.get("prompt_tokens", 0))
                                              for r in recs),
                        "follow_p95_ms": percentile(follow, 95),
                        "first_p50_ms": percentile([r["first_ms"] for r in rows], 50),
                        "through_model": len(through), "tail_drafted": len(tail),
                        "drafted": drafted, "accepted": accepted,
                        "acceptance": accepted / drafted if drafted else float("nan")}
    if "off" in summary:
        base = summary["off"]["follow_p50_ms"]
        for row in summary.values():
            row["follow_p50_vs_off"] = row["follow_p50_ms"] / base if base else float("nan")
    return {"summary": summary, "sessions": results}


def _typed_answers(engine: Any, ti: int, task: Task, chars: int, max_tokens: int,
                   max_lines: int, reuse: bool) -> list[tuple[str, dict[str, Any]]]:
    """The answer and its record at the task's cursor and after each of ``chars`` typed
    characters of its target, from a cleared cache, with the suffix moved or not."""
    from fimls.engine.api import CompletionRequest
    from fimls.memo import SuggestionMemo

    engine.reset()
    engine.prev_gen.clear()
    got: list[tuple[str, dict[str, Any]]] = []
    for k in range(min(chars, len(task.target)) + 1):
        engine.memo = SuggestionMemo()
        req = CompletionRequest(
            uri=f"bench://suffix/{ti}", version=k + 1,
            prefix=task.prefix + task.target[:k], suffix=task.suffix,
            max_tokens=max_tokens, max_lines=max_lines, speculative="off",
            reuse_suffix=reuse)
        res = engine.complete(req, lambda: False)
        got.append((res.text, json.loads(res.record.to_json())))
    return got


def run_suffix_bench(engine: Any, tasks: list[Task], chars: int, *, max_tokens: int,
                     max_lines: int,
                     progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """The quality cost of suffix reuse (FIM): the user types the real text.

    Per task, two passes over the same keystrokes: the first request, then ``chars``
    typed characters of the target, asking after each. With ``reuse_suffix`` the cached
    suffix entries move to their new positions (they attended to the old prefix: an
    approximation); without it everything after the edit is evaluated again, which is
    what a fresh prompt computes. The memo is cleared before every keystroke so the model
    answers each one, and speculation is off so only the suffix's cache differs. Each
    answer is scored against the rest of the target.
    """
    rows: list[dict[str, Any]] = []
    for ti, task in enumerate(tasks):
        answers = {reuse: _typed_answers(engine, ti, task, chars, max_tokens, max_lines, reuse)
                   for reuse in (True, False)}
        for k, ((a, ra), (b, rb)) in enumerate(
                zip(answers[True], answers[False], strict=True)):
            if k == 0:
                continue  # the first request is the same computation in both passes
            rest = task.target[k:]
            rows.append({"task_id": task.task_id, "typed": k,
                         "shifted": int(ra.get("shifted_tokens", 0)),
                         "same": a == b, "reuse": a, "fresh": b, "target": rest,
                         "reuse_ms": float(ra["total_ms"]), "fresh_ms": float(rb["total_ms"]),
                         "reuse_evaluated": int(ra.get("evaluated_tokens", 0)),
                         "fresh_evaluated": int(rb.get("evaluated_tokens", 0))})
        if progress:
            progress("suffix reuse")
    moved = [r for r in rows if r["shifted"]]

    def side(key: str, rs: list[dict[str, Any]]) -> dict[str, Any]:
        q = quality.summarize(quality.score(r[key], r["target"]) for r in rs)
        return {"keystrokes": len(rs), "line_exact": q["line_exact"],
                "prefix_ratio": q["prefix_ratio"],
                "ms_p50": percentile([r[f"{key}_ms"] for r in rs], 50),
                "evaluated_p50": percentile([float(r[f"{key}_evaluated"]) for r in rs], 50)}

    summary = {"tasks": len(tasks), "keystrokes": len(rows), "moved": len(moved),
               "same": sum(r["same"] for r in rows),
               "same_moved": sum(r["same"] for r in moved),
               "reuse": side("reuse", rows), "fresh": side("fresh", rows),
               "reuse_moved": side("reuse", moved), "fresh_moved": side("fresh", moved)}
    return {"summary": summary, "rows": rows}


def format_suffix_table(label: str, s: dict[str, Any]) -> str:
    """Suffix reuse against a fresh evaluation, on the same keystrokes."""
    w = max(22, len(label) + 2)
    head = (f"{'model':<{w}}{'keystrokes':<22}{'n':>5}{'line-exact':>11}{'prefix':>8}"
            f"{'p50 ms':>9}{'evaluated':>10}")
    lines = [head, "-" * len(head)]
    for name, key in (("all, suffix moved", "reuse"), ("all, fresh", "fresh"),
                      ("moved only, moved", "reuse_moved"), ("moved only, fresh", "fresh_moved")):
        r = s[key]
        lines.append(f"{label:<{w}}{name:<22}{r['keystrokes']:>5}{r['line_exact']:>11.3f}"
                     f"{r['prefix_ratio']:>8.3f}{r['ms_p50']:>9.0f}{r['evaluated_p50']:>10.0f}")
    lines.append(f"{label}: suffix moved on {s['moved']}/{s['keystrokes']} keystrokes; "
                 f"answers identical to fresh on {s['same']}/{s['keystrokes']} "
                 f"({s['same_moved']}/{s['moved']} of the moved)")
    return "\n".join(lines)


def lookup_speed(n_tokens: int = 8192, calls: int = 2000, seed: int = 0) -> float:
    """Microseconds per prompt-lookup proposal over ``n_tokens`` of history (code-like
    token statistics: a few hundred distinct ids, many repeats)."""
    import numpy as np

    from fimls.drafting import PromptLookupDraft

    rng = np.random.default_rng(seed)
    src = rng.zipf(1.3, size=n_tokens).astype(np.int32) % 5000
    d = PromptLookupDraft(max_ngram_size=3, num_pred_tokens=8)
    d.set_source("context", src)
    d.set_source("tail", src[-200:])
    hist = [int(x) for x in src[-64:]]
    t0 = time.perf_counter()
    for i in range(calls):
        hist[-1] = int(src[(i * 7919) % n_tokens])
        d.propose(hist, 8)
    return (time.perf_counter() - t0) / calls * 1e6


def plot(result: BenchResult, path: Path) -> bool:
    """A PNG of the latency distributions per task set and configuration."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log.warning("matplotlib is not installed (pip install 'fimls[bench]'): no plot")
        return False
    kinds = sorted({r.kind for r in result.runs})
    ncols = len(kinds) + (1 if result.keystroke else 0)
    fig, axes = plt.subplots(1, max(1, ncols), figsize=(5 * max(1, ncols), 4.5), squeeze=False)
    for ax, kind in zip(axes[0], kinds, strict=False):
        cfgs = sorted({r.config for r in result.runs if r.kind == kind},
                      key=lambda c: (c != "off", c))
        data = [[r.record["total_ms"] for r in result.runs if r.kind == kind and r.config == c]
                for c in cfgs]
        ax.boxplot(data, tick_labels=cfgs, showfliers=True)
        ax.set_title(f"{kind}: total latency")
        ax.set_ylabel("ms")
    if result.keystroke:
        ax = axes[0][len(kinds)]
        sessions = result.keystroke["sessions"]
        cfgs = list(sessions)
        data = [[ms for r in sessions[c] for ms in r["follow_ms"]] for c in cfgs]
        ax.boxplot(data, tick_labels=cfgs)
        ax.set_yscale("log")
        ax.set_title("typing the suggestion: follow-up latency")
        ax.set_ylabel("ms (log)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True
