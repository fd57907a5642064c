"""The LSP handlers: thin functions that read a message's params, call the server
(:class:`fimls.server.FimlsServer`) and map its answer; and the server built with them."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lsprotocol import types

from fimls.config import Options
from fimls.crossfile.workspace import Workspace
from fimls.documents import Pos, file_path
from fimls.nextedit.service import Proposal
from fimls.server import (
    ACCEPT_COMMAND,
    CURSOR_NOTIFICATION,
    DOCUMENT_STATE_REQUEST,
    NEXT_EDITS_DISMISSED,
    NEXT_EDITS_REQUEST,
    OUTCOME_NOTIFICATIONS,
    STATUS_REQUEST,
    EngineFactory,
    FimlsServer,
)

log = logging.getLogger(__name__)

# The word the cursor ends: a plain completion item replaces it with itself plus the
# suggestion (clients filter items by that word).
_WORD_TAIL = re.compile(r"[A-Za-z0-9_]*$")

# -- handlers ------------------------------------------------------------------------------


def initialize(ls: FimlsServer, params: types.InitializeParams) -> None:
    """Take the position encoding, workspace roots and options; start loading the model.

    Loading starts now, not at ``initialized``: the client is still setting up anyway.
    """
    ls._loop = asyncio.get_running_loop()
    ls.encoding = str(ls.workspace.position_encoding or "utf-16")
    roots = [f.uri for f in (params.workspace_folders or [])]
    if not roots and params.root_uri:
        roots = [params.root_uri]
    ls.roots = roots
    ls.disk = Workspace([Path(p) for p in map(file_path, roots) if p is not None])
    ls.apply_options(params.initialization_options, initial=True)
    ls.start_loading()
    log.info("client %s, position encoding %s",
             params.client_info.name if params.client_info else "?", ls.encoding)


def initialized(ls: FimlsServer, params: types.InitializedParams) -> None:
    """The client takes requests now: show the model load's progress if it is still on."""
    ls._initialized = True
    ls.begin_progress()


def did_change_configuration(ls: FimlsServer,
                             params: types.DidChangeConfigurationParams) -> None:
    """Merge the new settings; a changed model option reloads the model."""
    ls.apply_options(params.settings, initial=False)


async def inline_completion(ls: FimlsServer, params: types.InlineCompletionParams,
                            ) -> types.InlineCompletionList:
    """textDocument/inlineCompletion: one item at the cursor, or none; asked for
    explicitly (trigger kind Invoked), up to three whose first lines differ."""
    invoked = (params.context is not None and params.context.trigger_kind
               == types.InlineCompletionTriggerKind.Invoked)
    if ls.options.completion.trigger_mode == "manual" and not invoked:
        return types.InlineCompletionList(items=[])
    got = await ls.complete_at(params.text_document.uri, params.position, invoked=invoked)
    if got is None:
        return types.InlineCompletionList(items=[])
    texts, _doc, pos, rid = got
    at = types.Position(line=pos.line, character=pos.character)
    # Clients run the item's command when it is accepted (VS Code does): that is how
    # the latency log learns which suggestions were taken, and which of them.
    return types.InlineCompletionList(items=[types.InlineCompletionItem(
        insert_text=text, range=types.Range(start=at, end=at),
        command=types.Command(title="fimls: suggestion accepted", command=ACCEPT_COMMAND,
                              arguments=[rid, i]))
        for i, text in enumerate(texts)])


def accept_command(ls: FimlsServer, *args: Any) -> None:
    """The accept command of an inline item: log the suggestion as accepted."""
    ls.outcome("accepted", list(args))


def status(ls: FimlsServer, params: Any) -> dict[str, Any]:
    """What the engine is doing: for status lines, and for tests that kill the worker."""
    sched = ls.scheduler
    engine = sched.engine
    return {"state": sched.state.value, "model": sched.model_name, "error": sched.load_error,
            "device": engine.placement.describe() if engine else None,
            "gpuLayers": engine.placement.gpu_layers if engine else 0,
            "serverPid": os.getpid(), "workerPid": engine.pid if engine else None,
            "restarts": sched.restarts}


def document_state(ls: FimlsServer, params: Any) -> dict[str, Any] | None:
    """The server's copy of a document, as a digest: lets a client (and the sync tests)
    check that incremental edits were applied as it applied them, without echoing the
    text back."""
    uri = getattr(getattr(params, "textDocument", None), "uri", None)
    doc = ls.docs.get(uri) if isinstance(uri, str) else None
    if doc is None:
        return None
    data = doc.text.encode("utf-8", "surrogatepass")
    return {"version": doc.version, "sha256": hashlib.sha256(data).hexdigest(),
            "length": len(doc.text), "lineCount": doc.line_count}


def cursor(ls: FimlsServer, params: Any) -> None:
    """fimls/cursor: where the user's cursor rests."""
    ls.on_cursor(params)


async def next_edits(ls: FimlsServer, params: Any) -> dict[str, Any]:
    """fimls/nextEdits: the verified next edits of the document's pending edit, nearest
    to ``position`` first."""
    uri = getattr(getattr(params, "textDocument", None), "uri", None)
    if not isinstance(uri, str) or ls.docs.get(uri) is None:
        return {"edits": []}
    line = getattr(getattr(params, "position", None), "line", None)
    at = line if isinstance(line, int) else 0
    found = await ls.next_edits_for(uri)
    log.debug("%s for %s: %d edits (pending: %s)", NEXT_EDITS_REQUEST, uri, len(found),
              ls.next_edits.tracker.pending(uri))
    found.sort(key=lambda p: (p.uri != uri, abs(p.line - at) if p.uri == uri else p.line))
    return {"edits": [e for p in found if (e := _edit_json(ls, p)) is not None]}


