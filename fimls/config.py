"""The options tree: typed dataclasses with defaults, and one converter for all sources.

The same option has one snake_case field name here, one ``--kebab-case`` flag on the command
line and one camelCase key in ``initializationOptions`` / ``workspace/didChangeConfiguration``
(flat, e.g. ``{"maxTokens": 32}``, or nested by section, e.g. ``{"completion": {"maxTokens":
32}}``, optionally under a top-level ``"fimls"`` key). An invalid value is reported once and
the field keeps its previous value.

Each option is written once, here: its default, its docstring (the ``--help`` text) and its
value rules (bounds, choices, nullability) in the field's metadata, which the one converter
reads. The engine's settings and the request's defaults are derived from these fields.
"""

from __future__ import annotations

import dataclasses
import itertools
import typing
from dataclasses import dataclass, field
from typing import Any

from fimls.disabled import DEFAULT_DISABLED_GLOBS

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
# Settings of the editor extensions that live in the same "fimls" section but are theirs.
CLIENT_KEYS = frozenset({"serverCommand", "trace", "enable"})
SPECULATIVE_MODES = ("auto", "off", "lookup", "model")
FIM_ORDERS = ("auto", "psm", "spm")
ISOLATIONS = ("process", "thread")
ENGINE_PROTOCOLS = ("auto", "llama", "openai")
ENGINE_SLOTS = ("document", "server")
TRIGGER_MODES = ("auto", "manual")

# What a field's metadata may say about its values (read by ``_coerce``):
#   min / max:  inclusive bounds of an integer
#   choices:    the allowed strings
#   upper:      the string is upper-cased before it is checked against ``choices``
#   nullable:   null (None) is allowed and resets the option
#   kind:       "path": a string where "" means unset (None); "globs": a list of strings
#               (on the command line, comma-separated)
#   words:      strings an integer option also takes as themselves (``auto``)
#   passthrough: False: a bench does not pass the option to the servers it starts (it sets
#               that option itself)


def _opt(default: Any, **meta: Any) -> Any:
    """A field with ``default`` and the value rules in ``meta`` (see above)."""
    return field(default=default, metadata=meta)


@dataclass(kw_only=True)
class ModelOptions:
    """Which model runs, and how."""

    model: str | None = _opt(None, kind="path", nullable=True)
    """A catalogue name (``fimls models``: gemma-3-270m, qwen2.5-coder-0.5b,
    qwen2.5-coder-1.5b) or a path to a GGUF file; None means ``FIMLS_MODEL`` if set, else
    the default, qwen2.5-coder-1.5b."""
    n_ctx: int = _opt(4096, min=64)
    """Context length in tokens (prompt plus completion)."""
    n_batch: int = _opt(512, min=1)
    """Tokens per prefill batch."""
    prompt_tokens: int = _opt(0, min=0)
    """Most tokens in a prompt (its window of the file; other files' chunks take at most
    half). 0: sized by time, from the prefill speed measured on this machine, so that a
    prompt nothing of which is cached costs about six seconds, and never under 1,024 tokens
    (on a GPU: as much as n_ctx allows). A FIM window is the lines before the cursor and a
    quarter of it after, as llama-server's /infill."""
    threads: int | None = _opt(None, min=1, nullable=True)
    """CPU threads for llama.cpp; None picks the number of cores (at most 8)."""
    n_gpu_layers: int | str = _opt("auto", min=-1, words=("auto",))
    """Layers offloaded to the GPU: auto (all of them, the main and the draft model's,
    when this llama.cpp build has a GPU backend and a GPU device; else none), a number
    (0: the CPU only; -1 or a large number: all). A load that fails with layers offloaded
    is done again on the CPU, with a warning."""
    fim_order: str = _opt("auto", choices=FIM_ORDERS)
    """FIM layout: auto (the model family's), psm or spm."""
    isolation: str = _opt("process", choices=ISOLATIONS)
    """process: the model runs in a worker process (a native crash is survived and the
    worker restarted); thread: inside the server process (no hop, no protection)."""
    load_timeout_s: int = _opt(300, min=1)
    """Seconds a worker process may take to load the model before it is killed and the
    load reported as failed (process isolation only)."""
    cancel_grace_ms: int = _opt(5000, min=100)
    """Milliseconds a worker process may ignore a cancel before it is deemed hung, killed
    and restarted (process isolation only)."""
    worker_nice: int = _opt(5, min=0, max=19)
    """How much lower the worker process's CPU priority is than the server's (a Unix nice
    increment; process isolation only): while the model computes, the editor and the
    server's answers to typing get a core first, and the model still has every core nobody
    else wants. 0: the same priority."""
    engine: str | None = _opt(None, nullable=True)
    """URL of an inference server to run the model instead of this process (llama.cpp's
    llama-server, or an OpenAI-compatible server). None: in-process. Document text is sent
    to that host, and to no other."""
    engine_protocol: str = _opt("auto", choices=ENGINE_PROTOCOLS)
    """How to speak to ``engine``: llama (llama-server's /completion), openai
    (/v1/completions) or auto (llama when the server answers /props)."""
    engine_key: str | None = _opt(None, nullable=True)
    """Bearer token for ``engine`` (or the FIMLS_ENGINE_KEY environment variable)."""
    engine_slot: str = _opt("document", choices=ENGINE_SLOTS)
    """Which llama-server slot serves a document: document (the same slot every time, its
    cache keeps the document's prompt; one editor per server) or server (the server picks
    an idle slot with the most similar cached prompt; a team sharing a server)."""


