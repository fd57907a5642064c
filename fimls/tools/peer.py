"""``fimls bench --peer``: fimls and llama.cpp's llama-server, side by side, in one run.

Both are driven the way an editor drives them, on the same tasks and the same model file:

* fimls: ``fimls serve`` over stdio; per task the document is opened (optionally the user
  then reads for ``open_wait`` seconds), a suggestion is asked at the cursor, then K
  characters of the real text are typed one at a time, asking after each;
* the peer: ``llama-server`` (the path given), asked the way llama.vim asks: ``/infill``
  (``/completion`` on the prefix for a model without FIM tokens)
  with the 256 lines before the cursor line and the 64 after (at most 6000 and 2000
  characters), ``cache_prompt``, greedy, one line (``stop: ["\\n"]``); the same K typed
  characters. The server runs with ``-c 4096 -np 1`` and the extra arguments given
  (``--cache-reuse 256 -b 1024 -ub 1024`` by default, as llama.vim's docs suggest).

Both report the same numbers: first request p50/p95, per keystroke p50/p95, first-line
match, character-prefix ratio and empty answers, and fimls's ratios to the peer.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shlex
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from fimls.latency import percentile
from fimls.tools.harness import (
    Task,
    close_doc,
    inline,
    insert,
    open_doc,
    start_client,
    stop_client,
    utf16_len,
    utf16_position,
)

DEFAULT_PEER_ARGS = "--cache-reuse 256 -b 1024 -ub 1024"
PEER_PREFIX_LINES, PEER_SUFFIX_LINES = 256, 64
PEER_PREFIX_CHARS, PEER_SUFFIX_CHARS = 6000, 2000
BENCH_ROOT = "file:///bench/repo"  # the workspace of documents opened at their paths


def _row(task: Task, latencies: list[float], first_text: str) -> dict[str, Any]:
    exp_line = task.target.split("\n", 1)[0]
    common = 0
    for a, b in zip(first_text, task.target, strict=False):
        if a != b:
            break
        common += 1
    return {"task_id": task.task_id, "latency_ms": latencies, "completion": first_text,
            "line_exact": bool(exp_line.strip())
            and first_text.split("\n", 1)[0].rstrip() == exp_line.rstrip(),
            "prefix_chars": common, "target_chars": len(task.target)}


def summarize_editor(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """First-request and per-keystroke latency (p50, p95) and first-suggestion quality."""
    first = [r["latency_ms"][0] for r in rows]
    later = [x for r in rows for x in r["latency_ms"][1:]]
    return {"n": len(rows),
            "first_p50_ms": percentile(first, 50), "first_p95_ms": percentile(first, 95),
            "typing_p50_ms": percentile(later, 50) if later else float("nan"),
            "typing_p95_ms": percentile(later, 95) if later else float("nan"),
            "line_exact": sum(r["line_exact"] for r in rows) / max(1, len(rows)),
            "char_prefix_ratio": sum(r["prefix_chars"] for r in rows)
            / max(1, sum(r["target_chars"] for r in rows)),
            "empty": sum(1 for r in rows if not r["completion"]) / max(1, len(rows))}


def keystroke_costs(rows: list[dict[str, Any]],
                    records: list[dict[str, Any]]) -> dict[str, float]:
    """What the typed characters of ``rows`` cost inside the server, from its latency log
    (``records``, one per request, in order): the share answered from the memo, the
    server's own time (p50), and the tokens the model evaluated for those that reached it
    (p50). A context that were evaluated again per keystroke would show there. NaN when
    the log does not match the rows."""
    asked = [r for r in records if not str(r.get("outcome", "")).startswith("prefill")]
    asked.sort(key=lambda r: float(r.get("ts", 0.0)))
    ks = [k for r in rows for k in range(len(r["latency_ms"]))]
    nan = float("nan")
    if len(asked) != len(ks):
        return {"key_memo_share": nan, "key_server_p50_ms": nan, "key_evaluated_p50": nan}
    keys = [r for r, k in zip(asked, ks, strict=True) if k > 0]
    model = [r for r in keys if r.get("stop") != "memo"]
    return {"key_memo_share": (len(keys) - len(model)) / len(keys) if keys else nan,
            "key_server_p50_ms": percentile([float(r.get("total_ms", 0.0)) for r in keys], 50),
            "key_evaluated_p50": percentile(
                [float(r.get("evaluated_tokens", 0)) for r in model], 50)}


class _Editor:
    """One ``fimls serve`` driven as an editor: per task the document is opened (with the
    task's other files first when ``open_extra``), a suggestion asked, K characters typed."""

    def __init__(self, client: Any, typing: int, open_wait: float = 0.0,
                 open_extra: bool = False, in_repo: bool = False,
                 cursor_hint: bool = False,
                 roots: Callable[[Task], str] | None = None) -> None:
        self.client = client
        self.typing, self.open_wait = typing, open_wait
        self.open_extra, self.cursor_hint = open_extra, cursor_hint
        self.root = BENCH_ROOT if open_extra or in_repo else None
        self.roots = roots  # each task's own workspace folder (a checkout), if any

    async def task(self, ti: int, task: Task) -> dict[str, Any]:
        """Run one task; its row (latencies, first suggestion, quality)."""
        from lsprotocol import types

        client, root = self.client, self.roots(task) if self.roots else self.root
        uri = f"file:///bench/editor/{ti}/main.py"
        extra: list[str] = []
        if root:
            uri = f"{root}/{task.path or 'main.py'}"
        if self.open_extra:
            # The task's other files first, as an editor with several buffers would have.
            for path, body in task.open:
                extra.append(f"{root}/{path}")
                open_doc(client, extra[-1], body)
        open_doc(client, uri, task.prefix + task.suffix)
        line, col = utf16_position(task.prefix)
        if self.cursor_hint:
            client.protocol.notify("fimls/cursor", {"textDocument": {"uri": uri},
                                                    "position": {"line": line, "character": col}})
        if self.open_wait:
            await asyncio.sleep(self.open_wait)
        lat: list[float] = []
        first = ""
        for k in range(self.typing + 1):
            t0 = time.perf_counter()
            res = await inline(client, uri, line, col)
            lat.append((time.perf_counter() - t0) * 1000.0)
            items = (res.items if isinstance(res, types.InlineCompletionList)
                     else list(res or []))
            text = items[0].insert_text if items else ""
            if k == 0:
                first = text if isinstance(text, str) else ""
            if k == self.typing or k >= len(task.target):
                break
            ch = task.target[k]
            insert(client, uri, k + 2, line, col, ch)
            line, col = (line + 1, 0) if ch == "\n" else (line, col + utf16_len(ch))
        close_doc(client, uri)
        for u in extra:
            close_doc(client, u)
        return _row(task, lat, first)


def _serve_cmd(serve_args: list[str], latency_log: Path | None) -> list[str]:
    import sys

    cmd = [sys.executable, "-m", "fimls", "serve", *serve_args, "--log-level", "WARNING"]
    if latency_log is not None:
        latency_log.unlink(missing_ok=True)
        cmd += ["--latency-log", str(latency_log)]
    return cmd


async def _fimls_session(cmd: list[str], tasks: Sequence[Task], typing: int, open_wait: float,
                         progress: Callable[[str], None] | None,
                         open_extra: bool = False, in_repo: bool = False,
                         cursor_hint: bool = False, roots: Callable[[Task], str] | None = None,
                         ) -> list[dict[str, Any]]:
    folders = sorted({roots(t) for t in tasks}) if roots else []
    client = await start_client(cmd, "fimls-bench-editor",
                                root_uri=BENCH_ROOT if open_extra or in_repo else None,
                                folders=folders)
    editor = _Editor(client, typing, open_wait, open_extra, in_repo, cursor_hint, roots)
    rows = []
    for ti, task in enumerate(tasks):
        rows.append(await editor.task(ti, task))
        if progress:
            progress("fimls")
    await stop_client(client)
    return rows


def run_fimls(serve_args: list[str], tasks: Sequence[Task], *, typing: int,
              open_wait: float = 0.0, latency_log: Path | None = None,
              progress: Callable[[str], None] | None = None,
              open_extra: bool = False, in_repo: bool = False,
              cursor_hint: bool = False, roots: Callable[[Task], str] | None = None,
              ) -> list[dict[str, Any]]:
    """Drive one ``fimls serve`` (started with ``serve_args``) over the tasks, as an editor
    (``in_repo``: each document at its path in a workspace; ``roots``: in the workspace
    folder, a URI, that it gives for the task, every one of them a folder of the session;
    ``open_extra``: also with the task's other files open first; ``cursor_hint``: as
    fimls's plugins, tell the server where the cursor rests once the document is open)."""
    return asyncio.run(_fimls_session(_serve_cmd(serve_args, latency_log), tasks, typing,
                                      open_wait, progress, open_extra, in_repo, cursor_hint,
                                      roots))


async def _paired_session(serve_args: list[str], tasks: Sequence[Task], typing: int,
                          logs: tuple[Path, Path], progress: Callable[[str], None] | None,
                          ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    clients = [await start_client(_serve_cmd(serve_args, log), "fimls-bench-editor",
                                  root_uri=BENCH_ROOT) for log in logs]
    editors = [_Editor(clients[0], typing, in_repo=True),
               _Editor(clients[1], typing, open_extra=True, in_repo=True)]
    rows: tuple[list[dict[str, Any]], list[dict[str, Any]]] = ([], [])
    for ti, task in enumerate(tasks):
        # Alternate which goes first: the machine's load drifts over a run, and a
        # keystroke's few milliseconds drift with it.
        for side in ((0, 1) if ti % 2 == 0 else (1, 0)):
            rows[side].append(await editors[side].task(ti, task))
            if progress:
                progress("fimls")
    for client in clients:
        await stop_client(client)
    return rows


def run_fimls_paired(serve_args: list[str], tasks: Sequence[Task], *, typing: int,
                     latency_logs: tuple[Path, Path],
                     progress: Callable[[str], None] | None = None,
                     ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The same tasks through two ``fimls serve`` at once, as documents in a workspace:
    one with each task's file alone, one with the task's other files open too. Task by
    task, in alternating order, so that both sides meet the same machine: their ratio is
    measured in one run, not in two runs minutes apart. Each server sees the same task
    sequence it would see on its own. Returns the rows (alone, open)."""
    return asyncio.run(_paired_session(serve_args, tasks, typing, latency_logs, progress))


def post_json(url: str, body: dict[str, Any], timeout: float = 600.0) -> dict[str, Any]:
    """POST ``body`` as JSON to ``url`` and return the JSON answer (llama-server's API)."""
    req = urllib.request.Request(url, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        out: dict[str, Any] = json.loads(r.read())
        return out


class PeerCrashed(RuntimeError):
    """llama-server died under the bench. ``wrong_cpu``: it died of SIGILL, the mark of a
    binary built (``GGML_NATIVE``, the default) on a machine whose CPU has instructions this
    one lacks, as a cache directory shared between machines can hand out."""

    def __init__(self, returncode: int, log: str) -> None:
        self.returncode = returncode
        hint = (": SIGILL, built for another CPU (rebuild it on this machine, or with "
                "-DGGML_NATIVE=OFF)" if self.wrong_cpu else "")
        super().__init__(f"llama-server exited ({returncode}){hint}; see {log}")

    @property
    def wrong_cpu(self) -> bool:
        """Whether the binary cannot run on this CPU at all (not a bug in either program)."""
        return self.returncode == -signal.SIGILL


class _PeerServer:
    """One llama-server process, started, asked over HTTP, and stopped."""

    def __init__(self, server: Path, model: Path, threads: int, extra_args: str,
                 port: int) -> None:
        if not port:
            with socket.socket() as sock:
                sock.bind(("127.0.0.1", 0))
                port = int(sock.getsockname()[1])
        cmd = [str(server), "-m", str(model), "--host", "127.0.0.1", "--port", str(port),
               "-c", "4096", "-t", str(threads), "-np", "1", "--no-webui",
               *shlex.split(extra_args)]
        fd, self.err_name = tempfile.mkstemp(prefix="fimls-peer-", suffix=".log")
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=fd)
        os.close(fd)
        self.base = f"http://127.0.0.1:{port}"

    def wait_ready(self, seconds: float = 600) -> None:
        """Until the server answers /health (it loads the model first)."""
        deadline = time.monotonic() + seconds
        while True:
            if self.proc.poll() is not None:
                raise PeerCrashed(self.proc.returncode, self.err_name)
            try:
                with urllib.request.urlopen(self.base + "/health", timeout=2) as r:
                    if json.loads(r.read()).get("status") == "ok":
                        return
            except Exception:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"llama-server did not start; see {self.err_name}"
                                       ) from None
                time.sleep(0.5)

    def post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """POST ``body`` to ``path``; PeerCrashed when the server died on it."""
        try:
            return post_json(self.base + path, body)
        except urllib.error.HTTPError:
            raise
        except OSError:
            # A binary built for another CPU can pass its start and die at its first batch.
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=10)
            if self.proc.returncode is None:
                raise
            raise PeerCrashed(self.proc.returncode, self.err_name) from None

    def close(self) -> None:
        """Stop the server."""
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def _infill_body(task: Task, typed: int, max_tokens: int,
                 extra: Callable[[Task], list[dict[str, str]]] | None) -> dict[str, Any]:
    """llama.vim's /infill request for ``task`` with ``typed`` characters of its target
    typed: the lines around the cursor, greedy, one line."""
    before = (task.prefix + task.target[:typed]).split("\n")
    pre = "\n".join(before[-(PEER_PREFIX_LINES + 1):])[-PEER_PREFIX_CHARS:]
    suf = "\n".join(task.suffix.split("\n")[:PEER_SUFFIX_LINES])
    body = {"input_prefix": pre, "input_suffix": suf[:PEER_SUFFIX_CHARS],
            "n_predict": max_tokens, "temperature": 0, "samplers": ["top_k"],
            "top_k": 1, "cache_prompt": True, "stop": ["\n"]}
    if extra is not None:
        body["input_extra"] = extra(task)
    return body


def _as_completion(body: dict[str, Any]) -> dict[str, Any]:
    """An /infill request as a /completion one on its prefix (a model without FIM tokens)."""
    body = {**body, "prompt": body["input_prefix"]}
    del body["input_prefix"], body["input_suffix"]
    body.pop("input_extra", None)
    return body


def run_peer(server: Path, model: Path, tasks: Sequence[Task], *, typing: int,
             max_tokens: int, threads: int, extra_args: str = DEFAULT_PEER_ARGS,
             port: int = 0, progress: Callable[[str], None] | None = None,
             extra: Callable[[Task], list[dict[str, str]]] | None = None,
             ) -> list[dict[str, Any]]:
    """Start ``server`` (llama-server) on ``model`` and ask it as llama.vim would (on
    ``port``; 0: a free one). ``extra`` gives a task's chunks of other files, sent as
    ``input_extra`` (llama.vim's ring buffer) with each of its requests."""
    peer = _PeerServer(server, model, threads, extra_args, port)
    try:
        peer.wait_ready()
        rows = []
        infill = True  # a model without FIM tokens is asked on its prefix, at /completion
        for task in tasks:
            lat: list[float] = []
            first = ""
            for k in range(typing + 1):
                body = _infill_body(task, k, max_tokens, extra)
                if not infill:
                    body = _as_completion(body)
                t0 = time.perf_counter()
                try:
                    r = peer.post("/infill" if infill else "/completion", body)
                except urllib.error.HTTPError:
                    if not infill:
                        raise
                    infill = False
                    body = _as_completion(body)
                    t0 = time.perf_counter()
                    r = peer.post("/completion", body)
                lat.append((time.perf_counter() - t0) * 1000.0)
                if k == 0:
                    first = str(r.get("content", ""))
                if k >= len(task.target):
                    break
            rows.append(_row(task, lat, first))
            if progress:
                progress("peer")
        return rows
    finally:
        peer.close()


def idle_prefill_stats(log: Path) -> dict[str, Any]:
    """How the idle prefill after opening went, from a latency log: runs, tokens, time."""
    from fimls.latency import read_records

    opens = [r for r in read_records(log) if str(r.get("outcome", "")).startswith("prefill")
             and not str(r.get("request_id", "")).endswith("-next")]
    tokens = [float(r.get("evaluated_tokens", 0)) for r in opens]
    ms = [float(r.get("model_ms", 0.0)) for r in opens]
    return {"runs": len(opens), "stopped": sum(r["outcome"] != "prefill" for r in opens),
            "tokens_p50": percentile(tokens, 50), "ms_p50": percentile(ms, 50),
            "tokens_per_s": sum(tokens) / max(1e-9, sum(ms) / 1000.0)}


def format_side_by_side(table: dict[str, dict[str, dict[str, Any]]]) -> str:
    """One row per model and system; fimls's rows carry their ratio to the peer's."""
    head = (f"{'model':<22} {'system':<38} {'first p50':>10} {'first p95':>10} "
            f"{'key p50':>9} {'key p95':>9} {'line':>6} {'chars':>6} {'empty':>6}")
    lines = [head, "-" * len(head)]
    for model, systems in table.items():
        peer = systems.get("llama-server")
        for name, s in systems.items():
            lines.append(
                f"{model:<22} {name:<38} {s['first_p50_ms']:>8.0f}ms {s['first_p95_ms']:>8.0f}ms"
                f" {s['typing_p50_ms']:>7.0f}ms {s['typing_p95_ms']:>7.0f}ms"
                f" {s['line_exact']:>6.3f} {s['char_prefix_ratio']:>6.3f} {s['empty']:>6.2f}")
            if peer is not None and name != "llama-server":
                def ratio(key: str, s: dict[str, Any] = s,
                          peer: dict[str, Any] = peer) -> str:
                    p = peer.get(key) or float("nan")
                    return f"{s[key] / p:.2f}x" if p == p and p else "-"
                lines.append(f"{'':<22} {'  vs llama-server':<38} {ratio('first_p50_ms'):>10} "
                             f"{ratio('first_p95_ms'):>10} {ratio('typing_p50_ms'):>9} "
                             f"{ratio('typing_p95_ms'):>9} "
                             f"{s['line_exact'] - peer['line_exact']:>+6.3f} "
                             f"{s['char_prefix_ratio'] - peer['char_prefix_ratio']:>+6.3f}")
    return "\n".join(lines)
