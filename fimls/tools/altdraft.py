"""Should alternatives be drafted? Explicit requests on HumanEval infilling tasks through
the in-process engine; each alternative's greedy tokens, and what a prompt-lookup draft over
the prompt would have saved, priced with this machine's measured verify costs.

    python fimls/tools/altdraft.py --n 20 --model qwen2.5-coder-1.5b --save /tmp/alt.json
    python fimls/tools/altdraft.py --load /tmp/alt.json   # priced again, no model

Greedy decoding makes the truth known: a drafted token is accepted exactly when it equals
the token plain decoding chose. Two prices are printed, in one-token steps: drafting at
every step where the lookup proposes something, and an oracle that drafts only where it
pays (no real policy does better).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fimls.drafting import PromptLookupDraft, common_prefix_len


@dataclass
class Tally:
    """Alternatives seen, their decoded tokens, and each pricing's steps."""

    lines: int = 0
    tokens: int = 0
    matched: int = 0  # tokens a draft got right
    always: float = 0.0
    oracle: float = 0.0
    seqs: list[tuple[list[int], list[int]]] = field(default_factory=list)
    costs: dict[int, float] = field(default_factory=dict)  # a batch of k drafted tokens

    def price(self, prompt: Sequence[int], toks: list[int], cost: Any, k_max: int) -> None:
        """Add one alternative's plain tokens ``toks`` after ``prompt``."""
        look = PromptLookupDraft(num_pred_tokens=k_max)
        look.set_source("context", prompt)
        i = 0
        while i < len(toks):
            d = look.propose([*prompt, *toks[:i]], k_max)
            if d is None:
                self.always += 1.0
                self.oracle += 1.0
                i += 1
                continue
            acc = min(common_prefix_len(d.tokens, toks[i:]), len(toks) - i - 1)
            step = acc + 1
            self.matched += acc
            self.always += cost(len(d.tokens))
            # The oracle drafts only the tokens that will be accepted, and only where that
            # batch costs less than the steps it replaces.
            self.oracle += min(cost(acc), float(step)) if acc else 1.0
            i += step if acc else 1
        self.lines += 1
        self.tokens += len(toks)


def _record(engine: Any, tally: Tally) -> None:
    """Wrap the engine's branch decoding to keep each alternative's tokens."""
    from fimls.engine.alternatives import BRANCH_SEQ

    model = engine.model
    plain = model.decode_at
    current: list[int] = []

    def decode_at(batch: list[tuple[int, int, int]], logits: list[int]) -> bool:
        if batch and batch[-1][2] == BRANCH_SEQ:
            current.append(batch[-1][0])  # the token whose logits choose the next
        return bool(plain(batch, logits))

    alt_line = engine._alt_line

    def wrapped(st: Any, n0: int, head: list[int], first: int, held: int) -> str:
        current.clear()
        text = str(alt_line(st, n0, head, first, held))
        # The tokens decoded after the branch's first token: those a draft could save.
        if len(current) > 1:
            tally.seqs.append((list(st.seq[:n0]) + head + [first], current[1:]))
        return text

    model.decode_at = decode_at
    engine._alt_line = wrapped


def run(n: int, model: str, k_max: int) -> Tally:
    """Explicit requests on ``n`` single-line and ``n`` multi-line tasks."""
    from fimls.config import Options, apply_dict
    from fimls.engine import make_engine
    from fimls.engine.api import CompletionRequest
    from fimls.tools.harness import load_tasks

    opts, _ = apply_dict(Options(), {"isolation": "thread", "model": model})
    engine = make_engine(opts, isolation="thread")
    tally = Tally()
    _record(engine, tally)
    tasks = [t for name in ("humaneval-single", "humaneval-multi") for t in load_tasks(name, n)[1]]
    for i, t in enumerate(tasks):
        req = CompletionRequest(uri=f"file:///alt/{i}/main.py", version=0, prefix=t.prefix,
                                suffix=t.suffix, rel_path="main.py", max_tokens=32,
                                alternatives=2)
        engine.complete(req, lambda: False)
        print(f"\r{i + 1}/{len(tasks)}", end="", file=sys.stderr)
    print(file=sys.stderr)
    cost = engine.policy.cost
    for prompt, toks in tally.seqs:
        tally.price(prompt, toks, cost, k_max)
    tally.costs = {k: cost(k) for k in range(k_max + 1)}
    engine.close()
    return tally


def reprice(saved: dict[str, Any], k_max: int) -> Tally:
    """A saved run (``--save``) priced again, with its costs: no model needed."""
    costs = {int(k): float(v) for k, v in saved["costs"].items()}
    tally = Tally(costs=costs)
    for prompt, toks in saved["seqs"]:
        tally.price(prompt, toks, lambda k: costs[min(k, max(costs))], k_max)
    return tally


def main(argv: list[str] | None = None) -> int:
    """Print the tally."""
    p = argparse.ArgumentParser(prog="altdraft.py", description=__doc__.split("\n")[0])
    p.add_argument("--n", type=int, default=40, help="tasks per HumanEval set (default 40)")
    p.add_argument("--model", default="qwen2.5-coder-1.5b")
    p.add_argument("--draft-max", type=int, default=8, help="most tokens one draft proposes")
    p.add_argument("--save", type=Path, help="write the alternatives' tokens and the costs")
    p.add_argument("--load", type=Path, help="price a saved run again (no model)")
    a = p.parse_args(argv)
    if a.load:
        t = reprice(json.loads(a.load.read_text()), a.draft_max)
    else:
        t = run(a.n, a.model, a.draft_max)
    if a.save:
        a.save.write_text(json.dumps({"costs": t.costs, "seqs": t.seqs}))
    steps = max(t.tokens, 1)
    print(f"{a.model}: {t.lines} alternatives, {t.tokens} tokens after the branch token; "
          f"a prompt-lookup draft matched {t.matched} ({t.matched / steps:.2f})")
    print(f"  steps: plain {t.tokens}, drafting always {t.always:.1f} "
          f"({t.always / steps:.2f}x), oracle {t.oracle:.1f} ({t.oracle / steps:.2f}x)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
