"""The side-by-side report of ``fimls bench --peer`` (fimls.tools.peer), without servers."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from fimls.tools.harness import Task
from fimls.tools.peer import (
    PeerCrashed,
    _row,
    format_side_by_side,
    keystroke_costs,
    run_peer,
    summarize_editor,
)


def task(target: str) -> Task:
    return Task("t", "def f(x):\n    ", "\n", target)


def test_rows_score_the_first_suggestion_against_the_real_text() -> None:
    right = _row(task("return x + 1\n"), [900.0, 10.0, 12.0], "return x + 1")
    wrong = _row(task("return x + 1\n"), [1100.0, 300.0], "return x - 1")
    empty = _row(task("return x\n"), [1000.0], "")
    assert right["line_exact"] and not wrong["line_exact"] and not empty["line_exact"]
    assert wrong["prefix_chars"] == len("return x ")
    s = summarize_editor([right, wrong, empty])
    assert s["n"] == 3 and s["first_p50_ms"] == 1000.0
    assert s["typing_p50_ms"] == 12.0  # the typed-character requests only
    assert math.isclose(s["line_exact"], 1 / 3) and math.isclose(s["empty"], 1 / 3)


def test_the_table_gives_fimls_ratios_to_the_peer() -> None:
    fimls = {"first_p50_ms": 500.0, "first_p95_ms": 900.0, "typing_p50_ms": 50.0,
             "typing_p95_ms": 400.0, "line_exact": 0.5, "char_prefix_ratio": 0.6,
             "empty": 0.0}
    peer = {**fimls, "first_p50_ms": 1000.0, "typing_p50_ms": 200.0, "line_exact": 0.45}
    text = format_side_by_side({"qwen2.5-coder-0.5b": {"fimls": fimls,
                                                       "llama-server": peer}})
    ratio_line = next(line for line in text.splitlines() if "vs llama-server" in line)
    assert "0.50x" in ratio_line and "0.25x" in ratio_line and "+0.050" in ratio_line


def test_the_gate_table_counts_shown_precision_and_recall() -> None:
    from fimls.tools.bench import Run, format_gate_table, gate_table

    def run(text: str, target: str, conf: float | None) -> Run:
        return Run("edits", "off", text, text, {"confidence": conf,
                                                "confidence_mean": conf}, target)

    runs = [run("a = 1", "a = 1", 0.9), run("b = 2", "b = 3", 0.2),
            run("c = 3", "c = 3", 0.4), run("d", "e", None),  # no confidence: never gated
            run("", "f", 0.1)]  # empty: nothing to show, not counted
    rows = {r["threshold"]: r["confidence"] for r in gate_table(runs, thresholds=(0, 0.3, 0.5))[
        "edits"]}
    assert rows[0] == {"shown": 4, "precision": 0.5, "recall": 1.0}
    assert rows[0.3] == {"shown": 3, "precision": 2 / 3, "recall": 1.0}
    assert rows[0.5] == {"shown": 2, "precision": 0.5, "recall": 0.5}
    assert "edits" in format_gate_table(gate_table(runs))


def test_keystroke_costs_come_from_the_servers_log_in_request_order() -> None:
    rows = [{"latency_ms": [900.0, 2.0, 3.0]}, {"latency_ms": [800.0, 400.0]}]
    log = [  # as written: an idle job's record among them, not in request order
        {"ts": 1.0, "outcome": "returned", "stop": "eog", "total_ms": 900, "evaluated_tokens": 700},
        {"ts": 1.9, "outcome": "prefill_stopped", "total_ms": 30, "evaluated_tokens": 0},
        {"ts": 2.1, "outcome": "returned", "stop": "memo", "total_ms": 0.1},
        {"ts": 2.0, "outcome": "returned", "stop": "memo", "total_ms": 0.3},
        {"ts": 3.0, "outcome": "returned", "stop": "eog", "total_ms": 800, "evaluated_tokens": 600},
        {"ts": 4.0, "outcome": "returned", "stop": "eog", "total_ms": 400, "evaluated_tokens": 12},
    ]
    got = keystroke_costs(rows, log)
    assert got["key_memo_share"] == 2 / 3
    assert got["key_server_p50_ms"] == 0.3  # of 0.1, 0.3 and 400: the first requests not counted
    assert got["key_evaluated_p50"] == 12  # only the typed character the model answered
    nan = keystroke_costs(rows, log[:-1])  # a record missing: no guess
    assert all(v != v for v in nan.values())


@pytest.mark.parametrize(("signal_name", "wrong_cpu"), [("ILL", True), ("SEGV", False)])
def test_a_peer_that_dies_says_whether_it_was_built_for_another_cpu(
        tmp_path: Path, signal_name: str, wrong_cpu: bool) -> None:
    """A llama-server from a cache shared between machines can carry instructions this CPU
    lacks: it dies of SIGILL, which the bench names (the tests then skip); any other death
    stays an error."""
    server = tmp_path / "llama-server"
    server.write_text(f"#!/bin/sh\nkill -{signal_name} $$\n")
    server.chmod(0o755)
    with pytest.raises(PeerCrashed) as caught:
        run_peer(server, tmp_path / "model.gguf", [task("return x\n")], typing=0,
                 max_tokens=4, threads=1)
    assert caught.value.wrong_cpu is wrong_cpu
    assert ("built for another CPU" in str(caught.value)) is wrong_cpu
