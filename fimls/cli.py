"""Command line: ``fimls serve``, ``complete``, ``bench``, ``soak``, ``tasks`` and ``stats``.

Every option of the options tree is a flag here (``--max-tokens``) and a camelCase key in
the editor's ``initializationOptions`` (``maxTokens``): one converter reads both.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import sys
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import Any

from fimls import __version__
from fimls.config import Options, apply_dict, describe
from fimls.engine import make_engine

log = logging.getLogger(__name__)


def _add_option_flags(p: argparse.ArgumentParser) -> None:
    for key, flag, default, doc in describe():
        p.add_argument(flag, dest=f"opt_{key}", default=None, metavar="VALUE",
                       help=f"{doc} (default: {default}; initializationOptions key: {key})")


def _options_from_args(args: argparse.Namespace) -> Options:
    data: dict[str, Any] = {}
    for name, value in vars(args).items():
        if name.startswith("opt_") and value is not None:
            key = name[4:]
            data[key] = _parse_scalar(value)
    opts, warnings = apply_dict(Options(), data)
    for w in warnings:
        print(f"fimls: {w}", file=sys.stderr)
    return opts


def _parse_scalar(value: str) -> Any:
    """Command-line values are strings: numbers become ints so one converter serves all."""
    try:
        return int(value)
    except ValueError:
        return value


def _setup_logging(level: str) -> None:
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("fimls").setLevel(level)
    # pygls logs a full traceback for every message it cannot deserialize (which may quote
    # the message); the server answers those itself and logs one line instead.
    logging.getLogger("pygls.protocol.json_rpc").addFilter(
        lambda rec: not str(rec.msg).startswith("Unable to deserialize message"))


def cmd_serve(args: argparse.Namespace) -> int:
    """LSP over stdio."""
    opts = _options_from_args(args)
    _setup_logging(opts.logging.log_level)
    from fimls.server import serve

    return serve(opts, make_engine)


def _example_path() -> Path:
    return Path(str(resources.files("fimls").joinpath("examples/primes.py")))


def _parse_target(target: str | None) -> tuple[Path, int, int | None]:
    if not target:
        path = _example_path()
        # The cursor goes at the end of the loop header, where the body is missing.
        lines = path.read_text(encoding="utf-8").split("\n")
        line = next(i for i, t in enumerate(lines, 1) if t.startswith("    for n in"))
        return path, line, None
    parts = target.rsplit(":", 2)
    if len(parts) == 3 and parts[1].isdigit() and parts[2].isdigit():
        return Path(parts[0]), int(parts[1]), int(parts[2])
    parts = target.rsplit(":", 1)
    if len(parts) == 2 and parts[1].isdigit():
        return Path(parts[0]), int(parts[1]), None
    raise SystemExit(f"fimls: expected FILE:LINE[:COL] (1-based), got {target!r}")


def cmd_complete(args: argparse.Namespace) -> int:
    """One completion through the same engine and prompt builder as the server."""
    opts = _options_from_args(args)
    _setup_logging(opts.logging.log_level)
    from fimls.documents import Pos, TextDocument
    from fimls.engine.api import CompletionRequest, ModelLoadError

    path, line, col = _parse_target(args.target)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        print(f"fimls: cannot read {path}: {exc}", file=sys.stderr)
        return 2
    text = raw.decode("utf-8", errors="replace")
    doc = TextDocument(uri=path.resolve().as_uri(), language_id="", version=0, text=text)
    if col is None:
        col = len(doc.line_text(line - 1)) + 1
    pos = Pos(max(0, line - 1), max(0, col - 1))
    prefix, suffix = doc.prefix_suffix(pos, "utf-32")
    try:
        engine = make_engine(opts, isolation="thread")
    except ModelLoadError as exc:
        print(f"fimls: {exc}", file=sys.stderr)
        return 1
    for warning in getattr(engine, "warnings", []):
        print(f"fimls: {warning}", file=sys.stderr)
    c = opts.completion
    # One completion on demand races no typing: the time limit applies only when asked for.
    max_time_ms = c.max_time_ms if getattr(args, "opt_maxTimeMs", None) is not None else 0
    # Asked for explicitly, a suggestion is shown however unsure: the gate only when given.
    gate = c.min_confidence if getattr(args, "opt_minConfidence", None) is not None else 0.0
    req = CompletionRequest(uri=doc.uri, version=0, prefix=prefix, suffix=suffix,
                            rel_path=path.name, max_tokens=c.max_tokens,
                            max_lines=c.max_lines, max_time_ms=max_time_ms,
                            speculative=c.speculative, min_confidence=gate)
    result = engine.complete(req, lambda: False)
    engine.close()
    where = f"{path}:{pos.line + 1}:{pos.character + 1}"
    named = "" if opts.model.model else ", the default"
    print(f"--- completion at {where} ({engine.model_name}{named})")
    print(result.text)
    print("--- latency record")
    print(result.record.to_json())
    return 0


def cmd_models(args: argparse.Namespace) -> int:
    """The model catalogue: what is installed, where, and what pairs with what."""
    from fimls.models import describe_models

    logging.basicConfig(stream=sys.stderr, level=logging.WARNING)
    rows = describe_models()
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    for r in rows:
        mark = " (default)" if r["default"] else ""
        size = int(r["size"]) / 2**20  # type: ignore[call-overload]
        print(f"{r['name']}{mark}: {r['description']}")
        print(f"  installed: {'yes' if r['installed'] else 'no, ' + str(r['install'])}; "
              f"size {size:.0f} MiB; licence {r['licence']}")
        print(f"  path: {r['path'] or '-'}; vocabulary: {r['n_vocab'] or '-'}; "
              f"FIM template: {r['template'] or '-'}; draft model: {r['draft'] or '-'}")
        if r.get("error"):
            print(f"  error: {r['error']}")
    return 0


def cmd_stats(args: argparse.Namespace) -> int:
    """p50/p95 of each latency field and counts by outcome."""
    from fimls.latency import format_summary, read_records, summarize

    path = Path(args.log) if args.log else None
    if path is None:
        from fimls.models import default_latency_log
        path = default_latency_log()
    if not path.exists():
        print(f"fimls: no latency log at {path}", file=sys.stderr)
        return 1
    records = list(read_records(path))
    s = summarize(records)
    if args.plot:
        from fimls.latency import plot_log

        try:
            plot_log(records, Path(args.plot))
        except ImportError:
            print("fimls: --plot needs matplotlib: pip install 'fimls[bench]'", file=sys.stderr)
            return 2
        print(f"plot: {args.plot}", file=sys.stderr)
    if args.json:
        print(json.dumps(s, indent=2))
    else:
        print(f"latency log: {path}")
        print(format_summary(s))
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    """Speculation on/off on the same prompts; table, JSON and PNG."""
    from fimls.models import catalogue_name
    from fimls.tools import bench
    from fimls.tools.harness import Task, load_tasks

    opts = _options_from_args(args)
    _setup_logging(opts.logging.log_level)
    if args.quality:
        return _quality_bench(args, opts)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    sets = [load_tasks(s.strip(), args.n) for s in args.sets.split(",") if s.strip()]
    configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    if opts.completion.draft_model and "model" not in configs:
        configs.append("model")
    if "off" in configs:
        configs.remove("off")
    configs.insert(0, "off")
    for c in configs:
        if c not in ("off", "auto", "lookup", "model"):
            raise SystemExit(f"fimls bench: unknown configuration {c!r}")
    if "model" in configs and not opts.completion.draft_model:
        raise SystemExit("fimls bench: configuration 'model' needs --draft-model")
    models = [x.strip() for x in (args.models or "").split(",") if x.strip()] or [None]
    total = (sum(len(t) * args.repeats + args.warmup for _, t in sets) * len(configs)
             * len(models))
    editor_n = (args.editor_tasks if args.editor_tasks is not None
                else (20 if args.peer and not args.cross_set else 0))
    editor_tasks: list[Task] = []
    if editor_n:
        editor_tasks = load_tasks(args.editor_set or args.sets.split(",")[0].strip(),
                                  editor_n)[1]
        total += (len(editor_tasks) * len(models)
                  * (1 + bool(args.peer) + 2 * bool(args.open_wait)))
    cross_tasks: list[Task] = []
    if args.cross_set:
        cross_tasks = load_tasks(args.cross_set, args.cross_tasks)[1]
        total += len(cross_tasks) * len(models) * (2 + 2 * bool(args.peer))
    suffix_tasks: list[Task] = []
    if args.suffix_tasks:
        suffix_tasks = load_tasks(args.suffix_set or args.editor_set
                                  or args.sets.split(",")[0].strip(), args.suffix_tasks)[1]
        total += len(suffix_tasks) * len(models)
    ks_tasks: list[Task] = []
    if args.keystroke_tasks:
        ks_tasks = load_tasks(args.keystroke_set, args.keystroke_tasks)[1]
        total += len(ks_tasks) * 2
    bar = bench.Progress(total, "bench")
    result = bench.BenchResult()
    m = opts.model
    result.setup = {"model": [], "draft_model": [],
                    "n_ctx": m.n_ctx, "threads": m.threads, "n_gpu_layers": m.n_gpu_layers,
                    "max_tokens": opts.completion.max_tokens, "temperature": 0,
                    "configs": configs, "warmup": args.warmup, "repeats": args.repeats,
                    "verify_cost": {}, "sets": {k: len(t) for k, t in sets}}
    for name in models if sets or suffix_tasks else []:
        # Each model in turn on the same tasks; its runs are labelled by model when several.
        model_opts = (dataclasses.replace(opts, model=dataclasses.replace(m, model=name))
                      if name else opts)
        engine = make_engine(model_opts, isolation="thread")
        label = engine.cfg.model_path.name
        result.setup["model"].append(str(engine.cfg.model_path))
        result.setup["draft_model"].append(str(engine.cfg.draft_model or ""))
        result.setup["verify_cost"][label] = engine.policy.batch_cost
        named = [(f"{k} [{name}]" if len(models) > 1 else k, t) for k, t in sets]
        result.runs += bench.run_engine_bench(
            engine, named, configs, warmup=args.warmup, repeats=args.repeats,
            max_tokens=opts.completion.max_tokens, max_lines=opts.completion.max_lines,
            progress=bar.step)
        if suffix_tasks:
            if engine.template.kind == "fim":
                result.suffix[catalogue_name(engine.cfg.model_path) or label] = \
                    bench.run_suffix_bench(
                        engine, suffix_tasks, args.suffix_chars,
                        max_tokens=opts.completion.max_tokens,
                        max_lines=opts.completion.max_lines, progress=bar.step)
            else:
                log.warning("%s has no FIM tokens: the suffix is not in its prompt, so "
                            "there is no suffix to reuse", label)
        engine.close()
    result.summary = bench.summarize_runs(result.runs)
    if ks_tasks:
        serve_args = _passthrough_flags(args)
        result.keystroke = bench.run_keystroke_bench(serve_args, ks_tasks, args.keystroke_chars,
                                                     out, typed=args.keystroke_type,
                                                     progress=bar.step)
    if editor_tasks:
        result.editor = _editor_bench(args, opts, models, editor_tasks, out, bar.step)
    if cross_tasks:
        result.cross = _cross_bench(args, opts, models, cross_tasks, out, bar.step)
    print(f"model: {', '.join(result.setup['model'])}  threads: {m.threads or 'auto'}  "
          f"gpu layers: {m.n_gpu_layers}  max tokens: {opts.completion.max_tokens}")
    for label, costs in result.setup["verify_cost"].items():
        print(f"verify cost (x one step) by draft length, {label}: " + ", ".join(
            f"{k}:{v:.2f}" for k, v in sorted(costs.items())))
    if result.runs:
        print(bench.format_table(result.summary))
        print("\nquality against the real text (first line, whole, prefix kept, edit "
              "similarity, empty answers):")
        print(bench.format_quality_table(result.summary))
        gates = bench.gate_table(result.runs)
        result.setup["gate"] = gates
        print("\nconfidence gate (--min-confidence), configuration off: non-empty suggestions "
              "shown, precision (first line right) and recall (right ones still shown):")
        print(bench.format_gate_table(gates))
    us = bench.lookup_speed()
    result.setup["lookup_us_per_call_8k"] = us
    print(f"prompt lookup: {us:.0f} us per proposal over 8k tokens of history")
    if result.cross:
        print(f"\nwith the other files open ({len(cross_tasks)} tasks of {args.cross_set}: "
              f"the first request, then {args.cross_typing} typed characters, through fimls "
              "serve):")
        print(_format_cross(result.cross))
        print("(memo: typed characters answered from the memo; srv p50: the server's own "
              "time per typed character, from its log; key eval: tokens the model evaluated "
              "per typed character that reached it, p50; 2nd: share of the requests that "
              "read their prompt a second time without the chunks / share that showed the "
              "second reading's line)")
    for label, res in result.suffix.items():
        print(f"\nsuffix reuse, {res['summary']['tasks']} tasks of "
              f"{args.suffix_set or args.editor_set or args.sets.split(',')[0]}: "
              f"{args.suffix_chars} typed characters of the real text, each answered with "
              "the cached suffix moved and with it evaluated fresh:")
        print(bench.format_suffix_table(label, res["summary"]))
    if result.keystroke:
        print("\ntyping the suggestion character by character, through fimls serve:")
        for cfg, row in result.keystroke["summary"].items():
            print(f"  {cfg:<6} follow-ups {row['requests']:>4}  p50 {row['follow_p50_ms']:8.1f} ms"
                  f"  p95 {row['follow_p95_ms']:8.1f} ms  "
                  f"p50 vs off {row.get('follow_p50_vs_off', float('nan')):.2f}  "
                  f"through the model {row['through_model']:>3}  drafts accepted "
                  f"{row['accepted']}/{row['drafted']}  first p50 {row['first_p50_ms']:.0f} ms, "
                  f"non-empty {row['non_empty_first']}/{len(ks_tasks)}, follow-ups reusing "
                  f">= 90% of the prompt {row['reuse_ge_90pct']}/{row['requests']}")
            print(f"         engine worker hop (to the worker process and back, per request): "
                  f"p50 {row['hop_p50_ms']:.2f} ms  p95 {row['hop_p95_ms']:.2f} ms")
    if result.editor:
        from fimls.tools.peer import format_side_by_side

        print(f"\nas an editor asks ({len(editor_tasks)} tasks of "
              f"{args.editor_set or args.sets.split(',')[0]}: the first request, then "
              f"{args.typing} typed characters of the real text, asking after each):")
        print(format_side_by_side(result.editor["summary"]))
        for label, systems in result.editor["summary"].items():
            for row in systems.values():
                idle = row.get("idle_prefill")
                if idle:
                    print(f"idle prefill after opening, {label}: {idle['runs']} runs, "
                          f"p50 {idle['tokens_p50']:.0f} tokens in {idle['ms_p50']:.0f} ms "
                          f"({idle['tokens_per_s']:.0f} tokens/s), {idle['stopped']} stopped "
                          "by the request")
    data = {"setup": result.setup, "summary": result.summary,
            "editor": result.editor or None,
            "suffix": result.suffix or None,
            "cross": result.cross or None,
            "keystroke": result.keystroke.get("summary") if result.keystroke else None,
            "runs": [r.__dict__ for r in result.runs]}
    (out / "bench.json").write_text(json.dumps(data, indent=1, default=str))
    print(f"\nJSON: {out / 'bench.json'}")
    if bench.plot(result, out / "bench.png"):
        print(f"plot: {out / 'bench.png'}")
    return 0


def _quality_bench(args: argparse.Namespace, opts: Options) -> int:
    from fimls.models import default_model_name
    from fimls.tools import quality_bench

    names = ([x.strip() for x in (args.models or "").split(",") if x.strip()]
             or [opts.model.model or default_model_name()])
    flags = _strip_flag(_strip_flag(_passthrough_flags(args), "--model"), "--min-confidence")
    gate = opts.completion.min_confidence
    return quality_bench.main(args, flags, model_names=names,
                              max_tokens=opts.completion.max_tokens, gate=gate,
                              threads=opts.model.threads or min(8, os.cpu_count() or 1))


def _editor_bench(args: argparse.Namespace, opts: Options, models: list[str | None],
                  tasks: list[Any], out: Path, step: Callable[[str], None]) -> dict[str, Any]:
    """fimls serve (and llama-server with --peer) as an editor drives them, per model."""
    from fimls.models import catalogue_name, default_model_name, resolve_model
    from fimls.tools import peer

    summary: dict[str, dict[str, dict[str, Any]]] = {}
    rows: dict[str, dict[str, Any]] = {}
    flags = _passthrough_flags(args)
    for name in models:
        model = name or opts.model.model or default_model_name()
        path = resolve_model(model)
        label = catalogue_name(path) or path.name
        serve = [*_strip_flag(flags, "--model"), "--model", str(model)]
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
                threads=opts.model.threads or min(8, os.cpu_count() or 1),
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


def _cross_bench(args: argparse.Namespace, opts: Options, models: list[str | None],
                 tasks: list[Any], out: Path, step: Callable[[str], None]) -> dict[str, Any]:
    """Cross-file tasks through fimls serve, alone and with the task's other files open."""
    from fimls.crossfile import CHARS_PER_TOKEN as CONTEXT_CHARS_PER_TOKEN
    from fimls.latency import percentile, read_records
    from fimls.models import catalogue_name, default_model_name, resolve_model
    from fimls.tools import bench, peer

    summary: dict[str, dict[str, dict[str, Any]]] = {}
    flags = _passthrough_flags(args)
    for name in models:
        model = name or opts.model.model or default_model_name()
        label = catalogue_name(resolve_model(model)) or str(model)
        serve = [*_strip_flag(flags, "--model"), "--model", str(model)]
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
            row["by_file_calls"] = bench.split_by_file_calls(rows, tasks)
            if system != FIMLS_ALONE:
                budget = opts.completion.context_tokens * CONTEXT_CHARS_PER_TOKEN
                row["definition_in_chunks"] = sum(bench.definition_in_chunks(t, budget)
                                                  for t in tasks)
            row["rows"] = rows
            summary[label][system] = row
        if args.peer:
            # The peer on the same tasks and model file: the file alone, then with the
            # chunks llama.vim's ring buffer would hold (bench.ring_chunks).
            path = resolve_model(model)
            for system, extra in ((PEER_ALONE, None), (PEER_OPEN, bench.ring_chunks)):
                rows = peer.run_peer(Path(args.peer), path, tasks, typing=args.cross_typing,
                                     max_tokens=opts.completion.max_tokens,
                                     threads=opts.model.threads or min(8, os.cpu_count() or 1),
                                     extra_args=args.peer_args, progress=step, extra=extra)
                row = peer.summarize_editor(rows)
                row["by_file_calls"] = bench.split_by_file_calls(rows, tasks)
                row["rows"] = rows
                summary[label][system] = row
    return summary


