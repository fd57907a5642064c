"""Next-edit suggestions through ``fimls serve`` with the default model: a rename on one
line is proposed at the other occurrences the model accepts, nearest first; applying one
leaves the rest; a place where the rename would break the code is not offered; typing new
code proposes nothing."""

from __future__ import annotations

from typing import Any

import pytest
from lsprotocol import types
from pytest_lsp import LanguageClient

from tests.lsp_helpers import insert, open_doc, session

pytestmark = pytest.mark.asyncio
DEFAULT = "qwen2.5-coder-1.5b"

DOC = ("def area(width, height):\n"
       "    size = width * height\n"
       "    print(\"area\", size)\n"
       "    return size\n"
       "\n"
       "\n"
       "def volume(width, height, depth):\n"
       "    size = width * height * depth\n"
       "    return size\n")


def _replace(client: LanguageClient, uri: str, version: int, line: int, start: int, end: int,
             text: str) -> None:
    client.text_document_did_change(types.DidChangeTextDocumentParams(
        text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=version),
        content_changes=[types.TextDocumentContentChangePartial(range=types.Range(
            start=types.Position(line=line, character=start),
            end=types.Position(line=line, character=end)), text=text)]))


async def _next_edits(client: LanguageClient, uri: str, line: int) -> list[Any]:
    res = await client.protocol.send_request_async("fimls/nextEdits", {
        "textDocument": {"uri": uri}, "position": {"line": line, "character": 0}})
    return list(res.edits)


async def test_a_rename_is_proposed_where_the_model_agrees() -> None:
    async with session(args=["--model", DEFAULT, "--idle-prefill", "false"]) as (client, _):
        uri = "file:///w/shapes.py"
        open_doc(client, uri, DOC)
        _replace(client, uri, 2, 1, 4, 8, "total")  # size -> total in area()
        edits = await _next_edits(client, uri, 1)
        lines = [e.range.start.line for e in edits]
        print(f"rename in area(): proposed at lines {lines}, confidence "
              f"{[round(e.confidence, 3) for e in edits]}")
        assert lines[:2] == [2, 3] and all(e.newText == "total" for e in edits)
        # In volume(), size is still assigned: `return total` there would break it.
        assert 8 not in lines
        # Applying one leaves the rest.
        rng = edits[0].range
        _replace(client, uri, 3, 2, rng.start.character, rng.end.character, "total")
        assert [e.range.start.line for e in await _next_edits(client, uri, 2)][:1] == [3]


async def test_typing_new_code_proposes_nothing() -> None:
    async with session(args=["--model", DEFAULT, "--idle-prefill", "false"]) as (client, _):
        uri = "file:///w/typing.py"
        open_doc(client, uri, DOC)
        insert(client, uri, 2, 3, 0, "\n")
        for i, ch in enumerate("    print(size)"):
            insert(client, uri, 3 + i, 3, i, ch)
            if ch in " (":
                assert await _next_edits(client, uri, 3) == []
        assert await _next_edits(client, uri, 3) == []
