"""The engine's decode loop on the real embedded model: edge cases and the cost model."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from fimls.engine.api import CompletionRequest
from fimls.engine.core import Engine, EngineConfig
from fimls.models import resolve_model
from tests.lsp_helpers import humaneval


@pytest.fixture(scope="module")
def engine() -> Iterator[Engine]:
    eng = Engine(EngineConfig(model_path=resolve_model(None), n_ctx=1024,
                              measure_costs=False))
    yield eng
    eng.close()


def _ask(engine: Engine, prefix: str, version: int = 1) -> tuple[str, str]:
    res = engine.complete(CompletionRequest(uri="file:///e.py", version=version, prefix=prefix,
                                            suffix=""), lambda: False)
    return res.text, res.record.stop


def test_an_empty_prompt_reads_no_stale_logits(engine: Engine) -> None:
    # Regression: with a continuation model that adds no BOS, an empty prefix (or a
    # one-token prefix, healed away) left no prompt token; the loop then read nxt[-1]: an
    # IndexError on a fresh cache, the previous request's next token otherwise.
    template = engine.template
    engine.template = dataclasses.replace(template, bos=-1)
    try:
        engine.reset()
        assert _ask(engine, "") == ("", "empty_prompt")
        assert _ask(engine, "def")[1] == "empty_prompt"
        text, _ = _ask(engine, "def add(a, b):\n    return", 2)
        assert text.strip()
        assert _ask(engine, "", 3) == ("", "empty_prompt")
    finally:
        engine.template = template
        engine.reset()


def test_verify_costs_are_learned_from_requests(tmp_path: Path) -> None:
    """A noisy cost table cached by an earlier start is a prior: real verify batches and
    steps move it, and what was learned is cached for the next start."""
    path = resolve_model(None)
    cache = tmp_path / "verify-costs.json"
    probe = Engine(EngineConfig(model_path=path, n_ctx=1024, measure_costs=False,
                                cost_cache=cache))
    key = probe._cost_key()
    probe.close()
    noisy = {"0": 1.0, "1": 5.28, "2": 3.30, "3": 2.91, "4": 9.0}
    cache.write_text(json.dumps({key: noisy}))
    eng = Engine(EngineConfig(model_path=path, n_ctx=1024, cost_cache=cache))
    try:
        prior = dict(eng.policy.batch_cost)
        assert prior[1] <= prior[2] <= prior[3]  # made monotone, not trusted as measured
        for task in humaneval("Multi", n=6, stride=100):
            eng.reset()
            eng.complete(CompletionRequest(uri="file:///c.py", version=1, prefix=task["prefix"],
                                           suffix=task["suffix"], max_tokens=32,
                                           speculative="lookup"), lambda: False)
        step = eng.policy.timings[0]
        verified = {k: t.samples for k, t in eng.policy.timings.items() if k and t.samples}
        assert step.samples >= 8 and verified
        learned = eng.policy.batch_cost
        assert any(abs(learned[k] - prior[k]) > 0.05 for k in verified)
    finally:
        eng.close()
    cached = json.loads(cache.read_text())[key]
    assert {int(k): v for k, v in cached.items()} == pytest.approx(
        {k: round(v, 4) for k, v in learned.items()})


def test_a_new_window_size_waits_for_a_cache_miss(engine: Engine) -> None:
    # Regression: on a slow machine the first request's prefill timing shrank the window,
    # which moved its start, and the next keystroke recomputed the whole prompt.
    code = "".join(f"def function_{i}(x):\n    return x * {i}\n\n" for i in range(200))
    sizer = engine.sizer
    saved = (sizer.tokens, sizer.window, sizer.fixed)
    try:
        engine.reset()
        # (fixed: the prefills' own timings must not move the size under the test.)
        sizer.fixed, sizer.tokens, sizer.window = 1, 600, 600

        def ask(prefix: str, uri: str) -> tuple[int, int]:
            res = engine.complete(CompletionRequest(uri=uri, version=1, prefix=prefix, suffix="",
                                                    max_tokens=4), lambda: False)
            return res.record.prompt_tokens, res.record.reused_tokens

        first, _ = ask(code + "def f", "file:///a.py")
        assert 500 < first <= 600
        sizer.tokens = 300  # as a prefill timing would set it
        size, reused = ask(code + "def fu", "file:///a.py")
        assert size > 500 and reused >= 0.9 * size and sizer.pending
        other = "".join(f"class C{i}:\n    pass\n\n" for i in range(200))
        size, _ = ask(other + "class D", "file:///b.py")
        assert size <= 300 and not sizer.pending
    finally:
        sizer.tokens, sizer.window, sizer.fixed = saved
        engine.reset()