# The cross table's systems: fimls serve, then llama-server with --peer.
FIMLS_ALONE, FIMLS_OPEN = "alone", "other files open"
PEER_ALONE, PEER_OPEN = "llama-server alone", "llama-server, ring"


def _format_cross(table: dict[str, dict[str, dict[str, Any]]]) -> str:
    """Quality and latency with the other files open against alone (each system against
    itself), and fimls against llama-server where the peer ran."""
    nan = float("nan")
    head = (f"{'model':<22} {'system':<18} {'line':>6} {'chars':>6} {'first p50':>10} "
            f"{'key p50':>9} {'key p95':>9} {'context':>8} {'memo':>5} {'srv p50':>8} "
            f"{'key eval':>8} {'2nd':>9}")
    lines = [head, "-" * len(head)]

    def ratios(label: str, s: dict[str, Any], a: dict[str, Any]) -> str:
        def ratio(key: str) -> str:
            return f"{s[key] / a[key]:.2f}x" if a[key] else "-"
        return (f"{'':<22} {label:<18} {ratio('line_exact'):>6} "
                f"{ratio('char_prefix_ratio'):>6} {ratio('first_p50_ms'):>10} "
                f"{ratio('typing_p50_ms'):>9} {ratio('typing_p95_ms'):>9}")

    for model, systems in table.items():
        for system, s in systems.items():
            lines.append(f"{model:<22} {system:<18} {s['line_exact']:>6.3f} "
                         f"{s['char_prefix_ratio']:>6.3f} {s['first_p50_ms']:>8.0f}ms "
                         f"{s['typing_p50_ms']:>7.1f}ms {s['typing_p95_ms']:>7.0f}ms "
                         f"{s.get('context_tokens_p50', nan):>8.0f} "
                         f"{s.get('key_memo_share', nan):>5.2f} "
                         f"{s.get('key_server_p50_ms', nan):>6.1f}ms "
                         f"{s.get('key_evaluated_p50', nan):>8.0f} "
                         f"{s.get('second_share', nan):>4.2f}/"
                         f"{s.get('second_taken_share', nan):.2f}")
            base = {FIMLS_OPEN: FIMLS_ALONE, PEER_OPEN: PEER_ALONE}.get(system)
            if base in systems:
                lines.append(ratios("  vs alone", s, systems[base]))
        for label, mine, theirs in (("alone", FIMLS_ALONE, PEER_ALONE),
                                    ("open", FIMLS_OPEN, PEER_OPEN)):
            if mine in systems and theirs in systems:
                lines.append(ratios(f"  {label} vs peer", systems[mine], systems[theirs]))
        lines += _format_split(systems, FIMLS_ALONE, FIMLS_OPEN, check_chunks=True)
        if PEER_OPEN in systems:
            lines.append(f"{'':<22} llama-server:")
            lines += _format_split(systems, PEER_ALONE, PEER_OPEN)
    return "\n".join(lines)


