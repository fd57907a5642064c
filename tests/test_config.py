"""Tests for fimls.config: defaults, camelCase keys (flat or nested), one warning per bad value."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from fimls.cli import build_parser
from fimls.config import (
    CompletionOptions,
    ModelOptions,
    Options,
    apply_dict,
    camel,
    describe,
    leaves,
    shown_default,
)
from fimls.disabled import DEFAULT_DISABLED_GLOBS
from fimls.engine import engine_config
from fimls.engine.api import CompletionRequest, EngineConfig
from fimls.postprocess import StopPolicy


def value(opts: Options, key: str) -> Any:
    """The current value of the option named by camelCase ``key``."""
    sec, name = leaves(opts)[key]
    return getattr(getattr(opts, sec), name)


def snapshot(opts: Options) -> dict[str, Any]:
    """camelCase key -> value for every option."""
    return {key: value(opts, key) for key in leaves(opts)}


def test_defaults() -> None:
    o = Options()
    assert snapshot(o) == {
        "model": None, "nCtx": 4096, "nBatch": 512, "promptTokens": 0, "threads": None,
        "nGpuLayers": "auto",
        "fimOrder": "auto", "isolation": "process", "loadTimeoutS": 300,
        "cancelGraceMs": 5000, "workerNice": 5, "engine": None, "engineProtocol": "auto",
        "engineKey": None,
        "engineSlot": "document",
        "maxTokens": 64, "maxLines": 8, "maxTimeMs": 1000,
        "speculative": "auto",
        "draftModel": None, "draftMax": 8, "ngramMax": 3, "idlePrefill": True,
        "reuseSuffix": True, "contextTokens": 512, "workspaceFiles": True,
        "secondReading": True, "triggerMode": "auto",
        "disabledGlobs": DEFAULT_DISABLED_GLOBS,
        "minConfidence": 0.3, "nextEditMargin": 2.0,
        "latencyLog": None, "logLevel": "INFO",
    }


def test_camel() -> None:
    assert camel("n_gpu_layers") == "nGpuLayers"
    assert camel("model") == "model"


def test_flat_camel_case_keys() -> None:
    new, warnings = apply_dict(Options(), {"maxTokens": 32, "nCtx": 2048, "logLevel": "debug",
                                           "model": "/models/m.gguf"})
    assert warnings == []
    assert (new.completion.max_tokens, new.model.n_ctx) == (32, 2048)
    assert new.logging.log_level == "DEBUG"
    assert new.model.model == "/models/m.gguf"


def test_nested_sections() -> None:
    new, warnings = apply_dict(Options(), {"completion": {"maxLines": 3},
                                           "model": {"nGpuLayers": -1, "fimOrder": "spm"},
                                           "logging": {"latencyLog": "/tmp/l.jsonl"}})
    assert warnings == []
    assert new.completion.max_lines == 3
    assert (new.model.n_gpu_layers, new.model.fim_order) == (-1, "spm")
    assert new.logging.latency_log == "/tmp/l.jsonl"


def test_under_fimls_key() -> None:
    new, warnings = apply_dict(Options(), {"fimls": {"speculative": "off",
                                                     "completion": {"maxTokens": 7}}})
    assert warnings == []
    assert (new.completion.speculative, new.completion.max_tokens) == ("off", 7)


def test_snake_case_and_string_numbers() -> None:
    new, warnings = apply_dict(Options(), {"max_tokens": 5, "nCtx": "128", "threads": "2"})
    assert warnings == []
    assert (new.completion.max_tokens, new.model.n_ctx, new.model.threads) == (5, 128, 2)
    new, warnings = apply_dict(Options(), {"minConfidence": "0.25", "contextTokens": "64"})
    assert warnings == []
    assert (new.completion.min_confidence, new.completion.context_tokens) == (0.25, 64)
    new, warnings = apply_dict(Options(), {"idlePrefill": "false", "reuseSuffix": "TRUE"})
    assert warnings == [] and (new.completion.idle_prefill, new.completion.reuse_suffix) == (
        False, True)
    assert apply_dict(Options(), {"idlePrefill": "no"})[1]  # only true or false


def test_nullable_options_reset() -> None:
    prev, _ = apply_dict(Options(), {"threads": 4, "model": "/m.gguf", "latencyLog": "/l"})
    new, warnings = apply_dict(prev, {"threads": None, "model": "", "latencyLog": None})
    assert warnings == []
    assert (new.model.threads, new.model.model, new.logging.latency_log) == (None, None, None)


def test_input_options_not_mutated() -> None:
    base = Options()
    new, _ = apply_dict(base, {"maxTokens": 9, "nCtx": 512})
    assert (base.completion.max_tokens, base.model.n_ctx) == (64, 4096)
    assert new.completion is not base.completion and new.model is not base.model


PREVIOUS = {"nCtx": 2048, "nBatch": 256, "threads": 3, "maxTokens": 40, "maxLines": 4,
            "model": "/m.gguf", "logLevel": "WARNING", "speculative": "lookup",
            "fimOrder": "psm", "latencyLog": "/l.jsonl", "nGpuLayers": 5,
            "isolation": "thread", "loadTimeoutS": 60, "cancelGraceMs": 2000, "workerNice": 0,
            "draftMax": 4,
            "ngramMax": 2, "draftModel": "/d.gguf"}


@pytest.mark.parametrize(("key", "bad"), [
    ("nCtx", 10),
    ("nCtx", "abc"),
    ("nCtx", 1.5),
    ("nCtx", True),
    ("nCtx", None),
    ("nBatch", 0),
    ("nBatch", []),
    ("maxTokens", 0),
    ("maxLines", -2),
    ("nGpuLayers", "many"),
    ("threads", 0),
    ("threads", "x"),
    ("threads", 1.7),
    ("threads", True),
    ("threads", [2]),
    ("model", 5),
    ("latencyLog", 3),
    ("logLevel", "LOUD"),
    ("logLevel", 10),
    ("speculative", "fast"),
    ("fimOrder", "mps"),
    ("isolation", "fork"),
    ("loadTimeoutS", 0),
    ("loadTimeoutS", None),
    ("cancelGraceMs", 99),
    ("workerNice", 20),
    ("workerNice", -1),
    ("cancelGraceMs", "soon"),
    ("draftMax", 65),
    ("draftMax", -1),
    ("ngramMax", 0),
    ("draftModel", 1),
])
def test_invalid_value_warns_once_and_keeps_previous(key: str, bad: Any) -> None:
    prev, warnings = apply_dict(Options(), PREVIOUS)
    assert warnings == []
    other = "maxTokens" if key != "maxTokens" else "maxLines"
    new, warnings = apply_dict(prev, {key: bad, other: 1})
    assert len(warnings) == 1
    assert key in warnings[0] and repr(value(prev, key)) in warnings[0]
    assert value(new, key) == PREVIOUS[key]
    assert value(new, other) == 1  # the valid key next to the bad one is still applied


def test_several_invalid_values_one_warning_each() -> None:
    new, warnings = apply_dict(Options(), {"nCtx": 1, "maxTokens": "x", "logLevel": "?",
                                           "maxLines": 2})
    assert len(warnings) == 3
    assert snapshot(new) == {**snapshot(Options()), "maxLines": 2}


def test_unknown_keys_warn_and_are_ignored() -> None:
    new, warnings = apply_dict(Options(), {"bogus": 1, "completion": {"alsoBogus": 2},
                                           "fimls": {"third": 3}, "maxTokens": 8})
    assert len(warnings) == 3
    for name in ("bogus", "alsoBogus", "third"):
        assert sum(name in w for w in warnings) == 1
    assert all("unknown" in w for w in warnings)
    assert snapshot(new) == {**snapshot(Options()), "maxTokens": 8}


@pytest.mark.parametrize("data", [[1, 2], "maxTokens=3", 7])
def test_non_dict_input_warns(data: Any) -> None:
    new, warnings = apply_dict(Options(), data)
    assert len(warnings) == 1
    assert snapshot(new) == snapshot(Options())


def test_none_input_is_silent() -> None:
    new, warnings = apply_dict(Options(), None)
    assert warnings == []
    assert snapshot(new) == snapshot(Options())


def test_describe_lists_every_option() -> None:
    rows = describe()
    opts = Options()
    table = leaves(opts)
    assert sorted(r[0] for r in rows) == sorted(table)
    assert len(rows) == len(table) == sum(
        len(dataclasses.fields(getattr(opts, s.name))) for s in dataclasses.fields(opts))
    for key, flag, default, doc in rows:
        _, name = table[key]
        assert flag == "--" + name.replace("_", "-")
        assert default == value(opts, key)
        assert doc.strip(), key
    assert len({r[1] for r in rows}) == len(rows)


@pytest.mark.parametrize(("key", "bad", "reason"), [
    ("nCtx", 10, "must be >= 64"),
    ("nCtx", "abc", "must be an integer"),
    ("nCtx", None, "null is not allowed"),
    ("threads", 0, "must be >= 1"),
    ("draftMax", 65, "must be between 0 and 64"),
    ("cancelGraceMs", 5, "must be >= 100"),
    ("workerNice", 20, "must be between 0 and 19"),
    ("isolation", True, "must be a string"),
    ("logLevel", "loud", "must be one of DEBUG, INFO, WARNING, ERROR"),
    ("speculative", "fast", "must be one of auto, off, lookup, model"),
    ("fimOrder", "x", "must be one of auto, psm, spm"),
    ("isolation", "fork", "must be one of process, thread"),
    ("model", 5, "must be a string path"),
    ("minConfidence", 1.5, "must be between 0.0 and 1.0"),
    ("minConfidence", "sure", "must be a number"),
    ("minConfidence", float("nan"), "must be a number"),
    ("contextTokens", -1, "must be >= 0"),
])
def test_invalid_value_warning_says_what_is_allowed(key: str, bad: Any, reason: str) -> None:
    _, warnings = apply_dict(Options(), {key: bad})
    assert warnings == [f"invalid value {bad!r} for {key}: {reason}; "
                        f"using {value(Options(), key)!r}"]


def test_rules_live_on_the_fields() -> None:
    """Every bounded or closed option says so in its field's metadata, which is what the
    converter reads (no option is special-cased by name)."""
    fields = {camel(f.name): f for sec in (ModelOptions, CompletionOptions)
              for f in dataclasses.fields(sec)}
    assert fields["nCtx"].metadata["min"] == 64
    assert (fields["draftMax"].metadata["min"], fields["draftMax"].metadata["max"]) == (0, 64)
    assert fields["speculative"].metadata["choices"] == ("auto", "off", "lookup", "model")
    assert fields["threads"].metadata["nullable"] and fields["model"].metadata["kind"] == "path"
    # A rule changed on the field is the rule applied.
    old = fields["nCtx"].metadata
    try:
        object.__setattr__(fields["nCtx"], "metadata", {**old, "min": 1000})
        _, warnings = apply_dict(Options(), {"nCtx": 512})
        assert warnings and "must be >= 1000" in warnings[0]
    finally:
        object.__setattr__(fields["nCtx"], "metadata", old)


def test_help_shows_defaults_keys_and_limits() -> None:
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "cmd")
    text = sub.choices["serve"].format_help()  # type: ignore[attr-defined]
    flat = " ".join(text.split())
    for key, flag, default, _doc in describe():
        assert flag in flat and f"initializationOptions key: {key}" in flat
        # (help text wraps at hyphens too: compared without any whitespace)
        assert f"default:{shown_default(default)}".replace(" ", "") in "".join(flat.split())
    for words in ("Values: at least 64.", "Values: 0 to 64.", "Values: at least 100.",
                  "Values: one of DEBUG, INFO, WARNING, ERROR."):
        assert words in flat


def test_defaults_are_written_once() -> None:
    """The engine's and the request's defaults are the options' own."""
    o = Options()
    cfg = EngineConfig(model_path=Path("/m.gguf"))
    assert (cfg.n_ctx, cfg.n_batch, cfg.threads, cfg.n_gpu_layers, cfg.fim_order,
            cfg.draft_max, cfg.ngram_max) == (
        o.model.n_ctx, o.model.n_batch, o.model.threads, o.model.n_gpu_layers,
        o.model.fim_order, o.completion.draft_max, o.completion.ngram_max)
    req = CompletionRequest(uri="u", version=1, prefix="", suffix="")
    assert (req.max_tokens, req.max_lines, req.speculative, req.second_reading) == (
        o.completion.max_tokens, o.completion.max_lines, o.completion.speculative,
        o.completion.second_reading)
    assert StopPolicy(ctx=None).max_lines == o.completion.max_lines  # type: ignore[arg-type]


