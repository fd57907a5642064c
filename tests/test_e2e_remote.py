"""``--engine URL``: fimls's LSP side in front of an existing inference server.

Against real servers, not mocks: llama-cpp-python's own OpenAI-compatible server (same
llama.cpp, installed from PyPI with the test extras) always; llama.cpp's llama-server when
one is built (``FIMLS_LLAMA_SERVER``, or where ``fimls bench --peer`` builds keep it),
skipped with the reason otherwise. Model: Qwen2.5-Coder 0.5B, as in the FIM tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from lsprotocol import types
from pygls.exceptions import JsonRpcException

from fimls.engine.api import CompletionRequest
from fimls.engine.core import Engine, EngineConfig
from fimls.models import resolve_model
from fimls.quality import score
from fimls.tools.peer import PeerCrashed, post_json
from tests.lsp_helpers import (
    end_position,
    humaneval,
    inline,
    insert,
    open_doc,
    read_log,
    session,
)

ROOT = Path(__file__).resolve().parents[1]
QWEN = "qwen2.5-coder-0.5b"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_http(url: str, proc: subprocess.Popen[bytes], timeout: float = 180.0,
              context: ssl.SSLContext | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=2, context=context) as r:
                if r.status == 200:
                    return
        except urllib.error.HTTPError as e:
            if e.code != 503:
                return  # it answers (with an error: an API key is asked for)
            time.sleep(0.3)  # llama-server answers 503 while it loads the model
        except OSError:
            time.sleep(0.3)
    raise RuntimeError(f"{url} did not answer within {timeout} s")


class OpenAIServer:
    """llama-cpp-python's server on a fixed port, which a test can stop and start again."""

    def __init__(self, tmp: Path, extra: Sequence[str] = (), scheme: str = "http") -> None:
        self.port = free_port()
        self.url = f"{scheme}://127.0.0.1:{self.port}"
        self.log = tmp / "llama-cpp-server.log"
        self.extra = list(extra)
        self.context: ssl.SSLContext | None = None  # trusts an https server's certificate
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        cmd = [sys.executable, "-m", "tests.llama_cpp_server", "--model",
               str(resolve_model(QWEN)), "--host", "127.0.0.1", "--port", str(self.port),
               "--n_ctx", "4096", "--n_threads", str(min(4, os.cpu_count() or 1)),
               *self.extra]
        with self.log.open("ab") as err:
            self.proc = subprocess.Popen(cmd, cwd=ROOT, stdout=err, stderr=err)
        try:
            wait_http(self.url + "/v1/models", self.proc, context=self.context)
        except BaseException:
            self.stop()  # a server that never answered must not outlive the test
            raise

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(30)
            self.proc = None


@pytest.fixture
def openai_server(tmp_path: Path) -> Iterator[OpenAIServer]:
    srv = OpenAIServer(tmp_path)
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()


def engine_args(url: str, log: Path, protocol: str) -> list[str]:
    return ["--model", QWEN, "--engine", url, "--engine-protocol", protocol,
            "--latency-log", str(log), "--max-tokens", "24", "--idle-prefill", "false"]


def answers_here(tasks: list[dict[str, str]]) -> list[str]:
    """The engine in this process, greedy, on each task: what the server should answer."""
    local = Engine(EngineConfig(model_path=resolve_model(QWEN), n_ctx=4096,
                                measure_costs=False))
    try:
        return [local.complete(CompletionRequest(
            uri=f"file:///t{i}.py", version=1, prefix=t["prefix"], suffix=t["suffix"],
            max_tokens=24, speculative="off"), lambda: False).text
            for i, t in enumerate(tasks)]
    finally:
        local.close()


