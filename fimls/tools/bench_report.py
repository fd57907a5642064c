"""What ``fimls bench`` prints: the tables of a run, from its result."""

from __future__ import annotations

from typing import Any

# The cross table's systems: fimls serve, then llama-server with --peer.
FIMLS_ALONE, FIMLS_OPEN = "alone", "other files open"
PEER_ALONE, PEER_OPEN = "llama-server alone", "llama-server, ring"


def format_cross(table: dict[str, dict[str, dict[str, Any]]]) -> str:
    """Quality and latency with the other files open against alone (each system against
    itself), and fimls against llama-server where the peer ran."""
    nan = float("nan")
    head = (f"{'model':<22} {'system':<18} {'line':>6} {'chars':>6} {'first p50':>10} "
            f"{'key p50':>9} {'key p95':>9} {'context':>8} {'memo':>5} {'srv p50':>8} "
            f"{'key eval':>8} {'2nd':>9}")
    lines = [head, "-" * len(head)]

    def ratios(label: str, s: dict[str, Any], a: dict[str, Any]) -> str:
        def ratio(key: str) -> str:
            return f"{s[key] / a[key]:.2f}x" if a[key] else "-"
        return (f"{'':<22} {label:<18} {ratio('line_exact'):>6} "
                f"{ratio('char_prefix_ratio'):>6} {ratio('first_p50_ms'):>10} "
                f"{ratio('typing_p50_ms'):>9} {ratio('typing_p95_ms'):>9}")

    for model, systems in table.items():
        for system, s in systems.items():
            lines.append(f"{model:<22} {system:<18} {s['line_exact']:>6.3f} "
                         f"{s['char_prefix_ratio']:>6.3f} {s['first_p50_ms']:>8.0f}ms "
                         f"{s['typing_p50_ms']:>7.1f}ms {s['typing_p95_ms']:>7.0f}ms "
                         f"{s.get('context_tokens_p50', nan):>8.0f} "
                         f"{s.get('key_memo_share', nan):>5.2f} "
                         f"{s.get('key_server_p50_ms', nan):>6.1f}ms "
                         f"{s.get('key_evaluated_p50', nan):>8.0f} "
                         f"{s.get('second_share', nan):>4.2f}/"
                         f"{s.get('second_taken_share', nan):.2f}")
            base = {FIMLS_OPEN: FIMLS_ALONE, PEER_OPEN: PEER_ALONE}.get(system)
            if base in systems:
                lines.append(ratios("  vs alone", s, systems[base]))
        for label, mine, theirs in (("alone", FIMLS_ALONE, PEER_ALONE),
                                    ("open", FIMLS_OPEN, PEER_OPEN)):
            if mine in systems and theirs in systems:
                lines.append(ratios(f"  {label} vs peer", systems[mine], systems[theirs]))
        lines += format_split(systems, FIMLS_ALONE, FIMLS_OPEN, check_chunks=True)
        if PEER_OPEN in systems:
            lines.append(f"{'':<22} llama-server:")
            lines += format_split(systems, PEER_ALONE, PEER_OPEN)
    return "\n".join(lines)


def format_split(systems: dict[str, dict[str, Any]], alone_key: str, open_key: str,
                  check_chunks: bool = False) -> list[str]:
    """Right first lines where the task's file calls the name elsewhere too (a call the
    model may copy, where its window reaches it) and where only the other file shows it
    (see :func:`fimls.tools.crosstasks.file_calls_elsewhere`)."""
    alone, opened = systems.get(alone_key), systems.get(open_key)
    if (alone is None or opened is None or "by_file_calls" not in alone
            or "by_file_calls" not in opened):
        return []
    out = []
    for part, what in (("file", "the file calls it elsewhere"),
                       ("other", "only the other file shows it")):
        a, o = alone["by_file_calls"][part], opened["by_file_calls"][part]
        ratio = f"{o['right'] / a['right']:.2f}x" if a["right"] else "-"
        out.append(f"{'':<22} {what}: {a['n']} tasks, right alone {a['right']}, "
                   f"open {o['right']} ({ratio})")
    if check_chunks and "definition_in_chunks" in opened:
        out.append(f"{'':<22} the called name's definition among the chunks: "
                   f"{opened['definition_in_chunks']} of {opened['n']} tasks")
    return out


