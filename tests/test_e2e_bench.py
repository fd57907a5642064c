"""``fimls bench --cross-set``: two real ``fimls serve`` (tiny model) over the same
cross-file tasks, one with each task's file alone and one with its other files open."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fimls.cli import main

MONEY = ("def convert_amount(value: float, rate: float) -> float:\n"
         "    \"\"\"The value in the other currency.\"\"\"\n    return value * rate\n")


def _task(i: int) -> dict[str, object]:
    prefix = (f"from pkg.money import convert_amount\n\n\ndef run_{i}(v):\n"
              f"    total = ")
    return {"task_id": f"t{i}", "path": f"pkg/app{i}.py", "prefix": prefix,
            "suffix": "\n    return total\n", "target": "convert_amount(v, rate=0.5)",
            "open": [{"path": "pkg/money.py", "text": MONEY},
                     {"path": "pkg/misc.py", "text": "A = 1\n"}]}


def test_cross_bench_runs_alone_and_open_side_by_side(tmp_path: Path) -> None:
    """Both sides answer every task and keystroke; only the open side sends context; and
    the two run task by task in alternating order (their latency ratio comes from one
    stretch of time), not one whole run after the other."""
    tasks = tmp_path / "cross.jsonl"
    tasks.write_text("".join(json.dumps(_task(i)) + "\n" for i in range(2)))
    out = tmp_path / "bench"
    assert main(["bench", "--sets", "", "--cross-set", str(tasks), "--cross-tasks", "2",
                 "--cross-typing", "2", "--max-tokens", "8", "--keystroke-tasks", "0",
                 "--out", str(out)]) == 0
    cross = json.loads((out / "bench.json").read_text())["cross"]
    (sides,) = cross.values()
    assert set(sides) == {"alone", "other files open"}
    for side in sides.values():
        assert [r["task_id"] for r in side["rows"]] == ["t0", "t1"]
        assert all(len(r["latency_ms"]) == 3 for r in side["rows"])  # asked, then 2 keys
        # The server's log has one record per request, in order (NaN if it did not match).
        assert 0.0 <= side["key_memo_share"] <= 1.0
        assert 0.0 <= side["key_server_p50_ms"] < 60_000
        # The tiny model reads its prompts in continuation mode: nothing is read twice.
        assert side["second_share"] == 0.0 and side["second_taken_share"] == 0.0
    (label,) = cross
    logs = {s: [json.loads(line) for line in (out / f"cross-{label}-{s}.jsonl").open()]
            for s in ("alone", "open")}
    built = {s: [r for r in recs if r.get("prompt_tokens", 0) > 0]
             for s, recs in logs.items()}
    assert built["alone"] and all(r["context_tokens"] == 0 for r in built["alone"])
    assert any(r["context_tokens"] > 0 for r in built["open"])
    # Task t0: alone first; task t1: open first. So alone starts and alone ends.
    first = {s: min(r["ts"] for r in recs) for s, recs in logs.items()}
    last = {s: max(r["ts"] for r in recs) for s, recs in logs.items()}
    assert first["alone"] < first["open"] and last["open"] < last["alone"]


def test_cross_bench_with_the_peer_sends_it_the_ring_chunks(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """With --peer the same tasks go to llama-server alone and with llama.vim's ring
    chunks (input_extra) on the same Qwen model file, and the table compares fimls with it.
    Skipped where no llama-server is built."""
    from fimls.tools.peer import PeerCrashed
    from tests.test_e2e_remote import QWEN, llama_server_binary

    binary = llama_server_binary()
    if binary is None:
        pytest.skip("no llama-server built (set FIMLS_LLAMA_SERVER, or build the peer as "
                    "the README's side-by-side section says)")
    tasks = tmp_path / "cross.jsonl"
    tasks.write_text("".join(json.dumps(_task(i)) + "\n" for i in range(2)))
    out = tmp_path / "bench"
    try:
        rc = main(["bench", "--sets", "", "--cross-set", str(tasks), "--cross-tasks", "2",
                   "--cross-typing", "1", "--max-tokens", "8", "--keystroke-tasks", "0",
                   "--models", QWEN, "--peer", str(binary), "--out", str(out)])
    except PeerCrashed as exc:
        if exc.wrong_cpu:  # a cached build from a machine with other instructions
            pytest.skip(str(exc))
        raise
    assert rc == 0
    (sides,) = json.loads((out / "bench.json").read_text())["cross"].values()
    assert set(sides) == {"alone", "other files open", "llama-server alone",
                          "llama-server, ring"}
    for side in ("llama-server alone", "llama-server, ring"):
        rows = sides[side]["rows"]
        assert [r["task_id"] for r in rows] == ["t0", "t1"]
        assert all(len(r["latency_ms"]) == 2 for r in rows)
        assert sides[side]["by_file_calls"]["other"]["n"] == 2
    printed = capsys.readouterr().out
    assert "  open vs peer" in printed and "llama-server, ring" in printed