@dataclass(kw_only=True)
class CompletionOptions:
    """How suggestions are produced."""

    trigger_mode: str = _opt("auto", choices=TRIGGER_MODES)
    """auto: suggestions while typing; manual: only when asked for (an inline completion
    request whose trigger kind is Invoked: VS Code's Trigger Inline Suggestion, the Neovim
    plugin's key); typing asks nothing of the model."""
    max_tokens: int = _opt(64, min=1)
    """Most tokens generated for one suggestion."""
    max_lines: int = _opt(8, min=1)
    """Most lines in a multi-line suggestion."""
    max_time_ms: int = _opt(1000, min=0)
    """Milliseconds of generating (after the first token) after which a multi-line
    suggestion stops at its next line end; the first line is always finished. As llama.vim's
    t_max_predict_ms (also 1000 by default). 0: no limit."""
    speculative: str = _opt("auto", choices=SPECULATIVE_MODES, passthrough=False)
    """auto, off, lookup or model (off: plain greedy decoding, no reuse of suggestions)."""
    draft_model: str | None = _opt(None, kind="path", nullable=True)
    """Path to a small GGUF with the main model's vocabulary, used as a drafter."""
    draft_max: int = _opt(8, min=0, max=64)
    """Most tokens drafted for one verification (4-16 on a GPU, fewer on a CPU)."""
    ngram_max: int = _opt(3, min=1)
    """Longest n-gram key prompt lookup matches (2-4)."""
    idle_prefill: bool = True
    """Evaluate the prompt the next request will most likely need while the user is idle:
    a file's opening after it is opened, the prompt at the last edit after a pause. A real
    request stops it at once."""
    reuse_suffix: bool = True
    """FIM models: after an edit before the cursor, keep the suffix's cached entries (moved
    to their new positions) instead of recomputing them. An approximation: they attended
    to the text before the edit."""
    context_tokens: int = _opt(512, min=0)
    """Most tokens of other files (open buffers, and workspace files the file imports) at
    the front of the prompt (definitions of the identifiers near the cursor and of the
    names the file imports, recently edited regions, a ring of chunks), at most half the
    prompt. 0: only the current file."""
    workspace_files: bool = True
    """Read the workspace files the current file imports (resolved inside its workspace
    folder; never what git ignores, never a file named like a secret) for definitions at
    the front of the prompt, as other open files are. false: open files only."""
    disabled_globs: tuple[str, ...] = _opt(DEFAULT_DISABLED_GLOBS, kind="globs")
    """Documents fimls never reads: no suggestions in them, and none of their text in any
    prompt, chunk, engine request or log. A glob without / matches the file name or a
    folder name on its path, one with / the path in its workspace (** for any folders);
    case is ignored. The default lists environment files, keys, certificates and
    credentials (docs/options.md has it whole); a list replaces it, [] disables nothing.
    On the command line: comma-separated."""
    second_reading: bool = True
    """FIM models, with other files' chunks in the prompt: the prompt is also read without
    them, and where that reading writes another first line, the line the prompt with the
    chunks finds more likely is shown. Only where the second reading costs at most what
    the request costs anyway. false: the prompt with the chunks alone writes the line."""
    min_confidence: float = _opt(0.3, min=0.0, max=1.0)
    """A suggestion whose first line has a token the model gave less than this probability
    is not shown (logged as ``gated``). 0.3: on the tuning set of real edits, the highest
    threshold that hides no right line (docs/measurements/confidence-gate.md). 0: show
    everything."""
    next_edit_margin: float = _opt(2.0)
    """Next-edit suggestions (the fimls/nextEdits request): after an edit to one line, the
    same change is proposed where the old form still stands in the open documents, at
    each place only if the model finds the edited line likelier than the original there
    by this much (natural log: 2.0 is about 7 times likelier)."""


@dataclass(kw_only=True)
class LoggingOptions:
    """Where logs go."""

    latency_log: str | None = _opt(None, kind="path", nullable=True, passthrough=False)
    """JSON Lines file for per-request latency records; None: the user state directory."""
    log_level: str = _opt("INFO", choices=LOG_LEVELS, upper=True, passthrough=False)
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


