"""Did a refactor move behaviour? The same fixed tasks through the engine before and after,
and how many suggestions are identical.

Three steps, the middle one run once on each side (an older checkout runs this file with
``PYTHONPATH`` pointing at it: only APIs every version has are used)::

    python fimls/tools/identity.py tasks --out /tmp/id/tasks.jsonl
    PYTHONPATH=/old/checkout python fimls/tools/identity.py run /tmp/id/tasks.jsonl \\
        --out /tmp/id/before.jsonl
    python fimls/tools/identity.py run /tmp/id/tasks.jsonl --out /tmp/id/after.jsonl
    python fimls/tools/identity.py compare /tmp/id/before.jsonl /tmp/id/after.jsonl

The tasks: HumanEval single-line and multi-line infilling, and real edits from this
repository's own history at a pinned revision, with the chunks of the workspace files each
edited file imports (so the second reading runs). Each runs with speculative decoding off
and auto, a fixed window (``--prompt-tokens``), no time limit and no gate.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
PINNED = "75df0c2"  # the real edits' revision of this repository


def _real_edits(n: int) -> list[dict[str, Any]]:
    """``n`` edits from this repository's history, each with its context chunks."""
    from fimls.crossfile import ContextStore
    from fimls.crossfile.workspace import Workspace
    from fimls.tools.quality_sets import extract_tree
    from fimls.tools.tasks import Limits, from_git

    rows, _ = from_git(ROOT, n=n, seed=1, rev=PINNED,
                       limits=Limits(extensions=frozenset({".py"})))
    tree = Path(tempfile.mkdtemp(prefix="fimls-identity-")) / "repo"
    tree.mkdir(parents=True)
    if not extract_tree(ROOT, PINNED, tree):
        raise SystemExit(f"identity.py: this checkout lacks {PINNED} (a shallow clone?)")
    out = []
    for r in rows:
        doc = tree / r["path"]
        disk = [(f.path.as_uri(), f.rel, f.text)
                for f in Workspace([tree]).imported_files(doc, r["prefix"] + r["suffix"])]
        store = ContextStore()
        text = str(r["prefix"] + r["suffix"])
        store.open(doc.as_uri(), r["path"], lambda text=text: text)  # type: ignore[misc]
        chunks = store.select(doc.as_uri(), r["prefix"], r["suffix"], 1536, disk=disk)
        out.append({"set": "real-edits", "task_id": r["task_id"], "prefix": r["prefix"],
                    "suffix": r["suffix"], "path": r["path"],
                    "context": [{"path": c.path, "text": c.text, "source": c.source,
                                 "uri": c.uri, "line": c.line} for c in chunks]})
    return out


def make_tasks(n: int) -> list[dict[str, Any]]:
    """The fixed task list."""
    from fimls.tools.harness import load_tasks

    out: list[dict[str, Any]] = []
    for name in ("humaneval-single", "humaneval-multi"):
        for t in load_tasks(name, n)[1]:
            out.append({"set": name, "task_id": t.task_id, "prefix": t.prefix,
                        "suffix": t.suffix, "path": "main.py", "context": []})
    return out + _real_edits(n)


def run(tasks: list[dict[str, Any]], prompt_tokens: int, max_tokens: int,
        model: str) -> list[dict[str, Any]]:
    """Every task with speculative decoding off, then auto, through one in-process engine."""
    from fimls.config import Options, apply_dict
    from fimls.engine import make_engine
    from fimls.engine.api import CompletionRequest

    try:
        from fimls.crossfile import ContextChunk
    except ImportError:  # a checkout from before the package
        from fimls.context import ContextChunk  # type: ignore[no-redef]

    opts, _ = apply_dict(Options(), {"promptTokens": prompt_tokens, "isolation": "thread",
                                     "model": model})
    engine = make_engine(opts, isolation="thread")
    rows = []
    for mode in ("off", "auto"):
        for i, t in enumerate(tasks):
            req = CompletionRequest(
                uri=f"file:///identity/{i}/{t['path']}", version=0, prefix=t["prefix"],
                suffix=t["suffix"], rel_path=t["path"], max_tokens=max_tokens,
                speculative=mode, context=[ContextChunk(**c) for c in t["context"]])
            result = engine.complete(req, lambda: False)
            rows.append({"set": t["set"], "task_id": t["task_id"], "speculative": mode,
                         "text": result.text})
            print(f"\r{mode} {i + 1}/{len(tasks)}", end="", file=sys.stderr)
    engine.close()
    print(file=sys.stderr)
    return rows


def compare(before: list[dict[str, Any]], after: list[dict[str, Any]]) -> str:
    """How many suggestions are identical, per task set and mode; each difference."""
    key = [(r["set"], r["speculative"], r["task_id"]) for r in before]
    theirs = {(r["set"], r["speculative"], r["task_id"]): r["text"] for r in after}
    same: Counter[tuple[str, str]] = Counter()
    total: Counter[tuple[str, str]] = Counter()
    lines = []
    for k, r in zip(key, before, strict=True):
        total[k[:2]] += 1
        if theirs.get(k) == r["text"]:
            same[k[:2]] += 1
        else:
            lines.append(f"  differs: {k[0]} {k[1]} {k[2]}: {r['text'][:60]!r} -> "
                         f"{theirs.get(k, '<missing>')[:60]!r}")
    head = [f"{s:<18} speculative {m:<5} identical {same[(s, m)]:>4} of {total[(s, m)]}"
            for s, m in total]
    all_same = sum(same.values())
    return "\n".join([*head, f"all: identical {all_same} of {sum(total.values())}", *lines])


def _read(path: str) -> list[dict[str, Any]]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def _write(path: str, rows: list[dict[str, Any]]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)


def main(argv: list[str] | None = None) -> int:
    """The three steps (see the module's docstring)."""
    p = argparse.ArgumentParser(prog="identity.py", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="step", required=True)
    t = sub.add_parser("tasks", help="write the fixed task list")
    t.add_argument("--n", type=int, default=20, help="tasks per set (default 20)")
    t.add_argument("--out", required=True)
    r = sub.add_parser("run", help="run the tasks through this checkout's engine")
    r.add_argument("tasks")
    r.add_argument("--out", required=True)
    r.add_argument("--prompt-tokens", type=int, default=1024)
    r.add_argument("--max-tokens", type=int, default=32)
    r.add_argument("--model", default="qwen2.5-coder-0.5b",
                   help="the engine's model (default qwen2.5-coder-0.5b: the engine's code is "
                        "what is compared, and the small model compares it three times faster)")
    c = sub.add_parser("compare", help="identical suggestions of two runs")
    c.add_argument("before")
    c.add_argument("after")
    args = p.parse_args(argv)
    if args.step == "tasks":
        _write(args.out, make_tasks(args.n))
    elif args.step == "run":
        _write(args.out, run(_read(args.tasks), args.prompt_tokens, args.max_tokens,
                             args.model))
    else:
        print(compare(_read(args.before), _read(args.after)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
