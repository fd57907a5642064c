"""FIM mode with a real FIM model (Qwen2.5-Coder 0.5B): what continuation mode had first.

- The text up to the cursor is read as written (no token healing, as llama-server's
  /infill).
- The single-line / multi-line policy and the dedent and suffix stops, checked against the
  model's own raw generation (what the engine computed, whatever this CPU's kernels make of
  it), not against outputs remembered from one machine.
- Typing what was suggested costs nothing, through ``fimls serve``.
- ``fimls complete`` with no arguments runs the default model, Qwen2.5-Coder 1.5B.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from importlib.resources import files
from pathlib import Path
from typing import Any

import pytest

from fimls.crossfile import ContextChunk
from fimls.engine import second as second_reading
from fimls.engine.api import CompletionRequest
from fimls.engine.core import (
    SUFFIX_FRESH_TOKENS,
    Engine,
    EngineConfig,
)
from fimls.models import CATALOGUE, resolve_model
from fimls.tools.harness import close_doc, utf16_len
from tests.lsp_helpers import end_position, inline, insert, open_doc, read_log, session

QWEN = CATALOGUE["qwen2.5-coder-0.5b"]


@pytest.fixture(scope="module")
def engine() -> Iterator[Engine]:
    # A fixed window: the suffix tests compare prompts, which a window learned from this
    # machine's timings would change between keystrokes.
    eng = Engine(EngineConfig(model_path=resolve_model(QWEN.name), n_ctx=2048,
                              prompt_tokens=1536, measure_costs=False))
    yield eng
    eng.close()


def _complete(engine: Engine, prefix: str, suffix: str, max_tokens: int = 24) -> str:
    return _run(engine, prefix, suffix, max_tokens)[0]


def _run(engine: Engine, prefix: str, suffix: str, max_tokens: int = 48) -> tuple[str, str]:
    """The suggestion, and the model's raw generated text it was cut from (after the healed
    text, which the prefix already holds)."""
    engine.reset()
    uri = "file:///h.py"
    req = CompletionRequest(uri=uri, version=1, prefix=prefix, suffix=suffix,
                            max_tokens=max_tokens, speculative="off")
    healed = engine.build(req).constraint
    text = engine.complete(req, lambda: False).text
    raw = b"".join(engine.vocab.text_piece(t) for t in engine.prev_gen.get(uri, []))
    assert raw.startswith(healed)
    return text, raw[len(healed):].decode("utf-8", "replace")


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def test_the_template_is_fim_and_the_prefix_is_read_as_written(engine: Engine) -> None:
    # As llama-server's /infill: the text up to the cursor as it is, indentation and half
    # words included.
    assert engine.template.kind == "fim"
    prefix = "def f():\n    "
    prompt = engine.build(CompletionRequest(uri="u", version=1, prefix=prefix, suffix="\n"))
    assert prompt.heal_tokens == 0 and prompt.constraint == b""
    assert prompt.prefix_window == prefix


@pytest.mark.parametrize(("prefix", "suffix"), [
    ("def add(a, b):\n    ", "\n\nprint(add(1, 2))\n"),
    ("def f(items):\n    out = []\n    for x in items:\n        ", "\n    return out\n"),
])
def test_no_doubled_indentation_after_an_indented_cursor(engine: Engine, prefix: str,
                                                         suffix: str) -> None:
    text = _complete(engine, prefix, suffix)
    assert text.strip() and not text[:1].isspace(), text


@pytest.mark.parametrize(("prefix", "suffix"), [
    ("def area(radius):\n    return 3.14159 * ", " ** 2\n"),
    ("import os\n\ndef home():\n    return os.path.join(os.environ[", "], '.cache')\n"),
])
def test_code_after_the_cursor_gets_one_line_without_the_suffix(engine: Engine, prefix: str,
                                                                 suffix: str) -> None:
    text, raw = _run(engine, prefix, suffix)
    assert text.strip() and "\n" not in text, (text, raw)
    rest = suffix.split("\n", 1)[0].strip()
    assert not text.rstrip().endswith(rest) and not text.rstrip().endswith(rest[:1]), text
    assert raw.startswith(text.rstrip()), (text, raw)


def test_a_block_stops_where_the_model_dedents(engine: Engine) -> None:
    prefix = "def mean(xs):\n    if not xs:\n"
    suffix = "\n\ndef median(xs):\n    return sorted(xs)[len(xs) // 2]\n"
    text, raw = _run(engine, prefix, suffix)
    lines = text.split("\n")
    assert text.strip() and raw.startswith(text.rstrip()), (text, raw)
    base = _indent(lines[0])
    assert base > 0 and all(_indent(t) >= base for t in lines if t.strip()), text
    # Whatever the model wrote after a line indented less than the block's first line is
    # not shown: the cut is where the raw text first dedents.
    raw_lines = [t for t in raw.split("\n") if t.strip()]
    dedent = next((i for i, t in enumerate(raw_lines) if _indent(t) < base), None)
    if dedent is not None:
        assert text.rstrip().split("\n")[-1] == raw_lines[dedent - 1], (text, raw)


@pytest.mark.parametrize(("prefix", "suffix", "follows"), [
    ("def fib(n):\n    if n < 2:\n        return n\n", "    return fib(n - 1) + fib(n - 2)\n",
     "return fib(n - 1) + fib(n - 2)"),
    ("def primes_below(limit):\n    result = []\n    for n in range(2, limit):\n",
     "\n    return result\n\n\nprint(primes_below(30))\n", "return result"),
])
def test_a_block_does_not_repeat_the_code_after_the_cursor(engine: Engine, prefix: str,
                                                           suffix: str, follows: str) -> None:
    text, raw = _run(engine, prefix, suffix)
    assert text.strip(), raw
    assert follows not in text and "print(primes_below" not in text, (text, raw)


async def test_typing_the_suggestion_costs_no_model_work(tmp_path: Path) -> None:
    log = tmp_path / "lat.jsonl"
    text = files("fimls").joinpath("examples/primes.py").read_text()
    cursor = text.index("range(2, limit):") + len("range(2, limit):")
    prefix = text[:cursor]
    async with session(args=["--model", QWEN.name, "--latency-log", str(log),
                             "--max-tokens", "32"]) as (c, _):
        uri = (tmp_path / "primes.py").as_uri()
        open_doc(c, uri, text)
        line, col = end_position(prefix)
        res = await inline(c, uri, line, col)
        assert res is not None and len(res.items) == 1
        shown = res.items[0].insert_text
        assert isinstance(shown, str) and "is_prime(n)" in shown, shown
        follow: list[str] = []
        typed = shown[:12]
        for k, ch in enumerate(typed):
            insert(c, uri, k + 2, line, col, ch)
            line, col = (line + 1, 0) if ch == "\n" else (line, col + utf16_len(ch))
            r = await inline(c, uri, line, col)
            assert r is not None and len(r.items) == 1
            follow.append(str(r.items[0].insert_text))
        # Typing something else than the suggestion asks the model again.
        insert(c, uri, len(typed) + 2, line, col, "#")
        other = await inline(c, uri, line, col + 1)
        assert other is not None
    for k, rest in enumerate(follow, start=1):
        assert rest == shown[k:], (k, rest, shown)
    recs = read_log(log)
    ups = [r for r in recs if 1 < r["version"] <= len(typed) + 1]
    assert len(ups) == len(typed)
    assert all(r["stop"] == "memo" and r["evaluated_tokens"] == 0 for r in ups), ups
    last = [r for r in recs if r["version"] == len(typed) + 2]
    assert last and last[0]["stop"] != "memo" and last[0]["evaluated_tokens"] > 0
    assert all(r["model"] == QWEN.name for r in recs)


def test_fimls_complete_runs_the_default_model(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "FIMLS_MODEL"}
    out = subprocess.run([sys.executable, "-m", "fimls", "complete"], env=env,
                         capture_output=True, text=True, timeout=600, check=True).stdout
    head, _, tail = out.partition("--- latency record")
    assert "(qwen2.5-coder-1.5b, the default, on CPU)" in head or (
        "(qwen2.5-coder-1.5b, the default, on " in head and "layers)" in head)
    suggestion = head.split("\n", 1)[1]
    assert "if is_prime(n):" in suggestion and "result.append(n)" in suggestion, out
    record = json.loads(tail.strip().splitlines()[-1])
    assert record["model"] == "qwen2.5-coder-1.5b" and record["outcome"] == "returned"


SUFFIX_DOC = ("\n".join(f"def helper_{i}(x):\n    return x * {i} + {i * i}\n" for i in range(12))
              + "\n\nif __name__ == '__main__':\n    print(primes_below(30))\n")


def test_max_time_shortens_a_block_to_whole_lines(engine: Engine) -> None:
    text = files("fimls").joinpath("examples/primes.py").read_text()
    cursor = text.index("range(2, limit):") + len("range(2, limit):")

    def run(max_time_ms: int) -> tuple[str, str]:
        engine.reset()
        req = CompletionRequest(uri="file:///t.py", version=1, prefix=text[:cursor],
                                suffix=text[cursor:], max_tokens=48, speculative="off",
                                max_time_ms=max_time_ms)
        res = engine.complete(req, lambda: False)
        return res.text, res.record.stop

    full, _ = run(0)
    cut, stop = run(1)  # time is up at once: the first complete line ends it
    assert full.count("\n") >= 2, full
    assert stop == "max_time" and cut.strip(), (cut, full)
    # Whole lines of what it would have suggested: the first one, finished.
    assert full.startswith(cut) and full[len(cut)] == "\n", (cut, full)
    assert len(cut.strip().splitlines()) == 1


def _keystroke(engine: Engine, prefix: str, reuse: bool) -> tuple[str, dict[str, int]]:
    req = CompletionRequest(uri="file:///k.py", version=1, prefix=prefix, suffix=SUFFIX_DOC,
                            max_tokens=16, speculative="off", reuse_suffix=reuse)
    res = engine.complete(req, lambda: False)
    rec = res.record
    # The engine's account of its cache is what llama.cpp holds.
    assert engine.model.kv_len() == len(engine.cache.tokens)
    return res.text, {"shifted": rec.shifted_tokens, "evaluated": rec.evaluated_tokens,
                      "prompt": rec.prompt_tokens, "generated": rec.generated_tokens}


@pytest.mark.parametrize("reuse", [True, False])
def test_a_keystroke_keeps_the_suffix_cache(engine: Engine, reuse: bool) -> None:
    engine.reset()
    head = ("def primes_below(limit):\n    result = []\n    for n in range(2, limit):\n"
            "        if is_")
    _, first = _keystroke(engine, head, reuse)
    assert first["shifted"] == 0 and first["evaluated"] >= first["prompt"]
    # The suffix's window in the prompt (a quarter of the window).
    window = engine.build(CompletionRequest(uri="file:///k.py", version=1, prefix=head,
                                            suffix=SUFFIX_DOC, max_tokens=16)).suffix_window
    suffix_tokens = len(engine.vocab.tokenize(window))
    assert suffix_tokens > SUFFIX_FRESH_TOKENS + 16
    recs = []
    # Typing changes the last tokens before the suffix (typing, a backspace, two
    # characters at once).
    for typed in ("prime(n", "prime(n):", "prime(", "prime(n)"):
        _, rec = _keystroke(engine, head + typed, reuse)
        recs.append(rec)
    kept = suffix_tokens - SUFFIX_FRESH_TOKENS  # the suffix's first tokens are recomputed
    moved = [r for r in recs if r["shifted"] >= kept]
    recomputed = [r for r in recs if r["evaluated"] >= suffix_tokens]
    if reuse:
        # Only the new text before the cursor, the suffix's first line, <mid> and the
        # output were computed.
        assert len(moved) >= 3 and not recomputed, recs
        assert all(r["evaluated"] <= r["generated"] + SUFFIX_FRESH_TOKENS + 8
                   for r in recs), recs
    else:
        assert not moved and len(recomputed) >= 3, recs


def test_a_keystroke_stopped_while_moving_the_suffix_leaves_the_cache_intact(
        engine: Engine) -> None:
    engine.reset()
    head = ("def primes_below(limit):\n    result = []\n    for n in range(2, limit):\n"
            "        if is_prime(n")
    _keystroke(engine, head, True)
    # (The output after <mid> is not kept when the prompt changes: the rest must be.)
    before = engine.cache.tokens[:engine.cache.tokens.index(engine.template.mid)]
    calls = 0

    def cancelled_in_the_gap() -> bool:
        nonlocal calls
        calls += 1
        return calls > 1  # checked once before the suffix is set aside, then stopped

    req = CompletionRequest(uri="file:///k.py", version=1, prefix=head + "):", suffix=SUFFIX_DOC,
                            max_tokens=16, speculative="off")
    res = engine.complete(req, cancelled_in_the_gap)
    assert res.record.outcome == "cancelled" and calls >= 2
    # Put back as it was, suffix included...
    assert engine.cache.tokens == before and engine.model.kv_len() == len(before)
    # ...so the next keystroke still moves it instead of recomputing it.
    _, rec = _keystroke(engine, head + "):", True)
    assert rec["shifted"] > 0


async def _wait_for(log: Path, pred: Callable[[list[dict[str, Any]]], bool],
                    timeout: float = 120.0) -> list[dict[str, Any]]:
    """The latency log's records once ``pred`` holds for them."""
    deadline = time.monotonic() + timeout
    while True:
        recs = read_log(log, idle=True)
        if pred(recs):
            return recs
        assert time.monotonic() < deadline, recs
        await asyncio.sleep(0.1)


