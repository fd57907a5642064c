"""Request lifecycle: one dedicated worker thread, superseding, cancellation, loading.

The model is owned by exactly one thread (never pygls's thread pool, which also reads
stdin). Requests queue for it; a newer request for a document supersedes the older one,
which is answered at once with an empty result whether it was queued or running.
While the model loads (or after it failed to load) requests are answered empty at once.

Typing the start of the suggestion just shown is answered here, on the caller's thread,
from a copy of the engine's memo (:mod:`fimls.memo`): the answer needs no model work, so it
neither waits for the worker nor stops its idle work (the prefetch of the suggestion after
this one keeps running). Only engines that answer such requests from their own memo say so
(``typed_from_memo``); the copy holds what they showed, so both give the same answer.

Listeners hear two things, on the engine thread: every change of :class:`EngineState`
(with the error for ``failed`` and ``restarting``, which is how a dead engine process is
reported) and every load-time warning of a new engine (a refused draft model).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field

from fimls.engine.api import (
    CompletionRequest,
    CompletionResult,
    EngineLike,
    EngineState,
    Prefill,
    describe_error,
)
from fimls.latency import LatencyLog, LatencyRecord, Outcome, Stop
from fimls.memo import SuggestionMemo

log = logging.getLogger(__name__)

StateListener = Callable[[EngineState, str | None], None]
WarningListener = Callable[[str], None]


@dataclass(kw_only=True)
class _Job:
    req: CompletionRequest
    future: Future[CompletionResult] = field(default_factory=Future)
    cancel_reason: Outcome | None = None
    still_current: Callable[[], bool] | None = None
    # The future may be cancelled by its awaiter (asyncio.wrap_future propagates an LSP
    # $/cancelRequest), so whether the job is finished is tracked separately.
    finished: bool = False
    # A running job that is cancelled is answered at once; its record is written when the
    # engine has actually let go of it (so the log shows how long it held the model).
    answered_ms: float | None = None  # when set: the client already has its (empty) answer
    idle: bool = False  # idle prefill: runs only while no request waits, nobody awaits it


class Scheduler:
    """Feeds requests to one engine on one thread; cancels and supersedes."""

    def __init__(self, latency_log: LatencyLog | None = None) -> None:
        self._lock = threading.Condition()
        self._queue: deque[_Job] = deque()
        self._by_uri: dict[str, _Job] = {}
        self._by_id: dict[str, _Job] = {}
        self._running: _Job | None = None
        self._idle: _Job | None = None  # the one idle prefill job waiting, if any
        self._engine: EngineLike | None = None
        self._loader: Callable[[], EngineLike] | None = None
        self._state = EngineState.IDLE
        self._last_loader: Callable[[], EngineLike] | None = None
        self._crashes: deque[float] = deque(maxlen=16)
        self._memo = SuggestionMemo()  # what the engine showed (when it has a memo)
        # The idle "next" prefetch last finished and not since overtaken by other model work:
        # asking for the same one again (typing through the suggestion) has nothing to do.
        self._idle_done: tuple[object, ...] | None = None
        self.restarts = 0
        self.load_error: str | None = None
        self.latency_log = latency_log or LatencyLog(None)
        self._stop = False
        self._on_state: list[StateListener] = []
        self._on_warning: list[WarningListener] = []
        self._thread = threading.Thread(target=self._loop, name="fimls-engine", daemon=True)
        self._thread.start()

    # -- state ---------------------------------------------------------------------------

    @property
    def state(self) -> EngineState:
        """idle, loading, ready, failed or restarting (the engine process died)."""
        return self._state

    @property
    def model_name(self) -> str:
        """The loaded model's file name, or an empty string."""
        return self._engine.model_name if self._engine else ""

    def on_state_change(self, cb: StateListener) -> None:
        """Call ``cb(state, error)`` (from the worker thread) whenever the state changes;
        ``error`` says why for ``failed`` and ``restarting`` (the engine process died)."""
        self._on_state.append(cb)

    def on_warning(self, cb: WarningListener) -> None:
        """Call ``cb(message)`` (from the worker thread) for each warning of a newly loaded
        engine (it works, but not as configured: a refused draft model)."""
        self._on_warning.append(cb)

    def _set_state(self, state: EngineState, error: str | None = None) -> None:
        self._state = state
        self.load_error = error
        self._notify(state, error)

    def _notify(self, state: EngineState, error: str | None) -> None:
        for cb in self._on_state:
            try:
                cb(state, error)
            except Exception:  # a listener must not kill the worker
                log.exception("state listener failed")

    def _warn(self, message: str) -> None:
        for cb in self._on_warning:
            try:
                cb(message)
            except Exception:  # a listener must not kill the worker
                log.exception("warning listener failed")

    @property
    def engine(self) -> EngineLike | None:
        """The engine in service, if any."""
        return self._engine

    def load(self, loader: Callable[[], EngineLike]) -> None:
        """(Re)load the engine on the worker thread; requests meanwhile get empty results."""
        with self._lock:
            self._loader = loader
            self._last_loader = loader
            self._state = EngineState.LOADING
            self._lock.notify_all()

    # -- requests ------------------------------------------------------------------------

    def submit(self, req: CompletionRequest, *,
               still_current: Callable[[], bool] | None = None) -> Future[CompletionResult]:
        """Queue a request; the previous one for the same document is superseded.

        ``still_current`` is asked (on the worker thread) before a result is delivered: a
        result for a document version that has moved on is dropped as superseded.
        """
        job = _Job(req=req, still_current=still_current)
        with self._lock:
            old = self._by_uri.get(req.uri)
            if old is not None:
                self._cancel_locked(old, Outcome.SUPERSEDED)
            rest = self._recall_locked(req)
            if rest is not None:
                waited = (time.monotonic() - req.created) * 1000.0
                rec = LatencyRecord(uri=req.uri, version=req.version,
                                    request_id=req.request_id, model=self.model_name,
                                    stop=Stop.MEMO, ttft_ms=waited, total_ms=waited)
                self._finish_locked(job, rest, Outcome.RETURNED, record=rec)
                return job.future
            if self._state not in (EngineState.READY, EngineState.UNREACHABLE):
                error = self.load_error if self._state == EngineState.FAILED else None
                self._finish_locked(job, "", Outcome.ERROR if error else Outcome.EMPTY,
                                    error=error or f"model {self._state}")
                return job.future
            self._by_uri[req.uri] = job
            self._by_id[req.request_id] = job
            self._queue.append(job)
            self._stop_idle_locked()
            self._lock.notify_all()
        return job.future

    def _memo_on(self) -> bool:
        return self._engine is not None and self._engine.typed_from_memo

    def _recall_locked(self, req: CompletionRequest) -> str | None:
        """The rest of the suggestion shown, when ``req`` typed its start (see fimls.memo)."""
        if (not self._memo_on() or self._state != EngineState.READY or req.prefill
                or req.speculative == "off" or req.alternatives or req.score):
            return None
        return self._memo.recall(req.uri, req.prefix, req.prefix_offset, req.suffix)

    def _remember_locked(self, job: _Job, text: str, rec: LatencyRecord) -> None:
        """Keep what the engine showed as its memo does: the newest answer per document
        (an empty one forgets it), but not an answer that came from the engine's memo."""
        if not self._memo_on() or job.idle or rec.stop == Stop.MEMO:
            return
        if rec.outcome in ("returned", "empty"):
            req = job.req
            self._memo.remember(req.uri, req.prefix, req.prefix_offset, req.suffix,
                                text if rec.outcome == Outcome.RETURNED else "")
        elif rec.outcome == Outcome.ERROR:
            self._memo = SuggestionMemo()  # the engine was reset
        else:
            # Gated, cancelled, superseded: what the engine now remembers is not known
            # here, so it answers the next such request itself.
            self._memo.forget(job.req.uri)

    @staticmethod
    def _idle_key(req: CompletionRequest) -> tuple[object, ...]:
        """Idle work for the same cursor and the same text around it is the same work."""
        return (req.uri, req.prefill, req.prefix_offset + len(req.prefix),
                req.prefix[-4096:], req.suffix[:4096])

    def prefill(self, req: CompletionRequest) -> bool:
        """Queue idle work (``req.prefill`` set): evaluate a prompt before it is asked for.

        It runs only while no request waits, and any request submitted meanwhile stops it
        at once (the engine aborts the batch in flight). A newer idle job replaces an older
        one. Returns False when it was not queued (a request is waiting or running, or the
        model is not ready).
        """
        job = _Job(req=req, idle=True)
        key = self._idle_key(req)
        with self._lock:
            running = self._running
            if (self._state != EngineState.READY or self._queue
                    or (running is not None and not running.idle)):
                return False
            if req.prefill == Prefill.NEXT and (key == self._idle_done or any(
                    j is not None and j.cancel_reason is None and self._idle_key(j.req) == key
                    for j in (running, self._idle))):
                return True  # the same work is under way, waiting, or done
            self._stop_idle_locked()
            self._idle = job
            self._by_id[req.request_id] = job
            self._lock.notify_all()
        return True

    def _stop_idle_locked(self, uri: str | None = None) -> None:
        """Drop the waiting idle job and stop the running one (only those for ``uri`` when
        given): a request comes first."""
        if self._idle is not None and uri in (None, self._idle.req.uri):
            self._by_id.pop(self._idle.req.request_id, None)
            self._idle = None
        job = self._running
        if (job is not None and job.idle and job.cancel_reason is None
                and uri in (None, job.req.uri)):
            job.cancel_reason = Outcome.PREEMPTED
            if self._engine is not None:
                try:
                    self._engine.interrupt(job.req.request_id)
                except Exception:
                    log.debug("interrupt failed", exc_info=True)

    def cancel(self, request_id: str, reason: Outcome = Outcome.CANCELLED) -> bool:
        """Cancel one request by id; False if it already finished."""
        with self._lock:
            job = self._by_id.get(request_id)
            if job is None:
                return False
            self._cancel_locked(job, reason)
            return True

    def cancel_uri(self, uri: str, reason: Outcome = Outcome.SUPERSEDED, *,
                   idle: bool = False) -> None:
        """Cancel whatever is pending for a document (it changed, or closed); ``idle``:
        its idle work too (it closed: nobody will ask for what that evaluates, and the
        machine's cores are the user's again)."""
        with self._lock:
            job = self._by_uri.get(uri)
            if job is not None:
                self._cancel_locked(job, reason)
            if idle:
                self._stop_idle_locked(uri)

    def _cancel_locked(self, job: _Job, reason: Outcome) -> None:
        if job.finished or job.cancel_reason is not None:
            return
        job.cancel_reason = reason
        if job is not self._running:
            with contextlib.suppress(ValueError):
                self._queue.remove(job)
            self._finish_locked(job, "", reason)
            return
        # The client hears now; the engine stops at its next token or batch boundary.
        rec = LatencyRecord(uri=job.req.uri, version=job.req.version,
                            request_id=job.req.request_id, model=self.model_name,
                            outcome=reason,
                            total_ms=(time.monotonic() - job.req.created) * 1000.0)
        self._respond(job, CompletionResult(text="", record=rec))
        job.answered_ms = rec.total_ms
        if self._engine is not None:
            # An engine in another process hears about it now rather than at its next poll.
            try:
                self._engine.interrupt(job.req.request_id)
            except Exception:
                log.debug("interrupt failed", exc_info=True)
        # The running job sees cancel_reason through its predicate and stops at the next
        # token or batch boundary; llama.cpp's abort callback polls it mid-batch too.

    def _finish_locked(self, job: _Job, text: str, outcome: Outcome, *,
                       record: LatencyRecord | None = None, error: str | None = None,
                       alternatives: list[str] | None = None,
                       scores: list[float] | None = None) -> None:
        rec = record or LatencyRecord(uri=job.req.uri, version=job.req.version,
                                      request_id=job.req.request_id, model=self.model_name)
        job.finished = True
        rec.outcome = outcome
        if error:
            rec.error = error
        if record is None:
            rec.total_ms = (time.monotonic() - job.req.created) * 1000.0
        if job.answered_ms is not None:
            rec.total_ms = job.answered_ms  # what the client waited
        if self._by_uri.get(job.req.uri) is job:
            del self._by_uri[job.req.uri]
        self._by_id.pop(job.req.request_id, None)
        self.latency_log.write(rec)
        if job.answered_ms is None:
            self._respond(job, CompletionResult(text=text, record=rec,
                                                alternatives=alternatives or [],
                                                scores=scores or []))

    @staticmethod
    def _respond(job: _Job, result: CompletionResult) -> None:
        # The awaiter may have cancelled the future already ($/cancelRequest).
        if job.future.set_running_or_notify_cancel():
            job.future.set_result(result)

    # -- worker --------------------------------------------------------------------------

    def _loop(self) -> None:
        while True:
            with self._lock:
                while (not self._stop and not self._queue and self._idle is None
                       and self._loader is None):
                    self._lock.wait()
                if self._stop:
                    return
                loader = self._loader
                self._loader = None
                job = None
                if loader is None:
                    if self._queue:
                        job = self._queue.popleft()
                    else:
                        job, self._idle = self._idle, None
                if job is not None:
                    self._running = job
            if loader is not None:
                self._do_load(loader)
                continue
            assert job is not None
            self._run(job)

    def _do_load(self, loader: Callable[[], EngineLike]) -> None:
        if self._engine is not None:
            self._engine.close()
            self._engine = None
        self._set_state(EngineState.LOADING)
        try:
            engine = loader()
        except Exception as exc:
            log.error("%s", exc)
            self._set_state(EngineState.FAILED, str(exc))
            return
        with self._lock:
            self._engine = engine
            self._memo = SuggestionMemo()
            self._idle_done = None
        engine.on_exit = lambda reason, e=engine: self._engine_died(e, reason)
        if hasattr(engine, "on_status"):
            # A remote engine says when its server stops (or starts again) answering.
            def status(state: str, why: str | None, e: EngineLike = engine) -> None:
                if self._engine is e and state != self._state:
                    self._set_state(EngineState(state), why)
            engine.on_status = status
        self._set_state(EngineState.READY)
        for warning in engine.warnings:
            self._warn(warning)

    def restart_delay(self) -> float:
        """Back-off before restarting a dead engine: 0.25 s, doubling with every crash in
        the last two minutes, at most 30 s."""
        now = time.monotonic()
        recent = sum(1 for t in self._crashes if now - t < 120.0)
        return min(30.0, 0.25 * 2 ** max(0, recent - 1))

    def _engine_died(self, engine: EngineLike, reason: str) -> None:
        """The engine's process is gone (called from its watcher thread): answer what was
        waiting for it, and start a new one after a back-off."""
        with self._lock:
            if self._engine is not engine or self._stop:
                return
            self._engine = None
            self._crashes.append(time.monotonic())
            delay = self.restart_delay()
            loader = self._last_loader
            self._state = EngineState.RESTARTING
            self.load_error = f"the engine process died ({reason}); restarting in {delay:.2f} s"
        self._notify(EngineState.RESTARTING, self.load_error)
        with contextlib.suppress(Exception):
            engine.close()
        if loader is None:
            return
        timer = threading.Timer(delay, self._restart, args=(loader,))
        timer.daemon = True
        timer.start()

    def _restart(self, loader: Callable[[], EngineLike]) -> None:
        with self._lock:
            # A reload asked for meanwhile (or a shutdown) wins over this one.
            if self._stop or self._state != EngineState.RESTARTING:
                return
            self.restarts += 1
            self._loader = loader
            self._state = EngineState.LOADING
            self._lock.notify_all()

    def _run(self, job: _Job) -> None:
        engine = self._engine

        def cancelled() -> bool:
            return job.cancel_reason is not None or self._stop

        if engine is None or cancelled():
            with self._lock:
                self._running = None
                if job.idle:
                    self._by_id.pop(job.req.request_id, None)
                else:
                    self._finish_locked(job, "", job.cancel_reason or Outcome.EMPTY)
            return
        alternatives: list[str] = []
        scores: list[float] = []
        try:
            result = engine.complete(job.req, cancelled)
            text, rec, alternatives = result.text, result.record, result.alternatives
            scores = result.scores
            if job.idle:
                pass  # the engine's own outcome: prefill or prefill_stopped
            elif job.cancel_reason is not None:
                text, rec.outcome = "", job.cancel_reason
            elif job.still_current is not None and not job.still_current():
                text, rec.outcome = "", Outcome.SUPERSEDED
        except Exception as exc:
            log.error("engine failed on request %s: %s", job.req.request_id,
                      describe_error(exc))
            log.debug("engine failure", exc_info=True)
            try:
                engine.reset()
            except Exception:
                log.exception("engine reset failed")
            text = ""
            rec = LatencyRecord(uri=job.req.uri, version=job.req.version,
                                request_id=job.req.request_id, model=self.model_name,
                                error=describe_error(exc))
            rec.outcome = Outcome.PREFILL_ERROR if job.idle else Outcome.ERROR
            rec.total_ms = (time.monotonic() - job.req.created) * 1000.0
        with self._lock:
            self._running = None
            if job.idle:
                done = job.req.prefill == Prefill.NEXT and rec.outcome == Outcome.PREFILL
                self._idle_done = self._idle_key(job.req) if done else None
            else:
                self._idle_done = None
                self._remember_locked(job, text, rec)
            self._finish_locked(job, text, rec.outcome, record=rec,
                                alternatives=alternatives if text else [],
                                scores=scores if rec.outcome == Outcome.SCORED else [])

    def shutdown(self, timeout: float = 5.0) -> None:
        """Stop the worker; pending requests are answered as cancelled."""
        with self._lock:
            self._stop = True
            for job in list(self._queue):
                self._finish_locked(job, "", Outcome.CANCELLED)
            self._queue.clear()
            self._idle = None
            self._lock.notify_all()
        self._thread.join(timeout)
        if self._engine is not None and not self._thread.is_alive():
            self._engine.close()
            self._engine = None
