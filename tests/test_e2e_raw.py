"""Raw JSON-RPC over stdio, for what a well-behaved client library cannot send."""

from __future__ import annotations

import itertools
import json
import os
import random
import select
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest


class Raw:
    """A bare stdio JSON-RPC peer for ``fimls serve`` (or for ``command``, a server such as
    the fake-engine one in tests/fake_server.py)."""

    def __init__(self, *args: str, command: Sequence[str] | None = None) -> None:
        cmd = list(command or [sys.executable, "-m", "fimls", "serve", "--log-level", "ERROR",
                               "--min-confidence", "0"])
        self.proc = subprocess.Popen([*cmd, *args], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        self._ids = itertools.count(1000)
        self._buf = b""

    def send(self, obj: Any) -> None:
        body = obj if isinstance(obj, bytes) else json.dumps(obj).encode()
        assert self.proc.stdin is not None
        self.proc.stdin.write(b"Content-Length: %d\r\n\r\n" % len(body) + body)
        self.proc.stdin.flush()

    def _fill(self, deadline: float) -> bool:
        # Our own buffer over the raw fd: select() cannot see bytes a buffered reader
        # already pulled in, which would hang a reply that arrived with a notification.
        out = self.proc.stdout
        assert out is not None
        ready, _, _ = select.select([out], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            return False
        chunk = os.read(out.fileno(), 65536)
        if not chunk:
            return False
        self._buf += chunk
        return True

    def recv(self, timeout: float = 10.0) -> dict[str, Any] | None:
        deadline = time.monotonic() + timeout
        while b"\r\n\r\n" not in self._buf:
            if not self._fill(deadline):
                return None
        header, rest = self._buf.split(b"\r\n\r\n", 1)
        n = int(header.split(b"Content-Length: ")[1].split(b"\r\n")[0])
        while len(rest) < n:
            if not self._fill(deadline + 30):
                return None
            header, rest = self._buf.split(b"\r\n\r\n", 1)
        self._buf = rest[n:]
        return dict(json.loads(rest[:n]))

    def recv_reply(self, msg_id: Any, timeout: float = 10.0) -> dict[str, Any] | None:
        """The response to ``msg_id``, skipping notifications and server requests."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            msg = self.recv(deadline - time.monotonic())
            if msg is None:
                return None
            if "method" not in msg and msg.get("id") == msg_id:
                return msg
        return None

    def request(self, method: str, params: Any, timeout: float = 30.0) -> dict[str, Any]:
        """Send a request and return its whole reply (result or error)."""
        msg_id = next(self._ids)
        self.send({"jsonrpc": "2.0", "id": msg_id, "method": method, "params": params})
        reply = self.recv_reply(msg_id, timeout)
        assert reply is not None, f"no reply to {method}"
        return reply

    def notify(self, method: str, params: Any) -> None:
        self.send({"jsonrpc": "2.0", "method": method, "params": params})

    def wait_ready(self, timeout: float = 120.0) -> dict[str, Any]:
        """Poll fimls/status until the model is loaded; the status."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            st = self.request("fimls/status", None)["result"]
            if st["state"] == "ready":
                return dict(st)
            time.sleep(0.1)
        raise AssertionError("model did not load")

    def inline_params(self, uri: str, line: int, character: int) -> dict[str, Any]:
        return {"textDocument": {"uri": uri}, "position": {"line": line, "character": character},
                "context": {"triggerKind": 2}}

    def open(self, uri: str, text: str) -> None:
        self.notify("textDocument/didOpen", {"textDocument": {
            "uri": uri, "languageId": "python", "version": 1, "text": text}})


def gone(pid: int, timeout: float) -> bool:
    """True once ``pid`` has exited (a zombie nobody reaped counts as exited)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return True
        if stat.rsplit(")", 1)[1].split()[0] in ("Z", "X"):
            return True
        time.sleep(0.05)
    return False


@pytest.fixture
def raw() -> Iterator[Raw]:
    peer = Raw()
    peer.send({"jsonrpc": "2.0", "id": 1, "method": "initialize",
               "params": {"capabilities": {}}})
    assert peer.recv_reply(1) is not None
    peer.send({"jsonrpc": "2.0", "method": "initialized", "params": {}})
    yield peer
    if peer.proc.poll() is None:
        peer.proc.kill()
    peer.proc.wait(10)


def test_request_before_initialize_is_refused() -> None:
    peer = Raw()
    try:
        peer.send({"jsonrpc": "2.0", "id": 7, "method": "textDocument/inlineCompletion",
                   "params": {"textDocument": {"uri": "file:///a.py"},
                              "position": {"line": 0, "character": 0},
                              "context": {"triggerKind": 1}}})
        reply = peer.recv_reply(7)
        assert reply is not None and reply["error"]["code"] == -32002
        peer.send({"jsonrpc": "2.0", "id": 8, "method": "initialize",
                   "params": {"capabilities": {}}})
        reply = peer.recv_reply(8)
        assert reply is not None and "capabilities" in reply["result"]
    finally:
        peer.proc.kill()
        peer.proc.wait(10)


def test_invalid_params_get_an_error_reply(raw: Raw) -> None:
    raw.send({"jsonrpc": "2.0", "id": 2, "method": "textDocument/inlineCompletion",
              "params": {"textDocument": {"uri": "file:///a.py"}}})
    reply = raw.recv_reply(2)
    assert reply is not None and reply["error"]["code"] == -32602


def test_malformed_json_gets_a_parse_error_and_the_server_lives(raw: Raw) -> None:
    raw.send(b"{not json")
    reply = raw.recv_reply(None)
    assert reply is not None and reply["error"]["code"] == -32700
    raw.send({"jsonrpc": "2.0", "id": 3, "method": "foo/bar", "params": {}})
    reply = raw.recv_reply(3)
    assert reply is not None and reply["error"]["code"] == -32601
    raw.send({"jsonrpc": "2.0", "id": 4, "method": "textDocument/inlineCompletion",
              "params": {"textDocument": {"uri": "file:///none.py"},
                         "position": {"line": 0, "character": 0},
                         "context": {"triggerKind": 1}}})
    reply = raw.recv_reply(4)
    assert reply is not None and reply["result"]["items"] == []


def test_closing_stdin_ends_the_server(raw: Raw) -> None:
    assert raw.proc.stdin is not None
    raw.proc.stdin.close()
    assert raw.proc.wait(15) is not None


def test_closing_stdin_mid_request_ends_server_and_worker(raw: Raw) -> None:
    st = raw.wait_ready()
    raw.open("file:///w/a.py", "def fibonacci(n):\n    ")
    raw.send({"jsonrpc": "2.0", "id": 50, "method": "textDocument/inlineCompletion",
              "params": raw.inline_params("file:///w/a.py", 1, 4)})
    assert raw.proc.stdin is not None
    raw.proc.stdin.close()
    assert raw.proc.wait(15) is not None
    assert gone(st["workerPid"], 10), "the engine worker outlived the server"


def test_requests_after_shutdown_are_refused_then_exit(raw: Raw) -> None:
    st = raw.wait_ready()
    assert raw.request("shutdown", None)["result"] is None
    reply = raw.request("textDocument/inlineCompletion", raw.inline_params("file:///w/a.py", 0, 0))
    assert reply["error"]["code"] == -32600  # InvalidRequest: the server is shutting down
    raw.notify("exit", None)
    assert raw.proc.wait(15) == 0
    assert gone(st["workerPid"], 10)


def test_exit_without_shutdown(raw: Raw) -> None:
    st = raw.wait_ready()
    raw.notify("exit", None)
    assert raw.proc.wait(15) == 1  # the spec's exit code when shutdown did not come first
    assert gone(st["workerPid"], 10)


def test_positions_negative_and_huge(raw: Raw) -> None:
    raw.open("file:///w/p.py", "import os\nprint(os.")
    for line, character in ((-1, 0), (0, -5)):
        reply = raw.request("textDocument/inlineCompletion",
                            raw.inline_params("file:///w/p.py", line, character))
        assert reply["error"]["code"] == -32602
    reply = raw.request("textDocument/inlineCompletion",
                        raw.inline_params("file:///w/p.py", 2**31 - 1, 2**31 - 1))
    assert reply["result"] is not None
    reply = raw.request("textDocument/inlineCompletion",
                        raw.inline_params("file:///w/p.py", 1, 2**31 - 1))
    for item in reply["result"]["items"]:
        assert item["range"]["start"] == {"line": 1, "character": 9}


def test_text_that_was_not_utf8_on_disk(raw: Raw) -> None:
    """Editors send undecodable bytes as U+FFFD, as Latin-1, or (some Python clients, via
    surrogateescape) as lone surrogates in JSON escapes: none of it may break a request."""
    raw.wait_ready()
    # Lone surrogates travel as JSON escapes (json.dumps writes them that way).
    text = "caf\udce9 = 'ol\udcc3'\nname = '\ufffd\u00e9t\u00e9'\ndef greet(who):\n    "
    raw.open("file:///w/latin.py", text)
    raw.notify("textDocument/didChange", {
        "textDocument": {"uri": "file:///w/latin.py", "version": 2},
        "contentChanges": [{"range": {"start": {"line": 0, "character": 0},
                                      "end": {"line": 0, "character": 0}}, "text": "\ud800#"}]})
    for line, character in ((3, 4), (0, 5), (1, 3)):
        reply = raw.request("textDocument/inlineCompletion",
                            raw.inline_params("file:///w/latin.py", line, character), 120)
        assert "result" in reply, reply
    # The server lives, and the next request on ordinary text is served.
    raw.open("file:///w/ok.py", "def add(a, b):\n    return a")
    reply = raw.request("textDocument/inlineCompletion",
                        raw.inline_params("file:///w/ok.py", 1, 12), 120)
    assert reply["result"]["items"], reply


# A message body, the id its error reply carries, and the error code.
ODD_MESSAGES: list[tuple[bytes, Any, int]] = [
    (b"null", None, -32600),
    (b"42", None, -32600),
    (b'"text"', None, -32600),
    (b'[{"jsonrpc": "2.0", "id": 1, "method": "fimls/status"}]', None, -32600),  # no batches
    (b'{"jsonrpc": "2.0", "id": null, "method": "fimls/status"}', None, -32600),
    (b'{"jsonrpc": "2.0", "id": 6, "method": 123}', 6, -32600),
    (b'{"jsonrpc": "1.0", "id": 7, "method": "fimls/status"}', 7, -32600),
    (b'{"jsonrpc": "2.0", "id": 8}', 8, -32600),
    (b'{"id": 9, "method": "fimls/status"}', 9, -32600),
    (b'{"jsonrpc": "2.0", "id": 10, "method": "$/unknown"}', 10, -32601),
    (b'{"jsonrpc": "2.0", "id": 11, "method": "textDocument/inlineCompletion", '
     b'"params": [1, 2]}', 11, -32602),
    (b'{"jsonrpc": "2.0", "id": 12, "method": "textDocument/inlineCompletion", "params": '
     b'{"textDocument": {"uri": "file:///a"}, "position": {"line": 1099511627776, '
     b'"character": 0}, "context": {"triggerKind": 1}}}', 12, -32602),
]


def check_odd_message(raw: Raw, body: bytes, reply_id: Any, code: int) -> None:
    """``body`` gets error ``code`` (for ``reply_id``), and the server serves on."""
    raw.send(body)
    reply = raw.recv_reply(reply_id)
    assert reply is not None and reply["error"]["code"] == code
    # Still alive and serving; params are optional.
    assert raw.request("fimls/status", None)["result"]["serverPid"] == raw.proc.pid
    raw.send({"jsonrpc": "2.0", "id": 99, "method": "fimls/status"})
    assert "result" in (raw.recv_reply(99) or {})


@pytest.mark.parametrize(("body", "reply_id", "code"), ODD_MESSAGES)
def test_odd_messages_get_the_right_error(raw: Raw, body: bytes, reply_id: Any,
                                          code: int) -> None:
    check_odd_message(raw, body, reply_id, code)


def test_messages_that_get_no_reply(raw: Raw) -> None:
    raw.notify("foo/unknownNotification", {"x": 1})
    raw.notify("$/unknownNotification", {})
    raw.send({"jsonrpc": "2.0", "id": 4242, "result": {}})  # a response to nothing
    raw.notify("textDocument/didOpen", {"textDocument": {"uri": "file:///x.py"}})  # bad params
    raw.notify("textDocument/didChange", {  # a range whose end comes before its start
        "textDocument": {"uri": "file:///x.py", "version": 2},
        "contentChanges": [{"range": {"start": {"line": 5, "character": 0},
                                      "end": {"line": 0, "character": 0}}, "text": "x"}]})
    reply = raw.request("fimls/status", None)
    assert reply["id"] != 4242 and "result" in reply


@pytest.mark.parametrize("n_ctx", ["64", "128"])
def test_context_smaller_than_the_prompt(n_ctx: str) -> None:
    """n_ctx far below the document (and, at 64, below prompt budget + max tokens)."""
    peer = Raw("--n-ctx", n_ctx)
    try:
        peer.request("initialize", {"capabilities": {}})
        peer.notify("initialized", {})
        peer.wait_ready()
        body = "".join(f"def function_{i}(x):\n    return x * {i}\n\n" for i in range(300))
        peer.open("file:///w/long.py", body + "def function_300(x):\n    return ")
        for _ in range(2):
            reply = peer.request("textDocument/inlineCompletion",
                                 peer.inline_params("file:///w/long.py", 901, 11), 120)
            assert isinstance(reply["result"]["items"], list)
        if n_ctx == "128":
            assert reply["result"]["items"], "a windowed prompt still completes"
        assert peer.request("fimls/status", None)["result"]["state"] == "ready"
    finally:
        peer.proc.kill()
        peer.proc.wait(10)


def _bad_model(kind: str, tmp: Path) -> Path:
    from fimls.models import resolve_model

    path = tmp / f"{kind}.gguf"
    if kind == "missing":
        return path
    if kind == "directory":
        path.mkdir()
    elif kind == "empty":
        path.write_bytes(b"")
    elif kind == "truncated":
        with resolve_model(None).open("rb") as fh:
            path.write_bytes(fh.read(3_000_000))
    elif kind == "random":
        path.write_bytes(random.Random(3).randbytes(1_000_000))
    elif kind == "random-with-magic":
        path.write_bytes(b"GGUF" + random.Random(4).randbytes(1_000_000))
    return path


@pytest.mark.parametrize("kind", ["missing", "directory", "empty", "truncated", "random",
                                  "random-with-magic"])
def test_bad_model_files(kind: str, tmp_path: Path) -> None:
    """One clear error naming the file; empty answers; then a good model (set through
    didChangeConfiguration) serves the next request."""
    path = _bad_model(kind, tmp_path)
    peer = Raw("--model", str(path))
    try:
        peer.request("initialize", {"capabilities": {}})
        peer.notify("initialized", {})
        deadline = time.monotonic() + 60
        while (st := peer.request("fimls/status", None)["result"])["state"] != "failed":
            assert time.monotonic() < deadline and st["state"] in ("idle", "loading"), st
            time.sleep(0.05)
        assert str(path) in st["error"]
        peer.open("file:///w/a.py", "def add(a, b):\n    return a")
        reply = peer.request("textDocument/inlineCompletion",
                             peer.inline_params("file:///w/a.py", 1, 12))
        assert reply["result"]["items"] == []
        peer.notify("workspace/didChangeConfiguration", {"settings": {"fimls": {"model": None}}})
        time.sleep(0.2)
        peer.wait_ready()
        reply = peer.request("textDocument/inlineCompletion",
                             peer.inline_params("file:///w/a.py", 1, 12), 120)
        assert reply["result"]["items"], reply
    finally:
        peer.proc.kill()
        peer.proc.wait(10)


def test_unusual_uris_and_odd_notifications(raw: Raw) -> None:
    """URIs of every shape editors use, versions going backwards, reopening, closing what
    was never opened, outcome notifications and settings of the wrong types."""
    raw.wait_ready()
    uris = ["untitled:Untitled-1", "file:///home/u/My%20Project/src/a%C3%A9.py",
            "vscode-notebook-cell:/x.ipynb#W0sZmlsZQ%3D%3D", "file:///C:/Users/x/a.py",
            "weird", "", "file://host/share/a.py"]
    for uri in uris:
        raw.open(uri, "def add(a, b):\n    return a")
        reply = raw.request("textDocument/inlineCompletion", raw.inline_params(uri, 1, 12), 60)
        assert isinstance(reply["result"]["items"], list), (uri, reply)
    raw.open("file:///v.py", "x = 1\n")
    raw.notify("textDocument/didChange", {"textDocument": {"uri": "file:///v.py", "version": 0},
                                          "contentChanges": [{"text": "y = 2\n"}]})
    raw.open("file:///v.py", "def sub(a, b):\n    return a")  # reopened without a close
    raw.notify("textDocument/didClose", {"textDocument": {"uri": "file:///never.py"}})
    raw.notify("fimls/didPartiallyAccept", {"requestId": 5, "acceptedLength": "x"})
    raw.notify("fimls/didShowCompletion", None)
    raw.notify("fimls/didAccept", {"requestId": {"nested": True}})
    raw.notify("workspace/didChangeConfiguration", {"settings": None})
    raw.notify("workspace/didChangeConfiguration", {"settings": {"fimls": {
        "maxTokens": "lots", "nCtx": -5, "unknownKey": 1, "completion": [1]}}})
    reply = raw.request("workspace/executeCommand", {"command": "fimls.acceptCompletion",
                                                     "arguments": [{"weird": 1}, None, 5]})
    assert "result" in reply
    reply = raw.request("workspace/executeCommand", {"command": "no.such.command"})
    assert reply["error"]["code"] == -32602
    state = raw.request("fimls/documentState", {"textDocument": {"uri": "file:///v.py"}})
    assert state["result"]["length"] == len("def sub(a, b):\n    return a")
    # The other buffers are seven copies of one function; what the model makes of them as
    # context is not under test here, the server's state is.
    raw.notify("workspace/didChangeConfiguration", {"settings": {"contextTokens": 0}})
    reply = raw.request("textDocument/inlineCompletion",
                        raw.inline_params("file:///v.py", 1, 12), 60)
    assert reply["result"]["items"], reply
    assert raw.request("fimls/status", None)["result"]["state"] == "ready"
