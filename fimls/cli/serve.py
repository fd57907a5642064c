"""``fimls serve``: the language server over stdio."""

from __future__ import annotations

import argparse
from typing import Any

from fimls.cli.common import add_option_flags, options_from_args, setup_logging
from fimls.engine import make_engine


def register(sub: Any) -> None:
    """The subcommand's parser."""
    s = sub.add_parser("serve", help="run the language server over stdio")
    add_option_flags(s)
    s.add_argument("--stdio", action="store_true", help="accepted for LSP clients; stdio is "
                   "the only transport")
    s.set_defaults(func=cmd_serve)


def cmd_serve(args: argparse.Namespace) -> int:
    """LSP over stdio."""
    opts = options_from_args(args)
    setup_logging(opts.logging.log_level)
    from fimls.server import serve

    return serve(opts, make_engine)