def _value_type(section: type, name: str) -> type:
    """The field's type without ``None`` (``int | None`` -> int)."""
    hint = typing.get_type_hints(section)[name]
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    return args[0] if args else hint


def _number(value: Any, f: dataclasses.Field[Any], kind: type) -> Any:
    """``value`` as the field's int or float, within its bounds; ValueError if it is not."""
    # bool is an int to Python, never to a user; strings come from the command line.
    word = "an integer" if kind is int else "a number"
    ok = (int, str) if kind is int else (int, float, str)
    if isinstance(value, bool) or not isinstance(value, ok):
        raise ValueError(f"must be {word}")
    try:
        v = kind(value)
    except ValueError:
        raise ValueError(f"must be {word}") from None
    if v != v:
        raise ValueError(f"must be {word}")  # NaN
    lo, hi = f.metadata.get("min"), f.metadata.get("max")
    if lo is not None and hi is not None and not lo <= v <= hi:
        raise ValueError(f"must be between {lo} and {hi}")
    if lo is not None and v < lo:
        raise ValueError(f"must be >= {lo}")
    if hi is not None and v > hi:
        raise ValueError(f"must be <= {hi}")
    return v


def _globs(value: Any) -> tuple[str, ...]:
    """A list of glob strings, or one comma-separated string (the command line)."""
    if isinstance(value, str):
        value = value.split(",")
    if not isinstance(value, (list, tuple)) or not all(isinstance(g, str) for g in value):
        raise ValueError("must be a list of glob strings")
    return tuple(g.strip() for g in value if g.strip())


def _coerce(value: Any, f: dataclasses.Field[Any], kind: type) -> Any:
    """Convert ``value`` to the field's type under its metadata; raise ValueError if it
    cannot be."""
    meta = f.metadata
    if value is None:
        if meta.get("nullable"):
            return None
        raise ValueError("null is not allowed")
    if meta.get("kind") == "path":
        if not isinstance(value, str):
            raise ValueError("must be a string path")
        return value or None
    if meta.get("kind") == "globs":
        return _globs(value)
    if kind is bool:
        if isinstance(value, bool):
            return value
        # The command line gives strings.
        if isinstance(value, str) and value.lower() in ("true", "false"):
            return value.lower() == "true"
        raise ValueError("must be true or false")
    if isinstance(value, str) and value in meta.get("words", ()):
        return value
    if kind is int or kind is float:
        return _number(value, f, kind)
    if kind is str:
        if not isinstance(value, str):
            raise ValueError("must be a string")
        if meta.get("upper"):
            value = value.upper()
        choices = meta.get("choices")
        if choices is not None and value not in choices:
            raise ValueError(f"must be one of {', '.join(choices)}")
        return value
    return value


def _field(section: type, name: str) -> dataclasses.Field[Any]:
    return next(f for f in dataclasses.fields(section) if f.name == name)


def limits(f: dataclasses.Field[Any]) -> str:
    """The field's value rules in words (``at least 64``, ``one of auto, off``), for --help."""
    meta = f.metadata
    lo, hi = meta.get("min"), meta.get("max")
    rule = ""
    if lo is not None and hi is not None:
        rule = f"{lo} to {hi}"
    elif lo is not None:
        rule = f"at least {lo}"
    elif hi is not None:
        rule = f"at most {hi}"
    elif meta.get("choices"):
        rule = "one of " + ", ".join(meta["choices"])
    if meta.get("words"):
        rule = " or ".join([*meta["words"], rule] if rule else meta["words"])
    return rule


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
        previous = getattr(section, name)
        f = _field(type(section), name)
        try:
            setattr(section, name, _coerce(value, f, _value_type(type(section), name)))
        except (ValueError, TypeError) as exc:
            warnings.append(f"invalid value {value!r} for {key}: {exc}; using {previous!r}")
    return new, warnings


def passes_through(key: str) -> bool:
    """Whether a bench passes the option ``key`` (camelCase), when given, to the servers
    it starts: all but those that each bench configuration, or the bench itself, sets."""
    sec, name = leaves(Options())[key]
    return bool(_field(type(getattr(Options(), sec)), name).metadata.get("passthrough", True))


def shown_default(value: Any) -> str:
    """An option's default as the command line would take it (a list comma-separated)."""
    return ",".join(value) if isinstance(value, tuple) else str(value)


def describe() -> list[tuple[str, str, Any, str]]:
    """(camelKey, --flag, default, help) for every option, for --help and the README: the
    help is the field's docstring and its value rules."""
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
            doc = docs.get(f.name, "")
            rule, choices = limits(f), f.metadata.get("choices", ())
            # Choices the docstring already names are not repeated.
            if rule and not (choices and all(c in doc for c in choices)):
                doc = f"{doc.rstrip()} Values: {rule}."
            rows.append((camel(f.name), "--" + f.name.replace("_", "-"),
                         getattr(getattr(opts, sec.name), f.name), doc))
    return rows
