"""Unit tests for the drafters and the cost model that decides when drafting pays."""

from __future__ import annotations

import numpy as np
import pytest

from fimls.drafting import (
    DraftPolicy,
    PromptLookupDraft,
    check_vocab_compatible,
    find_continuation,
    top_probability,
)


def arr(*xs: int) -> np.ndarray:
    return np.asarray(xs, dtype=np.int32)


def test_find_continuation_takes_the_nearest_match() -> None:
    src = arr(1, 2, 3, 9, 9, 1, 2, 3, 7, 8)
    assert find_continuation(src, arr(2, 3), 2) == [7, 8]
    assert find_continuation(src, arr(1, 2, 3), 5) == [7, 8]
    assert find_continuation(src, arr(4, 5), 3) is None
    # A match at the very end has nothing after it.
    assert find_continuation(arr(5, 6), arr(5, 6), 3) is None


def test_find_continuation_can_skip_the_trailing_self_match() -> None:
    src = arr(1, 2, 5, 1, 2)
    assert find_continuation(src, arr(1, 2), 1, exclude_tail=True) == [5]


def test_prompt_lookup_prefers_longer_keys_and_source_order() -> None:
    d = PromptLookupDraft(max_ngram_size=3, num_pred_tokens=4)
    d.set_source("tail", [10, 11, 12, 13, 14])
    d.set_source("context", [7, 21, 22, 99, 98, 21, 22])
    got = d.propose([5, 11, 12], 8)
    assert got is not None and got.source == "tail" and got.tokens == [13, 14]
    assert got.match_len == 2
    # Only the context knows this key; its own trailing occurrence is not a match.
    got = d.propose([98, 21, 22], 8)
    assert got is not None and got.source == "context" and got.tokens == [99, 98, 21, 22]
    assert got.match_len == 2
    assert d.propose([1000], 4) is None
    assert d.propose([], 4) is None


def test_prompt_lookup_caps_the_draft_length() -> None:
    d = PromptLookupDraft(max_ngram_size=2, num_pred_tokens=3)
    d.set_source("tail", list(range(20)))
    got = d.propose([4, 5], 10)
    assert got is not None and got.tokens == [6, 7, 8]


CPU_COSTS = {0: 1.0, 1: 1.97, 2: 3.2, 3: 2.7, 4: 3.9, 5: 3.5, 6: 4.6, 7: 4.0, 8: 5.3}
GPU_COSTS = {k: 1.0 + 0.02 * k for k in range(17)}


def test_policy_declines_weak_drafts_on_cpu_and_takes_the_tail() -> None:
    pol = DraftPolicy(prior=CPU_COSTS, max_draft=8)
    assert pol.choose("context", 8) == 0
    assert pol.choose("suffix", 8) == 0
    k = pol.choose("tail", 8)
    assert k >= 4  # the previous suggestion's tail is nearly always right
    gain = pol.expected_tokens(0.9, k) / pol.cost(k)
    assert gain > 1.0


def test_policy_drafts_more_where_verification_is_cheap() -> None:
    pol = DraftPolicy(prior=GPU_COSTS, max_draft=16)
    assert pol.choose("context", 16) > 0
    assert pol.choose("tail", 16) == 16


def test_policy_learns_from_rejections() -> None:
    pol = DraftPolicy(prior=CPU_COSTS, max_draft=8)
    assert pol.choose("tail", 8) > 0
    for _ in range(30):
        pol.record("tail", 8, 0)
    assert pol.choose("tail", 8) == 0
    assert pol.source("tail").estimate() < 0.2


def test_forced_mode_always_drafts() -> None:
    pol = DraftPolicy(prior=CPU_COSTS, max_draft=8)
    assert pol.choose("context", 8, force=True) > 0
    assert pol.choose("model", 8, extra_cost=1.0) == 0


def test_cost_interpolation_and_extrapolation() -> None:
    pol = DraftPolicy(prior={0: 1.0, 2: 2.0, 4: 3.0})
    assert pol.cost(1) == pytest.approx(1.5)
    assert pol.cost(6) == pytest.approx(4.0)


