"""The engine in a worker process, so that a native crash cannot take the editor's server down.

llama.cpp is C++: a failed assert calls ``abort()``, a bad GGUF can segfault, and a model
that does not fit invites the OOM killer. None of that may cost the user their language
server. :class:`ProcessEngine` has the engine's interface (``complete``, ``reset``,
``close``) and forwards each call over a pipe to ``python -m fimls.engine.worker``, which
owns the real :class:`~fimls.engine.core.Engine`.

Wire format: length-prefixed pickles, both ways (both ends are this package; nothing from
the client is ever unpickled, the request is built by the server). The child keeps its
message channel off file descriptor 1 so that native code printing to stdout cannot corrupt
it, and exits as soon as its stdin closes (the server is gone, however it died).

When the worker dies, the request in flight fails with :class:`WorkerDied` (the scheduler
answers it empty), the exit status and the tail of the worker's stderr are logged, and the
``on_exit`` callback lets the scheduler start a new worker with back-off.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import queue
import signal
import struct
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from functools import partial
from typing import IO, Any

from fimls.config import ModelOptions
from fimls.engine.api import (
    CompletionRequest,
    CompletionResult,
    EngineConfig,
    EngineError,
    ModelLoadError,
    describe_error,
)
from fimls.engine.device import Placement
from fimls.models import catalogue_name

log = logging.getLogger(__name__)

_HEADER = struct.Struct("<I")
_DEAD = ("dead",)
STDERR_TAIL_LINES = 20


class WorkerDied(EngineError):
    """The worker process exited while a request was in flight."""


def _send(fh: IO[bytes], msg: tuple[Any, ...]) -> None:
    data = pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL)
    fh.write(_HEADER.pack(len(data)) + data)
    fh.flush()


def _read_exact(fh: IO[bytes], n: int) -> bytes:
    chunks: list[bytes] = []
    while n:
        chunk = fh.read(n)
        if not chunk:
            raise EOFError
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def _recv(fh: IO[bytes]) -> tuple[Any, ...]:
    (size,) = _HEADER.unpack(_read_exact(fh, _HEADER.size))
    msg = pickle.loads(_read_exact(fh, size))
    assert isinstance(msg, tuple)
    return msg


def describe_exit(code: int | None) -> str:
    """``exit status 1`` or ``killed by signal 9 (SIGKILL)``, from a Popen return code."""
    if code is None:
        return "still running"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = "unknown signal"
        return f"killed by signal {-code} ({name})"
    return f"exit status {code}"


class ProcessEngine:
    """The engine interface, served by a child process that owns the model."""

    def __init__(self, cfg: EngineConfig, *, log_level: str = "INFO",
                 load_timeout_s: float = ModelOptions.load_timeout_s,
                 cancel_grace_s: float = ModelOptions.cancel_grace_ms / 1000.0,
                 nice: int = ModelOptions.worker_nice) -> None:
        """Start the worker and load ``cfg``'s model in it at ``nice`` below this process's
        CPU priority; raise ModelLoadError if that fails, the worker dies, or the load takes
        longer than ``load_timeout_s``."""
        self.cfg = cfg
        self.cancel_grace_s = cancel_grace_s
        self.model_name = catalogue_name(cfg.model_path) or cfg.model_path.name
        self.warnings: list[str] = []
        self.typed_from_memo = False  # the worker says, once the model is loaded
        self.placement = Placement()  # likewise
        self.on_exit: Callable[[str], None] | None = None
        self._replies: queue.Queue[tuple[Any, ...]] = queue.Queue()
        self._outbox: queue.Queue[tuple[Any, ...] | None] = queue.Queue()
        self._stderr_tail: deque[str] = deque(maxlen=STDERR_TAIL_LINES)
        self._closing = False
        self._current: str | None = None
        self.exit_reason: str | None = None
        # On an assert, ggml attaches gdb to print a backtrace: seconds of delay and a
        # screenful of noise where one line (the assert) says what happened.
        env = {**os.environ, "GGML_NO_BACKTRACE": "1"}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "fimls.engine.worker"], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, bufsize=0, env=env)
        assert self.proc.stdin and self.proc.stdout and self.proc.stderr
        self._stdin = self.proc.stdin
        self._stderr_thread = threading.Thread(target=self._pump_stderr, daemon=True,
                                               name="fimls-worker-stderr")
        self._stderr_thread.start()
        threading.Thread(target=self._pump_replies, daemon=True,
                         name="fimls-worker-replies").start()
        threading.Thread(target=self._pump_out, daemon=True, name="fimls-worker-out").start()
        self._post(("load", cfg, log_level, nice))  # a death shows up as the reply below
        try:
            reply = self._replies.get(timeout=load_timeout_s)
        except queue.Empty:
            # A load that hangs (a stalled network mount, a FIFO, a wedged driver) would
            # otherwise hold the engine thread, and every later request, forever.
            self._closing = True
            self.proc.kill()
            self.close()
            raise ModelLoadError(
                f"the model {cfg.model_path} did not load within {load_timeout_s:g} s "
                f"(loadTimeoutS): the engine worker was killed{self._tail_text()}") from None
        if reply[0] == "ready":
            self.model_name = reply[1]
            self.warnings = list(reply[2])
            self.typed_from_memo = bool(reply[3])
            self.placement = reply[4]
            log.info("engine worker pid %d serving %s", self.proc.pid, self.model_name)
            return
        self.close()
        if reply[0] == "load_error":
            raise ModelLoadError(reply[1])
        raise ModelLoadError(f"the engine worker died while loading {cfg.model_path}: "
                             f"{self.exit_reason}{self._tail_text()}")

    @property
    def pid(self) -> int:
        """The worker's process id."""
        return self.proc.pid

    # -- pipes -----------------------------------------------------------------------------

    def _post(self, msg: tuple[Any, ...] | None) -> None:
        # Never write from the caller's thread: a stopped or hung worker fills the pipe,
        # and the scheduler (holding its lock on the event loop thread) must not block.
        self._outbox.put(msg)

    def _pump_out(self) -> None:
        while (msg := self._outbox.get()) is not None:
            try:
                _send(self._stdin, msg)
            except (OSError, ValueError):
                return  # the worker is gone; the reply pump reports it

    def _pump_replies(self) -> None:
        out = self.proc.stdout
        assert out is not None
        try:
            while True:
                self._replies.put(_recv(out))
        except (EOFError, OSError, pickle.UnpicklingError, struct.error):
            pass
        self._stderr_thread.join(2.0)  # the last words usually explain the death
        try:
            code = self.proc.wait(5.0)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        self.exit_reason = describe_exit(code)
        # Decided before the waiter hears of the death: it may close us right after, and
        # an unexpected death must still be reported.
        closing = self._closing
        self._replies.put(_DEAD)
        if closing:
            return
        log.error("the engine worker (pid %d) exited unexpectedly: %s%s", self.proc.pid,
                  self.exit_reason, self._tail_text())
        if self.on_exit is not None:
            try:
                self.on_exit(self.exit_reason)
            except Exception:
                log.exception("worker exit callback failed")

    def _pump_stderr(self) -> None:
        err = self.proc.stderr
        assert err is not None
        for raw in iter(err.readline, b""):
            line = raw.decode("utf-8", "replace").rstrip("\n")
            self._stderr_tail.append(line)
            # The worker's own log lines, passed through to the server's stderr.
            print(line, file=sys.stderr, flush=True)

    def _tail_text(self) -> str:
        lines = [t for t in self._stderr_tail if t.strip()]
        return ("; last stderr lines:\n  " + "\n  ".join(lines)) if lines else ""

    # -- engine interface ------------------------------------------------------------------

    def complete(self, req: CompletionRequest, cancelled: Callable[[], bool]) -> CompletionResult:
        """Run ``req`` in the worker; ``cancelled`` is polled and forwarded."""
        t0 = time.monotonic()
        self._current = req.request_id
        self._post(("complete", req))
        cancel_at: float | None = None
        try:
            while True:
                try:
                    reply = self._replies.get(timeout=0.05)
                except queue.Empty:
                    if cancel_at is None and cancelled():
                        self._cancel(req.request_id)
                        cancel_at = time.monotonic()
                    elif (cancel_at is not None and self.proc.poll() is None
                          and time.monotonic() - cancel_at > self.cancel_grace_s):
                        # A worker that cannot stop is hung (a deadlock, a stopped process,
                        # native code that never polls the abort flag): end it, so that the
                        # usual death path answers and restarts.
                        log.error("the engine worker (pid %d) did not stop within %g s of "
                                  "a cancel: killing it", self.proc.pid, self.cancel_grace_s)
                        self.proc.kill()
                        cancel_at = float("inf")
                    continue
                if reply is _DEAD:
                    raise WorkerDied(f"engine worker {self.exit_reason}")
                if reply[1] != req.request_id:
                    continue  # a late answer to an earlier request
                if reply[0] == "error":
                    raise EngineError(f"engine worker: {reply[2]}")
                result: CompletionResult = reply[2]
                engine_ms: float = reply[3]
                now = time.monotonic()
                rec = result.record
                rec.hop_ms = max(0.0, (now - t0) * 1000.0 - engine_ms)
                rec.total_ms = (now - req.created) * 1000.0
                return result
        finally:
            self._current = None

    def interrupt(self, request_id: str) -> None:
        """Cancel ``request_id`` now if it is the one in the worker (any thread)."""
        if self._current == request_id:
            self._cancel(request_id)

    def _cancel(self, request_id: str) -> None:
        self._post(("cancel", request_id))

    def reset(self) -> None:
        """Forget the KV cache and remembered suggestions."""
        if self.proc.poll() is None:
            self._post(("reset",))

    def close(self, timeout: float = 3.0) -> None:
        """Stop the worker (politely, then not)."""
        self._closing = True
        if self.proc.poll() is None:
            self._post(("close",))
        self._post(None)  # ends the writer thread
        if self.proc.poll() is None:
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        with contextlib.suppress(OSError):
            self._stdin.close()


