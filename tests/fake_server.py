"""``fimls serve`` over stdio with the fake engine: ``python -m tests.fake_server ARGS``.

The server is the real one (``fimls.server.serve``); only the engine factory is fake, so
protocol tests run in seconds without a model. Run from the repository root.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time

from fimls.config import Options, apply_dict
from fimls.engine.api import EngineLike, ModelLoadError
from fimls.engine.device import Placement
from fimls.server import serve
from tests.fake_engine import FakeEngine


def parse_args(argv: list[str]) -> argparse.Namespace:
    """The fake engine's knobs, and the server's options as initializationOptions JSON."""
    p = argparse.ArgumentParser(prog="python -m tests.fake_server")
    p.add_argument("--text", default="return a + b", help="what every request answers")
    p.add_argument("--delay", type=float, default=0.0, help="seconds per request")
    # A load that takes a moment, as a real one does: the client then sees its progress
    # (a load finished before `initialized` shows none).
    p.add_argument("--load-delay", type=float, default=0.3, help="seconds per model load")
    p.add_argument("--load-error", default=None, help="every load fails with this message")
    p.add_argument("--warning", action="append", default=[], help="a load-time warning")
    p.add_argument("--crash-engines", type=int, default=0,
                   help="the first N engines crash (on_exit) on their first request")
    p.add_argument("--gpu", default=None, help="the engine runs on this GPU (all 29 layers)")
    p.add_argument("--reject-line", type=int, action="append", default=[],
                   help="scoring prefers the original line at this line (0-based)")
    p.add_argument("--options", default=None, help="server options, camelCase JSON")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Serve LSP on stdio until the client exits; the server's exit code."""
    args = parse_args(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    options, warnings = apply_dict(Options(), json.loads(args.options or "{}"))
    for w in warnings:
        print(f"fake_server: {w}", file=sys.stderr)
    made = 0

    def factory(opts: Options) -> EngineLike:
        nonlocal made
        made += 1
        time.sleep(args.load_delay)
        if args.load_error is not None:
            raise ModelLoadError(args.load_error)
        return FakeEngine(text=args.text, delay=args.delay, warnings=list(args.warning),
                          crash_on_complete=made <= args.crash_engines,
                          reject_lines=set(args.reject_line),
                          placement=Placement("CUDA", args.gpu, 29, 29) if args.gpu
                          else Placement())

    return serve(options, factory)


if __name__ == "__main__":
    sys.exit(main())
