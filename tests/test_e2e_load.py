"""A cancel storm through ``fimls serve`` with the real model.

1,000 inline-completion requests on four documents, a keystroke before each, some cancelled
with ``$/cancelRequest``, the client never waiting for an answer before typing on. Checked:
every request is answered; a superseded request is answered before the request that
superseded it (it never waits for newer work); the last request per document is served on
the final text; the server's copies equal the client's; and the latency log shows that no
two requests ever held the model at the same time.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import random
import time
from pathlib import Path
from typing import Any

import pytest
from lsprotocol import types

from tests.figures import report
from tests.lsp_helpers import end_position, humaneval, inline, insert, open_doc, read_log, session

pytestmark = pytest.mark.asyncio

REQUESTS = 1000
DOCS = 4


async def test_cancel_storm(tmp_path: Path) -> None:
    log = tmp_path / "lat.jsonl"
    rng = random.Random(5)
    tasks = humaneval("Multi", n=DOCS * 7, stride=1)[::7]
    async with session(args=["--latency-log", str(log), "--max-tokens", "32"]) as (client, _):
        docs: list[dict[str, Any]] = []
        for i, t in enumerate(tasks):
            uri = (tmp_path / f"storm{i}.py").as_uri()
            open_doc(client, uri, t["prefix"] + t["suffix"])
            line, col = end_position(t["prefix"])
            # What gets typed: the expected code, then filler (never runs out).
            docs.append({"uri": uri, "text": t["prefix"] + t["suffix"], "cursor": len(t["prefix"]),
                         "line": line, "col": col, "version": 1,
                         "typing": t["target"].replace("\n", " ") + "x" * REQUESTS})
        sent: list[dict[str, Any]] = []

        def answered(i: int) -> Any:
            def done(fut: asyncio.Future[Any]) -> None:
                sent[i]["answered_at"] = time.perf_counter()
                sent[i]["order"] = next(order)
            return done

        order = iter(range(10**9))
        for k in range(REQUESTS):
            d = docs[k % DOCS]
            ch = d["typing"][d["version"] - 1]
            d["version"] += 1
            edit_at = time.perf_counter()
            insert(client, d["uri"], d["version"], d["line"], d["col"], ch)
            d["text"] = d["text"][:d["cursor"]] + ch + d["text"][d["cursor"]:]
            d["cursor"] += 1
            d["col"] += 1
            fut = asyncio.ensure_future(inline(client, d["uri"], d["line"], d["col"]))
            sent.append({"doc": k % DOCS, "fut": fut, "edit_at": edit_at})
            fut.add_done_callback(answered(k))
            if rng.random() < 0.1 and k < REQUESTS - DOCS:
                # An explicit $/cancelRequest for the request just sent.
                await asyncio.sleep(0)
                pending = list(client.protocol._request_futures)
                if pending:
                    client.protocol.notify(types.CANCEL_REQUEST,
                                           types.CancelParams(id=pending[-1]))
            pause = rng.choice((0.0, 0.0, 0.0, 0.002, 0.02, 0.1))
            await asyncio.sleep(pause)
        results = await asyncio.wait_for(
            asyncio.gather(*(s["fut"] for s in sent), return_exceptions=True), 300)

        # Every request answered: a result, or the RequestCancelled error for the ones the
        # client cancelled itself.
        for r in results:
            assert r is not None
            if isinstance(r, BaseException):
                assert "cancel" in str(r).lower(), r
        # A superseded request never waits for newer work on its document: it is answered
        # before the request that superseded it.
        after_edit: list[float] = []  # superseded: from the next keystroke to the answer
        for i, s in enumerate(sent):
            later = [t for t in sent[i + 1:] if t["doc"] == s["doc"]]
            if later:
                assert s["order"] < later[0]["order"], i
                after_edit.append(max(0.0, s["answered_at"] - later[0]["edit_at"]) * 1000.0)
        # The last request per document is served, on the final text: the server's copy is
        # the client's, and asking again gives the same answer.
        last = {s["doc"]: r for s, r in zip(sent, results, strict=True)}
        for n, d in enumerate(docs):
            res = last[n]
            assert not isinstance(res, BaseException), f"doc {n}: {res}"
            state = await client.protocol.send_request_async(
                "fimls/documentState", {"textDocument": {"uri": d["uri"]}})
            assert state.version == d["version"]
            assert state.sha256 == hashlib.sha256(d["text"].encode()).hexdigest()
            again = await inline(client, d["uri"], d["line"], d["col"])
            assert again is not None
            assert [i.insert_text for i in again.items] == [i.insert_text for i in res.items]
    after_edit.sort()
    recs = [r for r in read_log(log) if "outcome" in r]
    assert len(recs) == REQUESTS + DOCS
    assert not [r for r in recs if r["outcome"] == "error"]
    finals = {r["uri"]: r for r in recs[:REQUESTS]}
    for d in docs:
        assert finals[d["uri"]]["version"] == d["version"]
        assert finals[d["uri"]]["outcome"] in ("returned", "empty")
    assert sum(bool(r.items) for r in last.values()) >= DOCS // 2
    # Never two requests in the model at once: the [start, start + model_ms] intervals
    # of the requests that reached it are disjoint.
    spans = sorted((r["ts"], r["ts"] + r["model_ms"] / 1000.0) for r in recs if r["model_ms"] > 0)
    assert len(spans) > DOCS
    for (_, end), (start, _) in itertools.pairwise(spans):
        assert start >= end - 0.0005
    reached = len(spans)
    p50 = after_edit[len(after_edit) // 2]
    p95 = after_edit[int(len(after_edit) * 0.95)]
    outcomes = {o: sum(r["outcome"] == o for r in recs)
                for o in ("returned", "empty", "superseded", "cancelled")}
    report(f"cancel storm: {REQUESTS} requests on {DOCS} documents, all answered, {outcomes}; "
          f"superseded answered {p50:.1f} ms (p50) / {p95:.1f} ms (p95) after the keystroke "
          f"that superseded them; {reached} reached the model, never two at once")
