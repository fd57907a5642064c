"""The scheduler with the fake engine, in process: supersede, cancel, states, restarts."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from pathlib import Path

import pytest

from fimls.engine.api import (
    CompletionRequest,
    CompletionResult,
    EngineLike,
    EngineState,
    ModelLoadError,
)
from fimls.latency import LatencyLog
from fimls.scheduler import Scheduler
from tests.fake_engine import FakeEngine

T = 5.0  # seconds any single wait may take before the test fails


def wait_until(pred: Callable[[], bool], timeout: float = T) -> None:
    """Poll ``pred`` until it holds; fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.002)


def req(uri: str = "file:///a.py", version: int = 1, alternatives: int = 0,
        ) -> CompletionRequest:
    """A small request."""
    return CompletionRequest(uri=uri, version=version, prefix="def add(a, b):\n    ",
                             suffix="", alternatives=alternatives)


def records(path: Path) -> list[dict[str, object]]:
    """The latency log's records."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().split("\n") if line.strip()]


class Recorder:
    """Collects the scheduler's state changes and warnings."""

    def __init__(self, sched: Scheduler) -> None:
        self.states: list[tuple[EngineState, str | None]] = []
        self.warnings: list[str] = []
        sched.on_state_change(lambda s, e: self.states.append((s, e)))
        sched.on_warning(self.warnings.append)


@pytest.fixture
def log_path(tmp_path: Path) -> Path:
    return tmp_path / "lat.jsonl"


@pytest.fixture
def sched(log_path: Path) -> Iterator[Scheduler]:
    s = Scheduler(LatencyLog(log_path))
    yield s
    s.shutdown(timeout=2.0)


def ready(sched: Scheduler, engine: FakeEngine) -> FakeEngine:
    """Load ``engine`` and wait until it serves."""
    sched.load(lambda: engine)
    wait_until(lambda: sched.state == EngineState.READY)
    return engine


def result(fut: Future[CompletionResult], timeout: float = T) -> CompletionResult:
    return fut.result(timeout)


def test_state_is_a_str_enum_with_the_wire_values() -> None:
    assert [s.value for s in EngineState] == ["idle", "loading", "ready", "failed",
                                               "restarting", "unreachable"]
    assert EngineState.READY == "ready" and json.dumps(EngineState.FAILED) == '"failed"'
    assert str(EngineState.RESTARTING) == "restarting"


def test_fake_engine_fits_the_protocol() -> None:
    engine: EngineLike = FakeEngine()  # mypy checks the structure; this checks it runs
    assert engine.pid is None and engine.on_exit is None and engine.warnings == []


def test_a_request_is_answered(sched: Scheduler, log_path: Path) -> None:
    engine = ready(sched, FakeEngine(text="return a + b"))
    res = result(sched.submit(req()))
    assert res.text == "return a + b" and res.outcome == "returned"
    assert sched.model_name == "fake.gguf" and sched.engine is engine
    assert [r["outcome"] for r in records(log_path)] == ["returned"]


def test_alternatives_reach_the_caller(sched: Scheduler) -> None:
    ready(sched, FakeEngine(text="return a + b", alternatives=["return b + a", "return 0"]))
    res = result(sched.submit(req(alternatives=2)))
    assert [res.text, *res.alternatives] == ["return a + b", "return b + a", "return 0"]
    assert result(sched.submit(req(version=2))).alternatives == []


def test_requests_before_ready_are_answered_empty_at_once(sched: Scheduler) -> None:
    assert sched.state == EngineState.IDLE
    res = result(sched.submit(req()), 1.0)
    assert res.text == "" and res.outcome == "empty" and res.record.error == "model idle"
    gate = threading.Event()

    def slow_load() -> EngineLike:
        gate.wait(T)
        return FakeEngine()

    sched.load(slow_load)
    assert sched.state == EngineState.LOADING
    res = result(sched.submit(req()), 1.0)
    assert res.outcome == "empty" and res.record.error == "model loading"
    gate.set()
    wait_until(lambda: sched.state == EngineState.READY)