def _format_split(systems: dict[str, dict[str, Any]], alone_key: str, open_key: str,
                  check_chunks: bool = False) -> list[str]:
    """Right first lines where the task's file calls the name elsewhere too (a call the
    model may copy, where its window reaches it) and where only the other file shows it
    (see :func:`fimls.tools.bench.file_calls_elsewhere`)."""
    alone, opened = systems.get(alone_key), systems.get(open_key)
    if (alone is None or opened is None or "by_file_calls" not in alone
            or "by_file_calls" not in opened):
        return []
    out = []
    for part, what in (("file", "the file calls it elsewhere"),
                       ("other", "only the other file shows it")):
        a, o = alone["by_file_calls"][part], opened["by_file_calls"][part]
        ratio = f"{o['right'] / a['right']:.2f}x" if a["right"] else "-"
        out.append(f"{'':<22} {what}: {a['n']} tasks, right alone {a['right']}, "
                   f"open {o['right']} ({ratio})")
    if check_chunks and "definition_in_chunks" in opened:
        out.append(f"{'':<22} the called name's definition among the chunks: "
                   f"{opened['definition_in_chunks']} of {opened['n']} tasks")
    return out


def _strip_flag(flags: list[str], flag: str) -> list[str]:
    """``flags`` without ``flag`` and its value."""
    out: list[str] = []
    skip = False
    for f in flags:
        if skip:
            skip = False
        elif f == flag:
            skip = True
        else:
            out.append(f)
    return out


