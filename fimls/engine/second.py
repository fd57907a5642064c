"""The second reading: with other files' chunks in a FIM prompt, the first line is read a
second time without them, and where that reading writes another line, the prompt with the
chunks judges which is likelier (see :meth:`SecondReading._second_line`)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from fimls.drafting import common_prefix_len
from fimls.engine.api import CompletionRequest
from fimls.engine.decode import Decoding, _line_ended, _past_forced
from fimls.engine.kvmirror import SECOND_SEQ, Cancelled
from fimls.engine.parts import EngineParts
from fimls.latency import Stop
from fimls.prompt import Prompt

# Reading the prompt without the chunks as well is worth it where it costs no more than the
# request costs anyway (a new place: both are read from scratch), or this little (a GPU,
# or both readings cached): see SecondReading._second_plan.
SECOND_FREE_SECONDS = 0.25


@dataclass(frozen=True)
class SecondLine:
    """What a second reading computed (``Engine.second_log`` keeps these for tests)."""

    first: tuple[int, ...]  # the first line read with the chunks (up to its end token)
    second: tuple[int, ...]  # read without them: the same up to ``at``, then its own
    at: int  # the first token where the two differ (len(first) where they do not)
    # Log-probabilities of first[at:] and second[at:] given the prompt with the chunks
    # (NaN where they were not compared).
    first_logp: float
    second_logp: float
    outcome: str  # the record's second_line: "same", "kept" or "taken"


class SecondReading(EngineParts):
    """The second reading (a part of :class:`fimls.engine.core.Engine`)."""

    def _second_plan(self, req: CompletionRequest, prompt: Prompt, tokens: list[int],
                     common: int) -> list[int] | None:
        """The prompt without the chunks when this request's first line is to be read a
        second time (see :meth:`_second_line`), else None.

        The second reading is priced like a draft: it is read only where it costs at most
        what the request costs anyway (a new place: both prompts are read from scratch; on
        a GPU, little), and where both fit the cache together.
        """
        room = self.model.n_ctx - 2 * req.max_tokens - 16
        if len(tokens) + len(self.cache.alt) > room:
            self.cache.truncate_alt(0)  # its entries would crowd this prompt out of the cache
        if (not req.second_reading or self.template.kind != "fim"
                or prompt.context_tokens <= 0 or tokens != prompt.tokens):
            return None
        alt = prompt.without_context()
        if len(tokens) + len(alt) > room:
            return None
        cached = min(common_prefix_len(alt, self.cache.alt), len(alt) - 1)
        extra = self.sizer.seconds(len(alt) - cached)
        if extra > max(self.sizer.seconds(len(tokens) - common), SECOND_FREE_SECONDS):
            return None
        return alt

    def _evaluate_alt(self, seq: list[int], chunk: int | None = None) -> int:
        """Make sequence SECOND_SEQ hold exactly ``seq``, with logits at its last position;
        returns how many tokens that evaluated."""
        done, dt = self.cache.evaluate_alt(seq, chunk)
        if done > 1:
            self._observe_prefill(done, dt)
        return done

    def _second_line(self, st: Decoding, stopped: bool) -> bool:
        """Read the first line a second time, without the other files' chunks, and show
        the line that reading writes instead where the prompt with the chunks finds it
        more likely. Returns whether the request stops (as ``stopped`` did, or where the
        shown line ends it).

        Chunks bring the signatures a file lacks; they also pull the model towards what
        they show where the file already says what comes (an argument the signature
        offers and the call never passes, a helper's body written out instead of a call),
        and greedy decoding, one token at a time, then commits to a line that is not the
        likeliest. The file read alone proposes a second line: the prompt without the
        chunks is evaluated (in its own cache sequence, usually read already at idle), the
        first line is put through it in one batch, and where that reading would choose
        another token it writes its own line from there. The prompt with the chunks,
        which knows the most, judges: it scores the second line's differing tokens in one
        batch (on a branch of its cache), and the line with the higher log-probability is
        shown. A multi-line suggestion goes on from the shown line, with the chunks.
        """
        alt = st.alt
        assert alt is not None
        line = list(st.gen)
        n0 = len(st.seq) - len(line)  # the prompt's length
        m = len(alt)
        views = self._alt_views(st, alt, line)
        # Where would the reading without the chunks choose another token?
        reader = _LineReader(self, st)
        at, own = -1, None
        for i, tok in enumerate(line):
            own = reader.choose(views[i])
            if own is None or own != tok:
                at = i
                break
            reader.add(tok)
        nan = float("nan")
        if at < 0 or own is None:
            return self._second_done(st, "same" if at < 0 else "kept", line, line,
                                     len(line) if at < 0 else at, nan, nan, stopped)
        second = self._own_line(st, reader, [*line[:at], own], m)
        first_logp = self._first_logp(line, n0, at)
        if not reader.done or math.isnan(first_logp):
            return self._second_done(st, "kept", line, second, at, first_logp, nan, stopped)
        p = n0 + at - 1  # the position whose logits chose token ``at``
        logits = self._branch_logits(st, p, second[at:-1])
        lps = [_logprob(lg, t) for lg, t in zip(logits, second[at:], strict=True)]
        if sum(lps) <= first_logp:
            self.model.drop_parked()
            return self._second_done(st, "kept", line, second, at, first_logp, sum(lps),
                                     stopped)
        stop = self._show_second(st, n0, at, second, logits, lps)
        return self._second_done(st, "taken", line, second, at, first_logp, sum(lps), stop)

    def _alt_views(self, st: Decoding, alt: list[int], line: list[int],
                   ) -> list[npt.NDArray[Any]]:
        """The logits the prompt without the chunks gives before each token of ``line``:
        that prompt read (usually cached already), then the line through it in one batch."""
        rec, m = st.rec, len(alt)
        rec.second_tokens += self._evaluate_alt(alt)
        views = [np.array(self.model.logits(-1), dtype=np.float32)]
        if len(line) > 1:
            if st.cancelled():
                raise Cancelled
            if not self.model.decode_at([(t, m + i, SECOND_SEQ) for i, t in
                                         enumerate(line[:-1])], list(range(len(line) - 1))):
                self.model.kv_truncate(m, SECOND_SEQ)
                raise Cancelled
            self.cache.alt.extend(line[:-1])
            rec.second_tokens += len(line) - 1
            views += [self.model.logits(i) for i in range(len(line) - 1)]
        return views

    def _own_line(self, st: Decoding, reader: _LineReader, second: list[int], m: int,
                  ) -> list[int]:
        """The reading without the chunks writes its own line on from ``second`` (the
        first line up to where it differs, and its own token there), one token a step."""
        self.cache.truncate_alt(m + len(second) - 1)
        reader.add(second[-1])
        while not reader.done and len(second) < st.req.max_tokens:
            if st.cancelled():
                raise Cancelled
            pos = m + len(second) - 1
            if not self.model.decode_at([(second[-1], pos, SECOND_SEQ)], [0]):
                self.model.kv_truncate(pos, SECOND_SEQ)
                raise Cancelled
            self.cache.alt.append(second[-1])
            st.rec.second_tokens += 1
            nxt = reader.choose(self.model.logits(0))
            if nxt is None:
                break
            second.append(nxt)
            reader.add(nxt)
        return second

    def _first_logp(self, line: list[int], n0: int, at: int) -> float:
        """The log-probability of ``line[at:]`` as the prompt with the chunks chose it
        (each the greedy choice); NaN where a token was forced."""
        first_logp = 0.0
        for i in range(at, len(line)):
            pos = n0 + i - 1
            if self.cache.greedy[pos] != line[i] or pos not in self.cache.probs:
                return float("nan")  # a forced token: its probability is not known
            first_logp += float(np.log(max(self.cache.probs[pos], 1e-30)))
        return first_logp

    def _branch_logits(self, st: Decoding, p: int, tokens: list[int],
                       ) -> list[npt.NDArray[Any]]:
        """The logits the prompt with the chunks gives after position ``p`` and after each
        of ``tokens``, decoded in one batch on a branch of the cache (kept parked)."""
        self.model.branch(p)
        batch = [(st.seq[p], p, 1)] + [(t, p + 1 + i, 1) for i, t in enumerate(tokens)]
        if not self.model.decode_at(batch, list(range(len(batch)))):
            self.model.drop_parked()
            raise Cancelled
        st.rec.second_tokens += len(batch)
        return [self.model.logits(i) for i in range(len(batch))]

    def _show_second(self, st: Decoding, n0: int, at: int, second: list[int],
                     logits: list[npt.NDArray[Any]], lps: list[float]) -> bool:
        """Show the second line: the branch becomes the cache, the decoding state goes back
        to the prompt and takes the line's tokens again (forced text and stop rules as for
        any token), with what the prompt with the chunks gave each. Returns whether the
        request stops."""
        p = n0 + at - 1
        preds: list[int | None] = [self.cache.greedy_at(p + i, lg)
                                   for i, lg in enumerate(logits)]
        self.cache.adopt_branch(p, [st.seq[p], *second[at:-1]], preds)
        st.seq, st.gen, st.common = st.seq[:n0], [], n0
        st.out, st.text, st.remaining = bytearray(), "", st.constraint
        st.line_probs, st.line_done = [], False
        st.rec.stop = Stop.MAX_TOKENS  # (the first line's own stop no longer holds)
        stop = False
        for i, tok in enumerate(second):
            if not st.remaining:
                # Forced text is the user's, and a token the stop rules put in place of
                # the greedy one is not the model's guess (as in _run): not counted.
                if i >= at:
                    st.line_probs.append(float(np.exp(lps[i - at])))
                elif self.cache.greedy[n0 + i - 1] == tok:
                    st.line_probs.append(self.cache.probs.get(n0 + i - 1, 1.0))
            stop = self._emit(st, tok)
            if stop:
                break
        st.line_done = _line_ended(st.out)
        return stop

    def _second_done(self, st: Decoding, outcome: str, first: list[int], second: list[int],
                     at: int, first_logp: float, second_logp: float, stop: bool) -> bool:
        """Record what the second reading came to; returns ``stop``."""
        st.rec.second_line = outcome
        if self.second_log is not None:
            self.second_log.append(SecondLine(tuple(first), tuple(second), at, first_logp,
                                              second_logp, outcome))
        return stop


class _LineReader:
    """Greedy choices along one line under the engine's rules for forced (healed) text and
    a leading newline, outside the decoding state (for the second reading)."""

    def __init__(self, engine: EngineParts, st: Decoding) -> None:
        self.engine = engine
        self.remaining = st.constraint
        self.ban = st.ban_leading
        self.out = bytearray()
        self.done = False

    def choose(self, logits: npt.NDArray[Any]) -> int | None:
        """The token this line takes next, or None when no token keeps the rules."""
        eng = self.engine
        ban = b"" if self.out else self.ban
        tok = int(np.argmax(logits))
        if eng._allowed(tok, self.remaining, ban):
            return tok
        return eng._constrained_argmax(self.remaining, ban, logits)

    def add(self, tok: int) -> None:
        """Take ``tok``: what it adds past the forced text, and whether the line ended."""
        eng = self.engine
        if tok in eng.template.stop_ids or eng.vocab.is_eog(tok):
            self.done = True
            return
        piece, self.remaining = _past_forced(eng.vocab.text_piece(tok), self.remaining)
        self.out += piece
        self.done = _line_ended(self.out)


def _logprob(logits: npt.NDArray[Any], tok: int) -> float:
    """log p(tok) under ``logits``."""
    x = np.asarray(logits, dtype=np.float64)
    top = float(np.max(x))
    return float(x[tok] - top - np.log(np.sum(np.exp(x - top))))
