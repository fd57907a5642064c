"""``fimls soak``: thousands of requests with random edits against one ``fimls serve``.

A language server lives for days. This drives one server over stdio the way a busy editor
does, for as many requests as asked (10,000 by default), and reports what a leak or a
lost request would show: the resident memory (RSS) of the server and of its engine worker
at the start and at the end, the error count, and request latency (p50/p95).

The workload, drawn from a seeded random generator, per step:

* typing at the cursor, one character, then asking and waiting (most steps; what is typed
  is usually the suggestion that was shown, sometimes other text);
* a burst: three keystrokes, each followed by a request, without waiting (the first two
  are superseded);
* an edit near the cursor or, rarely, far above it: insertions and deletions of random
  text including CRLF, lone CR, U+2028, form feeds and non-BMP characters;
* a request cancelled with ``$/cancelRequest``;
* switching to another of the open documents, or closing one and opening it afresh.

"Start" RSS is taken after a warm-up (the first ``--warmup`` requests, when llama.cpp has
allocated its compute buffers and the caches have filled); RSS right after the model
loaded is printed too. An error is a request that got an LSP error it did not ask for (a
cancelled request may answer RequestCancelled), a latency record with outcome ``error``,
or a request unanswered after 60 s.
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fimls.latency import percentile, read_records
from fimls.tools.harness import inline_params, open_doc, start_client, utf16_position

EDIT_CHARS = ["a", "b", "x", "_", " ", "(", ")", ":", "=", "0", "\n", "\n    ", "\r\n", "\r",
              "\t", "é", "😀", "\u2028", "\f", "\x85", "#"]


def rss_kib(pid: int | None) -> int:
    """Resident memory of ``pid`` in KiB (0 if it is gone)."""
    if not pid:
        return 0
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


@dataclass
class Doc:
    """The client's copy of one open document and its cursor (as a character offset)."""

    uri: str
    text: str
    cursor: int
    version: int = 1
    shown: str = ""  # the last suggestion at the cursor: what the user may type next

    def position(self, offset: int | None = None) -> tuple[int, int]:
        """(line, UTF-16 character) of ``offset`` (default: the cursor); LSP line ends."""
        return utf16_position(self.text[:self.cursor if offset is None else offset])


@dataclass
class SoakResult:
    """What a soak run measured."""

    requests: int = 0
    errors: list[str] = field(default_factory=list)
    latencies_ms: list[float] = field(default_factory=list)
    waited_ms: list[float] = field(default_factory=list)  # requests the client awaited
    rss: dict[str, dict[str, int]] = field(default_factory=dict)
    outcomes: dict[str, int] = field(default_factory=dict)
    rss_series: list[tuple[int, int]] = field(default_factory=list)  # (requests, KiB)
    seconds: float = 0.0


