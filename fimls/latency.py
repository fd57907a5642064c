"""The per-request latency record, its JSON Lines writer, and ``fimls stats`` summaries.

One record per completion request, whatever its outcome. Records hold no document text:
only the URI, sizes and timings.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

TIMING_FIELDS = ("queue_ms", "prompt_ms", "ttft_ms", "decode_ms", "total_ms", "hop_ms",
                 "model_ms")
COUNT_FIELDS = ("prompt_tokens", "reused_tokens", "generated_tokens", "drafted_tokens",
                "accepted_tokens")


class Word(str, Enum):
    """A word of the log: compares, prints and serialises as its text."""

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)


class Stop(Word):
    """Why a suggestion's generation stopped (``stop`` in the log)."""

    NONE = ""
    EOG = "eog"  # the model's end of text (or of the infill)
    POLICY = "policy"  # a stop rule cut it (the line, the block, the text that follows)
    MAX_TOKENS = "max_tokens"
    MAX_TIME = "max_time"  # maxTimeMs, at a line end
    MEMO = "memo"  # the rest of the suggestion being typed, from the memo
    MEMO_END = "memo_end"  # the typed suggestion's end: not grown by a model step
    NO_TOKEN = "no_token"  # no token keeps the forced text
    CONTEXT_FULL = "context_full"
    EMPTY_PROMPT = "empty_prompt"


class Outcome(Word):
    """How a request ended (``outcome`` in the log)."""

    RETURNED = "returned"
    EMPTY = "empty"
    GATED = "gated"  # hidden by minConfidence
    CANCELLED = "cancelled"
    SUPERSEDED = "superseded"
    ERROR = "error"
    PREFILL = "prefill"  # idle work done
    PREFILL_STOPPED = "prefill_stopped"  # idle work stopped by a request
    PREFILL_ERROR = "prefill_error"
    PREEMPTED = "preempted"  # idle work set aside for a request
    SCORED = "scored"  # next-edit verification: middles scored, nothing generated


@dataclass(kw_only=True)
class LatencyRecord:
    """What one request cost, and how it ended."""

    ts: float = field(default_factory=time.time)
    uri: str = ""
    version: int | None = None
    request_id: str | None = None
    queue_ms: float = 0.0
    prompt_ms: float = 0.0
    ttft_ms: float = 0.0
    decode_ms: float = 0.0
    total_ms: float = 0.0
    hop_ms: float = 0.0  # time spent crossing to the engine worker process and back
    model_ms: float = 0.0  # time this request held the model, from ``ts`` (0: never did)
    prompt_tokens: int = 0
    reused_tokens: int = 0
    shifted_tokens: int = 0  # suffix entries kept from the cache at moved positions (FIM)
    memo_tokens: int = 0  # tokens replayed from the previous generation without compute
    evaluated_tokens: int = 0  # positions the model computed for this request (0: none)
    context_tokens: int = 0  # tokens of other buffers' chunks at the prompt's front
    context_sources: str = ""  # which kinds of chunks, e.g. "definition:2,recent:1"
    window_tokens: int = 0  # the prompt's token budget
    # The second reading (see fimls.engine.core): the tokens it evaluated for this request
    # (the prompt without the chunks, the lines it read and wrote), and what came of it:
    # "same" (it wrote the same first line), "kept" (another, less likely), "taken"
    # (another, more likely: shown), "" (not read).
    second_tokens: int = 0
    second_line: str = ""
    # An explicit request's alternatives (see fimls.engine.alternatives): how many, and the
    # tokens decoded for them on a branch of the cached prompt (no prompt evaluated again).
    alternatives: int = 0
    alt_tokens: int = 0
    generated_tokens: int = 0
    drafted_tokens: int = 0
    accepted_tokens: int = 0
    draft_batches: int = 0  # verification batches (mean accepted length = accepted / this)
    draft: str = "none"
    # The lowest (and the mean) probability of the model's own tokens on the suggestion's
    # first line; None when the model chose none (memo, forced text only).
    confidence: float | None = None
    confidence_mean: float | None = None
    outcome: Outcome = Outcome.EMPTY
    model: str = ""
    # Where the model ran: CPU, or the GPU backend holding gpu_layers of its layers.
    backend: str = ""
    gpu_layers: int = 0
    stop: Stop = Stop.NONE
    error: str | None = None

    def to_json(self) -> str:
        """One JSON line, timings rounded to 0.01 ms."""
        d = asdict(self)
        for k in TIMING_FIELDS:
            d[k] = round(float(d[k]), 2)
        return json.dumps(d, separators=(",", ":"))