def test_newer_request_supersedes_the_running_one(sched: Scheduler, log_path: Path) -> None:
    engine = ready(sched, FakeEngine(delay=10.0))
    first = req()
    f1 = sched.submit(first)
    wait_until(engine.started.is_set)
    t0 = time.monotonic()
    f2 = sched.submit(req(version=2))
    res1 = result(f1, 1.0)  # answered at once, not when the engine lets go
    assert time.monotonic() - t0 < 1.0
    assert res1.text == "" and res1.outcome == "superseded"
    assert engine.interrupted == [first.request_id]  # the engine heard about it at once
    engine.delay = 0.0
    res2 = result(f2)
    assert res2.outcome == "returned"
    assert [r["outcome"] for r in records(log_path)] == ["superseded", "returned"]


def test_a_queued_request_that_is_superseded_never_runs(sched: Scheduler) -> None:
    engine = ready(sched, FakeEngine(delay=0.2))
    busy = sched.submit(req("file:///busy.py"))
    wait_until(engine.started.is_set)
    queued = req("file:///b.py")
    fq = sched.submit(queued)
    newer = sched.submit(req("file:///b.py", version=2))
    assert result(fq, 1.0).outcome == "superseded"
    assert result(busy).outcome == "returned" and result(newer).outcome == "returned"
    assert queued.request_id not in [r.request_id for r in engine.calls]
    assert engine.interrupted == []  # only a running request is interrupted


def test_cancel_by_id_answers_at_once_and_the_engine_stops(sched: Scheduler,
                                                           log_path: Path) -> None:
    engine = ready(sched, FakeEngine(delay=10.0))
    r = req()
    fut = sched.submit(r)
    wait_until(engine.started.is_set)
    assert sched.cancel(r.request_id)
    assert result(fut, 1.0).outcome == "cancelled"
    # The engine lets go long before its 10 s (it polls cancelled()), then the log record
    # is written with what the client waited, not how long the engine held the model.
    wait_until(lambda: len(records(log_path)) == 1, 2.0)
    rec = records(log_path)[0]
    assert rec["outcome"] == "cancelled" and float(str(rec["total_ms"])) < 1000
    assert not sched.cancel(r.request_id)  # finished: nothing to cancel
    engine.delay = 0.0
    assert result(sched.submit(req("file:///next.py"))).outcome == "returned"


def test_cancel_uri_cancels_what_is_pending_for_a_document(sched: Scheduler) -> None:
    engine = ready(sched, FakeEngine(delay=10.0))
    fut = sched.submit(req())
    wait_until(engine.started.is_set)
    sched.cancel_uri("file:///a.py", "cancelled")
    assert result(fut, 1.0).outcome == "cancelled"


def test_a_result_for_a_stale_version_is_dropped(sched: Scheduler) -> None:
    ready(sched, FakeEngine())
    res = result(sched.submit(req(), still_current=lambda: False))
    assert res.text == "" and res.outcome == "superseded"


def test_engine_error_answers_error_without_text_and_resets(sched: Scheduler) -> None:
    engine = ready(sched, FakeEngine(error=UnicodeDecodeError("utf-8", b"secret", 0, 1, "x")))
    res = result(sched.submit(req()))
    assert res.text == "" and res.outcome == "error"
    assert res.record.error is not None and "secret" not in res.record.error
    assert res.record.error.startswith("UnicodeDecodeError")
    assert engine.resets == 1
    assert sched.state == EngineState.READY


def test_failed_load_is_a_state_with_its_error(sched: Scheduler) -> None:
    rec = Recorder(sched)

    def bad() -> EngineLike:
        raise ModelLoadError("model file not found: /nope.gguf")

    sched.load(bad)
    wait_until(lambda: sched.state == EngineState.FAILED)
    assert rec.states == [(EngineState.LOADING, None),
                          (EngineState.FAILED, "model file not found: /nope.gguf")]
    res = result(sched.submit(req()), 1.0)
    assert res.outcome == "error" and res.record.error == "model file not found: /nope.gguf"
    # A reload with a good engine recovers.
    ready(sched, FakeEngine())
    assert sched.load_error is None
    assert result(sched.submit(req())).outcome == "returned"


