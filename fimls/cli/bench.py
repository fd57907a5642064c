"""``fimls bench``: speculative decoding against plain decoding on the same prompts, and
the scenarios that drive ``fimls serve`` as an editor does; a table, JSON and a PNG."""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fimls.cli.bench_runs import cross_bench, editor_bench, run_quality
from fimls.cli.common import add_option_flags, options_from_args, passthrough_flags, setup_logging
from fimls.config import Options
from fimls.engine import make_engine

log = logging.getLogger(__name__)


def _scenario_arguments(b: argparse.ArgumentParser) -> None:
    """The flags of the scenarios through fimls serve: typing, the editor, llama-server
    beside it, the cross-file tasks, suffix reuse."""
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


def register(sub: Any) -> None:
    """The subcommand's parser."""
    from fimls.tools import quality_args

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
    _scenario_arguments(b)
    quality_args.add_arguments(b)
    b.add_argument("--out", default="bench-out", help="folder for bench.json and bench.png")
    add_option_flags(b)
    b.set_defaults(func=cmd_bench)


@dataclass
class BenchPlan:
    """What one ``fimls bench`` run measures, read from its flags."""

    sets: list[tuple[str, list[Any]]]
    configs: list[str]
    models: list[str | None]
    editor: list[Any] = field(default_factory=list)
    cross: list[Any] = field(default_factory=list)
    suffix: list[Any] = field(default_factory=list)
    keystroke: list[Any] = field(default_factory=list)
    total: int = 0  # progress steps

    def first_set(self, args: argparse.Namespace) -> str:
        """The task set the editor and suffix scenarios default to."""
        return str(args.sets.split(",")[0].strip())


def _configs(args: argparse.Namespace, opts: Options) -> list[str]:
    """The speculative modes to run, ``off`` first (the baseline)."""
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
    return configs


def _plan(args: argparse.Namespace, opts: Options) -> BenchPlan:
    """The tasks of every scenario the flags ask for, and the progress steps they take."""
    from fimls.tools.harness import load_tasks

    plan = BenchPlan(sets=[load_tasks(s.strip(), args.n) for s in args.sets.split(",")
                           if s.strip()],
                     configs=_configs(args, opts),
                     models=[x.strip() for x in (args.models or "").split(",") if x.strip()]
                     or [None])
    n_models = len(plan.models)
    plan.total = (sum(len(t) * args.repeats + args.warmup for _, t in plan.sets)
                  * len(plan.configs) * n_models)
    editor_n = (args.editor_tasks if args.editor_tasks is not None
                else (20 if args.peer and not args.cross_set else 0))
    if editor_n:
        plan.editor = load_tasks(args.editor_set or plan.first_set(args), editor_n)[1]
        plan.total += (len(plan.editor) * n_models
                       * (1 + bool(args.peer) + 2 * bool(args.open_wait)))
    if args.cross_set:
        plan.cross = load_tasks(args.cross_set, args.cross_tasks)[1]
        plan.total += len(plan.cross) * n_models * (2 + 2 * bool(args.peer))
    if args.suffix_tasks:
        plan.suffix = load_tasks(args.suffix_set or args.editor_set or plan.first_set(args),
                                 args.suffix_tasks)[1]
        plan.total += len(plan.suffix) * n_models
    if args.keystroke_tasks:
        plan.keystroke = load_tasks(args.keystroke_set, args.keystroke_tasks)[1]
        plan.total += len(plan.keystroke) * 2
    return plan


