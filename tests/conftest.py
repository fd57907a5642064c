"""Shared test configuration: servers log to a per-test cache dir, never the user's."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest


@pytest.fixture(autouse=True)
def _isolated_state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The embedded model is assembled once per machine (in the real cache), but latency
    # logs and other state go to the test's own directory.
    monkeypatch.setenv("FIMLS_STATE_DIR", str(tmp_path / "state"))
    if "FIMLS_CACHE_DIR" in os.environ:
        monkeypatch.setenv("FIMLS_CACHE_DIR", os.environ["FIMLS_CACHE_DIR"])


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Print what the lossless test counted (identical outputs per drafter)."""
    from tests import test_speculative

    lines = test_speculative.pytest_terminal_summary_lines()
    if lines:
        terminalreporter.section("speculative decoding: lossless check")
        for line in lines:
            terminalreporter.write_line(line)
    from tests.figures import FIGURES

    if FIGURES:
        terminalreporter.section("reliability: measured figures")
        for line in FIGURES:
            terminalreporter.write_line(line)
