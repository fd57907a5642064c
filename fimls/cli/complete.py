"""``fimls complete``: one completion at FILE:LINE[:COL], through the same engine and
prompt builder as the server."""

from __future__ import annotations

import argparse
import sys
from importlib import resources
from pathlib import Path
from typing import Any

from fimls.cli.common import add_option_flags, options_from_args, setup_logging
from fimls.engine import make_engine


def register(sub: Any) -> None:
    """The subcommand's parser."""
    c = sub.add_parser("complete", help="one completion at FILE:LINE[:COL] (1-based); "
                       "without a target, on a bundled example")
    c.add_argument("target", nargs="?", help="FILE:LINE[:COL]")
    add_option_flags(c)
    c.set_defaults(func=cmd_complete)


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
    opts = options_from_args(args)
    setup_logging(opts.logging.log_level)
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
    req = CompletionRequest.from_options(c, uri=doc.uri, version=0, prefix=prefix,
                                         suffix=suffix, rel_path=path.name,
                                         max_time_ms=max_time_ms, min_confidence=gate)
    result = engine.complete(req, lambda: False)
    engine.close()
    where = f"{path}:{pos.line + 1}:{pos.character + 1}"
    named = "" if opts.model.model else ", the default"
    print(f"--- completion at {where} ({engine.model_name}{named}, on "
          f"{engine.placement.describe()})")
    print(result.text)
    print("--- latency record")
    print(result.record.to_json())
    return 0
