"""The engine's narrow interface: plain request and result types, no LSP, no llama.cpp.

Everything that crosses from the server to the engine (and could cross a process boundary
later) is one of these dataclasses.
"""

from __future__ import annotations

import itertools
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

from fimls.latency import LatencyRecord

_ids = itertools.count(1)


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
    max_tokens: int = 64
    max_lines: int = 8
    speculative: str = "auto"
    neighbors: list[str] = field(default_factory=list)  # text of other open buffers
    request_id: str = field(default_factory=lambda: f"r{next(_ids)}")
    created: float = field(default_factory=time.monotonic)

    def __post_init__(self) -> None:
        self.prefix = scrub(self.prefix)
        self.suffix = scrub(self.suffix)
        self.neighbors = [scrub(t) for t in self.neighbors]


_SURROGATE = re.compile("[\ud800-\udfff]")


def scrub(text: str) -> str:
    """Lone surrogates (undecodable bytes some clients send as JSON escapes) become U+FFFD,
    character for character: the tokenizer needs valid UTF-8 and offsets must not move."""
    return _SURROGATE.sub("\ufffd", text) if _SURROGATE.search(text) else text


@dataclass(kw_only=True)
class CompletionResult:
    """The suggestion (possibly empty) and what producing it cost."""

    text: str
    record: LatencyRecord

    @property
    def outcome(self) -> str:
        """returned, empty, superseded, cancelled or error."""
        return self.record.outcome


@dataclass(kw_only=True)
class EngineConfig:
    """Model and context settings the engine is built with."""

    model_path: Path
    n_ctx: int = 4096
    n_batch: int = 512
    threads: int | None = None
    n_gpu_layers: int = 0
    fim_order: str = "auto"
    draft_model: Path | None = None
    draft_max: int = 8
    ngram_max: int = 3
    measure_costs: bool = True


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