def test_warnings_are_their_own_event_not_a_state(sched: Scheduler) -> None:
    rec = Recorder(sched)
    ready(sched, FakeEngine(warnings=["draft model refused; continuing without one"]))
    wait_until(lambda: bool(rec.warnings))
    assert rec.warnings == ["draft model refused; continuing without one"]
    assert [s for s, _ in rec.states] == [EngineState.LOADING, EngineState.READY]


def test_reload_closes_the_old_engine(sched: Scheduler) -> None:
    old = ready(sched, FakeEngine())
    new = FakeEngine(text="new")
    sched.load(lambda: new)
    wait_until(lambda: sched.engine is new)
    assert old.closed and not new.closed
    assert result(sched.submit(req())).text == "new"


def counting_loader(made: list[FakeEngine], *, crash_on_complete: bool = False,
                    delay: float = 0.0) -> Callable[[], EngineLike]:
    """A loader that makes a new fake engine each time (a restart needs a new one)."""
    def load() -> EngineLike:
        engine = FakeEngine(crash_on_complete=crash_on_complete, delay=delay)
        made.append(engine)
        return engine
    return load


def test_a_dead_engine_is_restarted_with_growing_back_off(sched: Scheduler) -> None:
    rec = Recorder(sched)
    made: list[FakeEngine] = []
    sched.load(counting_loader(made))
    wait_until(lambda: sched.state == EngineState.READY)
    delays = []
    for n in (1, 2, 3):
        died = time.monotonic()
        made[-1].crash("killed by signal 9 (SIGKILL)")
        assert sched.state == EngineState.RESTARTING
        assert sched.engine is None and made[-1].closed
        state, error = rec.states[-1]
        assert state == EngineState.RESTARTING and error is not None
        assert "the engine process died (killed by signal 9 (SIGKILL))" in error
        # Requests meanwhile are answered empty at once.
        assert result(sched.submit(req()), 1.0).outcome == "empty"
        # The predicate is called within this iteration only: the loop variable is safe.
        wait_until(lambda: sched.restarts == n and sched.state == EngineState.READY)  # noqa: B023
        delays.append(time.monotonic() - died)
        assert len(made) == n + 1
    assert "restarting in 1.00 s" in str(rec.states[-3][1])
    # 0.25 s, 0.5 s, 1 s (each at least its back-off; a little scheduling slack on top).
    for took, want in zip(delays, (0.25, 0.5, 1.0), strict=True):
        assert want <= took < want + 2.0
    assert all(e.closed for e in made[:-1]) and not made[-1].closed
    assert result(sched.submit(req())).outcome == "returned"


def test_back_off_is_capped_at_30_s(sched: Scheduler) -> None:
    assert sched.restart_delay() == 0.25
    now = time.monotonic()
    sched._crashes.extend([now] * 16)
    assert sched.restart_delay() == 30.0
    sched._crashes.clear()
    sched._crashes.extend([now - 121.0] * 16)  # older than two minutes: forgotten
    assert sched.restart_delay() == 0.25


def test_a_crash_under_a_request_answers_it(sched: Scheduler) -> None:
    made: list[FakeEngine] = []
    sched.load(counting_loader(made, crash_on_complete=True, delay=0.05))
    wait_until(lambda: sched.state == EngineState.READY)
    res = result(sched.submit(req()))
    assert res.text == "" and res.outcome == "error" and "SIGKILL" in str(res.record.error)
    wait_until(lambda: sched.restarts == 1 and sched.state == EngineState.READY)


def test_a_reload_during_the_back_off_wins(sched: Scheduler) -> None:
    made: list[FakeEngine] = []
    sched.load(counting_loader(made))
    wait_until(lambda: sched.state == EngineState.READY)
    made[0].crash()
    chosen = FakeEngine(text="chosen")
    sched.load(lambda: chosen)
    wait_until(lambda: sched.engine is chosen)
    time.sleep(0.4)  # past the 0.25 s back-off: the restart timer must not replace it
    assert sched.engine is chosen and sched.restarts == 0 and len(made) == 1


