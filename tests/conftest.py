"""Shared test configuration: servers log to a per-test cache dir, never the user's.

Tests come in three layers, marked here by file so that no test has to say it:

- ``e2e``: real models (engine, worker process, ``fimls serve`` over stdio);
- ``editor``: real editors (Neovim, VS Code) driving ``fimls serve``;
- ``unit``: everything else, including the fake-engine server tests; seconds in all.

``pytest -m unit`` runs the fast layer, ``pytest -m "not editor"`` skips the editors.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

# The default model is Qwen2.5-Coder 1.5B; protocol and engine tests run on the tiny Gemma
# (seconds, not minutes, of prefill), set here so that every `fimls serve` a test starts
# inherits it. Tests of the default or of FIM behaviour name their model themselves.
os.environ["FIMLS_MODEL"] = "gemma-3-270m"

# Files that load the real model; test_e2e_*.py are e2e by name.
E2E_FILES = frozenset({"test_engine.py", "test_privacy.py", "test_sync_differential.py",
                       "test_speculative.py", "test_worker.py"})


def layer_of(filename: str) -> str:
    """The marker (unit, e2e or editor) of the tests in ``filename``."""
    if filename.startswith("test_editor_"):
        return "editor"
    if filename.startswith("test_e2e_") or filename in E2E_FILES:
        return "e2e"
    return "unit"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test with its layer (see the module docstring)."""
    for item in items:
        item.add_marker(getattr(pytest.mark, layer_of(item.path.name)))


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
