"""The real server over stdio with the fake engine (tests/fake_server.py): the protocol, the
progress and the messages the user sees, in seconds and without a model."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from lsprotocol import types
from pytest_lsp import LanguageClient

from tests.lsp_helpers import (
    ask_then_cancel,
    inline,
    insert,
    next_edits,
    open_doc,
    read_log,
    replace_range,
    session,
)
from tests.test_e2e_raw import ODD_MESSAGES, Raw, check_odd_message

FAKE = [sys.executable, "-m", "tests.fake_server"]
REFUSAL = ("draft model starcoder2-vocab.gguf refused: vocabularies differ; "
           "continuing without a draft model")


def fake(*args: str) -> list[str]:
    """The fake server's command line."""
    return [*FAKE, *args]


async def until(pred: Callable[[], bool], timeout: float = 10.0) -> bool:
    """Poll ``pred`` on the event loop; whether it held within ``timeout``."""
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.02)
    return True


def progress(client: LanguageClient, kind: type) -> list[Any]:
    """The progress reports of type ``kind``, over all tokens."""
    return [r for reports in client.progress_reports.values() for r in reports
            if isinstance(r, kind)]


async def status(client: LanguageClient) -> Any:
    return await client.protocol.send_request_async("fimls/status", None)


async def test_completes_and_reports_status() -> None:
    async with session(command=fake("--text", "return a + b")) as (client, _):
        uri = "file:///w/a.py"
        open_doc(client, uri, "def add(a, b):\n    ")
        res = await inline(client, uri, 1, 4)
        assert res is not None and [i.insert_text for i in res.items] == ["return a + b"]
        st = await status(client)
        # An engine in the server's own process has no worker pid.
        assert (st.state, st.model, st.workerPid, st.restarts) == ("ready", "fake.gguf",
                                                                   None, 0)
        assert st.error is None and isinstance(st.serverPid, int)
        assert (st.device, st.gpuLayers) == ("CPU", 0)


async def test_status_names_the_gpu_the_model_runs_on() -> None:
    async with session(command=fake("--gpu", "NVIDIA H100 80GB HBM3")) as (client, _):
        uri = "file:///w/a.py"
        open_doc(client, uri, "def add(a, b):\n    ")
        assert await inline(client, uri, 1, 4) is not None
        st = await status(client)
        assert (st.state, st.gpuLayers) == ("ready", 29)
        assert st.device == "CUDA: NVIDIA H100 80GB HBM3 (29 of 29 layers)"


async def test_failed_load_after_progress_began_ends_the_progress() -> None:
    """Regression: a load that failed after $/progress began left the progress open."""
    cmd = fake("--load-delay", "2.0", "--load-error", "model file not found: /nope.gguf")
    async with session(command=cmd, ready=False) as (client, _):
        assert await until(lambda: bool(progress(client, types.WorkDoneProgressBegin)), 5.0)
        assert await until(lambda: bool(progress(client, types.WorkDoneProgressEnd)), 5.0), \
            "the progress of a failed load never ended"
        (end,) = progress(client, types.WorkDoneProgressEnd)
        assert end.message == "model failed to load"
        assert await until(lambda: bool(client.messages))
        (msg,) = client.messages
        assert msg.type == types.MessageType.Error and "/nope.gguf" in msg.message
        assert (await status(client)).state == "failed"


async def test_a_refused_draft_model_is_a_warning() -> None:
    """Regression: the refusal (the server carries on) was shown as an Error."""
    async with session(command=fake("--warning", REFUSAL)) as (client, _):
        assert await until(lambda: bool(client.messages))
        (msg,) = client.messages
        assert msg.type == types.MessageType.Warning and msg.message == f"fimls: {REFUSAL}"
        open_doc(client, "file:///w/a.py", "def add(a, b):\n    ")
        res = await inline(client, "file:///w/a.py", 1, 4)
        assert res is not None and len(res.items) == 1  # it does carry on


async def test_an_engine_crash_is_an_error_and_completions_resume(tmp_path: Path) -> None:
    """Regression: a dead engine process (no completions for a while) was a Warning."""
    log = tmp_path / "lat.jsonl"
    cmd = fake("--crash-engines", "1", "--options", f'{{"latencyLog": "{log}"}}')
    async with session(command=cmd) as (client, _):
        uri = "file:///w/a.py"
        open_doc(client, uri, "def add(a, b):\n    ")
        res = await inline(client, uri, 1, 4)
        assert res is not None and not res.items  # answered, not lost
        assert await until(lambda: bool(client.messages))
        (msg,) = client.messages
        assert msg.type == types.MessageType.Error
        assert "the engine process died (killed by signal 9 (SIGKILL))" in msg.message
        deadline = time.monotonic() + 5.0  # the back-off is 0.25 s
        while (st := await status(client)).state != "ready":
            assert time.monotonic() < deadline, st
            await asyncio.sleep(0.05)
        assert st.restarts == 1
        res = await inline(client, uri, 1, 4)
        assert res is not None and len(res.items) == 1
    assert [r["outcome"] for r in read_log(log)] == ["error", "returned"]


