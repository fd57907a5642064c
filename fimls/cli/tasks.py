"""``fimls tasks``: fill-in-the-middle task sets (JSONL) for ``fimls bench`` from real
code."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from fimls.cli.common import setup_logging


def register(sub: Any) -> None:
    """The subcommand's parser, with one sub-parser per source of tasks."""
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


def cmd_tasks(args: argparse.Namespace) -> int:
    """Fill-in-the-middle tasks (JSONL) from a repository's history or from source files."""
    from fimls.tools import tasks

    setup_logging("WARNING")
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
