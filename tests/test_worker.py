"""The engine's process boundary: exit descriptions, scrubbing, error redaction, and a real
worker that fails to load or dies under a request."""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

import pytest

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
    finally:
        eng.close()
    assert exits == ["killed by signal 11 (SIGSEGV)"]
    died = [r.getMessage() for r in caplog.records if "exited unexpectedly" in r.getMessage()]
    assert died and "last stderr lines" in died[0] and "loaded" in died[0]
