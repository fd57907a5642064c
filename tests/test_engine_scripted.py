"""The engine's own code on a scripted model (tests/scripted_model.py): the decode loop,
the KV mirror, drafting, the second reading and cancellation, from logits a test writes.
No weights are loaded: these are unit tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from fimls.crossfile import ContextChunk
from fimls.engine.api import CompletionRequest, EngineConfig
from fimls.engine.core import Engine
from tests.scripted_model import Script, ScriptedModel, continuing, scripted_vocab

MID = "<|fim_middle|>"
PREFIX = "def total(values):\n    result = 0\n    for v in values:\n        result = "
SUFFIX = "\n    return result\n"


@pytest.fixture(scope="module")
def vocab_path(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, object]]:
    yield scripted_vocab(tmp_path_factory.mktemp("vocab"))


def _engine(vocab_path: tuple[Path, object], script: Script) -> tuple[Engine, ScriptedModel]:
    path, vocab = vocab_path
    model = ScriptedModel(vocab, script)  # type: ignore[arg-type]
    cfg = EngineConfig(model_path=path, n_ctx=model.n_ctx, measure_costs=False,
                       prompt_tokens=1024)
    return Engine(cfg, model=model), model  # type: ignore[arg-type]


def _request(**kw: object) -> CompletionRequest:
    args: dict[str, object] = {"uri": "file:///w/a.py", "version": 1, "prefix": PREFIX,
                               "suffix": SUFFIX, "rel_path": "a.py", "max_tokens": 24,
                               "speculative": "off"}
    args.update(kw)
    return CompletionRequest(**args)  # type: ignore[arg-type]


def _mirror_holds(engine: Engine, model: ScriptedModel) -> bool:
    cells = model.cells[0]
    return engine.cache.tokens == [cells[p] for p in range(len(cells))] \
        and model.kv_len() == len(engine.cache.tokens)


def test_the_decode_loop_writes_the_scripted_line(vocab_path: tuple[Path, object]) -> None:
    engine, model = _engine(vocab_path, continuing("result + v", after=MID))
    res = engine.complete(_request(), lambda: False)
    assert res.text == "result + v"
    assert res.record.stop == "eog" and res.record.outcome == "returned"
    # Greedy tokens of probability 0.9 each: the confidence is theirs.
    assert res.record.confidence == pytest.approx(0.9, abs=1e-3)
    # Lazy: the cache holds the prompt and every token written; the end token that
    # stopped it is never evaluated.
    assert _mirror_holds(engine, model)
    assert len(engine.cache.tokens) == res.record.prompt_tokens + res.record.generated_tokens


def test_a_repeated_request_reads_only_what_changed(vocab_path: tuple[Path, object]) -> None:
    engine, model = _engine(vocab_path, continuing("result + v", after=MID))
    first = engine.complete(_request(), lambda: False)
    before = model.decoded
    again = engine.complete(_request(version=2), lambda: False)
    assert again.text == first.text
    assert again.record.reused_tokens == again.record.prompt_tokens
    # Speculation off forgets earlier greedy choices but not the cache: the prompt's last
    # token, then each generated token, are all it evaluates.
    assert model.decoded - before == again.record.evaluated_tokens
    assert again.record.evaluated_tokens <= again.record.generated_tokens + 1
    assert _mirror_holds(engine, model)


def test_lookup_drafts_are_verified_and_change_no_token(vocab_path: tuple[Path, object]) -> None:
    line = "result + v * v  # squares"
    prefix = f"def squares(values):\n    result = 0\n    # {line}\n    for v in values:\n" \
             "        result = "
    plain, _ = _engine(vocab_path, continuing(line, after=MID, p=0.95))
    off = plain.complete(_request(prefix=prefix, max_tokens=40), lambda: False)
    engine, model = _engine(vocab_path, continuing(line, after=MID, p=0.95))
    drafted = engine.complete(_request(prefix=prefix, speculative="lookup", max_tokens=40),
                              lambda: False)
    assert drafted.text == off.text == line
    rec = drafted.record
    assert rec.draft_batches > 0 and rec.accepted_tokens > 0
    assert rec.accepted_tokens <= rec.drafted_tokens
    assert _mirror_holds(engine, model)


def _judged(seen: bytes) -> dict[bytes, float]:
    """With the chunk in the prompt: "a" a little likelier than "b" to start the line, but
    "alpha(v)" is unlikely on, "beta(v)" certain. Without it: "beta(v)" outright."""
    if MID.encode() not in seen:
        return {}
    gap = seen.split(MID.encode())[-1]
    if b"CHUNK" not in seen:
        return continuing("beta(v)", after=MID)(seen)
    if gap == b"":
        return {b"a": 0.35, b"b": 0.3}
    if gap.startswith(b"a"):
        return continuing("alpha(v)", after=MID, p=0.2)(seen)
    return continuing("beta(v)", after=MID, p=0.99)(seen)


def test_the_second_reading_shows_the_line_the_chunks_find_likelier(
        vocab_path: tuple[Path, object]) -> None:
    engine, model = _engine(vocab_path, _judged)
    engine.second_log = []
    chunk = ContextChunk(path="lib.py", text="# CHUNK\ndef alpha(v):\n    return v\n",
                         source="definition")
    res = engine.complete(_request(context=[chunk], second_reading=True), lambda: False)
    (read,) = engine.second_log
    assert read.outcome == res.record.second_line == "taken"
    assert res.text == "beta(v)"
    assert read.second_logp > read.first_logp
    assert _mirror_holds(engine, model) and model.kv_len(1) == 0
    # Off, the prompt with the chunk writes its own greedy line.
    engine2, _ = _engine(vocab_path, _judged)
    off = engine2.complete(_request(context=[chunk], second_reading=False, version=2),
                           lambda: False)
    assert off.text == "alpha(v)"


def test_a_cancelled_request_leaves_the_mirror_true(vocab_path: tuple[Path, object]) -> None:
    engine, model = _engine(vocab_path, continuing("result + v", after=MID))
    calls = {"n": 0}

    def cancelled() -> bool:
        calls["n"] += 1
        return calls["n"] > 3
    res = engine.complete(_request(), cancelled)
    assert res.record.outcome == "cancelled" and res.text == ""
    assert _mirror_holds(engine, model)
    again = engine.complete(_request(version=2), lambda: False)
    assert again.text == "result + v" and _mirror_holds(engine, model)


def test_every_part_the_engine_declares_is_implemented() -> None:
    """A part's declaration (fimls.engine.parts) is only a signature: were a part's method
    renamed, the declaration would answer None in its place."""
    from fimls.engine.parts import EngineParts

    declared = [name for name, value in vars(EngineParts).items()
                if callable(value) and not name.startswith("__")]
    assert "_second_line" in declared and "_evaluate" in declared
    for name in declared:
        owner = next(c for c in Engine.__mro__ if name in vars(c))
        assert owner is not EngineParts, f"{name} is declared but no part defines it"


def _three_ways(seen: bytes) -> dict[bytes, float]:
    """At the cursor "a" (0.5), "b" (0.3) or "c" (0.15); each then writes its own line."""
    if MID.encode() not in seen:
        return {}
    gap = seen.split(MID.encode())[-1]
    if gap == b"":
        return {b"a": 0.5, b"b": 0.3, b"c": 0.15}
    for word in ("alpha(v)", "beta(v)", "c + 1"):
        if gap.startswith(word[:1].encode()):
            return continuing(word, after=MID, p=0.9)(seen)
    return {}


def test_alternatives_branch_from_the_cached_prompt(vocab_path: tuple[Path, object]) -> None:
    engine, model = _engine(vocab_path, _three_ways)
    auto = engine.complete(_request(speculative="auto"), lambda: False)
    assert auto.text == "alpha(v)" and auto.alternatives == []
    prompt_evaluated = auto.record.evaluated_tokens
    asked = engine.complete(_request(speculative="auto", alternatives=2, version=2),
                            lambda: False)
    assert [asked.text, *asked.alternatives] == ["alpha(v)", "beta(v)", "c + 1"]
    rec = asked.record
    # The prompt was in the cache: nothing of it read again (at most its last token, on
    # the branch), and the alternatives' own tokens are counted apart.
    assert rec.reused_tokens == rec.prompt_tokens and prompt_evaluated >= rec.prompt_tokens
    assert rec.evaluated_tokens <= 1 and rec.alternatives == 2
    # The shown line read once more (the prompt's last token and the line's), then each
    # alternative's own tokens.
    assert rec.alt_tokens == len("alpha(v)") + len("beta(v)") + len("c + 1")
    # The branch is gone, the cache still holds the first suggestion's path.
    assert _mirror_holds(engine, model) and model.kv_len(1) == 0


def test_alternatives_with_the_same_first_line_are_skipped(
        vocab_path: tuple[Path, object]) -> None:
    def same(seen: bytes) -> dict[bytes, float]:
        if MID.encode() not in seen:
            return {}
        gap = seen.split(MID.encode())[-1]
        if gap == b"":
            return {b"x": 0.6, b" ": 0.3}
        return continuing(" x", after=MID, p=0.9)(seen) if gap.startswith(b" ") \
            else continuing("x", after=MID, p=0.9)(seen)
    engine, _ = _engine(vocab_path, same)
    res = engine.complete(_request(alternatives=2), lambda: False)
    assert res.text == "x" and res.alternatives == []


def _short_then_deep(seen: bytes) -> dict[bytes, float]:
    """At the cursor "a" (0.6) or "b" (0.25, a line of one token); after "alp", "h" (0.8)
    or "s" (0.15)."""
    if MID.encode() not in seen:
        return {}
    gap = seen.split(MID.encode())[-1]
    if gap == b"":
        return {b"a": 0.6, b"b": 0.25}
    if gap == b"alp":
        return {b"h": 0.8, b"s": 0.15}
    for word in ("alps(v)", "alpha(v)", "b"):
        if gap.startswith(word[:len(gap)].encode()) and len(gap) <= len(word):
            return continuing(word, after=MID, p=0.9)(seen)
    return {}


def test_a_deeper_branch_after_a_short_one_reads_the_shown_line_again(
        vocab_path: tuple[Path, object]) -> None:
    # The short branch overwrote the branch's cells after the cursor: the deeper one must
    # not decode after a gap (the scripted model raises, as llama.cpp does).
    engine, model = _engine(vocab_path, _short_then_deep)
    res = engine.complete(_request(alternatives=2), lambda: False)
    assert [res.text, *res.alternatives] == ["alpha(v)", "b", "alps(v)"]
    assert _mirror_holds(engine, model) and model.kv_len(1) == 0


def test_scoring_reads_each_middle_after_the_cached_prompt(
        vocab_path: tuple[Path, object]) -> None:
    # The script writes "result + v" (each byte at 0.9): that middle scores far above a
    # middle the script never writes, and the prompt is read once for both.
    engine, model = _engine(vocab_path, continuing("result + v", after=MID))
    res = engine.complete(_request(score=["result + v", "total - w"]), lambda: False)
    good, bad = res.scores
    assert res.text == "" and res.record.outcome == "scored"
    assert good > bad + 10 and good > len("result + v") * -1.0
    # Each middle is one batch: the prompt's last token again, then the middle's but last.
    assert res.record.alt_tokens == sum(len(engine.vocab.tokenize(m))
                                        for m in ("result + v", "total - w"))
    # Asked again, the prompt is in the cache: nothing of it is read again.
    again = engine.complete(_request(score=["result + v"], version=2), lambda: False)
    assert again.scores == pytest.approx([good], abs=1e-4)
    assert again.record.reused_tokens == again.record.prompt_tokens
    assert _mirror_holds(engine, model) and model.kv_len(1) == 0
