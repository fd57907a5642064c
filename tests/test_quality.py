"""Quality measures of fimls bench."""

from __future__ import annotations

import pytest

from fimls.quality import edit_similarity, first_line, score, summarize


def test_a_right_first_line_is_line_exact_but_not_exact() -> None:
    s = score("    return a + b\n    # done\n", "    return a + b\n")
    assert s.line_exact and not s.exact and not s.empty
    assert s.prefix_ratio == 1.0


def test_trailing_whitespace_does_not_count() -> None:
    s = score("x = 1  \n", "x = 1\n")
    assert s.exact and s.line_exact and s.edit_similarity == 1.0


def test_an_empty_suggestion_is_never_right() -> None:
    s = score("", "")
    assert s.empty and not s.line_exact and not s.exact
    s = score("  \n", "x")
    assert s.empty and s.prefix_ratio == 0.0


def test_prefix_ratio_and_edit_similarity() -> None:
    s = score("result.append(x)", "result.append(n)")
    assert s.prefix_ratio == pytest.approx(14 / 16)
    assert s.edit_similarity == pytest.approx(1 - 1 / 16)
    assert edit_similarity("kitten", "sitting") == pytest.approx(1 - 3 / 7)
    assert edit_similarity("abc", "") == 0.0


def test_first_line_splits_only_at_lsp_line_ends() -> None:
    assert first_line("a\fb\u2028c\x85d\r\ne") == "a\fb\u2028c\x85d"
    assert first_line("x\ry") == "x"


def test_summary_rates() -> None:
    rows = [score("a\n", "a\n"), score("b\n", "a\n"), score("", "a\n"), score("a\nz", "a\nb")]
    q = summarize(rows)
    assert q["line_exact"] == 0.5 and q["exact"] == 0.25 and q["empty_rate"] == 0.25
    assert q["tasks"] == 4


def test_bench_summary_reports_quality_per_set_and_config() -> None:
    from fimls.tools.bench import Run, format_quality_table, summarize_runs

    rec = {"generated_tokens": 4, "decode_ms": 10.0, "drafted_tokens": 0, "accepted_tokens": 0,
           "draft_batches": 0, "ttft_ms": 5.0, "total_ms": 15.0}
    runs = [Run("set [m]", "off", "0:a", "return x\n", rec, "return x\n"),
            Run("set [m]", "off", "1:b", "", rec, "y = 1\n"),
            Run("set [m]", "off", "2:c", "z = 2\nw", rec, "z = 2\nq\n")]
    q = summarize_runs(runs)["set [m]"]["off"]["quality"]
    assert q["line_exact"] == pytest.approx(2 / 3) and q["exact"] == pytest.approx(1 / 3)
    assert q["empty_rate"] == pytest.approx(1 / 3)
    table = format_quality_table(summarize_runs(runs))
    assert "line-exact" in table and "set [m]" in table and "0.667" in table


def test_cross_tasks_split_by_whether_the_file_calls_the_name_elsewhere() -> None:
    """A task whose suffix calls the name again can be answered by copying; the split
    counts right first lines on each side, and the cli prints both sides' ratio."""
    from fimls.tools.bench_report import format_split as _format_split
    from fimls.tools.crosstasks import file_calls_elsewhere, split_by_file_calls
    from fimls.tools.harness import Task

    copied = Task("a", "from m import convert\nx = ", "\ny = convert(2, rate=1)\n",
                  "convert(1, rate=1)")
    qualified = Task("b", "import m\nx = ", "\ny = m.convert(2)\n", "convert(1, rate=1)")
    other_name = Task("e", "x = ", "\ny = reconvert(2)\nconvert = 1\n", "convert(1)")
    assert file_calls_elsewhere(qualified) and not file_calls_elsewhere(other_name)
    only = Task("c", "import m\nx = ", "\nprint(x)\n", "build(x)")
    assert not file_calls_elsewhere(only)
    assert not file_calls_elsewhere(Task("d", "", "", "(1, 2)"))
    rows = [{"task_id": "a", "line_exact": True}, {"task_id": "c", "line_exact": False}]
    alone = {"by_file_calls": split_by_file_calls(rows, [copied, only])}
    assert alone["by_file_calls"] == {"file": {"n": 1, "right": 1}, "other": {"n": 1, "right": 0}}
    rows = [{"task_id": "a", "line_exact": True}, {"task_id": "c", "line_exact": True}]
    opened = {"by_file_calls": split_by_file_calls(rows, [copied, only])}
    text = "\n".join(_format_split({"alone": alone, "other files open": opened},
                                    "alone", "other files open"))
    assert "calls it elsewhere: 1 tasks, right alone 1, open 1 (1.00x)" in text
    assert "other file shows it: 1 tasks, right alone 0, open 1 (-)" in text


