"""What the model's KV cache holds, mirrored on our side, and the operations that change
both together.

Sequence 0 holds the prompt as built and what was generated after it (``tokens``); for
positions whose logits were computed, ``greedy`` holds the token greedy decoding picks next
and ``probs`` that token's probability (a suggestion's confidence is made of these).
Sequence ``SECOND_SEQ`` holds the prompt read without other files' chunks (``alt``, the
second reading). Every change of the cache goes through this object, so no caller keeps
these in step by hand.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from fimls.drafting import common_prefix_len
from fimls.engine.llama import LlamaModel

# The cache sequence that holds the prompt read without other files' chunks (the second
# reading; 0 is the prompt as built, 1 parks entries or holds a branch, see LlamaModel).
SECOND_SEQ = 2


class Cancelled(Exception):
    """The request was cancelled or superseded while the engine worked on it."""


class KvMirror:
    """The cache's contents as the engine knows them (see the module's docstring)."""

    def __init__(self, model: LlamaModel) -> None:
        self.model = model
        self.tokens: list[int] = []  # sequence 0
        self.greedy: list[int | None] = []  # the greedy token after each position, if known
        self.probs: dict[int, float] = {}  # its probability, where greedy was computed
        self.alt: list[int] = []  # sequence SECOND_SEQ
        self.fresh_from = 0  # greedy entries below this predate the current request
        self.evaluated = 0  # tokens the model evaluated for the current request

    def reset(self) -> None:
        """Empty both sequences (after an error the cache's contents are unknown)."""
        self.model.kv_truncate(0)
        self.model.kv_truncate(0, SECOND_SEQ)
        self.tokens = []
        self.greedy = []
        self.alt = []
        self.probs.clear()

    def forget(self) -> None:
        """Sequence 0 was used for something else (a timing probe) and emptied."""
        self.tokens, self.greedy = [], []

    def forget_greedy(self) -> None:
        """Plain greedy decoding: nothing computed for an earlier request is reused but
        the cache itself."""
        self.greedy = [None] * len(self.tokens)

    def begin(self) -> None:
        """A request starts: what is known now predates it, and nothing is evaluated yet."""
        self.fresh_from = len(self.tokens)
        self.evaluated = 0

    def path(self) -> list[int]:
        """The cached tokens and the greedy token predicted after them, if known."""
        path = list(self.tokens)
        if self.greedy and self.greedy[-1] is not None:
            path.append(self.greedy[-1])
        return path

    def truncate(self, n: int) -> None:
        """Make sequence 0 hold only its first ``n`` positions."""
        if n < len(self.tokens):
            self.fresh_from = min(self.fresh_from, n)
            self.model.kv_truncate(n)
            del self.tokens[n:]
            del self.greedy[n:]

    def truncate_alt(self, n: int) -> None:
        """Make sequence SECOND_SEQ hold only its first ``n`` positions."""
        if n < len(self.alt):
            self.model.kv_truncate(n, SECOND_SEQ)
            del self.alt[n:]

    def greedy_at(self, pos: int, logits: npt.NDArray[np.float32]) -> int:
        """The greedy token after position ``pos``; its probability goes to ``probs``."""
        tok = int(np.argmax(logits))
        top = float(logits[tok])
        self.probs[pos] = 1.0 / float(np.sum(np.exp(logits - top, dtype=np.float32)))
        return tok

    def extend(self, tokens: Sequence[int], greedy: Sequence[int | None] | None = None) -> None:
        """Sequence 0 now also holds ``tokens`` (evaluated by the caller), with the greedy
        choices after them when known."""
        self.tokens.extend(tokens)
        self.greedy.extend(greedy if greedy is not None else [None] * len(tokens))

    def evaluate(self, seq: list[int], common: int, chunk: int | None = None,
                 ) -> tuple[int, float]:
        """Make sequence 0 hold exactly ``seq`` with the greedy choice after its last
        position (in batches of ``chunk`` tokens, each kept as it is done). Returns the
        tokens evaluated and the seconds that took; raises Cancelled when stopped."""
        n = len(seq)
        start = min(common, n - 1)
        self.truncate(start)
        t0 = time.perf_counter()
        done = self.model.prefill(seq[start:], start, chunk=chunk)
        dt = time.perf_counter() - t0
        self.extend(seq[start:start + done])
        self.evaluated += done
        if done < n - start:
            raise Cancelled
        self.greedy[n - 1] = self.greedy_at(n - 1, self.model.logits(-1))
        return done, dt

    def evaluate_alt(self, seq: list[int], chunk: int | None = None) -> tuple[int, float]:
        """Make sequence SECOND_SEQ hold exactly ``seq``, with logits at its last position.
        Returns the tokens evaluated and the seconds that took."""
        n = len(seq)
        start = min(common_prefix_len(seq, self.alt), n - 1)
        self.truncate_alt(start)
        t0 = time.perf_counter()
        done = self.model.prefill(seq[start:], start, chunk=chunk, seq=SECOND_SEQ)
        self.alt.extend(seq[start:start + done])
        if done < n - start:
            raise Cancelled
        return done, time.perf_counter() - t0

    def verify(self, seq: list[int], draft: list[int]) -> tuple[int, float]:
        """Evaluate ``[seq[-1]] + draft`` in one batch; keep the agreeing prefix.

        Precondition: sequence 0 holds exactly ``seq[:-1]``. Afterwards it holds ``seq``
        plus the accepted draft tokens, with the greedy choice after each. Returns how many
        draft tokens were accepted and the seconds the batch took.
        """
        n = len(seq)
        batch = [seq[-1], *draft]
        t0 = time.perf_counter()
        if not self.model.decode(batch, n - 1, list(range(len(batch)))):
            self.model.kv_truncate(n - 1)
            raise Cancelled
        self.evaluated += len(batch)
        preds = [self.greedy_at(n - 1 + i, self.model.logits(i)) for i in range(len(batch))]
        dt = time.perf_counter() - t0
        a = 0
        while a < len(draft) and preds[a] == draft[a]:
            a += 1
        self.extend(batch[:a + 1], preds[:a + 1])
        # Roll the cache back past the first disagreement.
        self.model.kv_truncate(n + a)
        return a, dt

    def adopt_moved(self, tokens: list[int], common: int) -> None:
        """Sequence 0 now holds all of ``tokens`` (the suffix moved into place, the last
        token just decoded): only the first ``common`` keep their greedy choices."""
        n = len(tokens)
        self.evaluated += 1
        self.fresh_from = min(self.fresh_from, common)
        self.tokens = list(tokens)
        self.greedy = self.greedy[:common] + [None] * (n - common)
        self.greedy[n - 1] = self.greedy_at(n - 1, self.model.logits(0))

    def adopt_branch(self, p: int, tokens: list[int], greedy: list[int | None]) -> None:
        """The branch decoded from position ``p`` (``tokens``, with the greedy choice after
        each) becomes sequence 0 from there."""
        self.model.take_branch(p)
        del self.tokens[p:]
        del self.greedy[p:]
        self.extend(tokens, greedy)
        self.fresh_from = min(self.fresh_from, p)
