"""The cross-file scenario's tasks, read: whether the task's file calls the name elsewhere
too, whether the definition is among the chunks fimls would choose, and the chunks
llama.vim's ring buffer would hold for llama-server."""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from typing import Any

from fimls.tools.harness import Task


def _called_name(task: Task) -> str | None:
    """The name a cross-file task's target calls (its leading identifier)."""
    m = re.match(r"[A-Za-z_]\w*", task.target)
    return m.group(0) if m else None


def file_calls_elsewhere(task: Task) -> bool:
    """Whether a cross-file task's own file calls the task's name outside the target line.

    The task maker puts the cursor before the first call in the file, but later calls
    in the suffix (and their arguments), qualified ones too, stay in the file: where the
    window reaches them, the file alone can copy them. Such tasks measure the model's
    copying; the others are those only the other file's chunks can answer, which is what
    the chunks are for.
    """
    name = _called_name(task)
    if name is None:
        return False
    call = re.compile(r"(?<!\w)" + re.escape(name) + r"\s*\(")
    return bool(call.search(task.prefix) or call.search(task.suffix))


def split_by_file_calls(rows: Sequence[dict[str, Any]], tasks: Sequence[Task],
                        ) -> dict[str, dict[str, int]]:
    """First-line matches of ``rows`` (one per task, by ``task_id``) split by
    :func:`file_calls_elsewhere`: ``{"file": ..., "other": ...}``, each with ``n`` and
    ``right``."""
    shown = {t.task_id: file_calls_elsewhere(t) for t in tasks}
    out = {"file": {"n": 0, "right": 0}, "other": {"n": 0, "right": 0}}
    for r in rows:
        part = out["file" if shown.get(r["task_id"], False) else "other"]
        part["n"] += 1
        part["right"] += bool(r["line_exact"])
    return out


def definition_in_chunks(task: Task, char_budget: int) -> bool:
    """Whether the chunks the server would choose for a cross-file task's first request
    (:meth:`fimls.crossfile.ContextStore.select`, the task's other files open, within
    ``char_budget`` characters) hold the definition of the name the target calls: where
    they do, a wrong line is the model's, not the retrieval's."""
    from fimls.crossfile import ContextStore, definitions

    name = _called_name(task)
    if name is None or not task.open:
        return False
    store = ContextStore()
    uri = f"file:///{task.path or 'current'}"
    store.open(uri, task.path, lambda: task.prefix + task.suffix)
    for path, text in task.open:
        store.open(f"file:///{path}", path, functools.partial(str, text))
    chosen = store.select(uri, task.prefix, task.suffix, char_budget)
    return any(name in definitions(c.text) for c in chosen)


# llama.vim's ring buffer: a chunk is picked from the ring_chunk_size (64) lines around the
# cursor, a run of ring_chunk_size / 2 + 1 of them.
RING_CHUNK_LINES = 33


def ring_chunks(task: Task) -> list[dict[str, str]]:
    """The ``input_extra`` chunks llama.vim would send for a cross-file task, at best.

    llama.vim keeps a ring of chunks picked when the user enters, leaves or saves a buffer:
    a random run of 33 of the 64 lines around the cursor. Here the user read the called
    name's definition in the file that defines it, and llama.vim picked the run that
    starts at the ``def``/``class`` line (of its possible picks, the one that helps most).
    The cursor never moved from the top of the other open files, so theirs are their
    first lines. The defining file's chunk comes last, nearest the cursor's file, as it
    would had the user just come from there.
    """
    name = _called_name(task)
    head = re.compile(r"^[ \t]*(?:async\s+)?(?:def|class)\s+" + re.escape(name or "") + r"\b"
                      r"|^" + re.escape(name or "") + r"\s*(?::[^=]*)?=", re.M)
    top: list[dict[str, str]] = []
    found: list[dict[str, str]] = []
    for path, text in task.open:
        lines = text.split("\n")
        m = head.search(text) if name else None
        at = text.count("\n", 0, m.start()) if m else 0
        if len(lines) < 3:  # llama.vim skips very small chunks
            continue
        chunk = {"filename": path,
                 "text": "\n".join(lines[at:at + RING_CHUNK_LINES]) + "\n"}
        (found if m else top).append(chunk)
    return top + found