class LatencyLog:
    """Appends records to a JSON Lines file; safe to call from any thread."""

    def __init__(self, path: Path | None) -> None:
        self._lock = threading.Lock()
        self._path = path
        self._fh: Any = None
        self._warned = False

    @property
    def path(self) -> Path | None:
        """Where records go (None: nowhere)."""
        return self._path

    def set_path(self, path: Path | None) -> None:
        """Switch files (configuration change); the old file is closed."""
        with self._lock:
            if self._fh is not None:
                self._fh.close()
                self._fh = None
            self._path = path

    def write(self, rec: LatencyRecord) -> None:
        """Append one record; an unwritable file is reported once, never raised."""
        line = rec.to_json()
        log.debug("latency %s", line)
        self._write_line(line)

    def write_event(self, event: str, request_id: str, *, uri: str | None = None,
                    accepted_length: int | None = None, index: int | None = None) -> None:
        """Append what the editor did with a suggestion: shown, accepted, partial, dismissed.

        Joined with the request's record by ``request_id`` in :func:`summarize`.
        """
        rec: dict[str, Any] = {"ts": time.time(), "event": event, "request_id": request_id}
        if uri is not None:
            rec["uri"] = uri
        if accepted_length is not None:
            rec["accepted_length"] = accepted_length
        if index is not None:
            rec["index"] = index
        self._write_line(json.dumps(rec, separators=(",", ":")))

    def _write_line(self, line: str) -> None:
        with self._lock:
            if self._path is None:
                return
            try:
                if self._fh is None:
                    self._path.parent.mkdir(parents=True, exist_ok=True)
                    self._fh = self._path.open("a", encoding="utf-8")
                self._fh.write(line + "\n")
                self._fh.flush()
            except OSError as exc:
                if not self._warned:
                    log.warning("cannot write latency log %s: %s", self._path, exc)
                    self._warned = True

    def close(self) -> None:
        """Close the file."""
        self.set_path(None)


def read_records(path: Path) -> Iterator[dict[str, Any]]:
    """Records from a latency log; lines that are not JSON objects are skipped."""
    with path.open(encoding="utf-8", errors="replace") as fh:
        for line in fh:
            line = line.strip()
            if not line:
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(obj, dict):
                yield obj


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0-100) by linear interpolation; NaN for no values."""
    if not values:
        return float("nan")
    xs = sorted(values)
    if len(xs) == 1:
        return xs[0]
    pos = (len(xs) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def _num(value: Any) -> float | None:
    """A numeric field's value; None for anything a hand-edited log may hold instead."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def summarize(records: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """p50/p95 of every timing and count field, counts by outcome, reuse and acceptance."""
    everything = list(records)
    events = [r for r in everything if "event" in r]
    # Idle prefill is no request: its records are summed up on their own.
    idle = [r for r in everything
            if "event" not in r and str(r.get("outcome", "")).startswith("prefill")]
    recs = [r for r in everything
            if "event" not in r and not str(r.get("outcome", "")).startswith("prefill")]
    out: dict[str, Any] = {"requests": len(recs),
                           "outcomes": dict(Counter(str(r.get("outcome")) for r in recs))}
    fields: dict[str, dict[str, float]] = {}
    for k in TIMING_FIELDS + COUNT_FIELDS:
        vals = [v for r in recs if (v := _num(r.get(k))) is not None]
        fields[k] = {"p50": percentile(vals, 50), "p95": percentile(vals, 95),
                     "n": float(len(vals))}
    out["fields"] = fields
    returned = [r for r in recs if r.get("outcome") == "returned"]
    kept = [v for r in returned if (v := _num(r.get("total_ms"))) is not None]
    out["returned_total_ms"] = {"p50": percentile(kept, 50), "p95": percentile(kept, 95)}

    prompt, reused = total_of(recs, "prompt_tokens"), total_of(recs, "reused_tokens")
    drafted, accepted = total_of(recs, "drafted_tokens"), total_of(recs, "accepted_tokens")
    out["reuse_ratio"] = reused / prompt if prompt else 0.0
    out["acceptance_rate"] = accepted / drafted if drafted else 0.0
    out["suggestions"] = _outcomes(recs, events)
    idle_ms = [v for r in idle if (v := _num(r.get("model_ms"))) is not None]
    out["idle_prefill"] = {"runs": len(idle),
                           "stopped": sum(1 for r in idle if r.get("outcome") != "prefill"),
                           "tokens": total_of(idle, "evaluated_tokens"),
                           "model_ms_p50": percentile(idle_ms, 50)}
    return out


def total_of(recs: list[dict[str, Any]], key: str) -> float:
    """The sum of a numeric field over ``recs``."""
    return sum(v for r in recs if (v := _num(r.get(key))) is not None)