async def answers_there(args: list[str], tasks: list[dict[str, str]],
                        tmp_path: Path) -> list[str]:
    """``fimls serve`` (with ``args``) asked at each task's cursor, as an editor would."""
    there: list[str] = []
    async with session(args=args) as (c, _):
        for i, t in enumerate(tasks):
            uri = (tmp_path / f"t{i}.py").as_uri()
            open_doc(c, uri, t["prefix"] + t["suffix"])
            line, col = end_position(t["prefix"])
            res = await inline(c, uri, line, col)
            there.append(res.items[0].insert_text  # type: ignore[misc]
                         if res and res.items else "")
    return there


async def test_completions_through_an_openai_compatible_server(
        tmp_path: Path, openai_server: OpenAIServer) -> None:
    tasks = humaneval("Single", n=6, stride=150)
    here = answers_here(tasks)
    log = tmp_path / "lat.jsonl"
    there = await answers_there(engine_args(openai_server.url, log, "openai"), tasks, tmp_path)
    assert sum(bool(x) for x in there) >= len(tasks) - 1, there
    right_here = sum(score(x, t["target"]).line_exact for x, t in zip(here, tasks, strict=True))
    right_there = sum(score(x, t["target"]).line_exact for x, t in zip(there, tasks, strict=True))
    assert right_there >= right_here - 1, (here, there)
    recs = read_log(log)
    assert len(recs) == len(tasks) and all("@ 127.0.0.1" in r["model"] for r in recs)
    assert all(r["hop_ms"] > 0 for r in recs if r["outcome"] == "returned")
    assert all(r["confidence"] is not None for r in recs if r["outcome"] == "returned")


async def test_an_unreachable_server_is_one_message_and_completions_come_back(
        tmp_path: Path, openai_server: OpenAIServer) -> None:
    log = tmp_path / "lat.jsonl"
    doc = "def add(a, b):\n    return "
    async with session(args=engine_args(openai_server.url, log, "openai")) as (c, _):
        uri = (tmp_path / "a.py").as_uri()
        open_doc(c, uri, doc + "\n")
        line, col = end_position(doc)
        first = await inline(c, uri, line, col)
        assert first is not None and first.items
        openai_server.stop()
        for k in range(4):  # an editor keeps asking as the user types (not the suggestion)
            insert(c, uri, k + 2, line, col, "(")
            col += 1
            res = await inline(c, uri, line, col)
            assert res is None or not res.items
        st = await c.protocol.send_request_async("fimls/status", None)
        assert st.state == "unreachable"
        errors = [m.message for m in c.messages if m.type == types.MessageType.Error]
        assert len(errors) == 1 and "unreachable" in errors[0], errors
        openai_server.start()  # back, on the same port: no editor restart
        deadline = time.monotonic() + 90
        back = None
        while time.monotonic() < deadline:
            back = await inline(c, uri, line, col)
            if back is not None and back.items:
                break
            await asyncio.sleep(0.5)
        assert back is not None and back.items
        st = await c.protocol.send_request_async("fimls/status", None)
        assert st.state == "ready"
    outcomes = [r["outcome"] for r in read_log(log)]
    assert outcomes[0] == "returned" and outcomes[-1] == "returned"
    assert "error" in outcomes


async def test_https_with_a_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if shutil.which("openssl") is None:
        pytest.skip("no openssl command to make a certificate")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-keyout", str(key), "-out", str(cert), "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1"], check=True, capture_output=True)
    srv = OpenAIServer(tmp_path, ["--ssl_keyfile", str(key), "--ssl_certfile", str(cert),
                                  "--api_key", "team-secret"], scheme="https")
    srv.context = ssl.create_default_context(cafile=str(cert))
    srv.start()
    # The server's certificate is trusted the way a team would: the system's store (here
    # the file OpenSSL is pointed at).
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))
    doc = "def add(a, b):\n    return "
    try:
        answers = {}
        for name, extra in (("no key", []), ("key", ["--engine-key", "team-secret"])):
            log = tmp_path / f"lat-{name}.jsonl"
            async with session(args=[*engine_args(srv.url, log, "openai"), *extra]) as (c, _):
                uri = (tmp_path / "a.py").as_uri()
                open_doc(c, uri, doc + "\n")
                line, col = end_position(doc)
                res = await inline(c, uri, line, col)
                answers[name] = res.items[0].insert_text if res and res.items else ""
                st = await c.protocol.send_request_async("fimls/status", None)
                answers[name + " state"] = st.state
        assert answers["key"] and answers["key state"] == "ready", answers
        # Without the key the server refuses, and fimls says so, once.
        assert not answers["no key"] and answers["no key state"] == "unreachable", answers
    finally:
        srv.stop()


