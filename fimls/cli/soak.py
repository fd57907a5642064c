"""``fimls soak``: many requests with random edits against one ``fimls serve``."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from fimls.cli.common import add_option_flags, options_from_args, passthrough_flags, setup_logging


def register(sub: Any) -> None:
    """The subcommand's parser."""
    so = sub.add_parser("soak", help="many requests with random edits against one fimls "
                        "serve: RSS at start and end, errors, latency")
    so.add_argument("--requests", type=int, default=10000, help="inline requests to send")
    so.add_argument("--warmup", type=int, default=200,
                    help="requests before the start RSS is taken")
    so.add_argument("--seed", type=int, default=1, help="random seed of the workload")
    so.add_argument("--out", default="bench-out", help="folder for soak.json and the log")
    add_option_flags(so)
    so.set_defaults(func=cmd_soak)


def cmd_soak(args: argparse.Namespace) -> int:
    """Soak one server; exit status 0 only if RSS grew < 5 % and nothing failed."""
    from fimls.tools import soak
    from fimls.tools.harness import load_tasks

    opts = options_from_args(args)
    setup_logging(opts.logging.log_level)
    tasks = load_tasks("humaneval-multi", 40)[1]
    texts = [t.prefix + t.suffix for t in tasks]
    out = Path(args.out)
    print(f"fimls soak: {args.requests} requests (warm-up {args.warmup}), seed {args.seed}",
          file=sys.stderr)
    res = soak.run_soak(passthrough_flags(args), texts, n_requests=args.requests,
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