def test_vocab_compatibility_messages_name_both_models() -> None:
    a = [b"<s>", b"a", b"b"]
    assert check_vocab_compatible("main.gguf", a, "draft.gguf", list(a)) is None
    why = check_vocab_compatible("main.gguf", a, "draft.gguf", a[:2])
    assert why is not None and "main.gguf" in why and "draft.gguf" in why and "2" in why
    why = check_vocab_compatible("main.gguf", a, "draft.gguf", [b"<s>", b"a", b"c"])
    assert why is not None and "token 2" in why


def test_top_probability() -> None:
    tok, p = top_probability(np.asarray([0.0, 10.0, 0.0], dtype=np.float32))
    assert tok == 1 and p > 0.99
    tok, p = top_probability(np.zeros(4, dtype=np.float32))
    assert p == pytest.approx(0.25)


def test_noisy_prior_is_made_monotone() -> None:
    # The table the issue saw cached after a start on a busy machine: a batch of 2 "cheaper"
    # than a batch of 1. Pooled, it is non-decreasing and keeps the table's average.
    pol = DraftPolicy(prior={0: 1.0, 1: 5.28, 2: 3.30, 3: 2.91})
    costs = [pol.cost(k) for k in range(4)]
    assert costs == sorted(costs)
    assert costs[1] == pytest.approx((5.28 + 3.30 + 2.91) / 3)


def test_costs_are_learned_from_real_timings() -> None:
    # A prior measured on a busy machine prices every draft out ...
    pol = DraftPolicy(prior={0: 1.0, 1: 5.0, 2: 6.0, 4: 8.0, 8: 12.0}, max_draft=8,
                      explore_every=0)
    assert pol.choose("context", 8) == 0
    # ... then real requests show verify batches costing about one step (a GPU).
    for _ in range(20):
        pol.observe(0, 0.010)
        for k in (1, 2, 4, 8):
            pol.observe(k, 0.0105 + 0.0002 * k)
    assert pol.cost(4) == pytest.approx(1.13, abs=0.05)
    assert pol.choose("context", 8) > 0


def test_one_stall_does_not_swing_the_learned_cost() -> None:
    pol = DraftPolicy(prior={0: 1.0, 4: 3.0})
    for _ in range(20):
        pol.observe(0, 0.010)
        pol.observe(4, 0.030)
    before = pol.cost(4)
    pol.observe(4, 3.0)  # the machine stalled for 3 s during one verify batch
    assert pol.cost(4) < before * 1.25


def test_refused_lengths_are_still_explored() -> None:
    pol = DraftPolicy(prior=CPU_COSTS, max_draft=8, explore_every=4)
    picks = [pol.choose("context", 8) for _ in range(8)]
    assert picks.count(0) == 6 and all(p > 0 for p in picks[3::4])


def test_draft_model_step_cost_is_learned() -> None:
    pol = DraftPolicy(draft_step_prior=1.0)
    assert pol.draft_step_cost == 1.0
    for _ in range(10):
        pol.observe(0, 0.040)
        pol.observe_draft(0.040, 4)  # 10 ms per drafted token: a quarter of a main step
    assert pol.draft_step_cost == pytest.approx(0.25, abs=0.01)


def test_a_running_source_is_matched_where_the_output_is() -> None:
    # The previous suggestion repeats a line; drafting at its second line must continue
    # from the second occurrence, not the last one.
    line = [7, 8, 9]
    tail = np.asarray([1, *line, 2, *line, 3, *line, 4], dtype=np.int32)
    key = np.asarray(line, dtype=np.int32)
    assert find_continuation(tail, key, 1) == [4]
    assert find_continuation(tail, key, 1, near=8) == [3]
    d = PromptLookupDraft(max_ngram_size=3)
    d.set_source("tail", tail)
    got = d.propose([*line], 2, tail_pos=4)
    assert got is not None and got.tokens == [2, 7]