def test_a_late_exit_of_a_replaced_engine_is_ignored(sched: Scheduler) -> None:
    old = ready(sched, FakeEngine())
    ready(sched, FakeEngine(text="new"))
    old.closed = False  # a late watcher thread of the old process
    old.crash()
    assert sched.state == EngineState.READY and sched.restarts == 0


def test_shutdown_answers_what_is_queued(log_path: Path) -> None:
    sched = Scheduler(LatencyLog(log_path))
    engine = ready(sched, FakeEngine(delay=0.3))
    running = sched.submit(req("file:///a.py"))
    wait_until(engine.started.is_set)
    queued = sched.submit(req("file:///b.py"))
    sched.shutdown(timeout=2.0)
    assert result(queued, 1.0).outcome == "cancelled"
    assert result(running).outcome in ("cancelled", "returned")
    assert engine.closed


# --- idle prefill -----------------------------------------------------------------------


def idle(uri: str = "file:///a.py") -> CompletionRequest:
    """An idle prefill job for ``uri``'s opening."""
    return CompletionRequest(uri=uri, version=1, prefix="def add(a, b):\n", suffix="",
                             prefill="open")


def test_a_request_stops_idle_prefill_at_once(sched: Scheduler, log_path: Path) -> None:
    engine = ready(sched, FakeEngine(delay=0.5))
    job = idle()
    assert sched.prefill(job)
    wait_until(lambda: bool(engine.calls))
    t0 = time.monotonic()
    res = result(sched.submit(req()))
    # The request waited for the idle job to stop, not for it to finish, then ran.
    assert res.text == "return a + b"
    assert time.monotonic() - t0 < 0.5 + 0.3
    assert engine.interrupted == [job.request_id]
    assert [c.prefill for c in engine.calls] == ["open", ""]
    wait_until(lambda: len(records(log_path)) == 2)
    outcomes = [r["outcome"] for r in records(log_path)]
    assert outcomes == ["prefill_stopped", "returned"]


def test_closing_a_document_stops_its_idle_work_not_others(sched: Scheduler,
                                                          log_path: Path) -> None:
    engine = ready(sched, FakeEngine(delay=10.0))
    job = idle()
    assert sched.prefill(job)
    wait_until(lambda: bool(engine.calls))
    sched.cancel_uri("file:///b.py", "cancelled", idle=True)  # another document's close
    sched.cancel_uri("file:///a.py", "superseded")  # an edit: the idle work stands
    assert engine.interrupted == []
    sched.cancel_uri("file:///a.py", "cancelled", idle=True)
    assert engine.interrupted == [job.request_id]
    # It stops at once, long before its 10 s.
    wait_until(lambda: [r["outcome"] for r in records(log_path)] == ["prefill_stopped"], 2.0)


def test_idle_prefill_waits_for_requests_and_yields_to_newer(sched: Scheduler,
                                                             log_path: Path) -> None:
    engine = ready(sched, FakeEngine(delay=0.2))
    fut = sched.submit(req())
    wait_until(lambda: bool(engine.calls))
    assert not sched.prefill(idle())  # a request is running: no idle work now
    result(fut)
    first, second = idle("file:///a.py"), idle("file:///b.py")
    engine.delay = 0.3
    assert sched.prefill(first)
    assert sched.prefill(second)  # replaces (or stops) the first
    wait_until(lambda: any(c.uri == "file:///b.py" for c in engine.calls))
    wait_until(lambda: any(r.get("outcome") == "prefill" for r in records(log_path)))
    done = [r for r in records(log_path) if r.get("outcome") == "prefill"]
    assert [r["uri"] for r in done] == ["file:///b.py"]