def test_the_called_names_definition_is_found_among_the_chunks() -> None:
    """The bench asks the server's own chunk choice whether the target's definition is
    in it: with the defining file open it is, with only an unrelated file it is not."""
    from fimls.tools.crosstasks import definition_in_chunks
    from fimls.tools.harness import Task

    money = ("pkg/money.py", "def convert_amount(value, rate):\n    return value * rate\n")
    misc = ("pkg/misc.py", "def unrelated(x):\n    return x\n")
    prefix = "from pkg.money import convert_amount\n\ndef run(v):\n    total = "
    task = Task("t", prefix, "\n    return total\n", "convert_amount(v, rate=0.5)",
                path="pkg/app.py", open=(money, misc))
    assert definition_in_chunks(task, 1536)
    assert not definition_in_chunks(Task("u", prefix, "\n", task.target, path="pkg/app.py",
                                         open=(misc,)), 1536)
    assert not definition_in_chunks(task, 0)


def test_ring_chunks_are_what_llama_vim_would_hold_at_best() -> None:
    """The peer's chunks: 33 lines from the called name's definition in the file that
    defines it (sent last, nearest the cursor's file), the first 33 lines of the others,
    nothing of a file too small for llama.vim to pick."""
    from fimls.tools.crosstasks import RING_CHUNK_LINES, ring_chunks
    from fimls.tools.harness import Task

    body = "".join(f"    x{i} = {i}\n" for i in range(50))
    money = ("pkg/money.py", "import os\n\n\nasync def convert_amount(v, rate):\n" + body)
    misc = ("pkg/misc.py", "".join(f"line{i}\n" for i in range(100)))
    tiny = ("pkg/tiny.py", "A = 1\n")
    task = Task("t", "x = ", "\n", "convert_amount(v, rate=0.5)", open=(money, misc, tiny))
    chunks = ring_chunks(task)
    assert [c["filename"] for c in chunks] == ["pkg/misc.py", "pkg/money.py"]
    assert chunks[1]["text"].startswith("async def convert_amount(v, rate):\n    x0 = 0\n")
    assert chunks[1]["text"].count("\n") == RING_CHUNK_LINES
    assert chunks[0]["text"] == "".join(f"line{i}\n" for i in range(RING_CHUNK_LINES))
    # A module-level assignment defines a name too; a call of it does not.
    rate = ("pkg/rates.py", "x = RATE(1)\nimport os\nRATE: float = 0.5\nB = 2\n")
    (chunk,) = ring_chunks(Task("r", "y = ", "\n", "RATE * 2", open=(rate,)))
    assert chunk["text"].startswith("RATE: float = 0.5\n")


def test_the_cross_table_compares_each_system_with_itself_and_fimls_with_the_peer() -> None:
    """With the peer's rows the table gives its own open-against-alone ratio, fimls's
    ratios to it, and its split lines."""
    from fimls.tools.bench_report import format_cross as _format_cross

    def row(line: float, first: float) -> dict[str, object]:
        return {"line_exact": line, "char_prefix_ratio": line, "first_p50_ms": first,
                "typing_p50_ms": 2.0, "typing_p95_ms": 9.0, "n": 10,
                "by_file_calls": {"file": {"n": 4, "right": 2}, "other": {"n": 6, "right": 1}}}

    table = {"m": {"alone": row(0.3, 100.0), "other files open": row(0.45, 200.0),
                   "llama-server alone": row(0.2, 50.0), "llama-server, ring": row(0.3, 80.0)}}
    text = _format_cross(table)
    lines = text.splitlines()
    vs = [ln.split() for ln in lines if ln.split()[:2] == ["vs", "alone"]]
    assert [v[2] for v in vs] == ["1.50x", "1.50x"]
    peer = [ln.split() for ln in lines if "vs peer" in ln]
    assert [p[:4] for p in peer] == [["alone", "vs", "peer", "1.50x"],
                                     ["open", "vs", "peer", "1.50x"]]
    assert peer[1][5] == "2.50x"  # first p50: 200 against 80 ms
    assert "llama-server:" in text and text.count("only the other file shows it") == 2
