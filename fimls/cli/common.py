"""What every subcommand shares: the option flags (every option of the options tree is a
flag, ``--max-tokens``, and a camelCase key of the editor's settings, ``maxTokens``; one
converter reads both), logging, and the flags a bench passes to the servers it starts."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import Any

from fimls.config import Options, apply_dict, describe, passes_through, shown_default


def add_option_flags(p: argparse.ArgumentParser) -> None:
    """A flag for every option."""
    for key, flag, default, doc in describe():
        p.add_argument(flag, dest=f"opt_{key}", default=None, metavar="VALUE",
                       help=f"{doc} (default: {shown_default(default)}; "
                       f"initializationOptions key: {key})")


def options_from_args(args: argparse.Namespace) -> Options:
    """The options the flags give (a bad value is reported and the default kept)."""
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


def setup_logging(level: str) -> None:
    """fimls's log at ``level`` on stderr (stdout may be the protocol)."""
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("fimls").setLevel(level)
    # pygls logs a full traceback for every message it cannot deserialize (which may quote
    # the message); the server answers those itself and logs one line instead.
    logging.getLogger("pygls.protocol.json_rpc").addFilter(
        lambda rec: not str(rec.msg).startswith("Unable to deserialize message"))


def strip_flag(flags: list[str], flag: str) -> list[str]:
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


def passthrough_flags(args: argparse.Namespace) -> list[str]:
    """The option flags given to a bench, for the servers it starts: every option the user
    gave whose declaration lets it through (see :func:`fimls.config.passes_through`)."""
    out: list[str] = []
    for key, flag, _default, _doc in describe():
        value = getattr(args, f"opt_{key}", None)
        if value is not None and passes_through(key):
            out += [flag, str(value)]
    if "--min-confidence" not in out:
        # Benchmarks score every suggestion the model makes; what the gate would hide is
        # measured apart (the gate table), so the servers they start show everything.
        out += ["--min-confidence", "0"]
    return out


def default_threads(opts: Options) -> int:
    """The threads llama.cpp gets: the option, else the cores (at most 8)."""
    return opts.model.threads or min(8, os.cpu_count() or 1)