def test_idle_prefill_is_not_counted_as_a_request(sched: Scheduler, log_path: Path) -> None:
    from fimls.latency import read_records, summarize

    ready(sched, FakeEngine(delay=0.0))
    assert sched.prefill(idle())
    wait_until(lambda: len(records(log_path)) == 1)
    result(sched.submit(req()))
    wait_until(lambda: len(records(log_path)) == 2)
    s = summarize(read_records(log_path))
    assert s["requests"] == 1 and s["outcomes"] == {"returned": 1}
    assert s["idle_prefill"]["runs"] == 1 and s["idle_prefill"]["stopped"] == 0


def typed(n: int, base: CompletionRequest | None = None, text: str = "return a + b",
          ) -> CompletionRequest:
    """``base`` (default: :func:`req`) after typing the first ``n`` characters of ``text``."""
    b = base or req()
    return CompletionRequest(uri=b.uri, version=(b.version or 0) + n,
                             prefix=b.prefix + text[:n], suffix=b.suffix)


def test_typing_the_shown_suggestion_is_answered_without_the_engine(
        sched: Scheduler, log_path: Path) -> None:
    engine = ready(sched, FakeEngine(text="return a + b", typed_from_memo=True))
    first = req()
    assert result(sched.submit(first)).text == "return a + b"
    # The prefetch of what follows is running: the keystroke must neither wait for it nor
    # stop it.
    engine.delay = 1.0
    nxt = CompletionRequest(uri=first.uri, version=1, prefix=first.prefix + "return a + b",
                            suffix="", prefill="next")
    assert sched.prefill(nxt)
    wait_until(lambda: len(engine.calls) == 2)
    t0 = time.monotonic()
    res = result(sched.submit(typed(3)), 0.5)
    assert time.monotonic() - t0 < 0.5
    assert res.text == "urn a + b" and res.outcome == "returned" and res.record.stop == "memo"
    assert engine.interrupted == [] and len(engine.calls) == 2
    # Asking for the same prefetch again (the server does after every answer) keeps it.
    again = CompletionRequest(uri=first.uri, version=4, prefix=nxt.prefix, suffix="",
                              prefill="next")
    assert sched.prefill(again)
    assert engine.interrupted == []
    wait_until(lambda: any(r.get("outcome") == "prefill" for r in records(log_path)))
    assert sched.prefill(again) and len(engine.calls) == 2  # done: nothing to redo
    memo = [r for r in records(log_path) if r.get("stop") == "memo"]
    assert len(memo) == 1 and memo[0]["outcome"] == "returned"
    # Typing something else is the engine's business.
    engine.delay = 0.0
    other = CompletionRequest(uri=first.uri, version=9, prefix=first.prefix + "x",
                              suffix="")
    assert result(sched.submit(other)).record.stop != "memo"
    assert engine.calls[-1] is other


def test_an_engine_without_a_memo_answers_typing_itself(sched: Scheduler) -> None:
    engine = ready(sched, FakeEngine(text="return a + b"))
    result(sched.submit(req()))
    res = result(sched.submit(typed(3)))
    assert res.text == "return a + b" and len(engine.calls) == 2


@pytest.mark.parametrize("outcome", ["gated", "superseded"])
def test_the_copy_forgets_what_the_engine_may_have_replaced(sched: Scheduler,
                                                           outcome: str) -> None:
    engine = ready(sched, FakeEngine(text="return a + b", typed_from_memo=True))
    result(sched.submit(req()))
    # A request elsewhere: the engine's memo now holds its answer, not the one shown.
    elsewhere = CompletionRequest(uri=req().uri, version=2, prefix=req().prefix + "\n",
                                  suffix="", min_confidence=0.5)
    if outcome == "gated":
        engine.confidence = 0.1
        res = result(sched.submit(elsewhere))
        assert res.outcome == "gated" and res.text == ""
    else:
        engine.delay = 0.5
        fut = sched.submit(elsewhere)
        wait_until(lambda: len(engine.calls) == 2)
        sched.cancel_uri(req().uri)
        assert result(fut).outcome == "superseded"
        wait_until(lambda: sched._running is None)
    engine.delay = 0.0
    n = len(engine.calls)
    result(sched.submit(typed(3)))
    assert len(engine.calls) == n + 1  # the engine answered, not the copy
