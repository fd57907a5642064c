"""The scenarios of ``fimls bench`` that drive ``fimls serve`` (and llama-server) as an
editor does: the quality mode over many repositories, the editor scenario, and the
cross-file tasks."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fimls.cli.common import default_threads, passthrough_flags, strip_flag
from fimls.config import Options
from fimls.tools.bench_report import FIMLS_ALONE, FIMLS_OPEN, PEER_ALONE, PEER_OPEN


def run_quality(args: argparse.Namespace, opts: Options) -> int:
    """``fimls bench --quality``: see :mod:`fimls.tools.quality_bench`."""
    from fimls.models import default_model_name
    from fimls.tools import quality_bench

    names = ([x.strip() for x in (args.models or "").split(",") if x.strip()]
             or [opts.model.model or default_model_name()])
    flags = strip_flag(strip_flag(passthrough_flags(args), "--model"), "--min-confidence")
    gate = opts.completion.min_confidence
    return quality_bench.main(args, flags, model_names=names,
                              max_tokens=opts.completion.max_tokens, gate=gate,
                              threads=default_threads(opts))


def editor_bench(args: argparse.Namespace, opts: Options, models: list[str | None],
                  tasks: list[Any], out: Path, step: Callable[[str], None]) -> dict[str, Any]:
    """fimls serve (and llama-server with --peer) as an editor drives them, per model."""
    from fimls.models import catalogue_name, default_model_name, resolve_model
    from fimls.tools import peer

    summary: dict[str, dict[str, dict[str, Any]]] = {}
    rows: dict[str, dict[str, Any]] = {}
    flags = passthrough_flags(args)
    for name in models:
        model = name or opts.model.model or default_model_name()
        path = resolve_model(model)
        label = catalogue_name(path) or path.name
        serve = [*strip_flag(flags, "--model"), "--model", str(model)]
        log_path = out / f"editor-{label}.jsonl"
        if args.editors > 1:
            runs = _editors_at_once(serve, tasks, args.editors, args.typing, out, label, step)
        else:
            runs = {"fimls": peer.run_fimls(serve, tasks, typing=args.typing,
                                            latency_log=log_path, progress=step)}
        if args.open_wait:
            runs[f"fimls, opened {args.open_wait:g}s before"] = peer.run_fimls(
                serve, tasks, typing=0, open_wait=args.open_wait,
                latency_log=out / f"editor-{label}-opened.jsonl", progress=step)
            # As fimls's VS Code and Neovim plugins do: the cursor is told once it rests.
            runs[f"fimls, opened {args.open_wait:g}s before, cursor told"] = peer.run_fimls(
                serve, tasks, typing=0, open_wait=args.open_wait, cursor_hint=True,
                latency_log=out / f"editor-{label}-cursor.jsonl", progress=step)
        if args.peer:
            runs["llama-server"] = peer.run_peer(
                Path(args.peer), path, tasks, typing=args.typing,
                max_tokens=opts.completion.max_tokens,
                threads=default_threads(opts),
                extra_args=args.peer_args, progress=step)
        summary[label] = {k: peer.summarize_editor(v) for k, v in runs.items()}
        rows[label] = runs
        if args.open_wait:
            idle = peer.idle_prefill_stats(out / f"editor-{label}-opened.jsonl")
            summary[label][f"fimls, opened {args.open_wait:g}s before"]["idle_prefill"] = idle
    return {"summary": summary, "rows": rows}


def _editors_at_once(serve: list[str], tasks: list[Any], editors: int, typing: int,
                     out: Path, label: str, step: Callable[[str], None],
                     ) -> dict[str, list[dict[str, Any]]]:
    """``editors`` fimls serve processes at the same time, each typing its share of the
    tasks: what a team sharing one ``--engine`` server sees, editor by editor."""
    from concurrent.futures import ThreadPoolExecutor

    from fimls.tools import peer

    def one(i: int) -> list[dict[str, Any]]:
        return peer.run_fimls(serve, tasks[i::editors], typing=typing,
                              latency_log=out / f"editor-{label}-{i + 1}.jsonl", progress=step)

    with ThreadPoolExecutor(editors) as pool:
        results = list(pool.map(one, range(editors)))
    return {f"fimls, editor {i + 1}/{editors}": rows for i, rows in enumerate(results)}


def cross_bench(args: argparse.Namespace, opts: Options, models: list[str | None],
                 tasks: list[Any], out: Path, step: Callable[[str], None]) -> dict[str, Any]:
    """Cross-file tasks through fimls serve, alone and with the task's other files open."""
    from fimls.crossfile import CHARS_PER_TOKEN as CONTEXT_CHARS_PER_TOKEN
    from fimls.latency import percentile, read_records
    from fimls.models import catalogue_name, default_model_name, resolve_model
    from fimls.tools import crosstasks, peer

    summary: dict[str, dict[str, dict[str, Any]]] = {}
    flags = passthrough_flags(args)
    for name in models:
        model = name or opts.model.model or default_model_name()
        label = catalogue_name(resolve_model(model)) or str(model)
        serve = [*strip_flag(flags, "--model"), "--model", str(model)]
        summary[label] = {}
        logs = (out / f"cross-{label}-alone.jsonl", out / f"cross-{label}-open.jsonl")
        both = peer.run_fimls_paired(serve, tasks, typing=args.cross_typing, latency_logs=logs,
                                     progress=step)
        for system, rows, log_path in zip((FIMLS_ALONE, FIMLS_OPEN), both, logs,
                                          strict=True):
            row = peer.summarize_editor(rows)
            log_records = list(read_records(log_path))
            # Requests that built a prompt (not those the memo answered).
            recs = [r for r in log_records
                    if r.get("outcome") in ("returned", "empty", "gated")
                    and r.get("prompt_tokens", 0) > 0]
            row["context_tokens_p50"] = percentile(
                [float(r.get("context_tokens", 0)) for r in recs], 50)
            # Of the requests that built a prompt: how many read it a second time without
            # the chunks, and how many showed that reading's line (see secondReading).
            row["second_share"] = sum(bool(r.get("second_line")) for r in recs) / max(1, len(recs))
            row["second_taken_share"] = (sum(r.get("second_line") == "taken" for r in recs)
                                         / max(1, len(recs)))
            row.update(peer.keystroke_costs(rows, log_records))
            row["by_file_calls"] = crosstasks.split_by_file_calls(rows, tasks)
            if system != FIMLS_ALONE:
                budget = opts.completion.context_tokens * CONTEXT_CHARS_PER_TOKEN
                row["definition_in_chunks"] = sum(crosstasks.definition_in_chunks(t, budget)
                                                  for t in tasks)
            row["rows"] = rows
            summary[label][system] = row
        if args.peer:
            # The peer on the same tasks and model file: the file alone, then with the
            # chunks llama.vim's ring buffer would hold (crosstasks.ring_chunks).
            path = resolve_model(model)
            for system, extra in ((PEER_ALONE, None), (PEER_OPEN, crosstasks.ring_chunks)):
                rows = peer.run_peer(Path(args.peer), path, tasks, typing=args.cross_typing,
                                     max_tokens=opts.completion.max_tokens,
                                     threads=default_threads(opts),
                                     extra_args=args.peer_args, progress=step, extra=extra)
                row = peer.summarize_editor(rows)
                row["by_file_calls"] = crosstasks.split_by_file_calls(rows, tasks)
                row["rows"] = rows
                summary[label][system] = row
    return summary
