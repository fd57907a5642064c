"""Figures the reliability tests measured, printed in pytest's terminal summary (so a CI
log shows them without -s)."""

from __future__ import annotations

FIGURES: list[str] = []


def report(line: str) -> None:
    """Print ``line`` now (with -s) and in the terminal summary."""
    print(line)
    FIGURES.append(line)
