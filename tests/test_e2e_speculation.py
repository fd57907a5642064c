"""Speculation through ``fimls serve``: typing the suggestion, drafts in the latency log."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from lsprotocol import types

from fimls.models import resolve_model
from fimls.tools.harness import utf16_len
from tests.lsp_helpers import end_position, humaneval, inline, insert, open_doc, read_log, session

pytestmark = pytest.mark.asyncio


async def test_typing_the_suggestion_character_by_character(tmp_path: Path) -> None:
    results = {}
    for mode in ("auto", "off"):
        log = tmp_path / f"{mode}.jsonl"
        task = humaneval("Multi", n=3, stride=40)[2]
        async with session(args=["--latency-log", str(log), "--speculative", mode]) as (c, _):
            uri = (tmp_path / f"{mode}.py").as_uri()
            open_doc(c, uri, task["prefix"] + task["suffix"])
            line, col = end_position(task["prefix"])
            res = await inline(c, uri, line, col)
            assert res is not None and len(res.items) == 1
            shown = res.items[0].insert_text
            assert isinstance(shown, str) and len(shown) >= 6
            follow: list[str] = []
            for k, ch in enumerate(shown[:6]):
                insert(c, uri, k + 2, line, col, ch)
                if ch == "\n":
                    line, col = line + 1, 0
                else:
                    col += utf16_len(ch)
                r = await inline(c, uri, line, col)
                assert r is not None
                follow.append(r.items[0].insert_text if r.items else "")
            results[mode] = (shown, follow, read_log(log))
    shown, follow, recs = results["auto"]
    # Each follow-up offers the rest of what was shown (not nothing, which would start
    # every string).
    for k, text in enumerate(follow, start=1):
        assert isinstance(text, str)
        if shown[k:].strip():
            assert text.strip() and shown[k:].startswith(text.rstrip("\n ")[:10]), (k, text)
    ups = [r for r in recs if r["version"] > 1]
    assert len(ups) == 6
    # Served from what the model already computed: no prompt, no decode steps.
    assert sum(r["memo_tokens"] > 0 for r in ups) >= 5
    assert sum(r["evaluated_tokens"] for r in ups) <= 12
    # With speculation off, every follow-up runs the model again.
    off_ups = [r for r in results["off"][2] if r["version"] > 1]
    assert all(r["memo_tokens"] == 0 and r["evaluated_tokens"] > 0 for r in off_ups)
    assert all(r["drafted_tokens"] == 0 for r in off_ups)


async def test_draft_model_path_through_serve(tmp_path: Path) -> None:
    log = tmp_path / "lat.jsonl"
    model = str(resolve_model(None))
    args = ["--latency-log", str(log), "--draft-model", model, "--speculative", "model",
            "--n-ctx", "2048"]
    async with session(args=args) as (client, _):
        for i, task in enumerate(humaneval("Single", n=3, stride=50)):
            uri = (tmp_path / f"d{i}.py").as_uri()
            open_doc(client, uri, task["prefix"] + task["suffix"])
            line, col = end_position(task["prefix"])
            res = await inline(client, uri, line, col)
            assert res is not None
    recs = read_log(log)
    assert len(recs) == 3
    drafted = sum(r["drafted_tokens"] for r in recs)
    accepted = sum(r["accepted_tokens"] for r in recs)
    assert drafted > 0 and accepted >= 0.8 * drafted
    assert any(r["draft"] == "model" for r in recs)


async def test_incompatible_draft_model_is_reported(tmp_path: Path) -> None:
    from tests.ggufs import write_vocab_gguf

    other = write_vocab_gguf(tmp_path / "qwen-vocab.gguf", "qwen2.5-coder")
    async with session(args=["--draft-model", str(other)], ready=False) as (client, _):
        for _ in range(400):
            if client.messages:
                break
            await asyncio.sleep(0.05)
        # A warning, not an error: the server carries on without the draft model.
        assert any("refusing draft model" in m.message and "qwen-vocab.gguf" in m.message
                   and m.type == types.MessageType.Warning for m in client.messages)
