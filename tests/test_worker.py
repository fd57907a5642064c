"""The engine's process boundary: exit descriptions, scrubbing, error redaction, and a real
worker that fails to load or dies under a request."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from fimls.config import Options, apply_dict
from fimls.engine import make_engine, worker
from fimls.engine.api import (
    CompletionRequest,
    EngineConfig,
    ModelLoadError,
    describe_error,
    scrub,
)
from fimls.engine.worker import ProcessEngine, WorkerDied, describe_exit
from fimls.models import resolve_model


def test_describe_exit() -> None:
    assert describe_exit(-9) == "killed by signal 9 (SIGKILL)"
    assert describe_exit(-11) == "killed by signal 11 (SIGSEGV)"
    assert describe_exit(1) == "exit status 1"
    assert describe_exit(None) == "still running"


def test_scrub_keeps_offsets() -> None:
    text = "caf\udce9 = 1\ud800"
    out = scrub(text)
    assert len(out) == len(text) and out == "caf\ufffd = 1\ufffd"
    out.encode("utf-8")
    plain = "nothing to do 😀"
    assert scrub(plain) is plain
    req = CompletionRequest(uri="u", version=1, prefix="a\udc80", suffix="\ud800b",
                            neighbors=["\udfff"])
    assert (req.prefix, req.suffix, req.neighbors) == ("a\ufffd", "\ufffdb", ["\ufffd"])


def test_describe_error_never_quotes_the_input() -> None:
    try:
        "secret text \udc80".encode()
    except UnicodeEncodeError as exc:
        assert "secret" not in describe_error(exc)
        assert describe_error(exc).startswith("UnicodeEncodeError")
    assert describe_error(ModelLoadError("model file not found: /m.gguf")) == (
        "model file not found: /m.gguf")


def test_worker_load_error_is_a_model_load_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + os.urandom(4096))  # passes the magic check, not llama.cpp
    with pytest.raises(ModelLoadError) as info:
        ProcessEngine(EngineConfig(model_path=bad, measure_costs=False))
    assert str(bad) in str(info.value)


def test_worker_load_timeout_kills_the_worker(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """A load that never finishes (the model path is a FIFO nobody writes: opening it
    blocks) fails with ModelLoadError after the timeout, and the worker is gone."""
    fifo = tmp_path / "hang.gguf"
    os.mkfifo(fifo)
    procs: list[subprocess.Popen[bytes]] = []
    real_popen = subprocess.Popen

    def spy(*args: Any, **kwargs: Any) -> subprocess.Popen[bytes]:
        proc = real_popen(*args, **kwargs)
        procs.append(proc)
        return proc

    monkeypatch.setattr(worker.subprocess, "Popen", spy)
    outcome: list[BaseException | ProcessEngine] = []

    def load() -> None:
        try:
            outcome.append(ProcessEngine(EngineConfig(model_path=fifo, measure_costs=False),
                                         load_timeout_s=2))
        except BaseException as exc:
            outcome.append(exc)

    t0 = time.monotonic()
    # In a thread, so that a load that never returns fails this test instead of hanging it.
    loader = threading.Thread(target=load, daemon=True)
    loader.start()
    loader.join(30)
    took = time.monotonic() - t0
    try:
        assert not loader.is_alive(), "the load did not time out"
        assert len(outcome) == 1 and isinstance(outcome[0], ModelLoadError), outcome
        assert str(fifo) in str(outcome[0]) and "within 2 s" in str(outcome[0])
        assert took < 10
        assert len(procs) == 1 and procs[0].poll() is not None  # killed and reaped
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def test_make_engine_passes_the_worker_options(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """loadTimeoutS and cancelGraceMs reach the worker engine (no environment variable)."""
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF" + bytes(60))
    monkeypatch.setenv("FIMLS_CACHE_DIR", str(tmp_path / "cache"))
    seen: dict[str, Any] = {}

    class Fake:
        def __init__(self, cfg: EngineConfig, **kwargs: Any) -> None:
            seen.update(kwargs, cfg=cfg)

    monkeypatch.setattr(worker, "ProcessEngine", Fake)
    opts, warnings = apply_dict(Options(), {"model": str(model), "loadTimeoutS": 7,
                                            "cancelGraceMs": 1500, "workerNice": 2,
                                            "logLevel": "debug"})
    assert warnings == []
    assert isinstance(make_engine(opts), Fake)
    assert seen["load_timeout_s"] == 7 and seen["cancel_grace_s"] == 1.5
    assert seen["nice"] == 2
    assert seen["log_level"] == "DEBUG"
    assert seen["cfg"].model_path == model
    assert seen["cfg"].cost_cache == tmp_path / "cache" / "verify-costs.json"


def _thread_nice(pid: int) -> dict[int, int]:
    """Each thread of ``pid`` and its nice value (field 19 of /proc/PID/task/TID/stat)."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{tid}/stat", encoding="ascii") as fh:
            # The command name (field 2) may hold spaces: count from its closing bracket.
            fields = fh.read().rsplit(")", 1)[1].split()
        out[int(tid)] = int(fields[16])
    return out


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="Linux /proc only")
def test_the_worker_and_every_thread_it_computes_on_run_at_a_lower_priority() -> None:
    """Linux keeps nice per thread: llama.cpp's compute threads must inherit it too, or the
    model's spinning threads still take the cores from the server's replies."""
    own = os.getpriority(os.PRIO_PROCESS, 0)
    eng = ProcessEngine(EngineConfig(model_path=resolve_model(None), threads=2,
                                     measure_costs=False), nice=3)
    try:
        req = CompletionRequest(uri="file:///a.py", version=1, max_tokens=8,
                                prefix="def fibonacci(n):\n    ", suffix="")
        assert eng.complete(req, lambda: False).text  # the compute threads exist now
        nice = _thread_nice(eng.pid)
    finally:
        eng.close()
    assert len(nice) >= 2
    assert set(nice.values()) == {min(19, own + 3)}


def test_worker_death_under_a_request_raises_and_reports(caplog: pytest.LogCaptureFixture,
                                                         ) -> None:
    eng = ProcessEngine(EngineConfig(model_path=resolve_model(None)), log_level="INFO")
    exits: list[str] = []
    eng.on_exit = exits.append
    try:
        req = CompletionRequest(uri="file:///a.py", version=1, max_tokens=64,
                                prefix="def fibonacci(n):\n    ", suffix="")
        warm = eng.complete(req, lambda: False)
        assert warm.text and warm.record.hop_ms >= 0.0
        req2 = CompletionRequest(uri="file:///b.py", version=1, max_tokens=64,
                                 prefix="import os\n\ndef walk(root):\n    ", suffix="")
        threading.Timer(0.05, os.kill, (eng.pid, signal.SIGSEGV)).start()
        with pytest.raises(WorkerDied, match="SIGSEGV"):
            eng.complete(req2, lambda: False)
        # The watcher thread reports the death just after it wakes the request; closing
        # before it has (a busy machine) would mark the exit as expected and skip the report.
        deadline = time.monotonic() + 10
        while not exits and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        eng.close()
    assert exits == ["killed by signal 11 (SIGSEGV)"]
    died = [r.getMessage() for r in caplog.records if "exited unexpectedly" in r.getMessage()]
    assert died and "last stderr lines" in died[0] and "loaded" in died[0]
