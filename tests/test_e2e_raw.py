"""Raw JSON-RPC over stdio, for what a well-behaved client library cannot send."""

from __future__ import annotations

import json
import select
import subprocess
import sys
import time
from typing import Any

import pytest


class Raw:
    """A bare stdio JSON-RPC peer for ``fimls serve``."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "fimls", "serve", "--log-level",
                                      "ERROR"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL)

    def send(self, obj: Any) -> None:
        body = obj if isinstance(obj, bytes) else json.dumps(obj).encode()
        assert self.proc.stdin is not None
        self.proc.stdin.write(b"Content-Length: %d\r\n\r\n" % len(body) + body)
        self.proc.stdin.flush()

    def recv(self, timeout: float = 10.0) -> dict[str, Any] | None:
        out = self.proc.stdout
        assert out is not None
        ready, _, _ = select.select([out], [], [], timeout)
        if not ready:
            return None
        header = b""
        while not header.endswith(b"\r\n\r\n"):
            header += out.read(1)
        n = int(header.split(b"Content-Length: ")[1].split(b"\r\n")[0])
        return dict(json.loads(out.read(n)))

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


@pytest.fixture
def raw() -> Raw:
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