class _Soaker:
    """One soak session: the client, its documents and what it measured."""

    def __init__(self, client: Any, texts: list[str], seed: int) -> None:
        self.client = client
        self.texts = texts
        self.rng = random.Random(seed)
        self.res = SoakResult()
        self.docs: list[Doc] = []
        self.current = 0
        self.serial = 0
        self.sent_at: dict[int, float] = {}
        self.done_at: dict[int, float] = {}

    async def snapshot(self, label: str) -> Any:
        """The server's and the worker's RSS now, as ``label``; the status it read."""
        st = await self.client.protocol.send_request_async("fimls/status", None)
        self.res.rss[label] = {"server": rss_kib(st.serverPid), "worker": rss_kib(st.workerPid)}
        return st

    def new_doc(self, text: str) -> Doc:
        """Open ``text`` as a new document; the cursor where a function's body starts."""
        self.serial += 1
        cut = text.find(":\n    ")
        cursor = cut + 6 if cut >= 0 else len(text)
        doc = Doc(uri=f"file:///soak/doc{self.serial}.py", text=text, cursor=cursor)
        open_doc(self.client, doc.uri, text)
        return doc

    def edit(self, doc: Doc, start: int, end: int, new: str) -> None:
        """Replace ``doc``'s text from ``start`` to ``end``, and tell the server."""
        from lsprotocol import types

        # Never split a CRLF: no editor puts a cursor between the two.
        if 0 < start < len(doc.text) and doc.text[start - 1] == "\r" and doc.text[start] == "\n":
            start -= 1
        if 0 < end < len(doc.text) and doc.text[end - 1] == "\r" and doc.text[end] == "\n":
            end += 1
        (sl, sc), (el, ec) = doc.position(start), doc.position(end)
        doc.version += 1
        self.client.text_document_did_change(types.DidChangeTextDocumentParams(
            text_document=types.VersionedTextDocumentIdentifier(uri=doc.uri,
                                                                version=doc.version),
            content_changes=[types.TextDocumentContentChangePartial(
                range=types.Range(start=types.Position(line=sl, character=sc),
                                  end=types.Position(line=el, character=ec)),
                text=new)]))
        doc.text = doc.text[:start] + new + doc.text[end:]
        if doc.cursor >= end:
            doc.cursor += len(new) - (end - start)
        elif doc.cursor > start:
            doc.cursor = start + len(new)

    def ask(self, doc: Doc) -> asyncio.Future[Any]:
        """Ask for a suggestion at ``doc``'s cursor (sent now, before any edit after it)."""
        line, col = doc.position()
        self.res.requests += 1
        fut = asyncio.ensure_future(self.client.text_document_inline_completion_async(
            inline_params(doc.uri, line, col)))
        self.sent_at[id(fut)] = time.perf_counter()
        fut.add_done_callback(lambda f: self.done_at.__setitem__(id(f), time.perf_counter()))
        return fut

    async def settle(self, futs: list[tuple[asyncio.Future[Any], Doc, bool]],
                     waited: bool) -> None:
        """Await the answers; their latency, or the error they are."""
        res = self.res
        for fut, doc, cancelled in futs:
            try:
                answer = await asyncio.wait_for(fut, 60)
            except asyncio.TimeoutError:
                res.errors.append(f"request on {doc.uri} unanswered after 60 s")
                continue
            except Exception as exc:  # an LSP error reply
                if not (cancelled and "cancel" in str(exc).lower()):
                    res.errors.append(f"{type(exc).__name__}: {exc}")
                self.sent_at.pop(id(fut), None)
                self.done_at.pop(id(fut), None)
                continue
            ms = (self.done_at.pop(id(fut)) - self.sent_at.pop(id(fut))) * 1000.0
            res.latencies_ms.append(ms)
            if waited:
                res.waited_ms.append(ms)
            items = getattr(answer, "items", None) or []
            text = items[0].insert_text if items else ""
            doc.shown = text if isinstance(text, str) else ""

    async def type_one(self, doc: Doc) -> None:
        """Type one character (usually the shown suggestion's next), ask, wait."""
        rng = self.rng
        if doc.shown and rng.random() < 0.8:
            ch, doc.shown = doc.shown[0], doc.shown[1:]
        else:
            ch, doc.shown = rng.choice(EDIT_CHARS), ""
        self.edit(doc, doc.cursor, doc.cursor, ch)
        await self.settle([(self.ask(doc), doc, False)], True)

    async def burst(self, doc: Doc) -> None:
        """Three keystrokes, each asked for, without waiting in between."""
        futs = []
        for _ in range(3):
            self.edit(doc, doc.cursor, doc.cursor, self.rng.choice(EDIT_CHARS))
            futs.append((self.ask(doc), doc, False))
            await asyncio.sleep(self.rng.choice((0.0, 0.005, 0.02)))
        await self.settle(futs, False)

    async def edit_elsewhere(self, doc: Doc) -> None:
        """An edit mostly near the cursor, sometimes far above it; then ask."""
        rng = self.rng
        span = 200 if rng.random() < 0.9 else len(doc.text)
        a = max(0, min(len(doc.text), doc.cursor + rng.randint(-span, span // 4)))
        if rng.random() < 0.5 and len(doc.text) > 400:
            self.edit(doc, a, min(len(doc.text), a + rng.randint(1, 12)), "")
        else:
            self.edit(doc, a, a, "".join(rng.choice(EDIT_CHARS)
                                         for _ in range(rng.randint(1, 8))))
        await self.settle([(self.ask(doc), doc, False)], True)

    async def ask_and_cancel(self, doc: Doc) -> None:
        """Ask, then cancel the request with ``$/cancelRequest``."""
        from lsprotocol import types

        fut = self.ask(doc)
        await asyncio.sleep(self.rng.choice((0.0, 0.01, 0.05)))
        pending = list(self.client.protocol._request_futures)
        if pending:
            self.client.protocol.notify(types.CANCEL_REQUEST, types.CancelParams(id=pending[-1]))
        await self.settle([(fut, doc, True)], False)

    async def step(self) -> Doc:
        """One random step of the workload (see the module's docstring)."""
        from lsprotocol import types

        doc = self.docs[self.current]
        r = self.rng.random()
        if r < 0.60:
            await self.type_one(doc)
        elif r < 0.75:
            await self.burst(doc)
        elif r < 0.87:
            await self.edit_elsewhere(doc)
        elif r < 0.92:
            await self.ask_and_cancel(doc)
        elif r < 0.97:  # switch documents
            self.current = (self.current + 1) % len(self.docs)
            doc = self.docs[self.current]
            await self.settle([(self.ask(doc), doc, False)], True)
        else:  # close a document and open it afresh (from an original text)
            self.client.text_document_did_close(types.DidCloseTextDocumentParams(
                text_document=types.TextDocumentIdentifier(uri=doc.uri)))
            self.docs[self.current] = self.new_doc(self.texts[self.rng.randrange(len(self.texts))])
        return doc


async def _soak(cmd: list[str], texts: list[str], n_requests: int, warmup: int, seed: int,
                log_path: Path, progress: bool) -> SoakResult:
    client = await start_client(cmd, "fimls-soak")
    soak = _Soaker(client, texts, seed)
    res = soak.res
    await soak.snapshot("loaded")
    soak.docs = [soak.new_doc(text) for text in texts[:4]]
    t_start = time.perf_counter()
    next_report = 0
    warm = False
    while res.requests < n_requests:
        if not warm and res.requests >= warmup:
            warm = True
            await soak.snapshot("start")
            t_start = time.perf_counter()
        doc = await soak.step()
        # Keep documents from growing or shrinking without bound.
        if len(doc.text) > 20000:
            soak.edit(doc, 0, len(doc.text) - 12000, "")
        if res.requests >= next_report:
            next_report += 500
            st = await client.protocol.send_request_async("fimls/status", None)
            res.rss_series.append((res.requests, rss_kib(st.serverPid) + rss_kib(st.workerPid)))
            if progress:
                print(f"  {res.requests:>6} requests, {len(res.errors)} errors, "
                      f"{time.perf_counter() - t_start:6.0f} s, worker RSS "
                      f"{rss_kib(st.workerPid) / 1024:.1f} MiB", file=sys.stderr, flush=True)
    await soak.snapshot("end")
    res.seconds = time.perf_counter() - t_start
    await client.shutdown_async(None)
    client.exit(None)
    await client.stop()
    recs = [r for r in read_records(log_path) if "outcome" in r]
    for rec in recs:
        res.outcomes[rec["outcome"]] = res.outcomes.get(rec["outcome"], 0) + 1
    res.errors += [f"latency record with outcome error: {rec.get('error')}" for rec in recs
                   if rec.get("outcome") == "error"]
    return res


def run_soak(serve_args: list[str], texts: list[str], *, n_requests: int, warmup: int,
             seed: int, out_dir: Path, progress: bool = True) -> SoakResult:
    """Start ``fimls serve`` with ``serve_args`` and soak it; the measurements."""
    out_dir.mkdir(parents=True, exist_ok=True)
    log_path = out_dir / "soak-latency.jsonl"
    log_path.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "fimls", "serve", *serve_args, "--log-level", "WARNING",
           "--latency-log", str(log_path)]
    return asyncio.run(_soak(cmd, texts, n_requests, warmup, seed, log_path, progress))


def report(res: SoakResult) -> tuple[str, bool]:
    """The printed summary, and whether the run passed (RSS growth < 5 %, 0 errors)."""
    start, end, loaded = res.rss.get("start", {}), res.rss.get("end", {}), res.rss.get("loaded", {})

    def total(d: dict[str, int]) -> int:
        return d.get("server", 0) + d.get("worker", 0)

    growth = (total(end) - total(start)) / total(start) * 100.0 if total(start) else float("nan")
    ok = not res.errors and growth < 5.0
    lines = [
        f"requests: {res.requests} in {res.seconds:.0f} s after warm-up  "
        f"outcomes: {json.dumps(res.outcomes)}",
        f"RSS after load: server {loaded.get('server', 0) / 1024:.1f} MiB, "
        f"worker {loaded.get('worker', 0) / 1024:.1f} MiB",
        f"RSS at start:   server {start.get('server', 0) / 1024:.1f} MiB, "
        f"worker {start.get('worker', 0) / 1024:.1f} MiB, total {total(start) / 1024:.1f} MiB",
        f"RSS at end:     server {end.get('server', 0) / 1024:.1f} MiB, "
        f"worker {end.get('worker', 0) / 1024:.1f} MiB, total {total(end) / 1024:.1f} MiB",
        f"RSS growth: {growth:+.2f} % (must be < 5 %)",
        f"errors: {len(res.errors)} (must be 0)",
        f"latency, all answered requests: p50 {percentile(res.latencies_ms, 50):.1f} ms  "
        f"p95 {percentile(res.latencies_ms, 95):.1f} ms",
        f"latency, requests the client waited for: p50 {percentile(res.waited_ms, 50):.1f} ms  "
        f"p95 {percentile(res.waited_ms, 95):.1f} ms",
    ]
    lines += [f"  error: {e}" for e in res.errors[:10]]
    lines.append("PASS" if ok else "FAIL")
    return "\n".join(lines), ok
