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


async def _soak(cmd: list[str], texts: list[str], n_requests: int, warmup: int, seed: int,
                log_path: Path, progress: bool) -> SoakResult:
    from lsprotocol import types

    rng = random.Random(seed)
    res = SoakResult()
    client = await start_client(cmd, "fimls-soak")

    async def status() -> Any:
        return await client.protocol.send_request_async("fimls/status", None)

    def snapshot(label: str, st: Any) -> None:
        res.rss[label] = {"server": rss_kib(st.serverPid), "worker": rss_kib(st.workerPid)}

    snapshot("loaded", await status())

    docs: list[Doc] = []
    serial = 0

    def new_doc(text: str) -> Doc:
        nonlocal serial
        serial += 1
        # The cursor goes where the body of a function starts, or at the end.
        cut = text.find(":\n    ")
        cursor = cut + 6 if cut >= 0 else len(text)
        doc = Doc(uri=f"file:///soak/doc{serial}.py", text=text, cursor=cursor)
        open_doc(client, doc.uri, text)
        return doc

    def edit(doc: Doc, start: int, end: int, new: str) -> None:
        # Never split a CRLF: no editor puts a cursor between the two.
        for name, off in (("start", start), ("end", end)):
            if 0 < off < len(doc.text) and doc.text[off - 1] == "\r" and doc.text[off] == "\n":
                if name == "start":
                    start -= 1
                else:
                    end += 1
        (sl, sc), (el, ec) = doc.position(start), doc.position(end)
        doc.version += 1
        client.text_document_did_change(types.DidChangeTextDocumentParams(
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

    sent_at: dict[int, float] = {}
    done_at: dict[int, float] = {}

    def ask(doc: Doc) -> asyncio.Future[Any]:
        line, col = doc.position()
        res.requests += 1
        # Sent now, not when a task first runs: the edits that follow come after it.
        fut = asyncio.ensure_future(client.text_document_inline_completion_async(
            inline_params(doc.uri, line, col)))
        sent_at[id(fut)] = time.perf_counter()
        fut.add_done_callback(lambda f: done_at.__setitem__(id(f), time.perf_counter()))
        return fut

    async def settle(futs: list[tuple[asyncio.Future[Any], Doc, bool]], waited: bool) -> None:
        for fut, doc, cancelled in futs:
            try:
                answer = await asyncio.wait_for(fut, 60)
            except asyncio.TimeoutError:
                res.errors.append(f"request on {doc.uri} unanswered after 60 s")
                continue
            except Exception as exc:  # an LSP error reply
                if not (cancelled and "cancel" in str(exc).lower()):
                    res.errors.append(f"{type(exc).__name__}: {exc}")
                sent_at.pop(id(fut), None)
                done_at.pop(id(fut), None)
                continue
            ms = (done_at.pop(id(fut)) - sent_at.pop(id(fut))) * 1000.0
            res.latencies_ms.append(ms)
            if waited:
                res.waited_ms.append(ms)
            items = getattr(answer, "items", None) or []
            text = items[0].insert_text if items else ""
            doc.shown = text if isinstance(text, str) else ""

    for text in texts[:4]:
        docs.append(new_doc(text))
    current = 0
    t_start = time.perf_counter()
    next_report = 0
    warm = False
    while res.requests < n_requests:
        if not warm and res.requests >= warmup:
            warm = True
            snapshot("start", await status())
            t_start = time.perf_counter()
        doc = docs[current]
        r = rng.random()
        if r < 0.60:  # type one character, ask, wait
            if doc.shown and rng.random() < 0.8:
                ch, doc.shown = doc.shown[0], doc.shown[1:]
            else:
                ch, doc.shown = rng.choice(EDIT_CHARS), ""
            edit(doc, doc.cursor, doc.cursor, ch)
            await settle([(ask(doc), doc, False)], True)
        elif r < 0.75:  # a burst of keystrokes, not waiting in between
            futs = []
            for _ in range(3):
                edit(doc, doc.cursor, doc.cursor, rng.choice(EDIT_CHARS))
                futs.append((ask(doc), doc, False))
                await asyncio.sleep(rng.choice((0.0, 0.005, 0.02)))
            await settle(futs, False)
        elif r < 0.87:  # an edit elsewhere: mostly near the cursor, sometimes far above
            span = 200 if rng.random() < 0.9 else len(doc.text)
            a = max(0, min(len(doc.text), doc.cursor + rng.randint(-span, span // 4)))
            if rng.random() < 0.5 and len(doc.text) > 400:
                b = min(len(doc.text), a + rng.randint(1, 12))
                edit(doc, a, b, "")
            else:
                edit(doc, a, a, "".join(rng.choice(EDIT_CHARS) for _ in range(rng.randint(1, 8))))
            await settle([(ask(doc), doc, False)], True)
        elif r < 0.92:  # ask, then cancel it
            fut = ask(doc)
            await asyncio.sleep(rng.choice((0.0, 0.01, 0.05)))
            pending = list(client.protocol._request_futures)
            if pending:
                client.protocol.notify(types.CANCEL_REQUEST, types.CancelParams(id=pending[-1]))
            await settle([(fut, doc, True)], False)
        elif r < 0.97:  # switch documents
            current = (current + 1) % len(docs)
            doc = docs[current]
            await settle([(ask(doc), doc, False)], True)
        else:  # close a document and open it afresh (from its original text)
            client.text_document_did_close(types.DidCloseTextDocumentParams(
                text_document=types.TextDocumentIdentifier(uri=doc.uri)))
            docs[current] = new_doc(texts[rng.randrange(len(texts))])
        # Keep documents from growing or shrinking without bound.
        if len(doc.text) > 20000:
            edit(doc, 0, len(doc.text) - 12000, "")
        if res.requests >= next_report:
            next_report += 500
            st = await status()
            worker_mib = rss_kib(st.workerPid) / 1024
            res.rss_series.append((res.requests, rss_kib(st.serverPid) + rss_kib(st.workerPid)))
            if progress:
                print(f"  {res.requests:>6} requests, {len(res.errors)} errors, "
                      f"{time.perf_counter() - t_start:6.0f} s, worker RSS "
                      f"{worker_mib:.1f} MiB", file=sys.stderr, flush=True)
    snapshot("end", await status())
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
