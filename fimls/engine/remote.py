"""An existing inference server as the engine (``--engine URL``).

fimls keeps its LSP side (the document mirror, the FIM prompt with other buffers' context,
post-processing, stale-work dropping, the latency log) and sends the prompt to a server
that batches many users: llama.cpp's llama-server (``/completion`` with the prompt as
token ids, ``cache_prompt`` and a stable ``id_slot`` per document) or any
OpenAI-compatible server (``/v1/completions`` with the prompt as text in the model's FIM
format). The vocabulary and FIM tokens come from a local GGUF (the ``model`` option, read
vocabulary-only: no weights are loaded).

Streams are read on a helper thread; the request loop polls ``cancelled`` between chunks
and closes the connection when the request is superseded, so the server stops generating.
A server that cannot be reached gives empty answers, one state change (``unreachable``)
and retries with a growing back-off, never one error per keystroke.

Only this module opens sockets, and only when ``--engine`` is given.
"""

from __future__ import annotations

import http.client
import json
import logging
import math
import queue
import socket
import ssl
import threading
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from fimls.engine.api import CompletionRequest, CompletionResult, EngineError
from fimls.engine.device import Placement
from fimls.engine.finish import finish, record_confidence, set_outcome
from fimls.latency import LatencyRecord, Outcome, Stop
from fimls.memo import SuggestionMemo
from fimls.postprocess import (
    CursorContext,
    StopPolicy,
    banned_first_bytes,
    cut_to_budget,
)
from fimls.prompt import Prompt, PromptInput, build_prompt, detect_template

log = logging.getLogger(__name__)

CONNECT_TIMEOUT_S = 3.0
READ_TIMEOUT_S = 60.0  # a server that sends nothing for this long is taken as failed
BACKOFF_FIRST_S = 0.5
BACKOFF_MAX_S = 30.0
DEFAULT_PROMPT_TOKENS = 2048  # the server's speed is unknown here; promptTokens overrides
_END = object()


class Unreachable(EngineError):
    """The server could not be reached (or failed); requests are answered empty."""


def forcing_grammar(forced: str, *, ban: bytes = b"") -> str:
    """A GBNF grammar for output that starts with ``forced`` (token healing), goes on with
    a character that is none of ``ban``'s (ASCII; see the engine's first-token rules), then
    anything."""
    lit = "".join(ch if ch.isascii() and ch.isalnum() else
                  f"\\x{ord(ch):02X}" if ord(ch) < 0x80 else
                  f"\\u{ord(ch):04X}" if ord(ch) < 0x10000 else f"\\U{ord(ch):08X}"
                  for ch in forced)
    parts = [f'"{lit}"'] if lit else []
    if ban:
        parts.append("[^" + "".join(f"\\x{b:02X}" for b in ban) + "]")
    parts.append("[^\\x00]*")
    return "root ::= " + " ".join(parts) + "\n"


def _detokenize(vocab: Any, tokens: list[int]) -> str:
    return b"".join(vocab.piece(t) for t in tokens).decode("utf-8", "replace")


@dataclass
class _Received:
    """What a completion's stream has given so far."""

    forced: str  # text the grammar forces at the cursor: the user's, not the suggestion
    policy: StopPolicy
    out: str = ""
    probs: list[float] = field(default_factory=list)  # the first line's tokens
    line_done: bool = False
    raw: str = ""  # the server's text while the forced part arrives
    t_first: float | None = None

    def unforced(self, piece: str, final: str) -> str | None:
        """``piece`` past the forced text; None while the forced text is still arriving."""
        if not self.forced:
            return piece
        self.raw += piece
        if len(self.raw) < len(self.forced) and self.forced.startswith(self.raw) and not final:
            return None
        if self.raw.startswith(self.forced):
            piece = self.raw[len(self.forced):]
        elif self.forced.startswith(self.raw):
            piece = ""  # stopped before the forced text was complete
        else:
            log.warning("engine server ignored the grammar forcing the text at the cursor")
            piece = self.raw
        self.forced = ""
        return piece


