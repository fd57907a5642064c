"""The LSP server: pygls handlers that translate between LSP and the engine's requests.

Handlers are the module-level functions below, one per LSP method (``build_server``
registers them); they stay thin: read params, build a :class:`CompletionRequest`, await the
scheduler, map the result. :class:`FimlsServer` holds the state they share: the documents,
the options, the scheduler and the latency log. The text mirror is ours (``documents``),
not pygls's workspace, because pygls splits lines on characters that are not LSP line ends
and re-splits the whole document on every change. JSON-RPC hardening (answers to malformed
or untimely messages) lives in :mod:`fimls.protocol`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from lsprotocol import types
from pygls.lsp.server import LanguageServer
from pygls.protocol.language_server import lsp_method

from fimls import __version__
from fimls.config import Options, apply_dict
from fimls.crossfile import CHARS_PER_TOKEN as CONTEXT_CHARS_PER_TOKEN
from fimls.crossfile import NEAR_AFTER, NEAR_BEFORE, ContextChunk, ContextStore
from fimls.crossfile.workspace import Workspace
from fimls.disabled import DisabledGlobs
from fimls.documents import DocumentStore, Pos, TextDocument, file_path, workspace_relative_path
from fimls.engine.api import (
    CompletionRequest,
    CompletionResult,
    EngineLike,
    EngineState,
    Prefill,
    describe_error,
)
from fimls.latency import LatencyLog, Outcome
from fimls.models import default_latency_log
from fimls.nextedit.service import NextEdits, Proposal, scoring_request
from fimls.nextedit.targets import Target
from fimls.protocol import StrictProtocol, valid_id
from fimls.scheduler import Scheduler

log = logging.getLogger(__name__)

# Idle prefill starts after this long with no request: an editor that asks at every
# keystroke asks well within it, so the prefill never races its request.
IDLE_PREFILL_DELAY_S = 0.3
# A file opened within this long of a request in another open file may be a peek: its
# opening is not prefilled over the cache that serves the other file.
OPEN_PREFILL_QUIET_S = 30.0
# A context set chosen for a cursor serves requests within this many lines of it: typing
# never changes the prompt's front (the KV cache keeps it); a jump elsewhere chooses anew.
CONTEXT_REGION_LINES = 40
ALTERNATIVES = 2  # more items for an explicit (Invoked) request, each another first line
OPEN_CONTEXT_LINES = 40  # after didOpen: identifiers of the file's first lines (its imports)
ACCEPT_COMMAND = "fimls.acceptCompletion"
STATUS_REQUEST = "fimls/status"
DOCUMENT_STATE_REQUEST = "fimls/documentState"
CURSOR_NOTIFICATION = "fimls/cursor"
NEXT_EDITS_REQUEST = "fimls/nextEdits"
NEXT_EDITS_DISMISSED = "fimls/dismissNextEdits"
"""Where the cursor rests ({textDocument: {uri}, position}), from fimls's own editor
plugins: the idle prefill then evaluates the prompt there before it is asked for."""
# What editors report about a suggestion, and the event it becomes in the latency log.
OUTCOME_NOTIFICATIONS = {"fimls/didShowCompletion": "shown", "fimls/didAccept": "accepted",
                         "fimls/didPartiallyAccept": "partial", "fimls/didDismiss": "dismissed"}


class FimlsProtocol(StrictProtocol):
    """The hardened protocol, whose text-document sync feeds our mirror instead of
    pygls's."""

    _server: FimlsServer

    @lsp_method(types.TEXT_DOCUMENT_DID_OPEN)
    def lsp_text_document__did_open(self, params: types.DidOpenTextDocumentParams) -> None:
        """Mirror the opened document."""
        self._server.on_open(params)

    @lsp_method(types.TEXT_DOCUMENT_DID_CHANGE)
    def lsp_text_document__did_change(self, params: types.DidChangeTextDocumentParams) -> None:
        """Apply incremental or full changes to the mirror."""
        self._server.on_change(params)

    @lsp_method(types.TEXT_DOCUMENT_DID_CLOSE)
    def lsp_text_document__did_close(self, params: types.DidCloseTextDocumentParams) -> None:
        """Forget the document."""
        self._server.on_close(params)


EngineFactory = Callable[[Options], EngineLike]


