"""``fimls bench``'s flags for the quality mode (:mod:`fimls.tools.quality_bench`), apart
from it so that building the command line imports nothing heavy."""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``fimls bench``'s flags for the quality mode."""
    parser.add_argument("--quality", metavar="SETS_TOML", default="",
                        help="right first lines on real edits from the repositories of SETS_TOML "
                             "(docs/measurements/quality-sets.toml), beside llama-server with "
                             "--peer; only this runs")
    parser.add_argument("--next-edits", metavar="SETS_TOML", default="",
                        help="next-edit suggestions on repeated edits from the repositories of "
                             "SETS_TOML (docs/measurements/nextedit-sets.toml): precision, "
                             "recall and the time to the first proposal; only this runs")
    parser.add_argument("--split", choices=("tuning", "report"), default="tuning",
                        help="which repositories of --quality (default tuning)")
    parser.add_argument("--mirrors", default="/work/.mirror",
                        help="folder of the git mirrors of --quality, one owner+name each")
    parser.add_argument("--quality-tasks", type=int, default=0,
                        help="tasks per repository for --quality (default: the file's)")
    parser.add_argument("--peer-only", action="store_true",
                        help="with --quality: run llama-server (--peer) alone, not fimls")
    parser.add_argument("--repos", default="",
                        help="with --quality: only these repositories of the split "
                             "(owner/name, comma-separated)")
    parser.add_argument("--checkouts", metavar="DIR", default="",
                        help="with --quality: fimls's workspace is each task's repository as "
                             "before its commit, extracted under DIR (workspace files the "
                             "document imports are read, as in an editor); without it the "
                             "workspace folder holds no files")
    parser.add_argument("--peer-from", metavar="OUTCOMES_JSONL", action="append", default=[],
                        help="with --quality: llama-server's lines from an earlier run's "
                             "quality-MODEL-SPLIT.jsonl (repeatable); with --peer, the tasks "
                             "they lack are run, otherwise every task must be there")
    parser.add_argument("--fimls-from", metavar="OUTCOMES_JSONL", action="append", default=[],
                        help="with --quality: fimls's lines from an earlier run's "
                             "quality-MODEL-SPLIT.jsonl (repeatable); the tasks they lack are "
                             "run, unless --peer-only")
    parser.add_argument("--latency-tasks", type=int, default=0,
                        help="with --quality and --peer: on N tasks spread over the repositories, "
                             "the first request after a --cursor-rest pause and --typing typed "
                             "characters, fimls beside llama-server")
    parser.add_argument("--cursor-rest", type=float, default=10.0,
                        help="seconds the cursor rests before the first request of "
                             "--latency-tasks (default 10; fimls/cursor is sent first)")
