"""Next-edit suggestions through ``fimls serve`` with the default model: a rename on one
line is proposed at the other occurrences the model accepts, nearest first; applying one
leaves the rest; a place where the rename would break the code is not offered; typing new
code proposes nothing."""

from __future__ import annotations

import pytest

from tests.lsp_helpers import insert, next_edits, open_doc, replace_range, session

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


async def test_a_rename_is_proposed_where_the_model_agrees() -> None:
    async with session(args=["--model", DEFAULT, "--idle-prefill", "false"]) as (client, _):
        uri = "file:///w/shapes.py"
        open_doc(client, uri, DOC)
        replace_range(client, uri, 2, 1, 4, 8, "total")  # size -> total in area()
        edits = await next_edits(client, uri, 1)
        lines = [e.range.start.line for e in edits]
        print(f"rename in area(): proposed at lines {lines}, confidence "
              f"{[round(e.confidence, 3) for e in edits]}")
        assert lines[:2] == [2, 3] and all(e.newText == "total" for e in edits)
        # In volume(), size is still assigned: `return total` there would break it.
        assert 8 not in lines
        # Applying one leaves the rest.
        rng = edits[0].range
        replace_range(client, uri, 3, 2, rng.start.character, rng.end.character, "total")
        assert [e.range.start.line for e in await next_edits(client, uri, 2)][:1] == [3]


async def test_typing_new_code_proposes_nothing() -> None:
    async with session(args=["--model", DEFAULT, "--idle-prefill", "false"]) as (client, _):
        uri = "file:///w/typing.py"
        open_doc(client, uri, DOC)
        insert(client, uri, 2, 3, 0, "\n")
        for i, ch in enumerate("    print(size)"):
            insert(client, uri, 3 + i, 3, i, ch)
            if ch in " (":
                assert await next_edits(client, uri, 3) == []
        assert await next_edits(client, uri, 3) == []