def _run_engines(args: argparse.Namespace, opts: Options, plan: BenchPlan, result: Any,
                 step: Callable[[str], None]) -> None:
    """Each model in turn, in this process, on the same tasks (its runs labelled by model
    when several): speculation on and off, and the suffix-reuse scenario."""
    from fimls.models import catalogue_name
    from fimls.tools import bench

    m = opts.model
    for name in plan.models if plan.sets or plan.suffix else []:
        model_opts = (dataclasses.replace(opts, model=dataclasses.replace(m, model=name))
                      if name else opts)
        engine = make_engine(model_opts, isolation="thread")
        label = engine.cfg.model_path.name
        result.setup["model"].append(str(engine.cfg.model_path))
        result.setup["draft_model"].append(str(engine.cfg.draft_model or ""))
        result.setup["verify_cost"][label] = engine.policy.batch_cost
        named = [(f"{k} [{name}]" if len(plan.models) > 1 else k, t) for k, t in plan.sets]
        result.runs += bench.run_engine_bench(
            engine, named, plan.configs, warmup=args.warmup, repeats=args.repeats,
            max_tokens=opts.completion.max_tokens, max_lines=opts.completion.max_lines,
            progress=step)
        if plan.suffix and engine.template.kind == "fim":
            result.suffix[catalogue_name(engine.cfg.model_path) or label] = \
                bench.run_suffix_bench(engine, plan.suffix, args.suffix_chars,
                                       max_tokens=opts.completion.max_tokens,
                                       max_lines=opts.completion.max_lines, progress=step)
        elif plan.suffix:
            log.warning("%s has no FIM tokens: the suffix is not in its prompt, so "
                        "there is no suffix to reuse", label)
        engine.close()


def _run_servers(args: argparse.Namespace, opts: Options, plan: BenchPlan, result: Any,
                 out: Path, step: Callable[[str], None]) -> None:
    """The scenarios through ``fimls serve``: typing the suggestion, the editor, the
    cross-file tasks."""
    from fimls.tools import bench

    if plan.keystroke:
        result.keystroke = bench.run_keystroke_bench(
            passthrough_flags(args), plan.keystroke, args.keystroke_chars, out,
            typed=args.keystroke_type, progress=step)
    if plan.editor:
        result.editor = editor_bench(args, opts, plan.models, plan.editor, out, step)
    if plan.cross:
        result.cross = cross_bench(args, opts, plan.models, plan.cross, out, step)


def _report(args: argparse.Namespace, plan: BenchPlan, result: Any, out: Path) -> None:
    """Every table, then bench.json and bench.png in ``out``."""
    from fimls.tools import bench, bench_report

    bench_report.print_setup(result)
    bench_report.print_engine_runs(result)
    us = bench.lookup_speed()
    result.setup["lookup_us_per_call_8k"] = us
    print(f"prompt lookup: {us:.0f} us per proposal over 8k tokens of history")
    bench_report.print_cross(result, len(plan.cross), args.cross_set, args.cross_typing)
    bench_report.print_suffix(result, args.suffix_set or args.editor_set
                              or plan.first_set(args), args.suffix_chars)
    bench_report.print_keystroke(result, len(plan.keystroke))
    bench_report.print_editor(result, len(plan.editor), args.editor_set
                              or plan.first_set(args), args.typing)
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


def _run_next_edits(args: argparse.Namespace, opts: Options) -> int:
    from fimls.models import default_model_name
    from fimls.tools.nextedit_bench import run_bench

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model = Path(opts.model.model or default_model_name()).stem
    path = out / f"nextedits-{model}-{args.split}.jsonl"
    repos = [r for r in args.repos.split(",") if r]
    tally = run_bench(args.next_edits, args.split, Path(args.mirrors), args.quality_tasks,
                      opts, path, repos)
    print(tally.report(opts.completion.next_edit_margin))
    print(f"candidates: {path}")
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    """Speculation on/off on the same prompts, and the scenarios the flags ask for."""
    from fimls.tools import bench

    opts = options_from_args(args)
    setup_logging(opts.logging.log_level)
    if args.quality:
        return run_quality(args, opts)
    if args.next_edits:
        return _run_next_edits(args, opts)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    plan = _plan(args, opts)
    bar = bench.Progress(plan.total, "bench")
    result = bench.BenchResult()
    m = opts.model
    result.setup = {"model": [], "draft_model": [],
                    "n_ctx": m.n_ctx, "threads": m.threads, "n_gpu_layers": m.n_gpu_layers,
                    "max_tokens": opts.completion.max_tokens, "temperature": 0,
                    "configs": plan.configs, "warmup": args.warmup, "repeats": args.repeats,
                    "verify_cost": {}, "sets": {k: len(t) for k, t in plan.sets}}
    _run_engines(args, opts, plan, result, bar.step)
    result.summary = bench.summarize_runs(result.runs)
    _run_servers(args, opts, plan, result, out, bar.step)
    _report(args, plan, result, out)
    return 0
