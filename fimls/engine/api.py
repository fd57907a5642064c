"""The engine's narrow interface: plain request and result types, no LSP, no llama.cpp.

Everything that crosses from the server to the engine (and could cross a process boundary
later) is one of these dataclasses.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field

from fimls.latency import LatencyRecord

_ids = itertools.count(1)


@dataclass(kw_only=True)
class CompletionRequest:
    """One completion at one cursor position of one document version."""

    uri: str
    version: int | None
    prefix: str
    suffix: str
    prefix_offset: int = 0
    repo_name: str | None = None
    rel_path: str = ""
    max_tokens: int = 64
    max_lines: int = 8
    speculative: str = "auto"
    neighbors: list[str] = field(default_factory=list)  # text of other open buffers
    request_id: str = field(default_factory=lambda: f"r{next(_ids)}")
    created: float = field(default_factory=time.monotonic)


@dataclass(kw_only=True)
class CompletionResult:
    """The suggestion (possibly empty) and what producing it cost."""

    text: str
    record: LatencyRecord

    @property
    def outcome(self) -> str:
        """returned, empty, superseded, cancelled or error."""
        return self.record.outcome