def print_setup(result: Any) -> None:
    """The run's model and machine, and each model's measured verify cost."""
    setup = result.setup
    print(f"model: {', '.join(setup['model'])}  threads: {setup['threads'] or 'auto'}  "
          f"gpu layers: {setup['n_gpu_layers']}  max tokens: {setup['max_tokens']}")
    for label, costs in setup["verify_cost"].items():
        print(f"verify cost (x one step) by draft length, {label}: " + ", ".join(
            f"{k}:{v:.2f}" for k, v in sorted(costs.items())))


def print_engine_runs(result: Any) -> None:
    """Speculation against plain decoding, quality and the gate table; the gate table is
    kept in the setup too."""
    from fimls.tools import bench

    if not result.runs:
        return
    print(bench.format_table(result.summary))
    print("\nquality against the real text (first line, whole, prefix kept, edit "
          "similarity, empty answers):")
    print(bench.format_quality_table(result.summary))
    gates = bench.gate_table(result.runs)
    result.setup["gate"] = gates
    print("\nconfidence gate (--min-confidence), configuration off: non-empty suggestions "
          "shown, precision (first line right) and recall (right ones still shown):")
    print(bench.format_gate_table(gates))


def print_cross(result: Any, tasks: int, task_set: str, typing: int) -> None:
    """The cross-file table."""
    if not result.cross:
        return
    print(f"\nwith the other files open ({tasks} tasks of {task_set}: the first request, "
          f"then {typing} typed characters, through fimls serve):")
    print(format_cross(result.cross))
    print("(memo: typed characters answered from the memo; srv p50: the server's own "
          "time per typed character, from its log; key eval: tokens the model evaluated "
          "per typed character that reached it, p50; 2nd: share of the requests that "
          "read their prompt a second time without the chunks / share that showed the "
          "second reading's line)")


def print_suffix(result: Any, task_set: str, chars: int) -> None:
    """The suffix-reuse table, per model."""
    from fimls.tools import bench

    for label, res in result.suffix.items():
        print(f"\nsuffix reuse, {res['summary']['tasks']} tasks of {task_set}: {chars} typed "
              "characters of the real text, each answered with the cached suffix moved and "
              "with it evaluated fresh:")
        print(bench.format_suffix_table(label, res["summary"]))


def print_keystroke(result: Any, tasks: int) -> None:
    """Typing the suggestion character by character, per speculative mode."""
    if not result.keystroke:
        return
    print("\ntyping the suggestion character by character, through fimls serve:")
    for cfg, row in result.keystroke["summary"].items():
        print(f"  {cfg:<6} follow-ups {row['requests']:>4}  p50 {row['follow_p50_ms']:8.1f} ms"
              f"  p95 {row['follow_p95_ms']:8.1f} ms  "
              f"p50 vs off {row.get('follow_p50_vs_off', float('nan')):.2f}  "
              f"through the model {row['through_model']:>3}  drafts accepted "
              f"{row['accepted']}/{row['drafted']}  first p50 {row['first_p50_ms']:.0f} ms, "
              f"non-empty {row['non_empty_first']}/{tasks}, follow-ups reusing "
              f">= 90% of the prompt {row['reuse_ge_90pct']}/{row['requests']}")
        print(f"         engine worker hop (to the worker process and back, per request): "
              f"p50 {row['hop_p50_ms']:.2f} ms  p95 {row['hop_p95_ms']:.2f} ms")


def print_editor(result: Any, tasks: int, task_set: str, typing: int) -> None:
    """fimls serve (and the peer) as an editor asks, side by side; idle prefill."""
    if not result.editor:
        return
    from fimls.tools.peer import format_side_by_side

    print(f"\nas an editor asks ({tasks} tasks of {task_set}: the first request, then "
          f"{typing} typed characters of the real text, asking after each):")
    print(format_side_by_side(result.editor["summary"]))
    for label, systems in result.editor["summary"].items():
        for row in systems.values():
            idle = row.get("idle_prefill")
            if idle:
                print(f"idle prefill after opening, {label}: {idle['runs']} runs, "
                      f"p50 {idle['tokens_p50']:.0f} tokens in {idle['ms_p50']:.0f} ms "
                      f"({idle['tokens_per_s']:.0f} tokens/s), {idle['stopped']} stopped "
                      "by the request")