class FimlsServer(LanguageServer):
    """fimls's language server: documents, options, the scheduler and the latency log."""

    protocol: FimlsProtocol

    def __init__(self, options: Options, engine_factory: EngineFactory) -> None:
        super().__init__("fimls", __version__, protocol_cls=FimlsProtocol,
                         text_document_sync_kind=types.TextDocumentSyncKind.Incremental)
        self.options = options
        self.engine_factory = engine_factory
        self.docs = DocumentStore()
        self.context = ContextStore()
        # uri -> (line it was chosen at, chunks): the other buffers' text in its prompts
        self._context_sets: dict[str, tuple[int, list[ContextChunk]]] = {}
        self.encoding = "utf-16"
        self.roots: list[str] = []
        self.disk = Workspace([])  # the workspace folders on disk; set at initialize
        self.disabled = DisabledGlobs.compile(options.completion.disabled_globs)
        self.hidden: set[str] = set()  # open documents disabledGlobs keeps unread
        self.next_edits = NextEdits(options.completion.next_edit_margin)
        self.latency_log = LatencyLog(self._latency_path(options))
        self.scheduler = Scheduler(self.latency_log)
        self._warned: set[str] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._progress_token: str | None = None
        self._progress_begun: str | None = None
        self._progress_seq = 0
        self._initialized = False
        self._prefill_timer: asyncio.TimerHandle | None = None
        self._last_ask: tuple[str, float] | None = None  # (uri, when) of the last request
        # (uri, cursor offset, shown text) of the last prefetch: the prompt it evaluates
        self._prefetch: tuple[str, int, str] | None = None
        self.exit_code = 0
        self.scheduler.on_state_change(self._on_engine_state)
        self.scheduler.on_warning(self._on_engine_warning)

    def report_server_error(self, error: Exception, source: Any) -> None:
        """Log server-side errors; never pop them up in the editor on every bad message.

        Unparsable JSON gets the JSON-RPC parse error reply (id null) the spec asks for.
        """
        if isinstance(error, json.JSONDecodeError):
            log.warning("malformed JSON from the client: %s", error)
            self.protocol.send_error(None, types.ErrorCodes.ParseError,
                                     f"Parse error: {error}")
            return
        # The message of an arbitrary exception may quote document text: type only.
        log.error("server error (%s): %s", getattr(source, "__name__", source),
                  describe_error(error))
        log.debug("server error", exc_info=error)

    # -- options and model -----------------------------------------------------------------

    @staticmethod
    def _latency_path(options: Options) -> Path:
        p = options.logging.latency_log
        return Path(p).expanduser() if p else default_latency_log()

    def apply_options(self, data: Any, *, initial: bool) -> None:
        """Merge client options; reload the model when a model option changed."""
        new, warnings = apply_dict(self.options, data)
        for w in warnings:
            self.warn_once(w)
        old = self.options
        self.options = new
        self.next_edits.margin = new.completion.next_edit_margin
        logging.getLogger("fimls").setLevel(new.logging.log_level)
        if new.logging.latency_log != old.logging.latency_log:
            self.latency_log.set_path(self._latency_path(new))
        if new.completion.disabled_globs != old.completion.disabled_globs:
            self.disabled = DisabledGlobs.compile(new.completion.disabled_globs)
            for uri in [u for u in self.docs.uris() if self.disabled.matches(u, self.roots)]:
                self._forget(uri)
                self.hidden.add(uri)
        if not initial and new.model != old.model:
            self.start_loading()

    def warn_once(self, message: str) -> None:
        """Log a warning and show it to the user, once per distinct message."""
        log.warning("%s", message)
        if message in self._warned:
            return
        self._warned.add(message)
        self.show(message, types.MessageType.Warning)

    def show(self, message: str, kind: types.MessageType) -> None:
        """window/showMessage, from any thread."""
        def send() -> None:
            try:
                self.window_show_message(types.ShowMessageParams(type=kind,
                                                                 message=f"fimls: {message}"))
            except Exception:
                log.debug("could not send showMessage", exc_info=True)
        self._call_in_loop(send)

    def _call_in_loop(self, fn: Callable[[], None]) -> None:
        loop = self._loop
        if loop is None:
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            fn()
        else:
            loop.call_soon_threadsafe(fn)

    def start_loading(self) -> None:
        """Load (or reload) the model on the engine thread; requests meanwhile get empty
        results. Progress is shown once the client can be sent requests (``initialized``)."""
        opts = self.options
        self.scheduler.load(lambda: self.engine_factory(opts))

    def begin_progress(self) -> None:
        """``$/progress`` for a model load in flight (call on the event loop thread)."""
        caps = self.client_capabilities
        window = caps.window if caps else None
        if (not (window and window.work_done_progress)
                or self.scheduler.state != EngineState.LOADING):
            return
        if self._progress_token is not None:
            return  # already showing
        self._progress_seq += 1
        token = f"fimls-load-{self._progress_seq}"
        self._progress_token = token

        def begin(*_: Any) -> None:
            try:
                self.work_done_progress.begin(token, types.WorkDoneProgressBegin(
                    title="fimls", message="loading model", cancellable=False))
            except Exception:
                log.debug("progress begin failed", exc_info=True)
                return
            self._progress_begun = token
            if self.scheduler.state in (EngineState.READY, EngineState.FAILED):
                self._end_progress()

        try:
            self.work_done_progress.create(token, callback=begin)
        except Exception:
            log.debug("progress create failed", exc_info=True)

    def _end_progress(self) -> None:
        token = self._progress_begun
        if token is None or token != self._progress_token:
            return  # not begun yet: begin() ends it as soon as it has begun
        self._progress_token = self._progress_begun = None
        ok = self.scheduler.state == EngineState.READY
        try:
            self.work_done_progress.end(token, types.WorkDoneProgressEnd(
                message="model ready" if ok else "model failed to load"))
        except Exception:
            log.debug("progress end failed", exc_info=True)

    def _on_engine_state(self, state: EngineState, error: str | None) -> None:
        # Called on the engine thread. A failed load and a dead engine process mean no
        # completions (for a while): errors. A failed load also ends the progress shown.
        if state in (EngineState.FAILED, EngineState.RESTARTING) and error:
            self.show(error, types.MessageType.Error)
        if state == EngineState.UNREACHABLE:
            # Once per outage, not per keystroke: the state changes only when it flips.
            self.show(f"fimls: the engine server is unreachable ({error}); completions "
                      "resume when it answers again", types.MessageType.Error)
        if state in (EngineState.READY, EngineState.FAILED):
            self._call_in_loop(self._end_progress)
        if state == EngineState.LOADING and self._initialized:
            self._call_in_loop(self.begin_progress)

    def _on_engine_warning(self, message: str) -> None:
        # Called on the engine thread: the engine works, but not as configured (a refused
        # draft model), so the user hears a warning rather than an error.
        self.show(message, types.MessageType.Warning)

    # -- documents -------------------------------------------------------------------------

    def on_open(self, params: types.DidOpenTextDocumentParams) -> None:
        """didOpen."""
        td = params.text_document
        if self.disabled.matches(td.uri, self.roots):
            # Not mirrored at all: no text of it exists here to leak (see fimls.disabled).
            self.hidden.add(td.uri)
            log.info("not reading %s: it matches disabledGlobs", td.uri)
            return
        self.docs.open(td.uri, td.language_id, td.version, td.text)
        self.next_edits.tracker.opened(td.uri, td.text)
        _repo, rel = workspace_relative_path(td.uri, self.roots)
        self.context.open(td.uri, rel or td.uri.rsplit("/", 1)[-1], self._reader(td.uri))
        self._plan_prefill(td.uri, None)

    def _reader(self, uri: str) -> Callable[[], str | None]:
        """The current text of ``uri`` while it is open (the context store keeps no copy)."""
        def read() -> str | None:
            d = self.docs.get(uri)
            return d.text if d is not None else None
        return read

    def on_change(self, params: types.DidChangeTextDocumentParams) -> None:
        """didChange: apply edits; whatever was computing for the old text is stale now."""
        uri = params.text_document.uri
        if uri in self.hidden:
            return
        changes: list[tuple[str, tuple[Pos, Pos] | None]] = []
        for ch in params.content_changes:
            rng = getattr(ch, "range", None)
            if rng is None:
                changes.append((ch.text, None))
            else:
                changes.append((ch.text, (Pos(rng.start.line, rng.start.character),
                                          Pos(rng.end.line, rng.end.character))))
        doc = self.docs.change(uri, params.text_document.version, changes, self.encoding)
        if doc is None:
            log.debug("didChange for a document that is not open: %s", uri)
        else:
            self.next_edits.tracker.changed(uri, doc.text)
        self.scheduler.cancel_uri(uri, Outcome.SUPERSEDED)
        last = changes[-1][1] if changes else None
        self.context.changed(uri, last[0].line if last is not None else None)
        if doc is not None and changes and changes[-1][1] is not None:
            text, rng = changes[-1]
            assert rng is not None
            # The cursor is most likely just after the last edit (the text before its start
            # did not change, so the start's offset is the same in the new text).
            self._plan_prefill(uri, doc.offset_at(rng[0], self.encoding) + len(text))

    def on_cursor(self, params: Any) -> None:
        """fimls/cursor: the user's cursor rests here (a file opened at a line, a click, a
        jump). Without it the cursor is known only at the first request, and a file opened
        deep down gets its opening evaluated, which serves no cursor there."""
        td = getattr(params, "textDocument", None)
        pos = getattr(params, "position", None)
        uri = getattr(td, "uri", None)
        line, char = getattr(pos, "line", None), getattr(pos, "character", None)
        if (not isinstance(uri, str) or not isinstance(line, int) or not isinstance(char, int)
                or line < 0 or char < 0):
            log.debug("%s without a document and position ignored", CURSOR_NOTIFICATION)
            return
        doc = self.docs.get(uri)
        if doc is not None:
            self._plan_prefill(uri, doc.offset_at(Pos(line, char), self.encoding))

    def _plan_prefill(self, uri: str, cursor: int | None) -> None:
        """After a short pause with no request, evaluate what the next request will need:
        the prompt at ``cursor``, or the file's opening when the cursor is unknown."""
        if self._prefill_timer is not None:
            self._prefill_timer.cancel()
            self._prefill_timer = None
        if not self.options.completion.idle_prefill or self._loop is None:
            return
        self._prefill_timer = self._loop.call_later(IDLE_PREFILL_DELAY_S, self._start_prefill,
                                                    uri, cursor)

    def _start_prefill(self, uri: str, cursor: int | None) -> None:
        self._prefill_timer = None
        doc = self.docs.get(uri)
        if doc is None:
            return
        if cursor is None:
            last = self._last_ask
            if (last is not None and last[0] != uri and last[0] in self.docs
                    and time.monotonic() - last[1] < OPEN_PREFILL_QUIET_S):
                # The cache serves a document the user was just typing in (this one may
                # be a peek or a background open): keep it.
                return
            repo, rel = workspace_relative_path(doc.uri, self.roots)
            c = self.options.completion
            # The context a cursor at the top would get (the identifiers of the first
            # lines: mostly imports, which name what this file uses from the others).
            context = self._context_for(doc, Pos(0, 0), "", doc.text[:8192], idle=True,
                                        near=(0, OPEN_CONTEXT_LINES))
            req = CompletionRequest(uri=uri, version=doc.version,
                                    prefix=doc.text[:self._text_cap()],
                                    suffix="", repo_name=repo, rel_path=rel,
                                    max_tokens=c.max_tokens, context=context,
                                    context_tokens=c.context_tokens, prefill=Prefill.OPEN)
        else:
            pf = self._prefetch
            if (pf is not None and pf[0] == uri and pf[1] == cursor
                    and doc.text[cursor - len(pf[2]):cursor] == pf[2]):
                return  # the suggestion was accepted: its prefetch evaluates this prompt
            req = replace(self.make_request(doc, doc.position_at(cursor, self.encoding),
                                            idle=True), prefill=Prefill.CURSOR)
        if self.scheduler.prefill(req):
            log.debug("idle prefill (%s) of %s queued", req.prefill, uri)

    def on_close(self, params: types.DidCloseTextDocumentParams) -> None:
        """didClose."""
        uri = params.text_document.uri
        self.hidden.discard(uri)
        self._forget(uri)

    def _forget(self, uri: str) -> None:
        """Drop a document and every copy of its text: its work, its chunks in others'
        prompts."""
        self.scheduler.cancel_uri(uri, Outcome.CANCELLED, idle=True)
        self.docs.close(uri)
        self.next_edits.tracker.closed(uri)
        # No text of a closed buffer is kept, nor sent again.
        self.context.close(uri)
        self._context_sets.pop(uri, None)
        for u, (line, chunks) in list(self._context_sets.items()):
            if any(c.uri == uri for c in chunks):
                self._context_sets[u] = (line, [c for c in chunks if c.uri != uri])

    # -- next edits ------------------------------------------------------------------------

    async def next_edits_for(self, uri: str) -> list[Proposal]:
        """The verified next edits of ``uri``'s pending edit (fimls/nextEdits)."""
        lines = {u: d.text.split("\n") for u in self.docs.uris()
                 if (d := self.docs.get(u)) is not None}
        return await self.next_edits.propose(uri, lines, self._score_target)

    async def _score_target(self, t: Target, lines: Sequence[str]) -> float | None:
        """The model's margin for ``t`` in its document as ``lines``: the edited line's
        log-probability there minus the original's; None when the engine cannot score."""
        doc = self.docs.get(t.uri)
        if doc is None:
            return None
        repo, rel = workspace_relative_path(doc.uri, self.roots)
        req = scoring_request(t, lines, self.options.completion, version=doc.version,
                              repo_name=repo, rel_path=rel, max_chars=self._text_cap())
        result: CompletionResult = await asyncio.wrap_future(self.scheduler.submit(req))
        if len(result.scores) != 2:
            return None
        return result.scores[1] - result.scores[0]

    # -- completion ------------------------------------------------------------------------

    def _text_cap(self) -> int:
        """Characters of text worth copying into a request: the model never sees more than
        n_ctx tokens."""
        return self.options.model.n_ctx * 8 + 4096

    def make_request(self, doc: TextDocument, pos: Pos, *, idle: bool = False) -> CompletionRequest:
        """A plain engine request for the cursor at ``pos`` in ``doc`` (``idle``: for idle
        work, which may choose a new context set)."""
        cap = self._text_cap()
        prefix, suffix = doc.prefix_suffix(pos, self.encoding, max_prefix=cap, max_suffix=cap)
        offset = doc.offset_at(pos, self.encoding) - len(prefix)
        repo, rel = workspace_relative_path(doc.uri, self.roots)
        return CompletionRequest.from_options(
            self.options.completion, uri=doc.uri, version=doc.version, prefix=prefix,
            suffix=suffix, prefix_offset=offset, repo_name=repo, rel_path=rel,
            neighbors=self._neighbor_texts(doc),
            context=self._context_for(doc, pos, prefix, suffix, idle=idle))

    def _context_for(self, doc: TextDocument, pos: Pos, prefix: str, suffix: str, *,
                     idle: bool, near: tuple[int, int] = (NEAR_BEFORE, NEAR_AFTER),
                     ) -> list[ContextChunk]:
        """The other buffers' chunks for a cursor, kept stable while the user types.

        A request near where the current set was chosen gets that set unchanged, so the
        prompt's front (and its KV cache) stays. A request elsewhere, or the first in a
        document, chooses a set. At idle (a pause after an edit) a set is chosen again
        and replaces the current one only if it brings definitions the current one lacks;
        the idle prefill that follows evaluates it before the next request.
        """
        budget = self.options.completion.context_tokens * CONTEXT_CHARS_PER_TOKEN
        if budget <= 0:
            return []
        cur = self._context_sets.get(doc.uri)
        if cur is not None and abs(cur[0] - pos.line) <= CONTEXT_REGION_LINES and not idle:
            return cur[1]
        disk = self._disk_files(doc)
        if len(self.docs.uris()) < 2 and not disk:
            return []
        chosen = self.context.select(doc.uri, prefix, suffix, budget, near=near, disk=disk)
        if cur is not None and abs(cur[0] - pos.line) <= CONTEXT_REGION_LINES:
            have = {c.key for c in cur[1]}
            if all(c.key in have for c in chosen if c.source == "definition"):
                return cur[1]
        self._context_sets[doc.uri] = (pos.line, chosen)
        return chosen

    def _disk_files(self, doc: TextDocument) -> list[tuple[str, str, str]]:
        """The workspace files ``doc`` imports that are not open, as (uri, path, text)."""
        path = file_path(doc.uri)
        if not self.options.completion.workspace_files or path is None:
            return []
        open_paths = {file_path(u) for u in self.docs.uris()}
        return [(f.path.as_uri(), f.rel, f.text)
                for f in self.disk.imported_files(Path(path), doc.text)
                if str(f.path) not in open_paths and not self.disabled.matches_path(f.rel)]

    def _neighbor_texts(self, doc: TextDocument, limit: int = 3) -> list[str]:
        """Up to ``limit`` other open buffers (their first 8k characters): a draft source."""
        out = []
        for uri in reversed(self.docs.uris()):
            if uri != doc.uri:
                other = self.docs.get(uri)
                if other is not None:
                    out.append(other.text[:8192])
                if len(out) >= limit:
                    break
        return out

    async def complete_at(self, uri: str, position: types.Position, *, invoked: bool = False,
                          ) -> tuple[list[str], TextDocument, Pos, str] | None:
        """Run one completion: the suggestions (the one an automatic request shows first;
        ``invoked``, the user asked: up to ALTERNATIVES more, shown however unsure); None
        when there is nothing to show (or it went stale)."""
        doc = self.docs.get(uri)
        if doc is None:
            return None
        pos = doc.position_at(doc.offset_at(Pos(position.line, position.character),
                                            self.encoding), self.encoding)
        req = self.make_request(doc, pos)
        if invoked:
            req = replace(req, alternatives=ALTERNATIVES, min_confidence=0.0)
        version = doc.version
        self.context.asked(uri, pos.line)
        if self._prefill_timer is not None:
            self._prefill_timer.cancel()  # a request is here: no idle work for now
            self._prefill_timer = None
        self._last_ask = (uri, time.monotonic())

        def still_current() -> bool:
            d = self.docs.get(uri)
            return d is not None and d.version == version

        fut = self.scheduler.submit(req, still_current=still_current)
        try:
            result: CompletionResult = await asyncio.wrap_future(fut)
        except asyncio.CancelledError:
            self.scheduler.cancel(req.request_id, Outcome.CANCELLED)
            raise
        if not result.text or not still_current():
            return None
        # While the user reads the suggestion, compute the one after accepting it (llama.vim
        # does the same): Tab, Tab is then instant. Any request stops it.
        nxt = replace(req, prefix=req.prefix + result.text, prefill=Prefill.NEXT, alternatives=0,
                      request_id=f"{req.request_id}-next", created=time.monotonic())
        if self.options.completion.idle_prefill and self.scheduler.prefill(nxt):
            self._prefetch = (uri, req.prefix_offset + len(nxt.prefix), result.text)
        return [result.text, *result.alternatives], doc, pos, req.request_id

    def outcome(self, event: str, params: Any) -> None:
        """Log what the editor did with a suggestion (shown, accepted, partial, dismissed)."""
        rid = getattr(params, "requestId", None) or getattr(params, "request_id", None)
        if rid is None and isinstance(params, list | tuple) and params:
            rid = params[0]
        if rid is None:
            log.debug("%s without a requestId ignored", event)
            return
        if not valid_id(rid):
            log.warning("%s with a requestId that is not a string ignored", event)
            return
        length = getattr(params, "acceptedLength", None)
        uri = getattr(params, "uri", None)
        # Which of an explicit request's items (0: the first); the accept command's second
        # argument, or the notification's ``index``.
        if isinstance(params, list | tuple):
            index = params[1] if len(params) > 1 else None
        else:
            index = getattr(params, "index", None)
        self.latency_log.write_event(
            event, str(rid), uri=uri if isinstance(uri, str) else None,
            accepted_length=length if isinstance(length, int) and length >= 0 else None,
            index=index if isinstance(index, int) and not isinstance(index, bool)
            and index >= 0 else None)


def build_server(options: Options, engine_factory: EngineFactory) -> FimlsServer:
    """The server with every handler registered (see :mod:`fimls.handlers`)."""
    from fimls.handlers import build_server as build

    return build(options, engine_factory)


def serve(options: Options, engine_factory: EngineFactory) -> int:
    """Run over stdio until exit; the process's exit code (see :mod:`fimls.handlers`)."""
    from fimls.handlers import serve as run

    return run(options, engine_factory)
