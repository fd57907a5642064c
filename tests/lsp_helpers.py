"""Drive ``fimls serve`` over stdio with pytest-lsp's real LSP client."""

from __future__ import annotations

import asyncio
import gzip
import json
import sys
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from lsprotocol import types
from pytest_lsp import LanguageClient
from pytest_lsp.client import make_test_lsp_client

SHARED = Path(__file__).resolve().parents[2] / "shared"
DATA = Path(__file__).resolve().parents[1] / "fimls" / "data"


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


def open_doc(client: LanguageClient, uri: str, text: str, version: int = 1,
             language: str = "python") -> None:
    """didOpen."""
    client.text_document_did_open(types.DidOpenTextDocumentParams(
        text_document=types.TextDocumentItem(uri=uri, language_id=language, version=version,
                                             text=text)))


def insert(client: LanguageClient, uri: str, version: int, line: int, character: int,
           text: str) -> None:
    """didChange inserting ``text`` at (line, character)."""
    pos = types.Position(line=line, character=character)
    client.text_document_did_change(types.DidChangeTextDocumentParams(
        text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=version),
        content_changes=[types.TextDocumentContentChangePartial(
            range=types.Range(start=pos, end=pos), text=text)]))


async def inline(client: LanguageClient, uri: str, line: int, character: int,
                 ) -> types.InlineCompletionList | None:
    """textDocument/inlineCompletion at (line, character)."""
    return await client.text_document_inline_completion_async(types.InlineCompletionParams(
        text_document=types.TextDocumentIdentifier(uri=uri),
        position=types.Position(line=line, character=character),
        context=types.InlineCompletionContext(
            trigger_kind=types.InlineCompletionTriggerKind.Automatic)))


def end_position(text: str) -> tuple[int, int]:
    """The (line, utf-16 character) position at the end of ``text``."""
    lines = text.split("\n")
    return len(lines) - 1, len(lines[-1].encode("utf-16-le")) // 2


def humaneval(kind: str = "Single", n: int = 40, stride: int = 1) -> list[dict[str, str]]:
    """HumanEval infilling tasks as {task_id, prefix, suffix, target}."""
    path = DATA / f"HumanEval-{kind}LineInfilling.jsonl.gz"
    tasks = []
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        for i, line in enumerate(fh):
            if i % stride:
                continue
            t = json.loads(line)
            tasks.append({"task_id": t["task_id"], "prefix": t["prompt"], "suffix": t["suffix"],
                          "target": t["canonical_solution"]})
            if len(tasks) >= n:
                break
    return tasks


def read_log(path: Path) -> list[dict[str, Any]]:
    """Records of a latency log."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
