"""The prompt window sized by measured prefill speed (fimls.sizing)."""

from __future__ import annotations

import math

from fimls.sizing import (
    MIN_PROMPT_TOKENS,
    PROMPT_SECONDS,
    RUNGS,
    PromptSizer,
    prior_rate,
    rung_at_most,
)


def test_the_prior_scales_with_threads_and_model_size() -> None:
    small, big = prior_rate(250_000_000, 2, gpu=False), prior_rate(1_100_000_000, 2, gpu=False)
    assert 400 < small < 800 and 100 < big < 200  # what this project measured on 2 cores
    assert prior_rate(1_100_000_000, 8, gpu=False) == 4 * big
    assert math.isinf(prior_rate(1_100_000_000, 2, gpu=True))


def test_rungs() -> None:
    assert rung_at_most(10) == MIN_PROMPT_TOKENS == RUNGS[0]
    assert rung_at_most(2047) == 1536 and rung_at_most(2048) == 2048
    assert rung_at_most(1e9) == RUNGS[-1]


def test_the_budget_is_what_prefills_in_the_target_time() -> None:
    s = PromptSizer(140.0)  # Qwen 1.5B on 2 cores: 840 tokens in 6 s
    assert s.tokens == 1024
    gpu = PromptSizer(math.inf)
    assert gpu.budget(4056) == 4056  # on a GPU the context is the limit
    assert PromptSizer(140.0, fixed=3000).budget(4056) == 3000  # promptTokens wins


def test_the_budget_follows_real_timings_but_not_noise() -> None:
    s = PromptSizer(600.0)  # guessed 3600 tokens in 6 s: 3072
    assert s.tokens == 3072
    # One slow sample (a burst of load) moves the estimate, not by a whole rung.
    changed = s.observe(512, 512 / 400.0)
    assert not changed and s.tokens == 3072
    # A machine that really is slower: the window comes down, once.
    changes = [s.observe(512, 512 / 150.0) for _ in range(10)]
    assert sum(changes) >= 1 and s.tokens <= 1024 * 1.5
    assert s.rate * PROMPT_SECONDS < 1536 * 1.25
    # Tiny prefills say nothing about speed.
    before = s.rate
    assert not s.observe(10, 10.0) and s.rate == before


def test_a_gpu_learns_its_speed_from_the_first_sample() -> None:
    s = PromptSizer(math.inf)
    s.observe(1000, 0.1)  # 10k tokens/s: 60k in 6 s
    assert s.rate == 10_000 and s.tokens == RUNGS[-1]
    assert s.budget(4056) == 4056


def test_a_fixed_budget_never_moves() -> None:
    s = PromptSizer(140.0, fixed=2000)
    assert not s.observe(1000, 100.0) and s.tokens == 2000


def test_a_new_window_waits_for_the_next_prompt_the_cache_does_not_cover() -> None:
    s = PromptSizer(600.0)
    assert s.budget(8000) == 3072 and not s.pending
    for _ in range(10):
        s.observe(512, 512 / 150.0)
    # Measured, not yet used: the prompt the cache holds keeps its window.
    assert s.pending and s.tokens < 3072 and s.budget(8000) == 3072
    s.adopt()
    assert not s.pending and s.budget(8000) == s.tokens


def test_prefill_time_at_the_measured_speed() -> None:
    assert PromptSizer(140.0).seconds(1024) == 1024 / 140.0
    assert PromptSizer(math.inf).seconds(100_000) == 0.0  # a GPU
