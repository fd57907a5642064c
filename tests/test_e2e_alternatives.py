"""Alternatives on demand, through ``fimls serve`` with the real model: an explicit
(Invoked) request gets up to three items whose first lines differ, the first being what the
automatic request showed; they come from the cached prompt (the log shows no prompt read
again, and the alternatives' own tokens apart), and accepting one logs its index."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from lsprotocol import types

from fimls.engine.alternatives import first_line
from tests.lsp_helpers import end_position, humaneval, inline, open_doc, read_log, session

pytestmark = pytest.mark.asyncio
QWEN = "qwen2.5-coder-0.5b"


def items(res: object) -> list[types.InlineCompletionItem]:
    return list(res if isinstance(res, list) else getattr(res, "items", None) or [])


async def test_an_invoked_request_offers_alternatives(tmp_path: Path) -> None:
    log = tmp_path / "lat.jsonl"
    args = ["--model", QWEN, "--max-tokens", "32", "--idle-prefill", "false",
            "--latency-log", str(log)]
    counts = []
    taken: types.Command | None = None
    async with session(args=args) as (client, _):
        for i, task in enumerate(humaneval("Single", n=6, stride=7)):
            uri = (tmp_path / f"t{i}.py").as_uri()
            open_doc(client, uri, task["prefix"] + task["suffix"])
            at = end_position(task["prefix"])
            auto = items(await inline(client, uri, *at))
            asked = items(await inline(client, uri, *at, invoked=True))
            if not auto:
                continue
            assert len(auto) == 1 and asked and asked[0].insert_text == auto[0].insert_text
            firsts = [first_line(str(it.insert_text)) for it in asked]
            assert len(set(firsts)) == len(firsts) <= 3
            assert [it.command.arguments[1] for it in asked if it.command] == list(
                range(len(asked)))
            counts.append(len(asked))
            if len(asked) > 1 and taken is None and asked[1].command is not None:
                taken = asked[1].command  # the user accepts the second item
                await client.workspace_execute_command_async(types.ExecuteCommandParams(
                    command=taken.command, arguments=taken.arguments))
    assert counts and max(counts) >= 2, counts
    recs = [r for r in read_log(log) if "outcome" in r]
    invoked = [r for r in recs if r.get("alternatives")]
    assert invoked
    for r in invoked:
        # The prompt was in the cache: nothing of it read again for the alternatives.
        assert r["evaluated_tokens"] <= 1 and r["alt_tokens"] > 0, r
    proc = subprocess.run([sys.executable, "-m", "fimls", "stats", str(log), "--json"],
                          capture_output=True, text=True, timeout=120, check=True)
    assert json.loads(proc.stdout)["suggestions"]["accepted_by_index"] == {"1": 1}
