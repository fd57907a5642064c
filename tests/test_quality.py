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