def llama_server_binary() -> Path | None:
    env = os.environ.get("FIMLS_LLAMA_SERVER")
    if env:
        return Path(env)
    # Where the README's side-by-side section builds it.
    path = Path.home() / ".cache/fimls-peer/llama-server-0.3.36/build/bin/llama-server"
    return path if path.exists() else None


@pytest.fixture
def llama_server(tmp_path: Path) -> Iterator[str]:
    binary = llama_server_binary()
    if binary is None:
        pytest.skip("no llama-server built (set FIMLS_LLAMA_SERVER, or build the peer as "
                    "the README's side-by-side section says)")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with (tmp_path / "llama-server.log").open("ab") as err:
        proc = subprocess.Popen(
            [str(binary), "-m", str(resolve_model(QWEN)), "--host", "127.0.0.1", "--port",
             str(port), "-c", "4096", "-np", "2", "-t", str(min(4, os.cpu_count() or 1)),
             "--no-repack", "--no-webui", "--slots"], stdout=err, stderr=err)
    try:
        try:
            wait_http(url + "/health", proc)
            # One token through every kernel: a binary built on a machine with other
            # instructions (a shared cache) dies of SIGILL here, not at its start.
            post_json(url + "/completion", {"prompt": "def f(", "n_predict": 1}, timeout=120)
        except (RuntimeError, OSError):
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(10)
            if proc.returncode is not None:
                crash = PeerCrashed(proc.returncode, str(tmp_path / "llama-server.log"))
                if crash.wrong_cpu:
                    pytest.skip(str(crash))
            raise
        yield url
    finally:
        proc.kill()
        proc.wait(30)


def busy_slots(url: str) -> list[bool]:
    with urllib.request.urlopen(url + "/slots", timeout=5) as r:
        return [bool(s.get("is_processing")) for s in json.loads(r.read())]


async def test_llama_server_a_cancelled_request_frees_its_slot(
        tmp_path: Path, llama_server: str) -> None:
    log = tmp_path / "lat.jsonl"
    long_doc = "# A long story, told line by line.\n"
    args = [*engine_args(llama_server, log, "llama"), "--max-tokens", "400",
            "--max-lines", "200", "--max-time-ms", "0"]
    async with session(args=args) as (c, _):
        uri = (tmp_path / "story.py").as_uri()
        open_doc(c, uri, long_doc)
        ok = await inline(c, uri, 1, 0)  # warm: the model answers through the server
        del ok
        # A character that is not the suggestion: asked again, it is the server's work.
        insert(c, uri, 2, 1, 0, "Q")
        params = types.InlineCompletionParams(
            text_document=types.TextDocumentIdentifier(uri=uri),
            position=types.Position(line=1, character=1),
            context=types.InlineCompletionContext(
                trigger_kind=types.InlineCompletionTriggerKind.Invoked))
        fut = asyncio.ensure_future(c.protocol.send_request_async(
            types.TEXT_DOCUMENT_INLINE_COMPLETION, params))
        deadline = time.monotonic() + 30
        while not any(busy_slots(llama_server)) and time.monotonic() < deadline:
            await asyncio.sleep(0.02)  # the server is generating for it
        assert any(busy_slots(llama_server))
        msg_id = max(c.protocol._request_futures)
        c.protocol.notify(types.CANCEL_REQUEST, types.CancelParams(id=msg_id))
        t0 = time.monotonic()
        while any(busy_slots(llama_server)) and time.monotonic() - t0 < 5:
            await asyncio.sleep(0.02)
        freed = time.monotonic() - t0
        try:
            res = await asyncio.wait_for(fut, 30)
        except JsonRpcException as exc:
            assert "cancel" in str(exc).lower(), exc
        else:
            assert not res or not res.items, res
        assert freed < 1.0, freed
    recs = read_log(log)
    assert any(r["outcome"] == "cancelled" for r in recs)
    assert all("@ 127.0.0.1" in r["model"] for r in recs)