def cmd_soak(args: argparse.Namespace) -> int:
    """Soak one server; exit status 0 only if RSS grew < 5 % and nothing failed."""
    from fimls.tools import soak
    from fimls.tools.harness import load_tasks

    opts = _options_from_args(args)
    _setup_logging(opts.logging.log_level)
    tasks = load_tasks("humaneval-multi", 40)[1]
    texts = [t.prefix + t.suffix for t in tasks]
    out = Path(args.out)
    print(f"fimls soak: {args.requests} requests (warm-up {args.warmup}), seed {args.seed}",
          file=sys.stderr)
    res = soak.run_soak(_passthrough_flags(args), texts, n_requests=args.requests,
                        warmup=args.warmup, seed=args.seed, out_dir=out)
    text, ok = soak.report(res)
    print(text)
    (out / "soak.json").write_text(json.dumps({
        "requests": res.requests, "seconds": res.seconds, "rss_kib": res.rss,
        "rss_series_kib": res.rss_series,
        "errors": res.errors, "outcomes": res.outcomes,
        "latency_ms": {"p50": soak.percentile(res.latencies_ms, 50),
                       "p95": soak.percentile(res.latencies_ms, 95)},
        "waited_ms": {"p50": soak.percentile(res.waited_ms, 50),
                      "p95": soak.percentile(res.waited_ms, 95)}}, indent=1))
    return 0 if ok else 1