async def test_newer_request_supersedes_older(tmp_path: Path) -> None:
    log = tmp_path / "lat.jsonl"
    cmd = fake("--delay", "0.5", "--options", f'{{"latencyLog": "{log}"}}')
    async with session(command=cmd) as (client, _):
        uri = "file:///w/s.py"
        open_doc(client, uri, "def add(a, b):\n    ")
        first = asyncio.ensure_future(inline(client, uri, 1, 4))
        await asyncio.sleep(0.1)
        second = asyncio.ensure_future(inline(client, uri, 1, 4))
        r1, r2 = await asyncio.gather(first, second)
        assert r1 is not None and not r1.items
        assert r2 is not None and len(r2.items) == 1
    assert [r["outcome"] for r in read_log(log)] == ["superseded", "returned"]


async def test_cancel_request_is_answered_at_once(tmp_path: Path) -> None:
    log = tmp_path / "lat.jsonl"
    cmd = fake("--delay", "30", "--options", f'{{"latencyLog": "{log}"}}')
    async with session(command=cmd) as (client, _):
        uri = "file:///w/c.py"
        open_doc(client, uri, "def add(a, b):\n    ")
        assert await ask_then_cancel(client, uri, 1, 4, after=0.2, timeout=5) < 2.0
    assert [r["outcome"] for r in read_log(log)] == ["cancelled"]


# -- raw JSON-RPC with the fake engine: the protocol layer in seconds --------------------------


@pytest.fixture
def raw() -> Iterator[Raw]:
    peer = Raw(command=FAKE)
    peer.request("initialize", {"capabilities": {}})
    peer.notify("initialized", {})
    yield peer
    if peer.proc.poll() is None:
        peer.proc.kill()
    peer.proc.wait(10)


def test_request_before_initialize_is_refused() -> None:
    peer = Raw(command=FAKE)
    try:
        reply = peer.request("fimls/status", None)
        assert reply["error"]["code"] == -32002  # ServerNotInitialized
        assert "capabilities" in peer.request("initialize", {"capabilities": {}})["result"]
    finally:
        peer.proc.kill()
        peer.proc.wait(10)


@pytest.mark.parametrize(("body", "reply_id", "code"), ODD_MESSAGES)
def test_odd_messages_get_the_right_error(raw: Raw, body: bytes, reply_id: Any,
                                          code: int) -> None:
    check_odd_message(raw, body, reply_id, code)


def test_malformed_json_gets_a_parse_error(raw: Raw) -> None:
    raw.send(b"{not json")
    reply = raw.recv_reply(None)
    assert reply is not None and reply["error"]["code"] == -32700
    assert reply["error"]["message"].startswith("Parse error")


def test_shutdown_then_exit(raw: Raw) -> None:
    raw.wait_ready(10)
    assert raw.request("shutdown", None)["result"] is None
    reply = raw.request("fimls/status", None)
    assert reply["error"]["code"] == -32600  # InvalidRequest: shutting down
    raw.notify("exit", None)
    assert raw.proc.wait(15) == 0


def test_exit_without_shutdown(raw: Raw) -> None:
    raw.notify("exit", None)
    assert raw.proc.wait(15) == 1


async def test_a_disabled_document_is_not_read_and_settings_can_disable_more() -> None:
    """disabledGlobs: a .env gets no suggestion and no copy on the server; a glob added at
    run time drops a matching open document at once."""
    async with session(command=fake("--text", "return a + b")) as (client, _):
        env, py = "file:///w/.env", "file:///w/a.py"
        open_doc(client, env, "TOKEN=abc\n", language="dotenv")
        open_doc(client, py, "def add(a, b):\n    ")
        res = await inline(client, env, 1, 0)
        assert res is not None and not res.items
        state = await client.protocol.send_request_async(
            "fimls/documentState", {"textDocument": {"uri": env}})
        assert state is None
        res = await inline(client, py, 1, 4)
        assert res is not None and [i.insert_text for i in res.items] == ["return a + b"]
        client.workspace_did_change_configuration(types.DidChangeConfigurationParams(
            settings={"fimls": {"disabledGlobs": ["*.py"]}}))
        await asyncio.sleep(0.2)
        res = await inline(client, py, 1, 4)
        assert res is not None and not res.items
        state = await client.protocol.send_request_async(
            "fimls/documentState", {"textDocument": {"uri": py}})
        assert state is None


