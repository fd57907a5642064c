"""Paired comparisons of two systems on the same tasks: how often each was right, the
difference with a bootstrap interval, and a sign test on the tasks where they differ.

A ratio from 20 tasks says little; these say how much it could move.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Paired:
    """System A against system B on ``n`` tasks (A's rate minus B's)."""

    n: int
    right_a: int
    right_b: int
    won: int  # right for A only
    lost: int  # right for B only
    diff: float
    lo: float  # the 95 % bootstrap interval of ``diff``
    hi: float
    p_sign: float  # two-sided exact sign test on the won and lost tasks

    def describe(self) -> str:
        """One line: the difference, its interval, and the sign test."""
        return (f"{self.diff:+.3f} [{self.lo:+.3f}, {self.hi:+.3f}]  "
                f"won {self.won} lost {self.lost}  p={self.p_sign:.3f}")


def sign_test(won: int, lost: int) -> float:
    """Two-sided exact binomial test of ``won`` against ``lost`` at one half each."""
    n = won + lost
    if n == 0:
        return 1.0
    k = min(won, lost)
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2.0 ** n
    return min(1.0, 2.0 * tail)


def bootstrap_diff(a: Sequence[bool], b: Sequence[bool], *, samples: int = 4000,
                   seed: int = 0) -> tuple[float, float]:
    """The 95 % percentile interval of mean(a) - mean(b), resampling tasks in pairs."""
    n = len(a)
    if n == 0:
        return (math.nan, math.nan)
    deltas = [int(x) - int(y) for x, y in zip(a, b, strict=True)]
    rng = random.Random(seed)
    means = sorted(sum(deltas[rng.randrange(n)] for _ in range(n)) / n
                   for _ in range(samples))
    return means[int(0.025 * samples)], means[min(samples - 1, int(0.975 * samples))]


def compare(a: Sequence[bool], b: Sequence[bool], *, samples: int = 4000,
            seed: int = 0) -> Paired:
    """A (``a[i]``: right on task i) against B on the same tasks."""
    if len(a) != len(b):
        raise ValueError("paired comparison of different task counts")
    n = len(a)
    won = sum(1 for x, y in zip(a, b, strict=True) if x and not y)
    lost = sum(1 for x, y in zip(a, b, strict=True) if y and not x)
    lo, hi = bootstrap_diff(a, b, samples=samples, seed=seed)
    diff = (sum(a) - sum(b)) / n if n else math.nan
    return Paired(n, sum(a), sum(b), won, lost, diff, lo, hi, sign_test(won, lost))
