"""How right a suggestion is, against the text the user really wrote there.

The measures of ``fimls bench`` (per task set, model and configuration):

* **line-exact**: the suggestion's first line equals the target's first line (trailing
  whitespace ignored) -- what a user sees first, and accepts or not;
* **exact**: the whole suggestion equals the whole target (trailing whitespace ignored);
* **prefix ratio**: how much of the target the suggestion gets right before it first
  differs, as a share of the target's length (what Tab, Tab would keep);
* **edit similarity**: 1 - Levenshtein distance / the longer length (CodeXGLUE's measure);
* **empty**: nothing was suggested.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from fimls.documents import split_lines

# Edit distance is quadratic: longer texts are compared on their heads.
MAX_COMPARED = 2000


def first_line(text: str) -> str:
    """The first line (LSP line ends only), without trailing whitespace."""
    return split_lines(text)[0].rstrip() if text else ""


def common_prefix(a: str, b: str) -> int:
    """Length of the longest common prefix of ``a`` and ``b``."""
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def edit_similarity(a: str, b: str) -> float:
    """1 - Levenshtein(a, b) / max(len): 1.0 for equal texts, 0.0 for nothing in common."""
    a, b = a[:MAX_COMPARED], b[:MAX_COMPARED]
    if not a and not b:
        return 1.0
    prev = list(range(len(b) + 1))
    for i, ca in enumerate(a, start=1):
        cur = [i] + [0] * len(b)
        for j, cb in enumerate(b, start=1):
            cur[j] = min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (ca != cb))
        prev = cur
    return 1.0 - prev[-1] / max(len(a), len(b))


@dataclass(frozen=True)
class Score:
    """The measures of one suggestion against its target."""

    line_exact: bool
    exact: bool
    prefix_ratio: float
    edit_similarity: float
    empty: bool


def score(suggestion: str, target: str) -> Score:
    """Score ``suggestion`` against ``target`` (the real text at the cursor)."""
    s, t = suggestion.rstrip(), target.rstrip()
    empty = not suggestion.strip()
    return Score(
        line_exact=not empty and first_line(s) == first_line(t),
        exact=not empty and s == t,
        prefix_ratio=common_prefix(s, t) / len(t) if t else float(not s),
        edit_similarity=edit_similarity(s, t),
        empty=empty)


def summarize(scores: Iterable[Score]) -> dict[str, float]:
    """Means of each measure (rates for the yes/no ones) over ``scores``."""
    rows = list(scores)
    n = len(rows) or 1
    return {"line_exact": sum(r.line_exact for r in rows) / n,
            "exact": sum(r.exact for r in rows) / n,
            "prefix_ratio": sum(r.prefix_ratio for r in rows) / n,
            "edit_similarity": sum(r.edit_similarity for r in rows) / n,
            "empty_rate": sum(r.empty for r in rows) / n,
            "tasks": float(len(rows))}
