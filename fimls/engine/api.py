"""The engine's narrow interface: plain request and result types, no LSP, no llama.cpp.

Everything that crosses from the server to the engine (and could cross a process boundary
later) is one of these dataclasses.
"""

from __future__ import annotations

import itertools
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from enum import Enum
from pathlib import Path
from typing import Any, Protocol

from fimls.config import CompletionOptions, ModelOptions
from fimls.crossfile.chunks import ContextChunk
from fimls.engine.device import Placement
from fimls.latency import LatencyRecord, Outcome, Word

_ids = itertools.count(1)


class Prefill(Word):
    """Idle work a request asks for instead of an answer (see ``CompletionRequest``)."""

    NONE = ""  # a real request: answer it
    OPEN = "open"  # evaluate the opening of the document (the cursor is unknown)
    CURSOR = "cursor"  # evaluate the prompt at this cursor
    NEXT = "next"  # also generate the suggestion here and remember it (a prefetch)


@dataclass(kw_only=True)
class CompletionRequest:
    """One completion at one cursor position of one document version."""

    uri: str
    version: int | None
    prefix: str
    suffix: str
    prefix_offset: int = 0
    repo_name: str | None = None
    rel_path: str = ""
    # The defaults are the options' (fimls.config), written there once.
    max_tokens: int = CompletionOptions.max_tokens
    max_lines: int = CompletionOptions.max_lines
    # No time limit unless the caller sets one (the server and `fimls complete` pass the
    # option's): a benchmark comparing outputs must not depend on the machine's speed.
    max_time_ms: int = 0
    speculative: str = CompletionOptions.speculative
    reuse_suffix: bool = CompletionOptions.reuse_suffix
    min_confidence: float = 0.0  # below this a suggestion is not shown (outcome "gated")
    neighbors: list[str] = field(default_factory=list)  # text of other open buffers
    # Chunks of other buffers for the prompt's front (fimls.crossfile), and their most tokens.
    context: list[ContextChunk] = field(default_factory=list)
    context_tokens: int = CompletionOptions.context_tokens
    second_reading: bool = CompletionOptions.second_reading  # see the option secondReading
    alternatives: int = 0  # an explicit request: up to this many more suggestions
    # Middles to score at the cursor instead of generating (next-edit verification), and
    # the most prompt tokens for them (0: the sizer's window).
    score: list[str] = field(default_factory=list)
    window: int = 0
    # Idle work, no answer (the prefix of a NEXT request ends with the suggestion shown).
    prefill: Prefill = Prefill.NONE
    request_id: str = field(default_factory=lambda: f"r{next(_ids)}")
    created: float = field(default_factory=time.monotonic)

    @classmethod
    def from_options(cls, options: CompletionOptions, **fields: Any) -> CompletionRequest:
        """A request with the decoding settings of ``options`` (``fields`` may set any,
        and must give the document and the cursor: uri, version, prefix, suffix)."""
        settings = {"max_tokens": options.max_tokens, "max_lines": options.max_lines,
                    "max_time_ms": options.max_time_ms, "speculative": options.speculative,
                    "reuse_suffix": options.reuse_suffix,
                    "min_confidence": options.min_confidence,
                    "context_tokens": options.context_tokens,
                    "second_reading": options.second_reading}
        return cls(**{**settings, **fields})

    def __post_init__(self) -> None:
        self.prefix = scrub(self.prefix)
        self.suffix = scrub(self.suffix)
        self.neighbors = [scrub(t) for t in self.neighbors]
        self.context = [replace(c, text=scrub(c.text), path=scrub(c.path))
                        for c in self.context]


_SURROGATE = re.compile("[\ud800-\udfff]")


def scrub(text: str) -> str:
    """Lone surrogates (undecodable bytes some clients send as JSON escapes) become U+FFFD,
    character for character: the tokenizer needs valid UTF-8 and offsets must not move."""
    if text.isascii():
        # Every keystroke's request passes its file and the open buffers' heads through
        # here: the ASCII check is ten times cheaper than the search.
        return text
    return _SURROGATE.sub("\ufffd", text) if _SURROGATE.search(text) else text


@dataclass(kw_only=True)
class CompletionResult:
    """The suggestion (possibly empty) and what producing it cost."""

    text: str
    record: LatencyRecord
    # More suggestions for an explicit request (``alternatives``), each with its own first
    # line; ``text`` stays the one an automatic request would show.
    alternatives: list[str] = field(default_factory=list)
    scores: list[float] = field(default_factory=list)  # of ``score``'s middles, in order

    @property
    def outcome(self) -> str:
        """returned, empty, gated, superseded, cancelled or error."""
        return self.record.outcome


