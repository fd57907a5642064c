"""The prompt window sized by time, from the prefill speed measured on this machine.

A FIM model reads the whole window before its first token: on a 2-core CPU Qwen2.5-Coder
1.5B prefills about 140 tokens/s, so a 4k-token window costs half a minute, while on a GPU
the same window costs a fraction of a second. So the window is as many tokens as the
machine prefills in about :data:`PROMPT_SECONDS`, learned from real prefill timings (a
start-up measurement on a busy machine would be noise), starting from a guess by model size.

The window changes only when the measured speed moves a whole rung, because a new window
size moves the window's start and the KV cache then starts over. And a new size is only
adopted at the next prompt the cache does not cover anyway (another file, a jump): text the
model already read costs nothing, whatever the window, so the keystroke after a
measurement is not the one that pays for it.
"""

from __future__ import annotations

import math

PROMPT_SECONDS = 6.0
"""Prefill time one prompt with nothing cached may cost; idle prefill hides most of it."""
MIN_PROMPT_TOKENS = 1024
"""Below this the model sees too little of the file to be worth asking."""
RUNGS = (1024, 1536, 2048, 3072, 4096, 6144, 8192, 12288, 16384, 24576, 32768)
MIN_SAMPLE_TOKENS = 64
"""Shorter prefills are dominated by fixed costs and say little about the speed."""

# On a 2-core x86 VM: Gemma 3 270M (0.25 GB) prefills ~600 tokens/s, Qwen2.5-Coder 1.5B
# Q4_K_M (1.1 GB) ~140 tokens/s: speed x size is ~150 GB.tokens/s, ~75 per core.
_BYTES_TOKENS_PER_S_PER_THREAD = 75e9


def prior_rate(model_bytes: int, threads: int, gpu: bool) -> float:
    """A first guess of the prefill speed (tokens/s) before anything was measured."""
    if gpu:
        return math.inf
    return _BYTES_TOKENS_PER_S_PER_THREAD * max(1, threads) / max(1, model_bytes)


def rung_at_most(tokens: float) -> int:
    """The largest rung not above ``tokens`` (the smallest rung at least)."""
    best = RUNGS[0]
    for r in RUNGS:
        if r <= tokens:
            best = r
    return best


class PromptSizer:
    """The prompt's token budget: prefill speed times :data:`PROMPT_SECONDS`, on rungs."""

    def __init__(self, prior_rate: float, *, fixed: int = 0) -> None:
        self.rate = prior_rate
        self.samples = 0
        self.fixed = fixed
        self.tokens = fixed or self._rung_for(prior_rate)
        """The window the measured speed asks for."""
        self.window = self.tokens
        """The window prompts are built with: ``tokens``, once :meth:`adopt` was called."""

    @staticmethod
    def _rung_for(rate: float) -> int:
        if math.isinf(rate):
            return RUNGS[-1]
        return rung_at_most(rate * PROMPT_SECONDS)

    def observe(self, tokens: int, seconds: float) -> bool:
        """Learn from one real prefill of ``tokens`` in ``seconds``; True when the budget
        changed."""
        if tokens < MIN_SAMPLE_TOKENS or seconds <= 0 or self.fixed:
            return False
        sample = tokens / seconds
        self.samples += 1
        if math.isinf(self.rate):
            self.rate = sample
        else:
            # The guess counts as one sample; later the average moves slowly (in log
            # space: a burst of load halves one sample, it must not halve the window).
            w = max(0.2, 1.0 / (self.samples + 1))
            self.rate = math.exp((1 - w) * math.log(self.rate) + w * math.log(sample))
        target = self.rate * PROMPT_SECONDS
        i = RUNGS.index(self.tokens) if self.tokens in RUNGS else 0
        up = RUNGS[min(i + 1, len(RUNGS) - 1)]
        if target < self.tokens * 0.75 or target > up * 1.25:
            new = rung_at_most(target)
            if new != self.tokens:
                self.tokens = new
                return True
        return False

    @property
    def pending(self) -> bool:
        """True when the measured window is not yet the one prompts are built with."""
        return self.window != self.tokens

    def adopt(self) -> None:
        """Build prompts with the measured window from now on."""
        self.window = self.tokens

    def budget(self, cap: int) -> int:
        """Tokens the prompt may use, at most ``cap`` (what the context leaves)."""
        return max(8, min(self.window, cap))

    def seconds(self, tokens: int) -> float:
        """The time prefilling ``tokens`` takes here, at the speed measured so far."""
        return 0.0 if math.isinf(self.rate) or self.rate <= 0 else tokens / self.rate