async def test_llama_server_answers_as_the_engine_here(
        tmp_path: Path, llama_server: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # The first-token rule (no leading newline on a blank line) goes to the server as a
    # grammar, as in-process: the same greedy text, cursor inside a word included.
    # Then again with no local GGUF: the server's own vocabulary, over HTTP.
    tasks = humaneval("Single", n=6, stride=150)
    tasks += [{"prefix": t["prefix"] + t["target"][:len(t["target"]) // 2],
               "suffix": t["suffix"], "target": t["target"][len(t["target"]) // 2:]}
              for t in tasks[:3]]
    here = answers_here(tasks)
    log = tmp_path / "lat.jsonl"
    # (The other open documents out of the prompt: the engine here had none.)
    args = [*engine_args(llama_server, log, "llama"), "--context-tokens", "0"]
    there = await answers_there(args, tasks, tmp_path)
    monkeypatch.delenv("FIMLS_MODEL", raising=False)
    served_vocab = await answers_there([a for a in args if a not in ("--model", QWEN)], tasks,
                                       tmp_path)
    # The prompt is the text as written (no healed token): a cursor cut mid-token leaves
    # the first token near a tie, where the server's cached slots (another request's prompt
    # before, other batch splits) move the numerics enough to flip it; so a few may differ.
    assert sum(a == b for a, b in zip(served_vocab, there, strict=True)) >= len(tasks) - 3
    same = sum(a == b for a, b in zip(here, there, strict=True))
    assert same >= len(tasks) - 3, list(zip(here, there, strict=True))
    # The grammar carries the engine's first-token rule: after a blank line's start no
    # answer opens with a line break.
    blank = [i for i, t in enumerate(tasks) if t["prefix"].endswith("\n")]
    assert blank and not any(there[i].startswith(("\n", "\r")) for i in blank)
    right_here = sum(score(x, t["target"]).line_exact for x, t in zip(here, tasks, strict=True))
    right_there = sum(score(x, t["target"]).line_exact for x, t in zip(there, tasks, strict=True))
    assert right_there >= right_here - 1, (here, there)


async def test_typing_the_suggestion_needs_no_round_trip(
        tmp_path: Path, openai_server: OpenAIServer) -> None:
    log = tmp_path / "lat.jsonl"
    doc = "def add(a, b):\n    return "
    # Idle work on: still nothing but the editor's own requests reaches the server.
    args = [a if a != "false" else "true" for a in engine_args(openai_server.url, log, "openai")]
    async with session(args=args) as (c, _):
        uri = (tmp_path / "a.py").as_uri()
        open_doc(c, uri, doc + "\n")
        line, col = end_position(doc)
        first = await inline(c, uri, line, col)
        assert first is not None and first.items
        shown = first.items[0].insert_text
        assert isinstance(shown, str) and len(shown) > 2
        openai_server.stop()  # typed text is answered here, with the server gone
        insert(c, uri, 2, line, col, shown[:2])
        res = await inline(c, uri, line, col + 2)
        assert res is not None and res.items and res.items[0].insert_text == shown[2:]
    recs = read_log(log, idle=True)
    asked = [r for r in recs if r["outcome"] != "prefill"]
    assert [r["stop"] for r in asked][-1] == "memo" and asked[-1]["hop_ms"] == 0
    assert all(r["model_ms"] < 50 for r in recs if r["outcome"] == "prefill")