# -- the worker side -------------------------------------------------------------------------


def _lower_priority(nice: int) -> None:
    """Lower this process's CPU priority by ``nice``, before any other thread exists.

    The model's threads spin on every core while it prefills or decodes, a prefetch
    included; at equal priority the server's reply to a typed character (a memo answer:
    0.1 ms of work) waited for a time slice, 1 to 12 ms (the cross-file bench's keystroke
    p75 went from about 6 ms to 3 ms at nice 5). Linux keeps a nice value per thread and a
    new thread inherits its creator's, so this runs before llama.cpp starts its threads.
    """
    if nice <= 0 or not hasattr(os, "nice"):
        return
    try:
        os.nice(nice)
    except OSError as exc:
        log.warning("could not lower the engine worker's CPU priority: %s", exc)


def _worker_main() -> int:
    # Messages go out on a private copy of fd 1; fd 1 itself now points at stderr, so a
    # stray printf in native code lands in the log instead of the middle of a message.
    out = os.fdopen(os.dup(1), "wb", buffering=0)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    inp = sys.stdin.buffer
    try:
        first = _recv(inp)
    except EOFError:
        return 0
    _, cfg, level, nice = first
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s[worker]: %(message)s")
    logging.getLogger("fimls").setLevel(level)
    _lower_priority(nice)

    from fimls.engine.core import Engine
    try:
        engine = Engine(cfg)
    except ModelLoadError as exc:
        _send(out, ("load_error", str(exc)))
        return 1
    _send(out, ("ready", engine.model_name, list(engine.warnings), engine.typed_from_memo,
                engine.placement))

    jobs: queue.Queue[tuple[Any, ...]] = queue.Queue()
    cancelled_ids: set[str] = set()

    def reader() -> None:
        while True:
            try:
                msg = _recv(inp)
            except (EOFError, OSError):
                # The server is gone (however it died): so is the reason to exist.
                os._exit(0)
            if msg[0] == "cancel":
                cancelled_ids.add(msg[1])
            else:
                jobs.put(msg)

    threading.Thread(target=reader, daemon=True, name="fimls-worker-reader").start()
    while True:
        _serve_one(engine, jobs.get(), cancelled_ids, out)


def _serve_one(engine: Any, msg: tuple[Any, ...], cancelled_ids: set[str], out: Any) -> None:
    """One message from the server: a request, a reset of the cache, or the end."""
    kind = msg[0]
    if kind == "complete":
        req: CompletionRequest = msg[1]
        rid = req.request_id
        t0 = time.monotonic()
        try:
            result = engine.complete(req, partial(set.__contains__, cancelled_ids, rid))
        except Exception as exc:
            log.error("engine failed on request %s: %s", rid, describe_error(exc))
            log.debug("engine failure", exc_info=True)
            engine.reset()
            _send(out, ("error", rid, describe_error(exc)))
        else:
            _send(out, ("result", rid, result, (time.monotonic() - t0) * 1000.0))
        # One request at a time: any cancel still in the set is for this one or late.
        cancelled_ids.clear()
    elif kind == "reset":
        engine.reset()
        cancelled_ids.clear()
    elif kind == "close":
        engine.close()
        # Not a normal interpreter exit: the reader thread is blocked in stdin, and
        # finalizing under it aborts ("could not acquire lock for <stdin>").
        sys.stderr.flush()
        os._exit(0)


if __name__ == "__main__":
    sys.exit(_worker_main())
