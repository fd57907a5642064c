"""Shared test configuration: servers log to a per-test cache dir, never the user's."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def _isolated_state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The embedded model is assembled once per machine (in the real cache), but latency
    # logs and other state go to the test's own directory.
    monkeypatch.setenv("FIMLS_STATE_DIR", str(tmp_path / "state"))
    if "FIMLS_CACHE_DIR" in os.environ:
        monkeypatch.setenv("FIMLS_CACHE_DIR", os.environ["FIMLS_CACHE_DIR"])
