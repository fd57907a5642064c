"""End to end: ``fimls serve`` with the real embedded model, over stdio, via pytest-lsp."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path
from typing import Any

import pytest
from lsprotocol import types

from tests.ggufs import write_vocab_gguf
from tests.lsp_helpers import (
    ask_then_cancel,
    end_position,
    humaneval,
    inline,
    insert,
    open_doc,
    read_log,
    session,
    wait_ready,
)

pytestmark = pytest.mark.asyncio


async def test_advertises_inline_completion_and_completes_a_real_file(tmp_path: Path) -> None:
    log = tmp_path / "lat.jsonl"
    task = humaneval("Single", n=1)[0]
    async with session(args=["--latency-log", str(log)]) as (client, init):
        caps = init.capabilities
        assert caps.inline_completion_provider is not None
        sync = caps.text_document_sync
        assert isinstance(sync, types.TextDocumentSyncOptions)
        assert sync.change == types.TextDocumentSyncKind.Incremental
        assert caps.position_encoding in (None, types.PositionEncodingKind.Utf16)

        uri = (tmp_path / "he.py").as_uri()
        open_doc(client, uri, task["prefix"] + task["suffix"])
        line, col = end_position(task["prefix"])
        res = await inline(client, uri, line, col)
        assert res is not None and len(res.items) == 1
        item = res.items[0]
        assert isinstance(item.insert_text, str) and item.insert_text.strip()
        assert item.range is not None
        assert (item.range.start.line, item.range.start.character) == (line, col)
    recs = read_log(log)
    assert [r["outcome"] for r in recs] == ["returned"]
    rec = recs[0]
    assert rec["uri"] == uri and rec["version"] == 1
    assert rec["prompt_tokens"] > 50 and rec["generated_tokens"] > 0
    assert task["prefix"][:40] not in log.read_text()  # no document text in the log


async def test_kv_reuse_after_typing_one_character(tmp_path: Path) -> None:
    log = tmp_path / "lat.jsonl"
    tasks = humaneval("Single", n=6, stride=17)
    async with session(args=["--latency-log", str(log)]) as (client, _):
        for i, t in enumerate(tasks):
            uri = (tmp_path / f"t{i}.py").as_uri()
            open_doc(client, uri, t["prefix"] + t["suffix"])
            line, col = end_position(t["prefix"])
            await inline(client, uri, line, col)
            insert(client, uri, 2, line, col, t["target"][0])
            res = await inline(client, uri, line, col + 1)
            assert res is not None
    recs = read_log(log)
    second = [r for r in recs if r["version"] == 2]
    first = [r for r in recs if r["version"] == 1]
    assert len(second) == len(tasks) == len(first)
    for r in second:
        assert r["reused_tokens"] >= 0.9 * r["prompt_tokens"], r
    # The first request of each document evaluated its prompt; the second did not.
    assert sum(r["reused_tokens"] for r in first) < 0.5 * sum(r["prompt_tokens"] for r in first)


async def test_newer_request_supersedes_older(tmp_path: Path) -> None:
    log = tmp_path / "lat.jsonl"
    task = humaneval("Multi", n=1)[0]
    async with session(args=["--latency-log", str(log), "--max-tokens", "48"]) as (client, _):
        uri = (tmp_path / "s.py").as_uri()
        text = task["prefix"] + task["suffix"]
        open_doc(client, uri, text)
        line, col = end_position(task["prefix"])
        first = asyncio.ensure_future(inline(client, uri, line, col))
        await asyncio.sleep(0.05)
        second = asyncio.ensure_future(inline(client, uri, line, col))
        r1, r2 = await asyncio.gather(first, second)
        assert r1 is not None and len(r1.items) == 0
        assert r2 is not None and len(r2.items) == 1
    outcomes = [r["outcome"] for r in read_log(log)]
    assert outcomes == ["superseded", "returned"]


async def test_rapid_requests_with_edits_only_newest_completes(tmp_path: Path) -> None:
    log = tmp_path / "lat.jsonl"
    task = humaneval("Single", n=3)[2]
    async with session(args=["--latency-log", str(log)]) as (client, _):
        uri = (tmp_path / "rapid.py").as_uri()
        open_doc(client, uri, task["prefix"] + task["suffix"])
        line, col = end_position(task["prefix"])
        target = task["target"].split("\n")[0] + "xxxxxxxxxxxxxxxxxxxx"
        futures = []
        for k in range(20):
            if k:
                insert(client, uri, k + 1, line, col + k - 1, target[k - 1])
            futures.append(asyncio.ensure_future(inline(client, uri, line, col + k)))
            await asyncio.sleep(0.01)
        results = await asyncio.wait_for(asyncio.gather(*futures), 120)
        assert all(r is not None for r in results)
        assert all(len(r.items) == 0 for r in results[:-1] if r is not None)
        # The server is alive and serves the final state.
        again = await inline(client, uri, line, col + 19)
        assert again is not None
    recs = read_log(log)
    assert len(recs) == 21
    assert all(r["outcome"] in ("superseded", "cancelled") for r in recs[:19])


async def test_cancel_request_stops_engine_work(tmp_path: Path) -> None:
    log = tmp_path / "lat.jsonl"
    # A long document: the prefill takes seconds, so the cancel lands mid-work.
    body = "".join(f"def function_{i}(x):\n    return x * {i} + {i * 7}\n\n" for i in range(400))
    async with session(args=["--latency-log", str(log)]) as (client, _):
        uri = (tmp_path / "long.py").as_uri()
        open_doc(client, uri, body)
        line, col = end_position(body)
        await ask_then_cancel(client, uri, line, col, after=0.3, timeout=30)
        # Still alive: a small document completes.
        uri2 = (tmp_path / "small.py").as_uri()
        open_doc(client, uri2, "def add(a, b):\n    return ")
        res2 = await inline(client, uri2, 1, 11)
        assert res2 is not None
    recs = read_log(log)
    assert recs[0]["outcome"] == "cancelled"
    assert recs[0]["generated_tokens"] == 0


async def test_result_for_a_stale_version_is_dropped(tmp_path: Path) -> None:
    log = tmp_path / "lat.jsonl"
    task = humaneval("Single", n=5)[4]
    async with session(args=["--latency-log", str(log)]) as (client, _):
        uri = (tmp_path / "stale.py").as_uri()
        open_doc(client, uri, task["prefix"] + task["suffix"])
        line, col = end_position(task["prefix"])
        fut = asyncio.ensure_future(inline(client, uri, line, col))
        await asyncio.sleep(0.02)
        insert(client, uri, 2, 0, 0, "# edited\n")
        res = await fut
        assert res is not None and len(res.items) == 0
    assert [r["outcome"] for r in read_log(log)] == ["superseded"]


async def test_bad_requests_get_empty_answers(tmp_path: Path) -> None:
    async with session() as (client, _):
        # Unknown document.
        res = await inline(client, "file:///nowhere/missing.py", 0, 0)
        assert res is not None and len(res.items) == 0
        # Empty document.
        uri = (tmp_path / "empty.py").as_uri()
        open_doc(client, uri, "")
        res = await inline(client, uri, 0, 0)
        assert res is not None
        # Positions past the end of the line and of the document are clamped.
        uri2 = (tmp_path / "short.py").as_uri()
        open_doc(client, uri2, "import os\nprint(os.")
        res = await inline(client, uri2, 1, 500)
        assert res is not None
        for item in res.items:
            assert item.range is not None and item.range.start.character == 9
        res = await inline(client, uri2, 99, 0)
        assert res is not None
        # didChange for a document that was never opened is ignored, not fatal.
        insert(client, "file:///never/opened.py", 2, 0, 0, "x")
        # Classic completion works too (one item).
        comp = await client.text_document_completion_async(types.CompletionParams(
            text_document=types.TextDocumentIdentifier(uri=uri2),
            position=types.Position(line=1, character=9)))
        assert comp is not None
        items = comp.items if isinstance(comp, types.CompletionList) else comp
        assert len(items) <= 1


async def test_missing_model_file_keeps_server_up(tmp_path: Path) -> None:
    missing = tmp_path / "nope.gguf"
    # The load fails at once, possibly before any progress could be shown: no ready wait.
    async with session(args=["--model", str(missing)], ready=False) as (client, _):
        for _ in range(200):
            if client.messages:
                break
            await asyncio.sleep(0.05)
        assert any(str(missing) in m.message for m in client.messages)
        assert any(m.type == types.MessageType.Error for m in client.messages)
        uri = (tmp_path / "a.py").as_uri()
        open_doc(client, uri, "def f():\n    ")
        res = await inline(client, uri, 1, 4)
        assert res is not None and len(res.items) == 0


async def test_failed_load_after_progress_began_ends_the_progress(tmp_path: Path) -> None:
    """Regression: a load that failed after ``$/progress`` began never ended the progress.

    A file that passes the cheap checks (GGUF magic, then noise) fails in the worker
    process, after the client has been told a load is under way. (A missing file fails
    before ``initialized``, so no progress ever begins for it.)
    """
    bad = tmp_path / "noise.gguf"
    bad.write_bytes(b"GGUF" + random.Random(4).randbytes(1_000_000))
    async with session(args=["--model", str(bad)], ready=False) as (client, _):
        def reports(kind: type) -> list[Any]:
            return [r for rs in client.progress_reports.values() for r in rs
                    if isinstance(r, kind)]

        for _ in range(600):
            if any(m.type == types.MessageType.Error for m in client.messages):
                break
            await asyncio.sleep(0.05)
        errors = [m for m in client.messages if m.type == types.MessageType.Error]
        assert errors and str(bad) in errors[0].message
        assert reports(types.WorkDoneProgressBegin), "the load failed before progress began"
        for _ in range(100):
            if reports(types.WorkDoneProgressEnd):
                break
            await asyncio.sleep(0.05)
        ends = reports(types.WorkDoneProgressEnd)
        assert len(ends) == 1, "the progress of the failed load never ended"
        assert ends[0].message == "model failed to load"


async def test_refused_draft_model_is_a_warning(tmp_path: Path) -> None:
    """Regression: a refused draft model (the server carries on without it) was shown as an
    Error; it is a Warning, and completions work."""
    other = write_vocab_gguf(tmp_path / "starcoder2-vocab.gguf", "starcoder2")
    async with session(args=["--draft-model", str(other)]) as (client, _):
        for _ in range(200):
            if client.messages:
                break
            await asyncio.sleep(0.05)
        refusals = [m for m in client.messages if "vocabularies differ" in m.message]
        assert len(refusals) == 1 and refusals[0].type == types.MessageType.Warning
        assert "continuing without a draft model" in refusals[0].message
        assert not [m for m in client.messages if m.type == types.MessageType.Error]
        uri = (tmp_path / "a.py").as_uri()
        open_doc(client, uri, "def add(a, b):\n    return ")
        res = await inline(client, uri, 1, 11)
        assert res is not None and len(res.items) == 1


async def test_invalid_option_is_reported_once_and_defaults_used(tmp_path: Path) -> None:
    opts = {"maxTokens": "lots", "nCtx": 2048}
    async with session(init_options=opts) as (client, _):
        uri = (tmp_path / "a.py").as_uri()
        open_doc(client, uri, "def add(a, b):\n    return ")
        res = await inline(client, uri, 1, 11)
        assert res is not None
        client.workspace_did_change_configuration(
            types.DidChangeConfigurationParams(settings={"fimls": {"maxTokens": "lots"}}))
        await inline(client, uri, 1, 11)
    bad = [m for m in client.messages if "maxTokens" in m.message]
    assert len(bad) == 1 and bad[0].type == types.MessageType.Warning


async def test_requests_while_loading_answer_empty_at_once(tmp_path: Path) -> None:
    async with session(ready=False) as (client, _):
        uri = (tmp_path / "a.py").as_uri()
        open_doc(client, uri, "def add(a, b):\n    return ")
        res = await asyncio.wait_for(inline(client, uri, 1, 11), 1.0)
        assert res is not None and len(res.items) == 0
        assert await wait_ready(client)
        ends = [r for reports in client.progress_reports.values() for r in reports
                if isinstance(r, types.WorkDoneProgressEnd)]
        assert len(ends) == 1
        res = await inline(client, uri, 1, 11)
        assert res is not None and len(res.items) == 1


@pytest.mark.parametrize("encoding", ["utf-8", "utf-16", "utf-32"])
async def test_position_encodings_with_non_bmp_text(tmp_path: Path, encoding: str) -> None:
    # The cursor follows a line with an emoji and a CJK character; its column differs
    # between encodings, and the returned range must use the negotiated one.
    line_text = 'greeting = "😀 你好"  # say hi\nprint(greeting.'
    async with session(encodings=[encoding]) as (client, init):
        assert init.capabilities.position_encoding == encoding
        uri = (tmp_path / "enc.py").as_uri()
        text = 'for ch in "😀 你好":'
        open_doc(client, uri, line_text + "\n" + text + "\n")
        units = {"utf-8": len(text.encode()), "utf-16": len(text.encode("utf-16-le")) // 2,
                 "utf-32": len(text)}[encoding]
        res = await inline(client, uri, 2, units)
        assert res is not None and len(res.items) == 1
        item = res.items[0]
        assert item.range is not None
        assert (item.range.start.line, item.range.start.character) == (2, units)
        # A column past the end of the line clamps to the end of the line.
        res = await inline(client, uri, 2, units + 40)
        assert res is not None and len(res.items) == 1
        item = res.items[0]
        assert item.range is not None and item.range.start.character == units


async def test_large_documents_are_served(tmp_path: Path) -> None:
    log = tmp_path / "lat.jsonl"
    big = "".join(f"def function_{i}(x):\n    return x * {i}\n\n" for i in range(300_000))
    assert len(big) > 10_000_000
    one_line = "x = [" + ", ".join(str(i) for i in range(200_000)) + ", "
    assert len(one_line) > 1_000_000
    async with session(args=["--latency-log", str(log)]) as (client, _):
        uri = (tmp_path / "big.py").as_uri()
        open_doc(client, uri, big)
        line, col = end_position(big)
        res = await asyncio.wait_for(inline(client, uri, line, col), 120)
        assert res is not None
        # A keystroke in a 10 MB document: incremental edit, then ask again.
        insert(client, uri, 2, line, col, "d")
        res = await asyncio.wait_for(inline(client, uri, line, col + 1), 120)
        assert res is not None
        uri2 = (tmp_path / "line.py").as_uri()
        open_doc(client, uri2, one_line)
        res = await asyncio.wait_for(inline(client, uri2, 0, len(one_line)), 120)
        assert res is not None
    recs = read_log(log)
    assert len(recs) == 3 and all(r["outcome"] in ("returned", "empty") for r in recs)
    # The prompt is a window near the cursor, not the document.
    assert all(r["prompt_tokens"] < 4096 for r in recs)
    assert recs[1]["reused_tokens"] >= 0.9 * recs[1]["prompt_tokens"]
