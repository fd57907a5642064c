"""Drive ``fimls serve`` over stdio with pytest-lsp's real LSP client."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any

from lsprotocol import types
from pygls.exceptions import JsonRpcException
from pytest_lsp import LanguageClient
from pytest_lsp.client import make_test_lsp_client

# The messages an editor sends most, shared with fimls bench and fimls soak.
from fimls.tools.harness import inline, insert, load_tasks, open_doc, utf16_position

__all__ = ["ask_then_cancel", "capabilities", "end_position", "humaneval", "inline", "insert",
           "next_edits", "open_doc", "read_log", "replace_range", "session", "wait_ready"]


def capabilities(*, encodings: Sequence[str] | None = None) -> types.ClientCapabilities:
    """A client that supports inline completion and progress (like VS Code)."""
    general = None
    if encodings is not None:
        general = types.GeneralClientCapabilities(
            position_encodings=[types.PositionEncodingKind(e) for e in encodings])
    return types.ClientCapabilities(
        general=general,
        window=types.WindowClientCapabilities(work_done_progress=True),
        text_document=types.TextDocumentClientCapabilities(
            inline_completion=types.InlineCompletionClientCapabilities(),
            synchronization=types.TextDocumentSyncClientCapabilities()))


async def wait_ready(client: LanguageClient, timeout: float = 120.0) -> bool:
    """Wait for the model-loading progress to end; True if it ended."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for reports in client.progress_reports.values():
            if any(isinstance(r, types.WorkDoneProgressEnd) for r in reports):
                return True
        await asyncio.sleep(0.05)
    return False


@asynccontextmanager
async def session(*, args: Sequence[str] = (), init_options: dict[str, Any] | None = None,
                  encodings: Sequence[str] | None = None, command: Sequence[str] | None = None,
                  workspace: Path | None = None, ready: bool = True,
                  ) -> AsyncIterator[tuple[LanguageClient, types.InitializeResult]]:
    """Start a server, initialize it, wait for the model, and shut it down afterwards."""
    client = make_test_lsp_client()
    if "--max-time-ms" not in args:
        # What is suggested must not depend on this machine's speed (maxTimeMs cuts
        # multi-line suggestions by wall-clock time; its own tests set it).
        args = [*args, "--max-time-ms", "0"]
    if "--min-confidence" not in args:
        # Nor on how sure the model is of it (the gate hides unsure suggestions; its own
        # tests set it).
        args = [*args, "--min-confidence", "0"]
    cmd = list(command or [sys.executable, "-m", "fimls", "serve", *args])
    await client.start_io(cmd[0], *cmd[1:])
    folders = None
    root_uri = None
    if workspace is not None:
        root_uri = workspace.as_uri()
        folders = [types.WorkspaceFolder(uri=root_uri, name=workspace.name)]
    result = await client.initialize_session(types.InitializeParams(
        capabilities=capabilities(encodings=encodings), root_uri=root_uri,
        workspace_folders=folders, initialization_options=init_options))
    try:
        if ready:
            assert await wait_ready(client), "model did not finish loading"
        yield client, result
    finally:
        try:
            await asyncio.wait_for(client.shutdown_session(), 30)
        finally:
            await client.stop()


def end_position(text: str) -> tuple[int, int]:
    """The (line, utf-16 character) position at the end of ``text``."""
    return utf16_position(text)


def humaneval(kind: str = "Single", n: int = 40, stride: int = 1) -> list[dict[str, str]]:
    """HumanEval infilling tasks as {task_id, prefix, suffix, target}: every ``stride``-th
    task from the first, at most ``n``."""
    _, tasks = load_tasks(f"humaneval-{kind.lower()}", n, stride)
    return [asdict(t) for t in tasks]


def read_log(path: Path, *, idle: bool = False) -> list[dict[str, Any]]:
    """Records of a latency log: the requests' (and with ``idle``, also idle prefill's)."""
    if not path.exists():
        return []
    recs = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    if idle:
        return recs
    return [r for r in recs if not str(r.get("outcome", "")).startswith("prefill")]


async def ask_then_cancel(client: LanguageClient, uri: str, line: int, character: int, *,
                          after: float, timeout: float) -> float:
    """Ask for an inline completion, send ``$/cancelRequest`` ``after`` seconds later, and
    return how long the answer then took. Either answer is valid: an empty result, or an
    LSP RequestCancelled error; only that error is caught, so a timeout or a non-empty
    result fails the caller's test."""
    params = types.InlineCompletionParams(
        text_document=types.TextDocumentIdentifier(uri=uri),
        position=types.Position(line=line, character=character),
        context=types.InlineCompletionContext(
            trigger_kind=types.InlineCompletionTriggerKind.Invoked))
    fut = asyncio.ensure_future(client.protocol.send_request_async(
        types.TEXT_DOCUMENT_INLINE_COMPLETION, params))
    await asyncio.sleep(after)
    msg_id = max(client.protocol._request_futures)
    client.protocol.notify(types.CANCEL_REQUEST, types.CancelParams(id=msg_id))
    t0 = time.monotonic()
    try:
        res = await asyncio.wait_for(fut, timeout)
    except JsonRpcException as exc:
        assert "cancel" in str(exc).lower(), exc
    else:
        assert not res or not res.items, res
    return time.monotonic() - t0


def replace_range(client: LanguageClient, uri: str, version: int, line: int, start: int,
                  end: int, text: str) -> None:
    """Send didChange replacing characters ``start``-``end`` of ``line`` with ``text``."""
    client.text_document_did_change(types.DidChangeTextDocumentParams(
        text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=version),
        content_changes=[types.TextDocumentContentChangePartial(range=types.Range(
            start=types.Position(line=line, character=start),
            end=types.Position(line=line, character=end)), text=text)]))


async def next_edits(client: LanguageClient, uri: str, line: int) -> list[Any]:
    """fimls/nextEdits at the start of ``line``: the edits it answers."""
    res = await client.protocol.send_request_async("fimls/nextEdits", {
        "textDocument": {"uri": uri}, "position": {"line": line, "character": 0}})
    return list(res.edits)