def cmd_tasks(args: argparse.Namespace) -> int:
    """Fill-in-the-middle tasks (JSONL) from a repository's history or from source files."""
    from fimls.tools import tasks

    _setup_logging("WARNING")
    exts = frozenset(tasks.LANGUAGES)
    if args.ext:
        exts = frozenset("." + e.strip().lstrip(".").lower() for e in args.ext.split(",")
                         if e.strip())
    limits = tasks.Limits(max_bytes=args.max_bytes, max_lines=args.max_lines,
                          extensions=exts)
    try:
        if args.source == "from-git":
            made, skipped = tasks.from_git(args.repo, n=args.n, seed=args.seed, rev=args.rev,
                                           since=args.since, max_commits=args.max_commits,
                                           limits=limits)
        elif args.source == "cross-file":
            made, skipped = tasks.cross_file(args.repo, n=args.n, seed=args.seed,
                                             rev=args.rev, limits=limits)
        else:
            made, skipped = tasks.from_files(args.paths, n=args.n, seed=args.seed,
                                             limits=limits)
    except tasks.TaskError as exc:
        print(f"fimls tasks: {exc}", file=sys.stderr)
        return 2
    if args.out == "-":
        tasks.write_jsonl(made, sys.stdout)
    else:
        with open(args.out, "w", encoding="utf-8") as fh:
            tasks.write_jsonl(made, fh)
    why = ", ".join(f"{k}: {v}" for k, v in sorted(skipped.items()))
    print(f"fimls tasks: {len(made)} tasks -> {args.out}" + (f" (skipped {why})" if why else ""),
          file=sys.stderr)
    return 0 if made else 1


