"""Speculative decoding against plain greedy decoding, on the real embedded model.

Lossless means: the same output as ``--speculative off``, or a first difference at a
position where the baseline's top-2 logit margin is tiny (batched CPU kernels are not
bit-identical to one-token decoding, so near-ties may flip). The identical counts are
printed in the test summary.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from fimls.engine.api import CompletionRequest
from fimls.engine.core import Engine, EngineConfig
from fimls.engine.draft_model import ModelDraft
from fimls.engine.llama import LlamaModel, ModelLoadError, Vocab
from fimls.models import resolve_model
from tests.ggufs import write_vocab_gguf
from tests.lsp_helpers import humaneval

EPSILON = 0.5  # top-2 logit margin under which a flipped choice is numerical noise
REPORT: list[str] = []


@pytest.fixture(scope="module")
def engine() -> Iterator[Engine]:
    path = resolve_model(None)
    eng = Engine(EngineConfig(model_path=path, n_ctx=2048, draft_model=path, draft_max=8))
    yield eng
    eng.close()


def _tasks() -> list[dict[str, str]]:
    return humaneval("Single", n=15, stride=70) + humaneval("Multi", n=15, stride=300)


def _generate(engine: Engine, task: dict[str, str], mode: str) -> tuple[str, list[int], dict]:
    engine.reset()
    engine.prev_gen.clear()
    req = CompletionRequest(uri="file:///t.py", version=1, prefix=task["prefix"],
                            suffix=task["suffix"], max_tokens=48, speculative=mode)
    res = engine.complete(req, lambda: False)
    return res.text, list(engine.prev_gen.get("file:///t.py", [])), res.record.__dict__


def _margin_at(engine: Engine, task: dict[str, str], gen: list[int]) -> float:
    """Top-2 logit margin of plain decoding after ``gen``."""
    engine.reset()
    prompt = engine.build(CompletionRequest(uri="x", version=1, prefix=task["prefix"],
                                            suffix=task["suffix"], max_tokens=48))
    seq = prompt.tokens + gen
    nb = engine.model.n_batch
    for s in range(0, len(seq), nb):
        chunk = seq[s:s + nb]
        last = s + nb >= len(seq)
        engine.model.decode(chunk, s, [len(chunk) - 1] if last else [])
    top2 = np.sort(np.asarray(engine.model.logits(-1)))[-2:]
    engine.reset()
    return float(top2[1] - top2[0])


@pytest.mark.parametrize("mode", ["lookup", "model"])
def test_speculation_is_lossless(engine: Engine, mode: str) -> None:
    tasks = _tasks()
    assert len(tasks) >= 30
    identical, drafted, accepted = 0, 0, 0
    for task in tasks:
        base_text, base_tokens, _ = _generate(engine, task, "off")
        text, tokens, rec = _generate(engine, task, mode)
        drafted += rec["drafted_tokens"]
        accepted += rec["accepted_tokens"]
        if text == base_text:
            identical += 1
            continue
        j = next((i for i, (a, b) in enumerate(zip(base_tokens, tokens, strict=False))
                  if a != b), min(len(base_tokens), len(tokens)))
        margin = _margin_at(engine, task, base_tokens[:j])
        assert margin < EPSILON, (task["task_id"], j, margin)
    REPORT.append(f"speculative={mode}: {identical}/{len(tasks)} outputs identical to "
                  f"--speculative off (others diverge only at top-2 margins < {EPSILON}); "
                  f"drafted {drafted}, accepted {accepted}")
    # The draft path really ran, and a same-vocabulary drafter is mostly right.
    assert drafted > 0 and accepted > 0
    if mode == "model":
        assert accepted >= 0.8 * drafted
    assert identical >= 0.6 * len(tasks)


def test_auto_mode_is_selective_where_verification_is_expensive(engine: Engine) -> None:
    tasks = _tasks()[:8]
    drafted = generated = 0
    for task in tasks:
        base_text, _, _ = _generate(engine, task, "off")
        text, _, rec = _generate(engine, task, "auto")
        drafted += rec["drafted_tokens"]
        generated += rec["generated_tokens"]
        if rec["drafted_tokens"] == 0:
            assert text == base_text
    if engine.policy.cost(4) >= 2.0:
        # A CPU-like machine: prompt-lookup drafts rarely pay, so auto verifies few.
        assert drafted <= 0.25 * generated, (drafted, generated, engine.policy.batch_cost)


def test_typing_the_suggestion_reuses_it(engine: Engine) -> None:
    task = humaneval("Multi", n=1)[0]
    engine.reset()
    engine.prev_gen.clear()
    first = engine.complete(CompletionRequest(uri="file:///k.py", version=1,
                                              prefix=task["prefix"], suffix=task["suffix"]),
                            lambda: False)
    shown = first.text
    assert len(shown) > 4
    for k in range(1, 5):
        res = engine.complete(CompletionRequest(uri="file:///k.py", version=1 + k,
                                                prefix=task["prefix"] + shown[:k],
                                                suffix=task["suffix"]), lambda: False)
        # The rest of the suggestion, known without running the model again.
        assert shown.startswith(shown[:k] + res.text) or res.text == shown[k:]
        assert res.record.memo_tokens > 0
        assert res.record.evaluated_tokens <= 2


def test_short_prompt_after_an_unrelated_one_is_not_forced_from_bos(engine: Engine) -> None:
    # Regression: a prompt under 32 bytes whose only overlap with the cached path was BOS
    # used to be forced token by token from BOS, and came back empty.
    def ask(uri: str, prefix: str) -> str:
        return engine.complete(CompletionRequest(uri=uri, version=1, prefix=prefix, suffix=""),
                               lambda: False).text

    engine.reset()
    engine.prev_gen.clear()
    fresh = ask("file:///a.py", "def add(a, b):\n    return a")
    assert fresh.strip()
    ask("file:///b.py", "name = 'x'\nname")
    assert ask("file:///c.py", "def add(a, b):\n    return a") == fresh


def test_incompatible_draft_model_is_refused(tmp_path: Path) -> None:
    other = write_vocab_gguf(tmp_path / "starcoder2-vocab.gguf", "starcoder2")
    with pytest.raises(ModelLoadError) as err:
        ModelDraft(other, _main_vocab(), "gemma-3-270m", n_ctx=512, n_batch=64, threads=1,
                   n_gpu_layers=0)
    msg = str(err.value)
    assert "starcoder2-vocab.gguf" in msg and "gemma" in msg and "vocabularies differ" in msg
    # The engine refuses the drafter but still completes without it.
    eng = Engine(EngineConfig(model_path=resolve_model(None), n_ctx=512, draft_model=other,
                              measure_costs=False))
    try:
        assert eng.draft_model is None
        assert any("vocabularies differ" in w for w in eng.warnings)
        res = eng.complete(CompletionRequest(uri="u", version=1, prefix="def add(a, b):\n",
                                             suffix="", speculative="auto"), lambda: False)
        assert res.outcome in ("returned", "empty")
    finally:
        eng.close()


def _main_vocab() -> Vocab:
    model = LlamaModel(resolve_model(None), vocab_only=True)
    return model.vocab


def pytest_terminal_summary_lines() -> list[str]:
    """Lines for conftest's terminal summary."""
    return REPORT


