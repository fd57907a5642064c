"""The canary: a ``.env`` holding a unique token is open beside a ``.py`` file, with
cross-file context and workspace files on. The token must appear in no prompt, in no request
body sent to an ``--engine`` host, in no log line and in no suggestion; a request inside the
``.env`` gets no items (``disabledGlobs``, see :mod:`fimls.disabled`).

Two runs: the engine in this machine's worker process (where no prompt leaves, the server's
own copy of the ``.env`` is checked to be absent), and ``--engine`` against llama-cpp-python's
server behind a proxy that records every request body.
"""

from __future__ import annotations

import http.server
import threading
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.lsp_helpers import end_position, inline, open_doc, session
from tests.test_e2e_remote import QWEN, OpenAIServer, free_port

pytestmark = pytest.mark.asyncio

TOKEN = f"sk-canary-{uuid.uuid4().hex}"
ENV = f"API_BASE=https://api.example.com\nAPI_TOKEN={TOKEN}\nDEBUG=1\nAPI_"
APP = ('"""The service\'s settings."""\n\nimport os\n\nAPI_BASE = os.environ["API_BASE"]\n'
       'DEBUG = os.environ.get("DEBUG") == "1"\n\n\ndef headers() -> dict[str, str]:\n'
       '    """The headers of every request to the API."""\n    return {"Authorization": ')


class RecordingProxy:
    """Forwards every request to ``upstream`` and keeps each request's path and body."""

    def __init__(self, upstream: str) -> None:
        self.bodies: list[tuple[str, bytes]] = []
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def forward(self) -> None:
                n = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(n) if n else None
                proxy.bodies.append((self.path, body or b""))
                req = urllib.request.Request(
                    upstream + self.path, data=body, method=self.command,
                    headers={k: v for k, v in self.headers.items()
                             if k.lower() in ("content-type", "authorization", "accept")})
                with urllib.request.urlopen(req, timeout=600) as up:
                    data = up.read()
                    self.send_response(up.status)
                    self.send_header("Content-Type", up.headers.get("Content-Type", ""))
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)

            do_GET = do_POST = forward

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()


@pytest.fixture
def recording(tmp_path: Path) -> Iterator[RecordingProxy]:
    srv = OpenAIServer(tmp_path)
    srv.start()
    proxy = RecordingProxy(srv.url)
    try:
        yield proxy
    finally:
        proxy.close()
        srv.stop()


async def canary_session(tmp_path: Path, args: list[str]) -> tuple[list[str], str]:
    """Open the ``.env`` and the ``.py`` in a workspace, ask in both (and again after
    typing in the ``.py``); the suggestions and the latency log's text."""
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / ".env").write_text(ENV)
    (ws / "settings.py").write_text(APP)
    log = tmp_path / "lat.jsonl"
    shown: list[str] = []
    async with session(args=[*args, "--latency-log", str(log), "--log-level", "DEBUG"],
                       workspace=ws) as (client, _):
        env_uri, py_uri = (ws / ".env").as_uri(), (ws / "settings.py").as_uri()
        open_doc(client, env_uri, ENV, language="dotenv")
        open_doc(client, py_uri, APP)
        res = await inline(client, env_uri, *end_position(ENV))
        assert res is None or not (res if isinstance(res, list) else res.items)
        state = await client.protocol.send_request_async(
            "fimls/documentState", {"textDocument": {"uri": env_uri}})
        assert state is None  # the server holds no copy of it
        res = await inline(client, py_uri, *end_position(APP))
        items = res if isinstance(res, list) else (res.items if res else [])
        shown += [str(i.insert_text) for i in items]
    return shown, log.read_text() if log.exists() else ""


async def test_the_canary_stays_home_with_the_local_engine(
        tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    shown, log = await canary_session(tmp_path, ["--model", QWEN])
    err = capfd.readouterr().err
    assert shown and all(TOKEN not in s for s in shown)
    assert log and TOKEN not in log
    assert TOKEN not in err and "it matches disabledGlobs" in err


async def test_the_canary_is_never_sent_to_the_engine_host(
        tmp_path: Path, recording: RecordingProxy, capfd: pytest.CaptureFixture[str]) -> None:
    args = ["--model", QWEN, "--engine", recording.url, "--engine-protocol", "openai",
            "--max-tokens", "24"]
    shown, log = await canary_session(tmp_path, args)
    err = capfd.readouterr().err
    completions = [b for p, b in recording.bodies if p.endswith("/completions")]
    assert completions, "the proxy saw no completion request"
    assert all(TOKEN.encode() not in b for _, b in recording.bodies)
    assert shown is not None and all(TOKEN not in s for s in shown)
    assert TOKEN not in log and TOKEN not in err