def _passthrough_flags(args: argparse.Namespace) -> list[str]:
    """The model/context flags given to bench, for the servers it starts."""
    keep = {"model", "nCtx", "nBatch", "threads", "nGpuLayers", "maxTokens", "maxLines",
            "draftModel", "draftMax", "ngramMax", "isolation", "loadTimeoutS", "cancelGraceMs",
            "workerNice",
            "promptTokens", "maxTimeMs", "idlePrefill", "reuseSuffix", "contextTokens",
            "secondReading",
            "minConfidence", "engine", "engineProtocol", "engineKey", "engineSlot"}
    out: list[str] = []
    for key, flag, _default, _doc in describe():
        value = getattr(args, f"opt_{key}", None)
        if key in keep and value is not None:
            out += [flag, str(value)]
    if "--min-confidence" not in out:
        # Benchmarks score every suggestion the model makes; what the gate would hide is
        # measured apart (the gate table), so the servers they start show everything.
        out += ["--min-confidence", "0"]
    return out


def build_parser() -> argparse.ArgumentParser:
    """The argument parser for all subcommands."""
    from fimls.tools import quality_args

    p = argparse.ArgumentParser(prog="fimls", description="Local fill-in-the-middle code "
                                "completion over the Language Server Protocol.")
    p.add_argument("--version", action="version", version=f"fimls {__version__}")
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("serve", help="run the language server over stdio")
    _add_option_flags(s)
    s.add_argument("--stdio", action="store_true", help="accepted for LSP clients; stdio is "
                   "the only transport")
    s.set_defaults(func=cmd_serve)
    c = sub.add_parser("complete", help="one completion at FILE:LINE[:COL] (1-based); "
                       "without a target, on a bundled example")
    c.add_argument("target", nargs="?", help="FILE:LINE[:COL]")
    _add_option_flags(c)
    c.set_defaults(func=cmd_complete)
    b = sub.add_parser("bench", help="measure speculative decoding against plain decoding")
    b.add_argument("--sets", default="humaneval-single,humaneval-multi",
                   help="comma-separated task sets: humaneval-single, humaneval-multi, or "
                   "JSONL files with prefix/suffix/target (e.g. from fimls tasks from-git)")
    b.add_argument("--n", type=int, default=12, help="tasks per set (default 12)")
    b.add_argument("--models", default="",
                   help="comma-separated models (catalogue names or GGUF paths) to compare on "
                   "the same tasks, e.g. qwen2.5-coder-0.5b,gemma-3-270m (default: --model)")
    b.add_argument("--warmup", type=int, default=3, help="warm-up requests per configuration")
    b.add_argument("--repeats", type=int, default=1, help="measured passes over each set")
    b.add_argument("--configs", default="off,auto,lookup",
                   help="speculative modes to compare with off (model is added with "
                   "--draft-model)")
    b.add_argument("--keystroke-tasks", type=int, default=6,
                   help="tasks for the typing-the-suggestion scenario through fimls serve "
                   "(0: skip)")
    b.add_argument("--keystroke-set", default="humaneval-multi",
                   help="task set of the typing scenario")
    b.add_argument("--keystroke-type", choices=("shown", "target"), default="shown",
                   help="type the suggestion that was shown, or the task's expected text")
    b.add_argument("--keystroke-chars", type=int, default=12,
                   help="characters typed per task in that scenario")
    b.add_argument("--peer", metavar="LLAMA_SERVER",
                   help="also drive llama.cpp's llama-server (this binary) on the same model "
                   "and tasks, as llama.vim does, and report fimls's ratios to it")
    b.add_argument("--peer-args", default="--cache-reuse 256 -b 1024 -ub 1024",
                   help="extra llama-server arguments (default: %(default)s)")
    b.add_argument("--editor-set", default="",
                   help="task set of the editor scenario (default: the first of --sets)")
    b.add_argument("--editor-tasks", type=int, default=None,
                   help="tasks for the editor scenario: fimls serve (and the peer) asked "
                   "at the cursor, then after each typed character (default: 20 with "
                   "--peer, else 0)")
    b.add_argument("--typing", type=int, default=3,
                   help="characters of the real text typed per task in the editor scenario")
    b.add_argument("--editors", type=int, default=1,
                   help="in the editor scenario, this many fimls serve processes typing at "
                   "once, each on its share of the tasks (with --engine: a team sharing "
                   "one server)")
    b.add_argument("--open-wait", type=float, default=0.0,
                   help="also run fimls with this many seconds between opening a document "
                   "and the first request (a user reading: idle prefill)")
    b.add_argument("--cross-set", default="",
                   help="cross-file tasks (fimls tasks cross-file): quality and latency "
                        "through fimls serve alone and with each task's other files open")
    b.add_argument("--cross-tasks", type=int, default=40,
                   help="tasks of --cross-set (default 40: with fewer, one task more or less "
                        "right moves the ratio by a tenth)")
    b.add_argument("--cross-typing", type=int, default=10,
                   help="characters typed per task of --cross-set (default 10): a typed "
                        "character's answer takes about 2 ms, spread 1 to 7 ms by the "
                        "machine, so its p50 needs hundreds of them to be stable")
    b.add_argument("--suffix-tasks", type=int, default=0,
                   help="the quality cost of suffix reuse (FIM models): on N tasks, type "
                        "--suffix-chars characters of the real text and compare each answer "
                        "with the suffix's cache moved against one evaluated fresh")
    b.add_argument("--suffix-set", default="",
                   help="task set for --suffix-tasks (default: --editor-set, else the first "
                        "of --sets)")
    b.add_argument("--suffix-chars", type=int, default=3,
                   help="typed characters per task for --suffix-tasks (default 3)")
    quality_args.add_arguments(b)
    b.add_argument("--out", default="bench-out", help="folder for bench.json and bench.png")
    _add_option_flags(b)
    b.set_defaults(func=cmd_bench)
    so = sub.add_parser("soak", help="many requests with random edits against one fimls "
                        "serve: RSS at start and end, errors, latency")
    so.add_argument("--requests", type=int, default=10000, help="inline requests to send")
    so.add_argument("--warmup", type=int, default=200,
                    help="requests before the start RSS is taken")
    so.add_argument("--seed", type=int, default=1, help="random seed of the workload")
    so.add_argument("--out", default="bench-out", help="folder for soak.json and the log")
    _add_option_flags(so)
    so.set_defaults(func=cmd_soak)
    ta = sub.add_parser("tasks", help="make fill-in-the-middle task sets (JSONL) for fimls "
                        "bench from real code")
    ta_sub = ta.add_subparsers(dest="source", required=True)
    tg = ta_sub.add_parser("from-git", help="hunks added in a repository's commits: the file "
                           "after the commit, the added lines hidden")
    tg.add_argument("repo", help="a git repository (work tree or bare)")
    tg.add_argument("--rev", default="HEAD", help="history reachable from this revision")
    tg.add_argument("--since", help="only commits after this date (as git log --since)")
    tg.add_argument("--max-commits", type=int, help="only the newest N commits")
    tf = ta_sub.add_parser("from-files", help="lines and blocks cut out of source files")
    tf.add_argument("paths", nargs="+", metavar="PATH", help="files or folders")
    tx = ta_sub.add_parser("cross-file", help="calls of a function or class defined in "
                           "exactly one other file; the task lists that file and two "
                           "unrelated ones to open (for quality with other buffers open)")
    tx.add_argument("repo", help="a git repository (work tree or bare)")
    tx.add_argument("--rev", default="HEAD", help="the files at this revision")
    for t in (tg, tf, tx):
        t.add_argument("--out", default="-", help="JSONL file to write (default: stdout)")
        t.add_argument("--n", type=int, default=300, help="most tasks to make (default 300)")
        t.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
        t.add_argument("--ext", help="comma-separated file extensions (default: every "
                       "language fimls knows)")
        t.add_argument("--max-bytes", type=int, default=100_000,
                       help="skip larger files (default 100000)")
        t.add_argument("--max-lines", type=int, default=6,
                       help="most lines a target spans (default 6)")
        t.set_defaults(func=cmd_tasks)
    mo = sub.add_parser("models", help="list the named models: installed or not, size, "
                        "path, vocabulary, FIM template, draft pairing")
    mo.add_argument("--json", action="store_true", help="machine-readable output")
    mo.set_defaults(func=cmd_models)
    st = sub.add_parser("stats", help="summarise a latency log")
    st.add_argument("log", nargs="?", help="latency log (default: the user state dir's)")
    st.add_argument("--json", action="store_true", help="machine-readable output")
    st.add_argument("--plot", metavar="PNG", help="write latency distributions and acceptance "
                    "over time to this PNG (needs matplotlib)")
    st.set_defaults(func=cmd_stats)
    return p


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``fimls`` console script."""
    args = build_parser().parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