def test_tail_drafts_after_an_edit_elsewhere(engine: Engine) -> None:
    """When the prompt no longer follows the cached path (an edit above the cursor, or any
    FIM model, whose prompt changes after the cursor), typing the suggestion is served by
    drafting its tail and verifying it in batches: nearly every drafted token is kept."""
    drafted = accepted = 0
    for task in humaneval("Multi", n=4, stride=150):
        engine.reset()
        engine.prev_gen.clear()
        first = engine.complete(CompletionRequest(uri="file:///e.py", version=1,
                                                  prefix=task["prefix"], suffix=task["suffix"],
                                                  max_tokens=48), lambda: False)
        shown = first.text
        if len(shown) < 12:
            continue
        # An edit at the top of the file and three typed characters of the suggestion.
        prefix = "# edited\n" + task["prefix"] + shown[:3]
        res = engine.complete(CompletionRequest(uri="file:///e.py", version=2, prefix=prefix,
                                                suffix=task["suffix"], max_tokens=48),
                              lambda: False)
        assert res.record.memo_tokens == 0  # the cached path no longer applies
        if res.record.drafted_tokens:
            assert res.record.draft == "tail"
        drafted += res.record.drafted_tokens
        accepted += res.record.accepted_tokens
    REPORT.append(f"previous-suggestion tail after an edit: accepted {accepted}/{drafted}")
    assert drafted > 0 and accepted >= 0.8 * drafted