def _outcomes(recs: list[dict[str, Any]], events: list[dict[str, Any]]) -> dict[str, Any]:
    """Shown / accepted / partially accepted / dismissed suggestions, joined by request id."""
    shown: set[str] = set()
    accepted: set[str] = set()
    partial: dict[str, int] = {}
    dismissed: set[str] = set()
    taken: Counter[int] = Counter()  # accepted, by item index
    for e in events:
        rid = str(e.get("request_id"))
        kind = e.get("event")
        if kind == "shown":
            shown.add(rid)
        elif kind == "accepted":
            accepted.add(rid)
            taken[int(_num(e.get("index")) or 0)] += 1
        elif kind == "partial":
            partial[rid] = max(partial.get(rid, 0), int(_num(e.get("accepted_length")) or 0))
        elif kind == "dismissed":
            dismissed.add(rid)
    partial_only = set(partial) - accepted
    by_id = {str(r.get("request_id")): r for r in recs}
    shown_ms = [v for rid in shown if (v := _num(by_id.get(rid, {}).get("total_ms"))) is not None]
    n_shown = len(shown | accepted | set(partial))
    return {"shown": n_shown, "accepted": len(accepted), "partially_accepted": len(partial_only),
            "dismissed": len(dismissed - accepted - set(partial)),
            "accept_rate": len(accepted) / n_shown if n_shown else 0.0,
            "any_accept_rate": len(accepted | set(partial)) / n_shown if n_shown else 0.0,
            "shown_total_ms": {"p50": percentile(shown_ms, 50), "p95": percentile(shown_ms, 95)},
            "accepted_by_index": {str(k): taken[k] for k in sorted(taken)}}


def format_summary(s: dict[str, Any]) -> str:
    """Human-readable table of a :func:`summarize` result."""
    lines = [f"requests: {s['requests']}"]
    oc = s["outcomes"]
    lines.append("outcomes: " + ", ".join(f"{k}={oc[k]}" for k in sorted(oc)))
    lines.append(f"{'field':<18}{'p50':>10}{'p95':>10}{'n':>8}")
    for k, v in s["fields"].items():
        lines.append(f"{k:<18}{v['p50']:>10.1f}{v['p95']:>10.1f}{int(v['n']):>8}")
    lines.append(f"reused/prompt tokens: {s['reuse_ratio']:.1%}")
    lines.append(f"draft acceptance: {s['acceptance_rate']:.1%}")
    sug = s.get("suggestions")
    if sug and sug["shown"]:
        lines.append(f"suggestions: shown {sug['shown']}, accepted {sug['accepted']}, "
                     f"partially accepted {sug['partially_accepted']}, dismissed "
                     f"{sug['dismissed']}; accept rate {sug['accept_rate']:.1%} "
                     f"(any part: {sug['any_accept_rate']:.1%}); latency of shown p50 "
                     f"{sug['shown_total_ms']['p50']:.0f} ms")
        by_index = sug.get("accepted_by_index") or {}
        if set(by_index) - {"0"}:
            lines.append("accepted by item (0: the first; others: alternatives asked for): "
                         + ", ".join(f"{k}: {v}" for k, v in by_index.items()))
    return "\n".join(lines)


def plot_log(records: list[dict[str, Any]], path: Path) -> None:
    """PNG: latency distributions by outcome, and suggestion acceptance over time.

    Needs matplotlib (``pip install 'fimls[bench]'``); raises ImportError without it.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    recs = [r for r in records if "event" not in r]
    events = [r for r in records if "event" in r]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    groups: dict[str, list[float]] = {}
    for r in recs:
        v = _num(r.get("total_ms"))
        if v is not None:
            groups.setdefault(str(r.get("outcome")), []).append(v)
    names = sorted(groups)
    if names:
        ax1.boxplot([groups[n] for n in names], tick_labels=names)
        ax1.set_yscale("log")
    ax1.set_title(f"latency by outcome ({len(recs)} requests)")
    ax1.set_ylabel("total ms (log)")
    shown = sorted((float(e["ts"]), str(e["request_id"])) for e in events
                   if e.get("event") == "shown" and _num(e.get("ts")) is not None)
    took = {str(e["request_id"]) for e in events if e.get("event") in ("accepted", "partial")}
    if shown:
        t0 = shown[0][0]
        xs, ys, n_acc = [], [], 0
        for i, (ts, rid) in enumerate(shown, start=1):
            n_acc += rid in took
            xs.append((ts - t0) / 60.0)
            ys.append(100.0 * n_acc / i)
        ax2.plot(xs, ys, marker=".")
        ax2.set_ylim(0, 100)
    ax2.set_title(f"accepted (fully or partly) of {len(shown)} shown, cumulative")
    ax2.set_xlabel("minutes")
    ax2.set_ylabel("%")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
