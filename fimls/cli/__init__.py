"""Command line: one module per subcommand (``serve``, ``complete``, ``doctor``,
``bench``, ``soak``, ``tasks``, ``models``, ``stats``), each with its parser
(``register``) and its command.

Every option of the options tree is a flag of the subcommands that run a model
(``--max-tokens``) and a camelCase key in the editor's ``initializationOptions``
(``maxTokens``): one converter reads both (:mod:`fimls.cli.common`).
"""

from __future__ import annotations

import argparse
import sys

from fimls import __version__
from fimls.cli import bench, complete, doctor, models, serve, soak, stats, tasks


def build_parser() -> argparse.ArgumentParser:
    """The argument parser for all subcommands."""
    p = argparse.ArgumentParser(prog="fimls", description="Local fill-in-the-middle code "
                                "completion over the Language Server Protocol.")
    p.add_argument("--version", action="version", version=f"fimls {__version__}")
    sub = p.add_subparsers(dest="cmd", required=True)
    for command in (serve, complete, doctor, bench, soak, tasks, models, stats):
        command.register(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``fimls`` console script."""
    args = build_parser().parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