async def test_idle_prefill_reads_the_file_before_the_first_request(engine: Engine,
                                                                     tmp_path: Path) -> None:
    log = tmp_path / "lat.jsonl"
    text = files("fimls").joinpath("examples/primes.py").read_text()
    cursor = text.index("range(2, limit):") + len("range(2, limit):")
    prefix = text[:cursor]

    def prefills(recs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        # (Not the prefetch of the suggestion after the shown one: another test's.)
        return [r for r in recs if r.get("outcome") == "prefill"
                and not r["request_id"].endswith("-next")]

    async with session(args=["--model", QWEN.name, "--latency-log", str(log),
                             "--max-tokens", "16"]) as (c, _):
        uri = (tmp_path / "primes.py").as_uri()
        open_doc(c, uri, text)  # the user reads: no request yet
        await _wait_for(log, lambda recs: len(prefills(recs)) == 1)
        line, col = end_position(prefix)
        first = await inline(c, uri, line, col)
        assert first is not None and len(first.items) == 1
        # An edit, then a pause: the prompt at the edit is evaluated before it is asked for.
        typed = "\n        total = 0"
        insert(c, uri, 2, line, col, typed)
        await _wait_for(log, lambda recs: len(prefills(recs)) == 2)
        second = await inline(c, uri, line + 1, len(typed) - 1)
        assert second is not None
    recs = read_log(log, idle=True)
    opened, edited = prefills(recs)[:2]
    asks = [r for r in recs if r["outcome"] in ("returned", "empty")]
    assert len(asks) == 2
    # The first request found the file's text up to the cursor already evaluated.
    prefix_tokens = len(engine.vocab.tokenize(prefix))
    assert opened["evaluated_tokens"] >= prefix_tokens
    assert asks[0]["reused_tokens"] >= prefix_tokens - 2, asks[0]
    assert asks[0]["evaluated_tokens"] < asks[0]["prompt_tokens"] - prefix_tokens + 40
    # After the edit's prefill the whole prompt was cached, up to its first token.
    assert edited["evaluated_tokens"] > 0
    assert asks[1]["reused_tokens"] == asks[1]["prompt_tokens"], asks[1]
    # Idle work is not a request: `fimls stats` counts it apart.
    from fimls.latency import summarize
    s = summarize(recs)
    idle = [r for r in recs if r["outcome"].startswith("prefill")]
    assert s["requests"] == 2 and s["idle_prefill"]["runs"] == len(idle) >= 2


async def test_a_file_opened_at_its_top_is_read_before_the_first_request(
        tmp_path: Path) -> None:
    # A client that sends only didOpen (no fimls/cursor), then asks near the file's top,
    # where editors open a file: the idle prefill evaluated the file's first lines while the
    # user read, and the request reuses them; only the lines around the cursor are new.
    log = tmp_path / "lat.jsonl"
    body = "".join(f"def helper_{i}(x):\n    return x + {i}\n\n" for i in range(300))
    cursor = body.index("def helper_12(")
    prefix = body[:cursor] + "def total(xs):\n    "
    text = prefix + "\n\n" + body[cursor:]
    budget = 512
    async with session(args=["--model", QWEN.name, "--latency-log", str(log),
                             "--max-tokens", "16", "--prompt-tokens", str(budget)]) as (c, _):
        uri = (tmp_path / "helpers.py").as_uri()
        open_doc(c, uri, text)
        await _wait_for(log, lambda recs: any(r.get("outcome") == "prefill" for r in recs))
        line, col = end_position(prefix)
        res = await inline(c, uri, line, col)
        assert res is not None
    recs = read_log(log, idle=True)
    opened = next(r for r in recs if r["outcome"] == "prefill")
    asks = [r for r in recs if r["outcome"] in ("returned", "empty")]
    assert len(asks) == 1
    assert opened["evaluated_tokens"] > budget // 3, opened
    # All of the lines above the cursor were read at the open, but the cursor's own line.
    assert asks[0]["reused_tokens"] >= asks[0]["prompt_tokens"] * 0.5, (opened, asks[0])


def test_the_window_is_the_lines_before_the_cursor_and_a_quarter_after() -> None:
    # A request with nothing cached reads its whole window (no smaller cold one): as
    # llama-server's /infill, 3/4 before the cursor and 1/4 after. Other files' chunks come
    # on top; the file's part stays the same.
    eng = Engine(EngineConfig(model_path=resolve_model(QWEN.name), n_ctx=2048,
                              measure_costs=False))
    try:
        eng.sizer.window = eng.sizer.tokens = 1024
        other = "".join(f"def other_{i}(y):\n    return y * {i}\n\n" for i in range(300))
        plain = CompletionRequest(uri="file:///other.py", version=1, prefix=other[:6000],
                                  suffix=other[6000:], max_tokens=8, repo_name="proj",
                                  rel_path="other.py")
        alone = eng.build(plain)
        # (less what the quantised start of the window drops: at most a quarter of it)
        assert alone.window == 1024 and len(alone.tokens) > 1024 * 3 // 4
        suffix_tokens = len(eng.vocab.tokenize(alone.suffix_window))
        assert 180 <= suffix_tokens <= 1024 // 4
        assert other[:6000].endswith(alone.prefix_window)
        chunk = ContextChunk(path="lib.py", text="def scale(v, k):\n    return v * k\n" * 4,
                             source="definition")
        both = eng.build(replace(plain, context=[chunk]))
        assert both.context_tokens > 40 and len(both.tokens) <= 1024
        rec = eng.complete(replace(plain, speculative="off"), lambda: False).record
        assert rec.window_tokens == 1024 and rec.prompt_tokens == len(alone.tokens), rec
    finally:
        eng.close()


async def test_the_cursor_a_plugin_reports_is_prefilled_before_the_request(
        tmp_path: Path) -> None:
    # A long file opened at a line far from its top (a jump, a search result): the file's
    # opening would serve no cursor there. fimls's plugins send fimls/cursor.
    log = tmp_path / "lat.jsonl"
    body = "".join(f"def helper_{i}(x):\n    return x + {i}\n\n" for i in range(300))
    prefix = body + "def total(xs):\n    "
    text = prefix + "\n\nprint(total([1, 2]))\n"
    async with session(args=["--model", QWEN.name, "--latency-log", str(log),
                             "--max-tokens", "16", "--prompt-tokens", "512"]) as (c, _):
        uri = (tmp_path / "helpers.py").as_uri()
        open_doc(c, uri, text)
        line, col = end_position(prefix)
        c.protocol.notify("fimls/cursor", {"textDocument": {"uri": uri},
                                           "position": {"line": line, "character": col}})
        await _wait_for(log, lambda recs: any(r.get("outcome") == "prefill"
                                              and r.get("evaluated_tokens", 0) > 0
                                              for r in recs))
        res = await inline(c, uri, line, col)
        assert res is not None
    recs = read_log(log, idle=True)
    asks = [r for r in recs if r["outcome"] in ("returned", "empty")]
    assert len(asks) == 1
    # The whole prompt at the cursor was evaluated while the user read.
    assert asks[0]["reused_tokens"] == asks[0]["prompt_tokens"] > 300, asks[0]
    assert asks[0]["evaluated_tokens"] < 40, asks[0]


async def test_accepting_a_suggestion_finds_the_next_one_ready(tmp_path: Path) -> None:
    log = tmp_path / "lat.jsonl"
    text = files("fimls").joinpath("examples/primes.py").read_text()
    cursor = text.index("range(2, limit):") + len("range(2, limit):")
    # One line at a time, so that after the first there is surely a next one.
    async with session(args=["--model", QWEN.name, "--latency-log", str(log),
                             "--max-tokens", "24", "--max-lines", "1"]) as (c, _):
        uri = (tmp_path / "primes.py").as_uri()
        open_doc(c, uri, text)
        line, col = end_position(text[:cursor])
        res = await inline(c, uri, line, col)
        assert res is not None and len(res.items) == 1
        shown = str(res.items[0].insert_text)
        assert shown.strip() == "if is_prime(n):", shown
        # While the user reads it, the suggestion after it is computed (prefetch)...
        await _wait_for(log, lambda recs: any(r.get("request_id", "").endswith("-next")
                                              and r["outcome"] == "prefill" for r in recs))
        # ...so accepting it (Tab) and asking again needs no model work.
        insert(c, uri, 2, line, col, shown)
        line, col = end_position(text[:cursor] + shown)
        after = await inline(c, uri, line, col)
    recs = read_log(log)
    assert len(recs) == 2, recs
    assert recs[1]["stop"] == "memo" and recs[1]["evaluated_tokens"] == 0, recs[1]
    assert after is not None and len(after.items) == 1
    assert "result.append(n)" in str(after.items[0].insert_text), after


# --- confidence and the gate ------------------------------------------------------------


def test_confidence_is_the_first_lines_least_likely_token_and_gates(engine: Engine) -> None:
    req = CompletionRequest(uri="file:///c.py", version=1,
                            prefix="def add(a, b):\n    return ", suffix="\n",
                            max_tokens=16, speculative="off")
    engine.reset()
    shown = engine.complete(req, lambda: False)
    conf, mean = shown.record.confidence, shown.record.confidence_mean
    assert shown.text and conf is not None and mean is not None
    assert 0.0 < conf <= mean <= 1.0
    # Just above its own confidence the same suggestion is gated; at it, it is shown.
    engine.reset()
    gated = engine.complete(replace(req, min_confidence=conf + 1e-3), lambda: False)
    assert gated.text == "" and gated.record.outcome == "gated"
    assert gated.record.confidence == conf
    engine.reset()
    kept = engine.complete(replace(req, min_confidence=conf), lambda: False)
    assert kept.text == shown.text and kept.record.outcome == "returned"


async def test_a_gated_suggestion_is_not_shown(tmp_path: Path) -> None:
    log = tmp_path / "lat.jsonl"
    async with session(args=["--model", QWEN.name, "--latency-log", str(log),
                             "--max-tokens", "12", "--min-confidence", "0.999"]) as (c, _):
        uri = (tmp_path / "vague.py").as_uri()
        text = "import os\n\n# \n"
        open_doc(c, uri, text)
        res = await inline(c, uri, 2, 2)
    recs = read_log(log)
    assert len(recs) == 1 and recs[0]["confidence"] is not None
    if recs[0]["confidence"] < 0.999:
        assert recs[0]["outcome"] == "gated" and (res is None or not res.items)
    else:  # a model this sure of a comment would be shown
        assert recs[0]["outcome"] == "returned" and res is not None and res.items


# --- other buffers in the prompt ----------------------------------------------------------


async def test_definitions_from_another_buffer_reach_the_prompt_and_leave_on_close(
        tmp_path: Path) -> None:
    log = tmp_path / "lat.jsonl"
    util = ('def convert_amount(value, rate):\n    """Value in another currency."""\n'
            "    return value * rate\n")
    # The name used near the cursor (not only imported: an import line is no use of it).
    prefix = ("from util import convert_amount\n\n\ndef run(v):\n"
              "    fee = convert_amount(1, 2)\n    total = ")
    async with session(args=["--model", QWEN.name, "--latency-log", str(log),
                             "--max-tokens", "8", "--speculative", "off",
                             "--idle-prefill", "false"], workspace=tmp_path) as (c, _):
        util_uri, app_uri = (tmp_path / "util.py").as_uri(), (tmp_path / "app.py").as_uri()
        open_doc(c, util_uri, util)
        open_doc(c, app_uri, prefix + "\n")
        line, col = end_position(prefix)
        await inline(c, app_uri, line, col)
        insert(c, app_uri, 2, line, col, "c")
        await inline(c, app_uri, line, col + 1)
        close_doc(c, util_uri)
        await inline(c, app_uri, line, col + 1)
    first, typed, closed = read_log(log)
    assert first["context_tokens"] > 0 and "definition:1" in first["context_sources"]
    # Typing keeps the set: the front of the prompt (the other file) stays cached.
    assert typed["context_tokens"] == first["context_tokens"]
    assert typed["reused_tokens"] > typed["context_tokens"]
    # Closed: nothing of it is sent again.
    assert closed["context_tokens"] == 0 and closed["context_sources"] == ""


# --- the second reading: the prompt without the chunks proposes another first line --------

AREA = ContextChunk(path="lib/shapes.py", source="definition", uri="file:///w/lib/shapes.py",
                    text='def area(width, height, *, unit="cm", rounding=None):\n'
                         '    """The area of a rectangle, in square units."""\n')
AREA_PREFIX = ("from lib.shapes import area\n\n\ndef report(room):\n"
               "    print(room.name)\n    return ")
# Another buffer holding this very function with a line of its own: with the chunk the
# model copies that line; the file alone cannot know it and writes another.
COPIED = ContextChunk(path="lib/report.py", source="recent", uri="file:///w/lib/report.py",
                      text="def report(room):\n    print(room.name)\n"
                           "    return shapes_area_in_square_metres_rounded(room.depth, 3)\n")


def _second_request(**kw: Any) -> CompletionRequest:
    base = CompletionRequest(uri="file:///w/app.py", version=1, prefix=AREA_PREFIX,
                             suffix="\n\n\nreport(None)\n", repo_name="w", rel_path="app.py",
                             max_tokens=32, speculative="off", context=[AREA],
                             context_tokens=256, second_reading=True)
    return replace(base, **kw)


def _second_run(engine: Engine, req: CompletionRequest) -> tuple[Any, Any]:
    engine.reset()
    engine.second_log = []
    try:
        res = engine.complete(req, lambda: False)
        (read,) = engine.second_log
    finally:
        engine.second_log = None
    return res, read


@pytest.mark.parametrize("speculative", ["off", "lookup"])
def test_the_second_reading_proposes_a_line_and_the_likelier_is_shown(
        engine: Engine, speculative: str) -> None:
    """The reading without the chunks follows the first line until it would choose another
    token, then writes its own; the prompt with the chunks scores both from there, and the
    line with the higher log-probability is what the suggestion starts with. What the
    second reading evaluated is counted token by token."""
    req = _second_request(context=[COPIED], speculative=speculative, max_tokens=24)
    alone = engine.build(replace(req, context=[])).tokens
    res, read = _second_run(engine, req)
    rec = res.record
    assert rec.context_tokens > 0 and rec.second_line == read.outcome
    first, second, at = list(read.first), list(read.second), read.at
    # The chunk's own line and the file's differ somewhere (the premise of the test).
    assert read.outcome in ("kept", "taken") and at < len(first) and first[:at] == second[:at]
    assert second[at] != first[at]
    scored = read.first_logp == read.first_logp and read.second_logp == read.second_logp
    if scored:
        assert (read.outcome == "taken") == (read.second_logp > read.first_logp)
    shown = second if read.outcome == "taken" else first
    assert engine.prev_gen[req.uri][:len(shown)] == shown
    # The prompt without the chunks from scratch, the first line through it in one batch,
    # its own tokens one a step, and the scoring batch.
    steps = len(second) - at - 1
    assert rec.second_tokens == (len(alone) + len(first) - 1 + steps
                                 + (len(second) - at if scored else 0))
    assert engine.model.kv_len() == len(engine.cache.tokens) and engine.model.kv_len(1) == 0
    assert 0.0 < (rec.confidence or 0.0) <= 1.0


def test_a_second_line_shown_becomes_the_cache(engine: Engine,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the second line wins (here made to win: every token it scores counts as
    certain), the cache's branch becomes sequence 0, the suggestion is made of that line's
    tokens, and the next request at the place reuses it."""

    monkeypatch.setattr(second_reading, "_logprob", lambda logits, tok: 0.0)
    req = _second_request(context=[COPIED], max_tokens=24)
    prompt = engine.build(req)
    res, read = _second_run(engine, req)
    assert read.outcome == res.record.second_line == "taken"
    second = list(read.second)
    gen = engine.prev_gen[req.uri]
    assert gen[:len(second)] == second
    # Lazy evaluation: the cache holds the prompt and every generated token but the last.
    assert engine.cache.tokens == prompt.tokens + gen[:-1]
    assert engine.model.kv_len() == len(engine.cache.tokens) and engine.model.kv_len(1) == 0
    raw = b"".join(engine.vocab.text_piece(t) for t in gen)
    assert raw.startswith(prompt.constraint)
    shown_line = raw[len(prompt.constraint):].decode().split("\n")[0].rstrip()
    assert res.text.split("\n")[0].rstrip() == shown_line
    again = engine.complete(replace(req, version=2), lambda: False)
    assert again.record.reused_tokens >= len(prompt.tokens) - 1
    monkeypatch.undo()
    engine.reset()


def test_without_chunks_or_with_the_option_off_nothing_is_read_twice(engine: Engine) -> None:
    engine.reset()
    plain = engine.complete(_second_request(context=[]), lambda: False)
    assert plain.record.second_line == "" and plain.record.second_tokens == 0
    engine.reset()
    off = engine.complete(_second_request(second_reading=False), lambda: False)
    assert off.record.second_line == "" and off.record.second_tokens == 0
    assert off.record.context_tokens > 0


def _read_cost(read: Any) -> int:
    """Tokens a second reading evaluated after its prompt: the first line in one batch,
    its own tokens one a step, the scoring batch."""
    cost = len(read.first) - 1
    if len(read.second) > read.at and read.outcome != "same":
        cost += len(read.second) - read.at - 1
        if read.second_logp == read.second_logp:
            cost += len(read.second) - read.at
    return cost


def test_the_second_reading_is_priced_and_cached(engine: Engine) -> None:
    """Read only where it costs no more than the request costs anyway: not when the prompt
    with the chunks is cached and this machine reads slowly; kept in its sequence, so the
    next request at the place reads only what changed."""
    sizer = engine.sizer
    saved = sizer.rate
    engine.second_log = []
    try:
        engine.reset()
        first = engine.complete(_second_request(second_reading=False), lambda: False)
        assert first.record.second_line == ""
        sizer.rate = 10.0  # tokens/s: the second reading alone would cost seconds
        cached_main = engine.complete(_second_request(version=2), lambda: False)
        assert cached_main.record.second_line == "" and cached_main.record.second_tokens == 0
        sizer.rate = float("inf")  # a GPU: reading it costs nothing worth counting
        read = engine.complete(_second_request(version=3), lambda: False)
        alone = engine.build(_second_request(context=[])).tokens
        assert read.record.second_line != ""
        assert read.record.second_tokens == len(alone) + _read_cost(engine.second_log[-1])
        again = engine.complete(_second_request(version=4), lambda: False)
        # Only the last prompt token of the second reading is evaluated again.
        assert again.record.second_line != ""
        assert again.record.second_tokens == 1 + _read_cost(engine.second_log[-1])
        assert engine.cache.alt[:len(alone)] == alone
    finally:
        sizer.rate = saved
        engine.second_log = None
        engine.reset()


def test_idle_prefill_at_the_cursor_reads_both_prompts(engine: Engine) -> None:
    engine.reset()
    n_alone = len(engine.build(_second_request(context=[])).tokens)
    idle = engine.complete(_second_request(prefill="cursor"), lambda: False)
    assert idle.record.second_tokens == n_alone and idle.text == ""
    engine.second_log = []
    try:
        res = engine.complete(_second_request(version=2), lambda: False)
        assert res.record.second_line != ""
        assert res.record.second_tokens == 1 + _read_cost(engine.second_log[-1])
    finally:
        engine.second_log = None


def test_both_prompts_must_fit_the_cache(tmp_path: Path) -> None:
    """Where the two prompts would not fit n_ctx together, the prompt with the chunks
    alone writes the line (and the second reading's entries never crowd it out)."""
    eng = Engine(EngineConfig(model_path=resolve_model(QWEN.name), n_ctx=512,
                              prompt_tokens=400, measure_costs=False))
    try:
        long_prefix = "".join(f"value_{i} = {i} * 3\n" for i in range(120)) + AREA_PREFIX
        res = eng.complete(_second_request(prefix=long_prefix), lambda: False)
        assert res.record.context_tokens > 0 and res.record.second_line == ""
        assert res.record.outcome in ("returned", "empty")
        # A request read twice leaves its second prompt cached; a long prompt after it
        # (no chunks) needs those positions, and gets them.
        mid_prefix = "".join(f"value_{i} = {i} * 3\n" for i in range(10)) + AREA_PREFIX
        eng.reset()  # (both prompts read from scratch: read twice whatever this CPU's speed)
        res = eng.complete(_second_request(prefix=mid_prefix), lambda: False)
        assert res.record.second_line != "" and len(eng.cache.alt) > 80
        res = eng.complete(_second_request(prefix=long_prefix, context=[], max_tokens=48),
                           lambda: False)
        # (the window's quantised start drops up to a quarter of its 400 tokens; with the
        # second prompt's 80 or more they pass the 400 the cache leaves a prompt)
        assert res.record.prompt_tokens > 300 and res.record.error is None
        assert eng.cache.alt == []
    finally:
        eng.close()


def test_idle_prefill_of_an_opened_file_reads_both_openings(engine: Engine) -> None:
    """After a file is opened, its opening is read with and without the chunks, so the
    first request in it reads only the part near the cursor, both times."""
    engine.reset()
    body = "".join(f"def helper_{i}(x):\n    return area(x, {i})\n\n\n" for i in range(12))
    text = "from lib.shapes import area\n\n\n" + body
    opened = engine.complete(_second_request(prefix=text, suffix="", prefill="open"),
                             lambda: False)
    n_opening = opened.record.second_tokens
    assert n_opening > 100 and opened.text == ""
    res = engine.complete(_second_request(prefix=text + "def report(room):\n    return "),
                          lambda: False)
    assert res.record.second_line != ""
    n_alone = len(engine.build(_second_request(prefix=text + "def report(room):\n    return ",
                                               context=[])).tokens)
    assert res.record.second_tokens < n_alone - n_opening // 2
