"""A fake engine (no model, no llama.cpp) for fast scheduler and protocol tests.

It implements :class:`fimls.engine.api.EngineLike`: each request takes ``delay`` seconds
(polling ``cancelled`` the way the real engine does between tokens) and answers ``text``;
it can raise instead, and it can "crash" the way a worker process dies, by calling
``on_exit``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from fimls.engine.api import CompletionRequest, CompletionResult, EngineError, gate
from fimls.engine.device import Placement
from fimls.latency import LatencyRecord

POLL_S = 0.002


@dataclass(kw_only=True)
class FakeEngine:
    """An engine that answers ``text`` after ``delay`` seconds; configurable failures."""

    text: str = "return a + b"
    delay: float = 0.0
    model_name: str = "fake.gguf"
    placement: Placement = field(default_factory=Placement)
    warnings: list[str] = field(default_factory=list)
    on_exit: Callable[[str], None] | None = None
    typed_from_memo: bool = False  # True: the scheduler answers typing ``text`` itself
    confidence: float | None = None  # the record's; the request's minConfidence gates on it
    alternatives: list[str] = field(default_factory=list)  # for a request that asks for them
    # Scoring (next-edit verification): the second middle scores 5 above the first, or 5
    # below where the middle's line (the prefix's line count) is one of these.
    reject_lines: set[int] = field(default_factory=set)
    fake_pid: int | None = None
    # Raised by ``complete`` (after the delay) instead of answering.
    error: Exception | None = None
    # ``complete`` "crashes" the process after the delay: on_exit, then WorkerDied-like.
    crash_on_complete: bool = False
    calls: list[CompletionRequest] = field(default_factory=list)
    interrupted: list[str] = field(default_factory=list)
    resets: int = 0
    closed: bool = False
    started: threading.Event = field(default_factory=threading.Event)

    @property
    def pid(self) -> int | None:
        """``fake_pid``: None, like an in-process engine, unless a test sets one."""
        return self.fake_pid

    def complete(self, req: CompletionRequest,
                 cancelled: Callable[[], bool]) -> CompletionResult:
        """Wait ``delay`` (or until cancelled), then answer, raise, or crash."""
        assert not self.closed, "complete on a closed engine"
        self.calls.append(req)
        self.started.set()
        t0 = time.monotonic()
        rec = LatencyRecord(uri=req.uri, version=req.version, request_id=req.request_id,
                            model=self.model_name, queue_ms=(t0 - req.created) * 1000.0)
        while time.monotonic() - t0 < self.delay:
            if cancelled():
                rec.outcome = "prefill_stopped" if req.prefill else "cancelled"
                return self._result("", rec, t0)
            time.sleep(POLL_S)
        if req.prefill:
            rec.outcome = "prefill"
            return self._result("", rec, t0)
        if req.score:
            rec.outcome = "scored"
            res = self._result("", rec, t0)
            margin = -5.0 if req.prefix.count("\n") in self.reject_lines else 5.0
            res.scores = [0.0, margin][:len(req.score)]
            return res
        if self.crash_on_complete:
            self.crash("killed by signal 9 (SIGKILL)")
            raise EngineError("engine worker killed by signal 9 (SIGKILL)")
        if self.error is not None:
            raise self.error
        rec.confidence = self.confidence
        text = gate(self.text, rec, req.min_confidence)
        if rec.outcome != "gated":
            rec.outcome = "returned" if text else "empty"
        rec.generated_tokens = len(self.text.split())
        res = self._result(text, rec, t0)
        if text and req.alternatives:
            res.alternatives = self.alternatives[:req.alternatives]
        return res

    @staticmethod
    def _result(text: str, rec: LatencyRecord, t0: float) -> CompletionResult:
        rec.model_ms = (time.monotonic() - t0) * 1000.0
        return CompletionResult(text=text, record=rec)

    def crash(self, reason: str = "killed by signal 9 (SIGKILL)") -> None:
        """Die the way a worker process does: tell ``on_exit`` (from another thread)."""
        if self.on_exit is not None and not self.closed:
            self.on_exit(reason)

    def interrupt(self, request_id: str) -> None:
        """Record the interrupt; the delay loop stops through ``cancelled`` anyway."""
        self.interrupted.append(request_id)

    def reset(self) -> None:
        """Count resets (the scheduler resets an engine after a failed request)."""
        self.resets += 1

    def close(self) -> None:
        """Mark closed: a closed engine must not be asked to complete."""
        self.closed = True
