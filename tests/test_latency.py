"""Tests for fimls.latency: the record's JSON, the JSON Lines writer, and stats summaries."""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import threading
from pathlib import Path
from typing import Any

import pytest

from fimls.latency import (
    LatencyLog,
    LatencyRecord,
    format_summary,
    percentile,
    read_records,
    summarize,
)

DOCUMENTED = {"ts", "uri", "version", "queue_ms", "prompt_ms", "ttft_ms", "decode_ms",
              "total_ms", "prompt_tokens", "reused_tokens", "generated_tokens",
              "drafted_tokens", "accepted_tokens", "draft", "outcome", "model"}
# String-valued fields: identifiers and enums, never text from the document.
# context_sources names kinds of chunks ("definition:2"), never their text; second_line
# says what the second reading came to ("same", "kept", "taken"), never the line.
STRING_FIELDS = {"uri", "request_id", "draft", "outcome", "model", "backend", "stop", "error",
                 "context_sources", "second_line"}


def record(**kw: Any) -> LatencyRecord:
    """A record like the engine writes for one returned suggestion."""
    base: dict[str, Any] = dict(uri="file:///w/src/app.py", version=7, request_id="r1",
                                queue_ms=1.234567, prompt_ms=20.0, ttft_ms=25.5,
                                decode_ms=40.0, total_ms=66.789, prompt_tokens=900,
                                reused_tokens=850, generated_tokens=12, drafted_tokens=8,
                                accepted_tokens=6, draft="lookup", outcome="returned",
                                model="gemma-3-270m", stop="newline")
    base.update(kw)
    return LatencyRecord(**base)


def lines_of(path: Path) -> list[dict[str, Any]]:
    """Every line of a JSON Lines file, parsed (all must parse)."""
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


# --- the record -------------------------------------------------------------------------


def test_record_json_has_documented_fields() -> None:
    d = json.loads(record().to_json())
    assert set(d) >= DOCUMENTED
    assert d["uri"] == "file:///w/src/app.py"
    assert d["version"] == 7
    assert d["outcome"] == "returned" and d["draft"] == "lookup"
    assert (d["prompt_tokens"], d["reused_tokens"], d["generated_tokens"]) == (900, 850, 12)
    assert (d["drafted_tokens"], d["accepted_tokens"]) == (8, 6)
    assert d["queue_ms"] == 1.23 and d["total_ms"] == 66.79  # rounded to 0.01 ms
    assert isinstance(d["ts"], float) and d["ts"] > 1e9


def test_record_is_one_line() -> None:
    line = record(error="boom\nsecond line").to_json()
    assert "\n" not in line
    assert json.loads(line)["error"] == "boom\nsecond line"


def test_record_holds_no_document_text() -> None:
    fields = {f.name for f in dataclasses.fields(LatencyRecord)}
    assert not fields & {"prefix", "suffix", "text", "completion", "content", "insert_text"}
    d = json.loads(record().to_json())
    strings = {k for k, v in d.items() if isinstance(v, str)}
    assert strings <= STRING_FIELDS
    assert all(isinstance(v, (int, float, str)) or v is None for v in d.values())


def test_default_record() -> None:
    d = json.loads(LatencyRecord().to_json())
    assert set(d) >= DOCUMENTED
    assert d["outcome"] == "empty" and d["total_ms"] == 0.0 and d["version"] is None


# --- the writer -------------------------------------------------------------------------


