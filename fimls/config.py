"""The options tree: typed dataclasses with defaults, and one converter for all sources.

The same option has one snake_case field name here, one ``--kebab-case`` flag on the command
line and one camelCase key in ``initializationOptions`` / ``workspace/didChangeConfiguration``
(flat, e.g. ``{"maxTokens": 32}``, or nested by section, e.g. ``{"completion": {"maxTokens":
32}}``, optionally under a top-level ``"fimls"`` key). An invalid value is reported once and
the field keeps its previous value.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
# Settings of the editor extensions that live in the same "fimls" section but are theirs.
CLIENT_KEYS = frozenset({"serverCommand", "trace"})
SPECULATIVE_MODES = ("auto", "off", "lookup", "model")


@dataclass(kw_only=True)
class ModelOptions:
    """Which model runs, and how."""

    model: str | None = None
    """Path to a GGUF file; None means the embedded default (Gemma 3 270M, Q4_K_M)."""
    n_ctx: int = 4096
    """Context length in tokens (prompt plus completion)."""
    n_batch: int = 512
    """Tokens per prefill batch."""
    threads: int | None = None
    """CPU threads for llama.cpp; None picks the number of cores (at most 8)."""
    n_gpu_layers: int = 0
    """Layers offloaded to the GPU (-1 or a large number: all)."""
    fim_order: str = "auto"
    """FIM layout: auto (the model family's), psm or spm."""
    isolation: str = "process"
    """process: the model runs in a worker process (a native crash is survived and the
    worker restarted); thread: inside the server process (no hop, no protection)."""


@dataclass(kw_only=True)
class CompletionOptions:
    """How suggestions are produced."""

    max_tokens: int = 64
    """Most tokens generated for one suggestion."""
    max_lines: int = 8
    """Most lines in a multi-line suggestion."""
    speculative: str = "auto"
    """auto, off, lookup or model (off: plain greedy decoding, no reuse of suggestions)."""
    draft_model: str | None = None
    """Path to a small GGUF with the main model's vocabulary, used as a drafter."""
    draft_max: int = 8
    """Most tokens drafted for one verification (4-16 on a GPU, fewer on a CPU)."""
    ngram_max: int = 3
    """Longest n-gram key prompt lookup matches (2-4)."""


@dataclass(kw_only=True)
class LoggingOptions:
    """Where logs go."""

    latency_log: str | None = None
    """JSON Lines file for per-request latency records; None: the user state directory."""
    log_level: str = "INFO"
    """Server log level on stderr."""


@dataclass(kw_only=True)
class Options:
    """All of fimls's options."""

    model: ModelOptions = field(default_factory=ModelOptions)
    completion: CompletionOptions = field(default_factory=CompletionOptions)
    logging: LoggingOptions = field(default_factory=LoggingOptions)


def camel(name: str) -> str:
    """snake_case to camelCase."""
    head, *rest = name.split("_")
    return head + "".join(p[:1].upper() + p[1:] for p in rest)


def leaves(opts: Options) -> dict[str, tuple[str, str]]:
    """camelCase key -> (section, field) for every option."""
    out: dict[str, tuple[str, str]] = {}
    for sec in dataclasses.fields(opts):
        for f in dataclasses.fields(getattr(opts, sec.name)):
            out[camel(f.name)] = (sec.name, f.name)
    return out


def _coerce(value: Any, default: Any, name: str) -> Any:
    """Convert ``value`` to the type of the field; raise ValueError if it cannot be."""
    kind = type(default) if default is not None else None
    if value is None:
        if default is None or name in ("threads", "model", "latency_log", "draft_model"):
            return None
        raise ValueError("null is not allowed")
    if name in ("threads",):
        if isinstance(value, bool) or not isinstance(value, int | str):
            raise ValueError("must be an integer")
        try:
            v = int(value)
        except (TypeError, ValueError):
            raise ValueError("must be an integer") from None
        if v < 1:
            raise ValueError("must be >= 1")
        return v
    if name in ("model", "latency_log", "draft_model"):
        if not isinstance(value, str):
            raise ValueError("must be a string path")
        return value or None
    if kind is bool:
        if isinstance(value, bool):
            return value
        raise ValueError("must be true or false")
    if kind is int:
        if isinstance(value, bool) or not isinstance(value, int | str):
            raise ValueError("must be an integer")
        try:
            v = int(value)
        except ValueError:
            raise ValueError("must be an integer") from None
        if name in ("n_ctx",) and v < 64:
            raise ValueError("must be >= 64")
        if name in ("n_batch", "max_tokens", "max_lines", "ngram_max") and v < 1:
            raise ValueError("must be >= 1")
        if name == "draft_max" and not 0 <= v <= 64:
            raise ValueError("must be between 0 and 64")
        return v
    if kind is str:
        if not isinstance(value, str):
            raise ValueError("must be a string")
        if name == "log_level":
            up = value.upper()
            if up not in LOG_LEVELS:
                raise ValueError(f"must be one of {', '.join(LOG_LEVELS)}")
            return up
        if name == "speculative" and value not in SPECULATIVE_MODES:
            raise ValueError(f"must be one of {', '.join(SPECULATIVE_MODES)}")
        if name == "fim_order" and value not in ("auto", "psm", "spm"):
            raise ValueError("must be auto, psm or spm")
        if name == "isolation" and value not in ("process", "thread"):
            raise ValueError("must be process or thread")
        return value
    return value


def _flatten(data: dict[str, Any], sections: set[str]) -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for k, v in data.items():
        if k in sections and isinstance(v, dict):
            flat.update(v)
        elif k == "fimls" and isinstance(v, dict):
            flat.update(_flatten(v, sections))
        else:
            flat[k] = v
    return flat


def apply_dict(opts: Options, data: Any) -> tuple[Options, list[str]]:
    """A copy of ``opts`` with camelCase ``data`` applied; and one warning per bad value.

    Unknown keys are ignored (editors send settings of other tools too) but reported.
    """
    new = dataclasses.replace(
        opts, **{s.name: dataclasses.replace(getattr(opts, s.name))
                 for s in dataclasses.fields(opts)})
    if not isinstance(data, dict):
        return new, ([] if data is None else ["options must be an object; ignored"])
    table = leaves(new)
    warnings: list[str] = []
    for key, value in _flatten(data, {s.name for s in dataclasses.fields(new)}).items():
        where = table.get(key) or table.get(camel(key))
        if where is None and key in CLIENT_KEYS:
            continue
        if where is None:
            warnings.append(f"unknown option {key!r} ignored")
            continue
        sec, name = where
        section = getattr(new, sec)
        default = getattr(section, name)
        try:
            setattr(section, name, _coerce(value, default, name))
        except (ValueError, TypeError) as exc:
            warnings.append(f"invalid value {value!r} for {key}: {exc}; using {default!r}")
    return new, warnings


def describe() -> list[tuple[str, str, Any, str]]:
    """(camelKey, --flag, default, docstring) for every option, for --help and the README."""
    import ast
    import inspect

    rows: list[tuple[str, str, Any, str]] = []
    opts = Options()
    for sec in dataclasses.fields(opts):
        cls = type(getattr(opts, sec.name))
        docs: dict[str, str] = {}
        tree = ast.parse(inspect.getsource(cls))
        cls_node = tree.body[0]
        body = cls_node.body if isinstance(cls_node, ast.ClassDef) else []
        for a, b in itertools.pairwise(body):
            if (isinstance(a, ast.AnnAssign) and isinstance(a.target, ast.Name)
                    and isinstance(b, ast.Expr) and isinstance(b.value, ast.Constant)):
                docs[a.target.id] = str(b.value.value)
        for f in dataclasses.fields(cls):
            rows.append((camel(f.name), "--" + f.name.replace("_", "-"),
                         getattr(getattr(opts, sec.name), f.name), docs.get(f.name, "")))
    return rows