def next_edits_dismissed(ls: FimlsServer, params: Any) -> None:
    """fimls/dismissNextEdits: the user dismissed the proposals; the chain ends."""
    uri = getattr(getattr(params, "textDocument", None), "uri", None)
    if isinstance(uri, str):
        ls.next_edits.tracker.dismiss(uri)


def _edit_json(ls: FimlsServer, p: Proposal) -> dict[str, Any] | None:
    """A proposal in the protocol's terms (positions in the negotiated encoding)."""
    doc = ls.docs.get(p.uri)
    if doc is None:
        return None
    base = doc.offset_at(Pos(p.line, 0), ls.encoding)
    start, end = (doc.position_at(base + c, ls.encoding) for c in (p.start, p.end))
    return {"textDocument": {"uri": p.uri},
            "range": {"start": {"line": start.line, "character": start.character},
                      "end": {"line": end.line, "character": end.character}},
            "newText": p.text, "confidence": p.confidence}


def outcome_handler(event: str) -> Callable[[FimlsServer, Any], None]:
    """The handler of one outcome notification: logs ``event`` for the request it names."""
    def on_outcome(ls: FimlsServer, params: Any) -> None:
        ls.outcome(event, params)
    on_outcome.__doc__ = f"Log a suggestion as {event}."
    return on_outcome


async def completion(ls: FimlsServer, params: types.CompletionParams,
                     ) -> types.CompletionList:
    """textDocument/completion, for clients without inline completion: one item that
    replaces the word before the cursor (clients filter items by it)."""
    invoked = (params.context is None or params.context.trigger_kind
               == types.CompletionTriggerKind.Invoked)
    if ls.options.completion.trigger_mode == "manual" and not invoked:
        return types.CompletionList(is_incomplete=True, items=[])
    got = await ls.complete_at(params.text_document.uri, params.position)
    if got is None:
        return types.CompletionList(is_incomplete=True, items=[])
    (text, *_), doc, pos, _rid = got
    line_start = doc.offset_at(Pos(pos.line, 0), ls.encoding)
    cursor = doc.offset_at(pos, ls.encoding)
    word = _WORD_TAIL.search(doc.text[max(line_start, cursor - 200):cursor])
    typed = word.group(0) if word else ""
    start = doc.position_at(cursor - len(typed), ls.encoding)
    label = (typed + text).split("\n", 1)[0].strip() or text.strip()
    at = types.Position(line=pos.line, character=pos.character)
    edit = types.TextEdit(range=types.Range(
        start=types.Position(line=start.line, character=start.character), end=at),
        new_text=typed + text)
    return types.CompletionList(is_incomplete=True, items=[types.CompletionItem(
        label=label[:80], kind=types.CompletionItemKind.Snippet, detail="fimls",
        filter_text=typed + text, text_edit=edit,
        insert_text_format=types.InsertTextFormat.PlainText)])


def exit_(ls: FimlsServer, params: Any) -> None:
    """Record the spec's exit code: 0 after a shutdown request, 1 without one."""
    ls.exit_code = 0 if ls.protocol._shutdown else 1


def shutdown(ls: FimlsServer, params: Any) -> None:
    """Stop the engine thread (pending requests are answered) and close the log."""
    ls.scheduler.shutdown()
    ls.latency_log.close()


def build_server(options: Options, engine_factory: EngineFactory) -> FimlsServer:
    """Create the server and register the handlers above."""
    server = FimlsServer(options, engine_factory)
    server.feature(types.INITIALIZE)(initialize)
    server.feature(types.INITIALIZED)(initialized)
    server.feature(types.WORKSPACE_DID_CHANGE_CONFIGURATION)(did_change_configuration)
    server.feature(types.TEXT_DOCUMENT_INLINE_COMPLETION,
                   types.InlineCompletionOptions())(inline_completion)
    server.command(ACCEPT_COMMAND)(accept_command)
    server.feature(STATUS_REQUEST)(status)
    server.feature(DOCUMENT_STATE_REQUEST)(document_state)
    server.feature(CURSOR_NOTIFICATION)(cursor)
    server.feature(NEXT_EDITS_REQUEST)(next_edits)
    server.feature(NEXT_EDITS_DISMISSED)(next_edits_dismissed)
    for method, event in OUTCOME_NOTIFICATIONS.items():
        server.feature(method)(outcome_handler(event))
    server.feature(types.TEXT_DOCUMENT_COMPLETION, types.CompletionOptions())(completion)
    server.feature(types.EXIT)(exit_)
    server.feature(types.SHUTDOWN)(shutdown)
    return server


def serve(options: Options, engine_factory: EngineFactory) -> int:
    """Run the server over stdio until the client exits; the process exit code."""
    server = build_server(options, engine_factory)
    try:
        server.start_io(sys.stdin.buffer, sys.stdout.buffer)
    except SystemExit:
        pass  # pygls exits on the exit notification: the code is ours to give
    finally:
        server.scheduler.shutdown(timeout=2.0)
        server.latency_log.close()
    return server.exit_code
