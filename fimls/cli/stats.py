"""``fimls stats``: a latency log summarised."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any


def register(sub: Any) -> None:
    """The subcommand's parser."""
    st = sub.add_parser("stats", help="summarise a latency log")
    st.add_argument("log", nargs="?", help="latency log (default: the user state dir's)")
    st.add_argument("--json", action="store_true", help="machine-readable output")
    st.add_argument("--plot", metavar="PNG", help="write latency distributions and acceptance "
                    "over time to this PNG (needs matplotlib)")
    st.set_defaults(func=cmd_stats)


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