async def test_manual_mode_answers_only_when_asked() -> None:
    async with session(command=fake("--text", "return a + b"),
                       init_options={"triggerMode": "manual"}) as (client, _):
        uri = "file:///w/a.py"
        open_doc(client, uri, "def add(a, b):\n    ")
        res = await inline(client, uri, 1, 4)
        assert res is not None and not res.items
        res = await inline(client, uri, 1, 4, invoked=True)
        assert res is not None and [i.insert_text for i in res.items] == ["return a + b"]
        client.workspace_did_change_configuration(types.DidChangeConfigurationParams(
            settings={"fimls": {"triggerMode": "auto"}}))
        await asyncio.sleep(0.2)
        res = await inline(client, uri, 1, 4)
        assert res is not None and [i.insert_text for i in res.items] == ["return a + b"]


async def test_an_untitled_buffer_saved_as_a_secret_is_dropped() -> None:
    """VS Code saves an untitled buffer as a close of it and an open of the file: once
    the file's name matches disabledGlobs, no copy of the text is left."""
    async with session(command=fake("--text", "return a + b")) as (client, _):
        untitled, env = "untitled:Untitled-1", "file:///w/.env.production"
        open_doc(client, untitled, "TOKEN=abc\n", language="plaintext")
        state = await client.protocol.send_request_async(
            "fimls/documentState", {"textDocument": {"uri": untitled}})
        assert state is not None and state.length == len("TOKEN=abc\n")
        client.text_document_did_close(types.DidCloseTextDocumentParams(
            text_document=types.TextDocumentIdentifier(uri=untitled)))
        open_doc(client, env, "TOKEN=abc\n", language="dotenv")
        for uri in (untitled, env):
            state = await client.protocol.send_request_async(
                "fimls/documentState", {"textDocument": {"uri": uri}})
            assert state is None
        res = await inline(client, env, 1, 0)
        assert res is not None and not res.items


async def test_the_accepted_item_is_logged_with_its_index(tmp_path: Path) -> None:
    log = tmp_path / "lat.jsonl"
    async with session(command=fake("--text", "return a + b", "--options",
                                    f'{{"latencyLog": "{log}"}}')) as (client, _):
        await client.workspace_execute_command_async(types.ExecuteCommandParams(
            command="fimls.acceptCompletion", arguments=["r7", 2]))
        client.protocol.notify("fimls/didAccept", {"requestId": "r8", "index": 1})
        client.protocol.notify("fimls/didAccept", {"requestId": "r9"})
        assert await until(lambda: len(read_log(log, idle=True)) >= 3)
    events = {e["request_id"]: e.get("index") for e in read_log(log, idle=True)}
    assert events == {"r7": 2, "r8": 1, "r9": None}


RENAMED = ("def area(w, h):\n"
           "    size = w * h\n"
           "    print('\U0001f600', size)\n"
           "    return size\n"
           "\n"
           "def other():\n"
           "    size = 3\n"
           "    return size\n")


async def test_next_edits_follow_a_rename_nearest_first() -> None:
    # The fake model prefers the original at line 6: that place is not offered.
    async with session(command=fake("--reject-line", "6")) as (client, _):
        uri = "file:///w/area.py"
        open_doc(client, uri, RENAMED)
        assert await next_edits(client, uri, 1) == []  # no edit yet
        replace_range(client, uri, 2, 1, 4, 8, "total")
        edits = await next_edits(client, uri, 1)
        assert [(e.range.start.line, e.newText) for e in edits] == [
            (2, "total"), (3, "total"), (7, "total")]
        # UTF-16 columns: the emoji before the name is two code units.
        first = edits[0].range
        assert (first.start.character, first.end.character) == (16, 20)
        assert edits[0].confidence > 0.99
        # Applying one leaves the rest.
        replace_range(client, uri, 3, 2, 16, 20, "total")
        assert [e.range.start.line for e in await next_edits(client, uri, 2)] == [3, 7]
        # Dismissing ends the chain.
        client.protocol.notify("fimls/dismissNextEdits", {"textDocument": {"uri": uri}})
        assert await next_edits(client, uri, 2) == []


async def test_typing_new_code_proposes_no_next_edit() -> None:
    async with session(command=fake()) as (client, _):
        uri = "file:///w/typing.py"
        open_doc(client, uri, "x = size\ny = size\n")
        insert(client, uri, 2, 2, 0, "\n")
        for i, ch in enumerate("z = si"):
            insert(client, uri, 3 + i, 2, i, ch)
        assert await next_edits(client, uri, 2) == []
