"""``fimls models``: the model catalogue."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from typing import Any


def register(sub: Any) -> None:
    """The subcommand's parser."""
    mo = sub.add_parser("models", help="list the named models: installed or not, size, "
                        "path, vocabulary, FIM template, draft pairing")
    mo.add_argument("--json", action="store_true", help="machine-readable output")
    mo.set_defaults(func=cmd_models)


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