def test_one_line_per_record(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "dir" / "latency.jsonl"
    log = LatencyLog(path)
    for i in range(3):
        log.write(record(uri=f"file:///{i}.py"))
    log.close()
    got = lines_of(path)
    assert [r["uri"] for r in got] == ["file:///0.py", "file:///1.py", "file:///2.py"]


def test_appends_to_existing_file(tmp_path: Path) -> None:
    path = tmp_path / "latency.jsonl"
    path.write_text(record(uri="old").to_json() + "\n", encoding="utf-8")
    log = LatencyLog(path)
    log.write(record(uri="new"))
    log.close()
    assert [r["uri"] for r in lines_of(path)] == ["old", "new"]


def test_set_path_switches_files(tmp_path: Path) -> None:
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    log = LatencyLog(a)
    log.write(record(uri="1"))
    log.set_path(b)
    assert log.path == b
    log.write(record(uri="2"))
    log.write(record(uri="3"))
    log.close()
    assert log.path is None
    log.write(record(uri="4"))  # closed: goes nowhere
    assert [r["uri"] for r in lines_of(a)] == ["1"]
    assert [r["uri"] for r in lines_of(b)] == ["2", "3"]


def test_no_path_writes_nothing(tmp_path: Path) -> None:
    log = LatencyLog(None)
    log.write(record())
    assert log.path is None
    assert list(tmp_path.iterdir()) == []


def test_unwritable_path_warns_once(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("x", encoding="utf-8")
    log = LatencyLog(blocker / "latency.jsonl")  # a file where a directory should be
    with caplog.at_level(logging.WARNING, logger="fimls.latency"):
        log.write(record())
        log.write(record())
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1
    assert "latency" in warnings[0].getMessage()
    good = tmp_path / "good.jsonl"
    log.set_path(good)
    log.write(record(uri="ok"))
    log.close()
    assert [r["uri"] for r in lines_of(good)] == ["ok"]


def test_concurrent_writes_keep_lines_whole(tmp_path: Path) -> None:
    path = tmp_path / "latency.jsonl"
    log = LatencyLog(path)

    def work(n: int) -> None:
        for i in range(50):
            log.write(record(uri=f"file:///{n}/{i}.py"))

    threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    log.close()
    got = lines_of(path)
    assert len(got) == 200
    assert len({r["uri"] for r in got}) == 200


# --- reading and summaries --------------------------------------------------------------


def test_read_records_skips_garbage(tmp_path: Path) -> None:
    path = tmp_path / "latency.jsonl"
    good = [record(uri="a").to_json(), record(uri="b").to_json()]
    path.write_bytes("\n".join([
        good[0], "", "not json", "[1, 2]", "42", '{"uri": "trunc', "   ", good[1],
    ]).encode() + b"\n\xff\xfe garbage bytes\n")
    assert [r["uri"] for r in read_records(path)] == ["a", "b"]


def test_percentile() -> None:
    assert math.isnan(percentile([], 50))
    assert percentile([5.0], 95) == 5.0
    assert percentile([4.0, 1.0, 3.0, 2.0], 50) == 2.5
    assert percentile([4.0, 1.0, 3.0, 2.0], 0) == 1.0
    assert percentile([4.0, 1.0, 3.0, 2.0], 100) == 4.0
    assert percentile([float(x) for x in range(1, 101)], 95) == pytest.approx(95.05)


def test_summarize() -> None:
    recs = [json.loads(record(total_ms=float(ms), outcome="returned").to_json())
            for ms in (10, 20, 30)]
    recs.append(json.loads(record(total_ms=500.0, outcome="error", prompt_tokens=100,
                                  reused_tokens=0, drafted_tokens=0,
                                  accepted_tokens=0).to_json()))
    recs.append(json.loads(record(total_ms=1.0, outcome="superseded").to_json()))
    recs.append({"outcome": "empty"})  # an old record missing every other field
    s = summarize(recs)
    assert s["requests"] == 6
    assert s["outcomes"] == {"returned": 3, "error": 1, "superseded": 1, "empty": 1}
    total = s["fields"]["total_ms"]
    assert total["n"] == 5
    assert total["p50"] == 20.0
    assert total["p95"] == pytest.approx(percentile([1.0, 10.0, 20.0, 30.0, 500.0], 95))
    assert s["returned_total_ms"] == {"p50": 20.0, "p95": pytest.approx(29.0)}
    assert s["reuse_ratio"] == pytest.approx((850 * 4) / (900 * 4 + 100))
    assert s["acceptance_rate"] == pytest.approx(6 / 8)
    text = format_summary(s)
    assert "requests: 6" in text and "returned=3" in text and "total_ms" in text


def test_summarize_nothing() -> None:
    s = summarize([])
    assert s["requests"] == 0 and s["outcomes"] == {}
    assert math.isnan(s["fields"]["total_ms"]["p50"])
    assert s["reuse_ratio"] == 0.0 and s["acceptance_rate"] == 0.0
    assert "requests: 0" in format_summary(s)


def test_outcome_events_are_joined_with_requests(tmp_path: Path) -> None:
    from fimls.latency import LatencyLog, LatencyRecord, read_records, summarize

    log = LatencyLog(tmp_path / "l.jsonl")
    for i in range(4):
        log.write(LatencyRecord(request_id=f"r{i}", outcome="returned", total_ms=100.0 * (i + 1)))
    for i in range(4):
        log.write_event("shown", f"r{i}")
    log.write_event("accepted", "r0")
    log.write_event("partial", "r1", accepted_length=3)
    log.write_event("partial", "r1", accepted_length=7)
    log.write_event("dismissed", "r2")
    log.close()
    s = summarize(read_records(tmp_path / "l.jsonl"))["suggestions"]
    assert s["shown"] == 4 and s["accepted"] == 1 and s["partially_accepted"] == 1
    assert s["dismissed"] == 1
    assert s["accept_rate"] == 0.25 and s["any_accept_rate"] == 0.5
    # Event lines are not counted as requests.
    assert summarize(read_records(tmp_path / "l.jsonl"))["requests"] == 4
