"""The client side that ``fimls bench``, ``fimls soak`` and the end-to-end tests share.

* Task sets: :class:`Task` (prefix, suffix, target) and :func:`load_tasks`, which reads a
  bundled HumanEval infilling set by name or any JSONL file with ``prefix`` (or ``prompt``),
  ``suffix`` and ``target`` (or ``canonical_solution``), such as ``fimls tasks`` writes.
* LSP positions: :func:`utf16_len` and :func:`utf16_position`, the (line, UTF-16 character)
  an editor sends for the end of a text, with the line ends LSP knows (``\\n``, ``\\r\\n``,
  ``\\r``).
* An LSP client: :func:`start_client` starts ``fimls serve`` and waits until the model is
  loaded; :func:`open_doc`, :func:`insert` and :func:`inline` (:func:`inline_params`) are
  the three messages an editor sends most. They take any pygls client, pytest-lsp's
  included.
"""

from __future__ import annotations

import asyncio
import gzip
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from lsprotocol import types
from pygls.lsp.client import LanguageClient

BUILTIN_SETS = {
    "humaneval-single": "HumanEval-SingleLineInfilling.jsonl.gz",
    "humaneval-multi": "HumanEval-MultiLineInfilling.jsonl.gz",
}


@dataclass(frozen=True)
class Task:
    """One fill-in-the-middle task: the document is prefix + suffix."""

    task_id: str
    prefix: str
    suffix: str
    target: str
    path: str = ""  # the document's path in its repository, when known
    # Other files of the repository an editor would have open: (path, text).
    open: tuple[tuple[str, str], ...] = ()


def _open_text(path: Path) -> Iterable[str]:
    if path.suffix == ".gz":
        with gzip.open(path, "rt", encoding="utf-8") as fh:
            yield from fh
    else:
        with path.open(encoding="utf-8") as fh:
            yield from fh


def builtin_path(name: str) -> Path:
    """The file of a bundled task set (a key of :data:`BUILTIN_SETS`)."""
    return Path(str(resources.files("fimls").joinpath("data", BUILTIN_SETS[name])))


def load_tasks(spec: str, n: int, stride: int | None = None) -> tuple[str, list[Task]]:
    """A task set by builtin name or JSONL path, and its name.

    Without ``stride``, ``n`` tasks spread over the whole set; with it, every ``stride``-th
    task from the first, at most ``n``.
    """
    if spec in BUILTIN_SETS:
        path = builtin_path(spec)
        name = spec
    else:
        path = Path(spec)
        name = path.name.split(".")[0]
    rows: list[Task] = []
    for line in _open_text(path):
        if not line.strip():
            continue
        t = json.loads(line)
        prefix = t.get("prefix", t.get("prompt"))
        target = t.get("target", t.get("canonical_solution", ""))
        if prefix is None or "suffix" not in t:
            raise ValueError(f"{path}: each line needs prefix (or prompt) and suffix")
        rows.append(Task(str(t.get("task_id", len(rows))), prefix, t["suffix"], target,
                         path=str(t.get("path", "")),
                         open=tuple((str(o["path"]), str(o["text"]))
                                    for o in t.get("open", []))))
    if not rows:
        raise ValueError(f"{path}: no tasks")
    step = stride or max(1, len(rows) // max(1, n))
    return name, rows[::step][:n]


def utf16_len(text: str) -> int:
    """Length of ``text`` in UTF-16 code units, the unit of LSP's default positions."""
    return len(text.encode("utf-16-le")) // 2


def utf16_position(text: str) -> tuple[int, int]:
    """The (line, UTF-16 character) position at the end of ``text``.

    Lines end at ``\\n``, ``\\r\\n`` or a lone ``\\r``, as in LSP (and never at U+2028, form
    feeds or other characters Python's ``str.splitlines`` would split at).
    """
    line = text.count("\n") + text.count("\r") - text.count("\r\n")
    start = max(text.rfind("\n"), text.rfind("\r")) + 1
    return line, utf16_len(text[start:])


async def start_client(cmd: list[str], name: str, timeout: float = 600.0,
                       root_uri: str | None = None, folders: Sequence[str] = (),
                       ) -> LanguageClient:
    """Start ``cmd`` (a ``fimls serve``), initialize it as an editor with progress support
    would, and return the pygls client once the model-loading progress has ended."""
    client = LanguageClient(name, "1")
    await client.start_io(cmd[0], *cmd[1:])
    ready = asyncio.Event()

    @client.feature(types.WINDOW_WORK_DONE_PROGRESS_CREATE)
    def _create(params: types.WorkDoneProgressCreateParams) -> None:
        return None

    @client.feature(types.PROGRESS)
    def _progress(params: types.ProgressParams) -> None:
        value = params.value
        if isinstance(value, dict) and value.get("kind") == "end":
            ready.set()

    await client.initialize_async(types.InitializeParams(
        root_uri=root_uri,
        workspace_folders=[types.WorkspaceFolder(uri=u, name="repo")
                           for u in (folders or ([root_uri] if root_uri else []))] or None,
        capabilities=types.ClientCapabilities(
            window=types.WindowClientCapabilities(work_done_progress=True))))
    client.initialized(types.InitializedParams())
    await asyncio.wait_for(ready.wait(), timeout)
    return client


def open_doc(client: Any, uri: str, text: str, version: int = 1,
             language: str = "python") -> None:
    """Send didOpen of ``text`` as ``uri``."""
    client.text_document_did_open(types.DidOpenTextDocumentParams(
        text_document=types.TextDocumentItem(uri=uri, language_id=language, version=version,
                                             text=text)))


def close_doc(client: Any, uri: str) -> None:
    """Send didClose of ``uri``."""
    client.text_document_did_close(types.DidCloseTextDocumentParams(
        text_document=types.TextDocumentIdentifier(uri=uri)))


async def stop_client(client: LanguageClient) -> None:
    """Shut the server down as an editor does (shutdown, exit) and stop the client."""
    await client.shutdown_async(None)
    client.exit(None)
    await client.stop()


def insert(client: Any, uri: str, version: int, line: int, character: int, text: str) -> None:
    """Send didChange inserting ``text`` at (line, character), the document now ``version``."""
    pos = types.Position(line=line, character=character)
    client.text_document_did_change(types.DidChangeTextDocumentParams(
        text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=version),
        content_changes=[types.TextDocumentContentChangePartial(
            range=types.Range(start=pos, end=pos), text=text)]))


def inline_params(uri: str, line: int, character: int, *, invoked: bool = False,
                  ) -> types.InlineCompletionParams:
    """The params of textDocument/inlineCompletion at (line, character), as typing
    triggers it (``invoked``: as the user's explicit request does)."""
    kind = (types.InlineCompletionTriggerKind.Invoked if invoked
            else types.InlineCompletionTriggerKind.Automatic)
    return types.InlineCompletionParams(
        text_document=types.TextDocumentIdentifier(uri=uri),
        position=types.Position(line=line, character=character),
        context=types.InlineCompletionContext(trigger_kind=kind))


async def inline(client: Any, uri: str, line: int, character: int, *, invoked: bool = False,
                 ) -> types.InlineCompletionList | list[types.InlineCompletionItem] | None:
    """textDocument/inlineCompletion at (line, character), as typing triggers it: the answer
    (an InlineCompletionList, a list of items, or None).

    A coroutine: wrapped in a task, the request goes out when the task first runs, after
    whatever the caller sends before it yields.
    """
    return await client.text_document_inline_completion_async(
        inline_params(uri, line, character, invoked=invoked))