class RemoteEngine:
    """:class:`fimls.engine.api.EngineLike` over HTTP(S) to an inference server."""

    def __init__(self, url: str, model_path: Path | None, *, protocol: str = "auto",
                 key: str | None = None, n_ctx: int = 4096, prompt_tokens: int = 0,
                 fim_order: str = "auto", slot: str = "document") -> None:
        """``model_path``: a GGUF whose vocabulary (only) is read; None: llama-server's
        own vocabulary, asked over HTTP (the default model's when the server cannot say)."""
        from fimls.engine.llama import LlamaModel

        parts = urlsplit(url.rstrip("/"))
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise EngineError(f"--engine must be an http(s) URL, not {url!r}")
        self.url = url.rstrip("/")
        self._scheme, self._host = parts.scheme, parts.hostname
        self._port = parts.port or (443 if parts.scheme == "https" else 80)
        self._base = parts.path.rstrip("/")
        self.key = key
        self.warnings: list[str] = []
        self.typed_from_memo = True  # see complete: typing the shown suggestion
        self.placement = Placement(backend="server", device=f"{self._host}:{self._port}")
        self.on_exit: Callable[[str], None] | None = None
        # Called with "unreachable" (and a reason) or "ready" when that changes.
        self.on_status: Callable[[str, str | None], None] | None = None
        self.protocol = protocol
        # Typing what was suggested is answered here, with no round trip (fimls.memo).
        self.memo = SuggestionMemo()
        self.slot = slot  # "document": id_slot from the URI; "server": the server picks
        self.slots = 0  # llama-server's slot count (/props), 0: unknown
        self._reachable = True
        self._retry_at = 0.0
        self._backoff = BACKOFF_FIRST_S
        self._lock = threading.Lock()
        self._current: tuple[str, http.client.HTTPConnection] | None = None
        props = self._props() if protocol in ("auto", "llama") else None
        if protocol == "auto":
            self.protocol = "openai" if props == {} else "llama"
        if props:
            self.slots = int(props.get("total_slots") or 0)
        self._vocab_model: LlamaModel | None = None
        self.vocab: Any
        if model_path is None and self.protocol == "llama" and props:
            from fimls.engine.httpvocab import HttpVocab

            self.vocab = HttpVocab(self._post, props, self._n_vocab())
            name = Path(str(props.get("model_path") or "model")).name
            log.info("engine %s: the server's vocabulary (%s)", self.url, name)
        else:
            if model_path is None:
                from fimls.models import resolve_model

                model_path = resolve_model(None)
                log.warning("engine %s: its vocabulary is not served; using %s's (--model "
                            "names the server's GGUF)", self.url, model_path.name)
            self._vocab_model = LlamaModel(model_path, vocab_only=True)
            self.vocab = self._vocab_model.vocab
            name = model_path.name
        self.template = detect_template(self.vocab, order=fim_order)
        # The texts of the template's stop tokens, sent with every request.
        self._stops = [_detokenize(self.vocab, [t]) for t in sorted(self.template.stop_ids)]
        self.n_ctx = n_ctx
        self.prompt_tokens = prompt_tokens or min(DEFAULT_PROMPT_TOKENS, n_ctx)
        self.model_name = f"{name} @ {self._host}:{self._port}"

    @property
    def pid(self) -> int | None:
        """No local process runs the model."""
        return None

    # -- HTTP -------------------------------------------------------------------------------

    def _connection(self, timeout: float) -> http.client.HTTPConnection:
        if self._scheme == "https":
            return http.client.HTTPSConnection(self._host, self._port, timeout=timeout,
                                               context=ssl.create_default_context())
        return http.client.HTTPConnection(self._host, self._port, timeout=timeout)

    def _headers(self) -> dict[str, str]:
        h = {"Content-Type": "application/json", "Accept": "application/json"}
        if self.key:
            h["Authorization"] = f"Bearer {self.key}"
        return h

    def _get(self, path: str) -> dict[str, Any] | None:
        """GET ``path`` as JSON; None when the server answers with an error."""
        conn = self._connection(CONNECT_TIMEOUT_S)
        try:
            conn.request("GET", self._base + path, headers=self._headers())
            resp = conn.getresponse()
            body = resp.read()
            if resp.status != 200:
                return None
            out = json.loads(body)
            return out if isinstance(out, dict) else None
        finally:
            conn.close()

    def _props(self) -> dict[str, Any] | None:
        """llama-server's ``/props``; {} when the server is not llama-server (taken as
        OpenAI-compatible), None when it cannot be reached (taken as llama-server)."""
        try:
            props = self._get("/props")
        except (OSError, ValueError, http.client.HTTPException):
            log.warning("engine %s: not reachable to detect its protocol; assuming "
                        "llama-server (--engine-protocol sets it)", self.url)
            return None
        if props is not None and ("default_generation_settings" in props
                                  or "total_slots" in props):
            return props
        return {}

    def _n_vocab(self) -> int:
        """The vocabulary's size from llama-server's ``/v1/models`` (0: not said)."""
        try:
            models = self._get("/v1/models") or {}
            return int(((models.get("data") or [{}])[0].get("meta") or {}).get("n_vocab", 0))
        except (OSError, ValueError, TypeError, AttributeError, http.client.HTTPException):
            return 0

    def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """POST ``body`` to ``path`` and return the JSON answer (raises on failure)."""
        conn = self._connection(READ_TIMEOUT_S)
        try:
            conn.request("POST", self._base + path, body=json.dumps(body).encode(),
                         headers=self._headers())
            resp = conn.getresponse()
            data = resp.read()
            if resp.status != 200:
                raise Unreachable(f"engine server answered HTTP {resp.status} at {path}")
            out = json.loads(data)
            if not isinstance(out, dict):
                raise Unreachable(f"engine server answered {path} with no object")
            return out
        finally:
            conn.close()

    # -- the request ------------------------------------------------------------------------

    def _build(self, req: CompletionRequest) -> Prompt:
        """The prompt as the engine here builds it (the healed token left out)."""
        inp = PromptInput(prefix=req.prefix, suffix=req.suffix, prefix_offset=req.prefix_offset,
                          repo_name=req.repo_name, rel_path=req.rel_path,
                          context=tuple(req.context), context_tokens=req.context_tokens)
        budget = min(self.prompt_tokens, self.n_ctx - req.max_tokens - 8)
        return build_prompt(self.template, self.vocab, inp, max(64, budget))

    def _put_back(self, prompt: Prompt) -> list[int]:
        """The prompt's tokens with the healed token put back before the suffix: the
        server gets the text up to the cursor as it is."""
        tokens = list(prompt.tokens)
        healed = self.vocab.tokenize(prompt.constraint)
        t = self.template
        if t.kind == "fim" and t.order == "psm" and t.suf in tokens:
            at = tokens.index(t.suf)
        elif t.kind == "fim" and t.mid >= 0 and tokens and tokens[-1] == t.mid:
            at = len(tokens) - 1
        else:
            at = len(tokens)
        tokens[at:at] = healed
        return tokens

    def _request_prompt(self, req: CompletionRequest, ctx: CursorContext,
                        ) -> tuple[Prompt, list[int], str, str | None]:
        """The prompt, its tokens, the text the output must start with (the healed token's,
        as in-process) and the grammar that forces it: only llama-server takes one."""
        prompt = self._build(req)
        ban = banned_first_bytes(ctx.mode, ctx.line_prefix)
        if self.protocol != "llama" or not (prompt.constraint or ban):
            tokens = self._put_back(prompt) if prompt.constraint else list(prompt.tokens)
            return prompt, tokens, "", None
        try:
            forced = prompt.constraint.decode("utf-8")
        except UnicodeDecodeError:  # half a character: put the token back instead
            return (prompt, self._put_back(prompt), "",
                    forcing_grammar("", ban=ban) if ban else None)
        return prompt, list(prompt.tokens), forced, forcing_grammar(forced, ban=ban)

    def _body(self, req: CompletionRequest, tokens: list[int],
              grammar: str | None) -> tuple[str, dict[str, Any]]:
        stops = self._stops
        if self.protocol == "llama":
            body: dict[str, Any] = {
                "prompt": tokens, "n_predict": req.max_tokens, "temperature": 0,
                "top_k": 1, "samplers": ["top_k"], "cache_prompt": True, "stream": True,
                # The chosen token's probability in the model's own distribution (what
                # the gate needs), and the server's timings with every chunk (the stream
                # is often closed before its last).
                "n_probs": 1, "timings_per_token": True, "stop": stops}
            if grammar is not None:
                body["grammar"] = grammar
            if self.slots and self.slot == "document":
                # One slot per document: its cache keeps that document's prompt.
                body["id_slot"] = zlib.crc32(req.uri.encode()) % self.slots
            return "/completion", body
        if tokens and tokens[0] == self.template.bos >= 0:
            tokens = tokens[1:]  # the server adds its own
        return "/v1/completions", {
            "prompt": _detokenize(self.vocab, tokens), "max_tokens": req.max_tokens,
            "temperature": 0, "stream": True, "logprobs": 1, "stop": stops, "echo": False}

    def _stream(self, path: str, body: dict[str, Any], rid: str,
                out: queue.Queue[Any]) -> None:
        """POST and put each streamed JSON event on ``out`` (then _END, or an exception)."""
        conn = self._connection(CONNECT_TIMEOUT_S)
        with self._lock:
            self._current = (rid, conn)
        try:
            # The network round trip: the TCP (and TLS) handshake, timed on its own, as the
            # response's first byte waits for the server's prompt processing too.
            t0 = time.monotonic()
            conn.connect()
            out.put(("hop", (time.monotonic() - t0) * 1000.0))
            # Connected: the server is there. Its first byte waits for a free slot and the
            # prompt, which under a team's load takes longer than a connection may.
            if conn.sock is not None:
                conn.sock.settimeout(READ_TIMEOUT_S)
            conn.request("POST", self._base + path, body=json.dumps(body).encode(),
                         headers=self._headers())
            resp = conn.getresponse()
            if resp.status != 200:
                raise Unreachable(f"engine server answered HTTP {resp.status} "
                                  f"{resp.reason} at {path}")
            while True:
                line = resp.readline()
                if not line:
                    break
                text = line.decode("utf-8", "replace").strip()
                if not text.startswith("data:"):
                    continue
                data = text[5:].strip()
                if data == "[DONE]":
                    break
                out.put(json.loads(data))
            out.put(_END)
        except BaseException as exc:  # handed to the request loop, which raises it
            out.put(exc)
        finally:
            with self._lock:
                if self._current is not None and self._current[0] == rid:
                    self._current = None
            conn.close()

    def _abort_stream(self, request_id: str | None = None) -> None:
        """Close the connection in flight: the server sees the client go and stops."""
        with self._lock:
            cur = self._current
        if cur is not None and (request_id is None or cur[0] == request_id):
            try:
                if cur[1].sock is not None:
                    cur[1].sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def _set_reachable(self, ok: bool, why: str | None = None) -> None:
        if ok:
            self._backoff = BACKOFF_FIRST_S
        else:
            self._retry_at = time.monotonic() + self._backoff
            self._backoff = min(BACKOFF_MAX_S, self._backoff * 2)
        if ok != self._reachable:
            self._reachable = ok
            if ok:
                log.info("engine server %s is reachable again", self.url)
            else:
                log.warning("engine server %s unreachable: %s", self.url, why)
            if self.on_status is not None:
                self.on_status("ready" if ok else "unreachable", why)

    def complete(self, req: CompletionRequest, cancelled: Callable[[], bool], *,
                 retried: bool = False) -> CompletionResult:
        """Stream one completion from the server, cut and trimmed as the local engine's."""
        t_start, wall = time.monotonic(), time.time()  # (as in Engine.complete)
        rec = LatencyRecord(ts=wall, uri=req.uri, version=req.version, request_id=req.request_id,
                            model=self.model_name, backend=self.placement.backend,
                            queue_ms=(t_start - req.created) * 1000.0)
        early = self._answered_here(req, rec, t_start)
        if early is not None:
            return early
        ctx = CursorContext.from_text(req.prefix, req.suffix)
        try:
            prompt, tokens, forced, grammar = self._request_prompt(req, ctx)
        except (OSError, ValueError, http.client.HTTPException, EngineError) as exc:
            # (The server's tokenizer, without a local GGUF.)
            self._set_reachable(False, str(exc) or type(exc).__name__)
            rec.outcome, rec.error = Outcome.ERROR, f"engine server: {type(exc).__name__}"
            return self._done(req, rec, "", t_start)
        rec.prompt_tokens = len(tokens)
        rec.context_tokens, rec.context_sources = prompt.context_tokens, prompt.context_sources
        rec.window_tokens = prompt.window
        path, body = self._body(req, tokens, grammar)
        events: queue.Queue[Any] = queue.Queue()
        threading.Thread(target=self._stream, args=(path, body, req.request_id, events),
                         daemon=True, name="fimls-remote").start()
        got = _Received(forced=forced, policy=StopPolicy(ctx=ctx, max_lines=req.max_lines))
        rec.stop = Stop.MAX_TOKENS
        try:
            if not self._receive(req, rec, events, got, cancelled):
                rec.outcome = Outcome.CANCELLED
                return self._done(req, rec, "", t_start)
        except (OSError, ValueError, http.client.HTTPException, EngineError) as exc:
            if (isinstance(exc, http.client.RemoteDisconnected | ConnectionResetError
                                | BrokenPipeError)
                    and not got.out and not retried):
                # Dropped before a word: once, at once (not a sign of an outage).
                return self.complete(req, cancelled, retried=True)
            self._set_reachable(False, str(exc) or type(exc).__name__)
            rec.outcome, rec.error = Outcome.ERROR, f"engine server: {type(exc).__name__}"
            return self._done(req, rec, "", t_start)
        self._set_reachable(True)
        return self._finish(req, rec, got, ctx, t_start)

    def _answered_here(self, req: CompletionRequest, rec: LatencyRecord,
                       t_start: float) -> CompletionResult | None:
        """The result of a request the server is not asked for: idle work, a suggestion
        the memo holds, a server known to be down; None for the others."""
        if req.prefill:
            # Idle work is not sent. Prefill is the server's business (cache_prompt keeps
            # what it saw), and the suggestion after the shown one, prefetched, is a
            # second generation per suggestion on a server others share: 4 editors on
            # one server waited 7-14 s (p50) for a first suggestion with it, 1.4 s without.
            rec.outcome = Outcome.PREFILL
            return self._done(req, rec, "", t_start)
        if req.speculative != "off":
            rest = self.memo.recall(req.uri, req.prefix, req.prefix_offset, req.suffix)
            if rest is not None:
                rec.stop, rec.outcome = Stop.MEMO, Outcome.RETURNED
                rec.ttft_ms = (time.monotonic() - req.created) * 1000.0
                return self._done(req, rec, rest, t_start)
        if not self._reachable and time.monotonic() < self._retry_at:
            rec.outcome, rec.error = Outcome.EMPTY, "unreachable"
            return self._done(req, rec, "", t_start)
        return None

    def _receive(self, req: CompletionRequest, rec: LatencyRecord, events: queue.Queue[Any],
                 got: _Received, cancelled: Callable[[], bool]) -> bool:
        """Read the stream into ``got`` until it ends or a stop rule cuts it; False when
        the request was cancelled (the stream is aborted)."""
        while True:
            if cancelled():
                self._abort_stream(req.request_id)
                return False
            try:
                ev = events.get(timeout=0.02)
            except queue.Empty:
                continue
            if ev is _END:
                return True
            if isinstance(ev, BaseException):
                raise ev
            if isinstance(ev, tuple):
                rec.hop_ms = ev[1]
                continue
            piece, piece_probs, final = self._parse(ev, rec)
            if self._take(req, rec, got, piece, piece_probs, final):
                return True

    def _take(self, req: CompletionRequest, rec: LatencyRecord, got: _Received, piece: str,
              piece_probs: list[float], final: str) -> bool:
        """One stream event's text into ``got``; True when the suggestion ends here (a
        stop rule, the time limit, or the server's own end)."""
        unforced = got.unforced(piece, final)
        if unforced is None:
            return False
        piece = unforced
        if piece and got.t_first is None:
            got.t_first = time.monotonic()
            rec.ttft_ms = (got.t_first - req.created) * 1000.0
        if not got.line_done:
            got.probs += piece_probs
            got.line_done = "\n" in (got.out + piece).lstrip(" \t\r\n")
        got.out += piece
        rec.generated_tokens += max(1, len(piece_probs)) if piece else 0
        cut = got.policy.cut(got.out)
        if cut is not None:
            got.out, rec.stop = got.out[:cut], Stop.POLICY
            self._abort_stream(req.request_id)
            return True
        if (req.max_time_ms and got.t_first is not None
                and (time.monotonic() - got.t_first) * 1000.0 >= req.max_time_ms
                and (short := cut_to_budget(got.out)) is not None):
            got.out, rec.stop = short, Stop.MAX_TIME
            self._abort_stream(req.request_id)
            return True
        if final:
            if final == "stop":
                rec.stop = Stop.EOG
            return True
        return False

    def _finish(self, req: CompletionRequest, rec: LatencyRecord, got: _Received,
                ctx: CursorContext, t_start: float) -> CompletionResult:
        """The suggestion, finished as the local engine finishes one
        (:mod:`fimls.engine.finish`)."""
        if got.t_first is not None:
            rec.decode_ms = rec.decode_ms or (time.monotonic() - got.t_first) * 1000.0
        record_confidence(rec, got.probs)
        text = finish(got.out, ctx, req, rec, self.memo)
        set_outcome(rec, text)
        return self._done(req, rec, text, t_start)

    def _parse(self, ev: dict[str, Any], rec: LatencyRecord) -> tuple[str, list[float], str]:
        """(text, probabilities of its tokens, finish reason or "") of one stream event;
        the server's timings go into ``rec``."""
        if self.protocol == "llama":
            probs = []
            for p in ev.get("completion_probabilities") or []:
                if "prob" in p:
                    probs.append(float(p["prob"]))
                elif "logprob" in p:
                    probs.append(math.exp(float(p["logprob"])))
            timings = ev.get("timings")
            if isinstance(timings, dict):
                n = int(timings.get("prompt_n", 0) or 0)
                rec.evaluated_tokens = n
                rec.reused_tokens = max(0, rec.prompt_tokens - n)
                rec.prompt_ms = float(timings.get("prompt_ms", 0.0) or 0.0)
                rec.decode_ms = float(timings.get("predicted_ms", 0.0) or 0.0)
            stop = "stop" if ev.get("stop") and ev.get("stop_type") in ("eos", "word") else (
                "length" if ev.get("stop") else "")
            return str(ev.get("content", "")), probs, stop
        choice = (ev.get("choices") or [{}])[0]
        lp = choice.get("logprobs") or {}
        probs = [math.exp(float(x)) for x in (lp.get("token_logprobs") or []) if x is not None]
        return str(choice.get("text", "")), probs, str(choice.get("finish_reason") or "")

    @staticmethod
    def _done(req: CompletionRequest, rec: LatencyRecord, text: str,
              t_start: float) -> CompletionResult:
        t_end = time.monotonic()
        rec.total_ms = (t_end - req.created) * 1000.0
        rec.model_ms = (t_end - t_start) * 1000.0
        return CompletionResult(text=text, record=rec)

    def interrupt(self, request_id: str) -> None:
        """Close the stream of ``request_id`` now."""
        self._abort_stream(request_id)

    def reset(self) -> None:
        """Forget the suggestions shown (the server keeps its own cache)."""
        self.memo = SuggestionMemo()

    def close(self) -> None:
        """Stop the stream in flight and free the vocabulary."""
        self._abort_stream()
        if self._vocab_model is not None:
            self._vocab_model.close()


def remote_engine(options: Any) -> RemoteEngine:
    """The remote engine for ``options`` (``model.engine`` set)."""
    import os

    from fimls.models import resolve_model

    m = options.model
    key = m.engine_key or os.environ.get("FIMLS_ENGINE_KEY") or None
    # A model named (option or $FIMLS_MODEL) gives the vocabulary; else the server does.
    named = m.model or os.environ.get("FIMLS_MODEL")
    return RemoteEngine(m.engine, resolve_model(named) if named else None,
                        protocol=m.engine_protocol, key=key,
                        n_ctx=m.n_ctx, prompt_tokens=m.prompt_tokens, fim_order=m.fim_order,
                        slot=m.engine_slot)