def test_engine_config_is_derived_from_the_options(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FIMLS_CACHE_DIR", str(tmp_path / "cache"))
    main, draft = tmp_path / "m.gguf", tmp_path / "d.gguf"
    for p in (main, draft):
        p.write_bytes(b"GGUF" + bytes(60))
    opts, warnings = apply_dict(Options(), {
        "model": str(main), "draftModel": str(draft), "nCtx": 1024, "nBatch": 64,
        "threads": 2, "nGpuLayers": 3, "fimOrder": "spm", "draftMax": 5, "ngramMax": 2,
        "speculative": "off"})
    assert warnings == []
    assert engine_config(opts) == EngineConfig(
        model_path=main, n_ctx=1024, n_batch=64, threads=2, n_gpu_layers=3, fim_order="spm",
        draft_model=draft, draft_max=5, ngram_max=2, measure_costs=False,
        cost_cache=tmp_path / "cache" / "verify-costs.json")


@pytest.mark.parametrize(("key", "field", "flag"), [
    ("secondReading", "second_reading", "--second-reading"),
])
def test_decoding_switches_reach_the_request_and_the_bench_servers(
        key: str, field: str, flag: str) -> None:
    from fimls.cli.common import passthrough_flags
    from fimls.documents import Pos as DPos
    from fimls.documents import TextDocument
    from fimls.server import FimlsServer

    opts, warnings = apply_dict(Options(), {key: False})
    assert warnings == [] and getattr(opts.completion, field) is False
    ls = FimlsServer(opts, lambda *a, **k: None)  # type: ignore[arg-type,return-value]
    doc = TextDocument(uri="file:///w/a.py", language_id="python", version=1, text="x = ")
    assert getattr(ls.make_request(doc, DPos(0, 4)), field) is False
    args = build_parser().parse_args(["bench", flag, "false"])
    flags = passthrough_flags(args)
    assert flags[flags.index(flag) + 1] == "false"


def test_the_options_reference_is_generated_from_the_declarations() -> None:
    from fimls.optionsdoc import render

    root = Path(__file__).resolve().parents[1]
    on_disk = (root / "docs" / "options.md").read_text(encoding="utf-8")
    assert on_disk == render(), "stale: python -m fimls.optionsdoc > docs/options.md"
    for key, flag, _default, _doc in describe():
        assert f"### `{key}`" in on_disk and f"`{flag} VALUE`" in on_disk


def test_a_bench_passes_every_option_but_those_it_sets_itself() -> None:
    from fimls.cli.common import passthrough_flags

    argv = ["bench"]
    for _key, flag, default, _doc in describe():
        argv += [flag, "false" if isinstance(default, bool) else "7"]
    flags = passthrough_flags(build_parser().parse_args(argv))
    passed = {f for f in flags if f.startswith("--")}
    held = {flag for _key, flag, _d, _doc in describe()} - passed
    assert held == {"--speculative", "--latency-log", "--log-level"}
    assert flags[flags.index("--workspace-files") + 1] == "false"