def gate(text: str, rec: LatencyRecord, min_confidence: float) -> str:
    """``text``, or "" with ``rec.outcome`` "gated" when its confidence is below
    ``min_confidence`` (a suggestion with no confidence, all forced text, is never gated)."""
    if (text and min_confidence > 0 and rec.confidence is not None
            and rec.confidence < min_confidence):
        rec.outcome = Outcome.GATED
        return ""
    return text


@dataclass(kw_only=True)
class EngineConfig:
    """Model and context settings the engine is built with.

    Derived from the options by :func:`fimls.engine.engine_config` (model paths resolved);
    the defaults here are the options' own, for tests that build one by hand.
    """

    model_path: Path
    n_ctx: int = ModelOptions.n_ctx
    n_batch: int = ModelOptions.n_batch
    prompt_tokens: int = ModelOptions.prompt_tokens
    threads: int | None = ModelOptions.threads
    n_gpu_layers: int | str = ModelOptions.n_gpu_layers
    fim_order: str = ModelOptions.fim_order
    draft_model: Path | None = None
    draft_max: int = CompletionOptions.draft_max
    ngram_max: int = CompletionOptions.ngram_max
    measure_costs: bool = True
    cost_cache: Path | None = None
    """JSON file where measured verify costs are kept between starts; None: not kept."""


class EngineError(Exception):
    """An engine failure whose message is ours: safe to log, never holds document text."""


class ModelLoadError(EngineError):
    """The model file could not be loaded; the message names the path and the reason."""


def describe_error(exc: BaseException) -> str:
    """What goes into logs and the latency record about a failure.

    Messages of arbitrary exceptions can quote their input (a UnicodeError quotes the
    text it choked on): only the type is kept; the traceback is logged at DEBUG level.
    """
    if isinstance(exc, EngineError):
        return str(exc)
    return f"{type(exc).__name__} (traceback at log level DEBUG)"


def check_gguf_file(path: Path) -> None:
    """Raise ModelLoadError with a clear reason unless ``path`` looks like a GGUF file.

    llama.cpp reports a bad file only as a NULL pointer (and may abort on some corrupt
    files), so the cheap checks happen here first.
    """
    if not path.exists():
        raise ModelLoadError(f"model file not found: {path}")
    if path.is_dir():
        raise ModelLoadError(f"model path is a directory, not a GGUF file: {path}")
    try:
        size = path.stat().st_size
        with path.open("rb") as fh:
            magic = fh.read(4)
    except OSError as exc:
        raise ModelLoadError(f"cannot read model file {path}: {exc}") from exc
    if size == 0:
        raise ModelLoadError(f"model file is empty: {path}")
    if magic != b"GGUF":
        raise ModelLoadError(f"not a GGUF file (bad magic {magic!r}): {path}")


class EngineState(str, Enum):
    """Where the engine in service stands (the ``state`` of ``fimls/status``, as a string).

    A str enum, so the wire value and comparisons with plain strings stay as they were.
    """

    IDLE = "idle"  # nothing asked for yet
    LOADING = "loading"  # a (re)load is under way; requests are answered empty
    READY = "ready"
    FAILED = "failed"  # the load failed; requests are answered empty with the error
    RESTARTING = "restarting"  # the engine process died; a new one starts after a back-off
    # The engine server (--engine) cannot be reached; requests are answered empty and it is
    # tried again after a back-off.
    UNREACHABLE = "unreachable"

    def __str__(self) -> str:
        return self.value


class EngineLike(Protocol):
    """What the scheduler and the server need from an engine.

    Two implementations: :class:`fimls.engine.core.Engine` (in this process) and
    :class:`fimls.engine.worker.ProcessEngine` (in a worker process); the tests add a fake.
    """

    model_name: str
    # Where the model runs (the CPU, a GPU, another server).
    placement: Placement
    # Load-time problems the engine worked around (a refused draft model): shown to the user.
    warnings: list[str]
    # Called with a reason (from any thread) when the engine's process dies on its own;
    # never called for an in-process engine, or after ``close``.
    on_exit: Callable[[str], None] | None
    # The engine answers typing the start of its shown suggestion from its memo, with no
    # model work (fimls.memo); the scheduler then answers those itself, from a copy.
    typed_from_memo: bool

    @property
    def pid(self) -> int | None:
        """The process that runs the model, or None when it is this one."""
        ...

    def complete(self, req: CompletionRequest,
                 cancelled: Callable[[], bool]) -> CompletionResult:
        """Run ``req``; ``cancelled`` is polled and the engine stops soon after it is true."""
        ...

    def interrupt(self, request_id: str) -> None:
        """``request_id`` was cancelled (any thread): stop now rather than at the next poll."""
        ...

    def reset(self) -> None:
        """Forget cached state (KV cache, remembered suggestions) after a failure."""
        ...

    def close(self) -> None:
        """Free the model (and end its process)."""
        ...
