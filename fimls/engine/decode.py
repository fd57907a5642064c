"""The decode loop: one request's tokens, one at a time (or a verified draft at a time),
under the forced text, the stop rules and cancellation; and the tokens it may choose."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from fimls.drafting import common_prefix_len
from fimls.engine.api import CompletionRequest, Prefill
from fimls.engine.finish import finish, record_confidence
from fimls.engine.kvmirror import Cancelled
from fimls.engine.parts import EngineParts
from fimls.latency import LatencyRecord, Stop
from fimls.postprocess import (
    CursorContext,
    StopPolicy,
    banned_first_bytes,
    cut_to_budget,
)

MIN_MEMO_SUGGESTION = 8  # replayed tokens that make a follow-up suggestion worth showing


@dataclass(kw_only=True)
class Decoding:
    """The state of one request's decode loop."""

    req: CompletionRequest
    rec: LatencyRecord
    cancelled: Callable[[], bool]
    seq: list[int]  # prompt tokens, then the generated ones
    common: int  # leading tokens of ``seq`` that the cache holds
    remaining: bytes  # forced text (token healing) not yet emitted
    ctx: CursorContext
    policy: StopPolicy
    drafting: bool
    ban_leading: bytes  # the first bytes the output may not start with (see _start)
    out: bytearray = field(default_factory=bytearray)
    text: str = ""
    gen: list[int] = field(default_factory=list)
    prompt_done: bool = False
    t_first: float | None = None
    sources: dict[str, int] = field(default_factory=dict)  # accepted tokens per source
    line_probs: list[float] = field(default_factory=list)  # greedy tokens of the first line
    line_done: bool = False
    # The second reading (see Engine._second_line): the prompt without other files'
    # chunks, read once the first line is written; None when this request has none (or
    # it was done). ``constraint``: the forced text the request started with.
    alt: list[int] | None = None
    constraint: bytes = b""


class Decoder(EngineParts):
    """The decode loop (a part of :class:`fimls.engine.core.Engine`)."""

    def _run(self, req: CompletionRequest, rec: LatencyRecord,
             cancelled: Callable[[], bool]) -> str:
        """The decode loop: next token (memo, draft or evaluate), constraint, emit."""
        return self._decode(req, rec, cancelled)[0]

    def _decode(self, req: CompletionRequest, rec: LatencyRecord,
                cancelled: Callable[[], bool]) -> tuple[str, Decoding | None]:
        """:meth:`_run`, and its decoding state (None when the memo or an empty prompt
        answered)."""
        fim = self.template.kind == "fim"
        # An explicit request for alternatives needs the prompt, not the memo's answer.
        if fim and req.speculative != "off" and not req.alternatives:
            # Continuation prompts replay a typed suggestion along the KV path (see
            # _align_with_path); a FIM prompt changes before the suffix, so the text is
            # remembered instead.
            rest = self.memo.recall(req.uri, req.prefix, req.prefix_offset, req.suffix)
            if rest is not None:
                rec.stop = Stop.MEMO
                rec.ttft_ms = (time.monotonic() - req.created) * 1000.0
                return rest, None
        st = self._start(req, rec, cancelled)
        if st is None:
            return "", None
        rec.stop = Stop.MAX_TOKENS
        while len(st.gen) < req.max_tokens and not self._step(st):
            pass
        self._finish(st)
        return finish(st.text, st.ctx, req, rec, self.memo if fim else None,
                      keep=req.prefill == Prefill.NEXT), st

    def _step(self, st: Decoding) -> bool:
        """One token (or one verified draft); True when the request stops here."""
        req, rec = st.req, st.rec
        if st.cancelled():
            raise Cancelled
        if (req.max_time_ms and st.t_first is not None
                and (time.monotonic() - st.t_first) * 1000.0 >= req.max_time_ms
                and (cut := cut_to_budget(st.text)) is not None):
            rec.stop = Stop.MAX_TIME
            st.text = cut
            return True
        if len(st.seq) >= self.model.n_ctx - 1:
            # A tiny context (or a huge max_tokens): stop before llama.cpp runs out.
            rec.stop = Stop.CONTEXT_FULL
            return True
        greedy = self._next_greedy(st)
        if greedy is None:
            return True
        tok = self._constrain(st, *greedy)
        if tok is None:
            rec.stop = Stop.NO_TOKEN
            return True
        at = len(st.seq) - 1
        if not st.line_done and tok == greedy[0] and not st.remaining:
            # Forced (healed) text is the user's, not the model's guess: not counted.
            st.line_probs.append(self.cache.probs.get(at, 1.0))
        stop = self._emit(st, tok)
        if not st.line_done:
            st.line_done = _line_ended(st.out)
        if st.alt is not None and (st.line_done or stop):
            # The first line is written: the reading without the chunks may propose
            # another (a stop mid-line by the stop rules leaves nothing to compare).
            stop = (self._second_line(st, stop) if st.line_done or rec.stop == Stop.EOG
                    else stop)
            st.alt = None
        return stop

    def _finish(self, st: Decoding) -> None:
        """The record's decoding figures; the tokens kept as the next request's draft."""
        rec = st.rec
        rec.generated_tokens = len(st.gen)
        rec.evaluated_tokens = self.cache.evaluated
        record_confidence(rec, st.line_probs)
        if st.sources:
            rec.draft = max(st.sources, key=lambda k: st.sources[k])
        if st.t_first is not None:
            rec.decode_ms = (time.monotonic() - st.t_first) * 1000.0
        self._remember(st.req.uri, st.gen)

    def _start(self, req: CompletionRequest, rec: LatencyRecord,
               cancelled: Callable[[], bool]) -> Decoding | None:
        """Build and align the prompt, prepare the drafters; None if the prompt is empty."""
        spec = req.speculative != "off"
        if not spec:
            # Plain greedy decoding: nothing computed for an earlier request is reused but
            # the cache itself (no replay of earlier suggestions).
            self.cache.forget_greedy()
        prompt = self.build(req)
        tokens, constraint = prompt.tokens, prompt.constraint
        if spec and self.template.kind == "continuation":
            tokens, constraint = self._align_with_path(prompt)
        rec.prompt_tokens = len(tokens)
        rec.context_tokens = prompt.context_tokens
        rec.context_sources = prompt.context_sources
        rec.window_tokens = prompt.window
        self.cache.begin()
        if not tokens:
            # Nothing to condition on (a model without BOS, an empty prefix): the logits
            # at hand belong to some earlier request.
            rec.stop = Stop.EMPTY_PROMPT
            return None
        ctx = CursorContext.from_text(req.prefix, req.suffix)
        common = common_prefix_len(tokens, self.cache.tokens)
        if req.reuse_suffix and self._can_shift:
            common = self._reuse_suffix(tokens, common, rec, cancelled)
        rec.reused_tokens = min(common, len(tokens))
        alt = self._second_plan(req, prompt, tokens, common)
        return Decoding(
            alt=alt, constraint=constraint,
            req=req, rec=rec, cancelled=cancelled, seq=list(tokens), common=common,
            remaining=constraint, ctx=ctx, policy=StopPolicy(ctx=ctx, max_lines=req.max_lines),
            drafting=self._setup_drafters(req, tokens),
            ban_leading=banned_first_bytes(ctx.mode, ctx.line_prefix))

    def _evaluate(self, seq: list[int], common: int, chunk: int | None = None) -> None:
        """Make the cache hold exactly ``seq`` with logits at its last position (in
        batches of ``chunk`` tokens, each kept as it is done)."""
        done, dt = self.cache.evaluate(seq, common, chunk)
        if done == 1:
            self.policy.observe(0, dt)
        else:
            self._observe_prefill(done, dt)

    def _next_greedy(self, st: Decoding) -> tuple[int, bool] | None:
        """The greedy token after ``st.seq``, and whether its logits are live (just
        computed) rather than remembered; None when the request should stop here."""
        n = len(st.seq)
        rec = st.rec
        live = False
        if st.common >= n and self.cache.greedy[n - 1] is not None:
            # Known from this request's verification, or (speculative modes) from the
            # generation that produced this token path: no compute at all.
            if n - 1 < self.cache.fresh_from:
                rec.memo_tokens += 1
        elif (rec.memo_tokens >= MIN_MEMO_SUGGESTION and self.cache.evaluated == 0
              and not st.remaining and st.out.strip()):
            # The user is typing the previous suggestion: its rest is shown as it was
            # rather than grown by one model step per keystroke.
            rec.stop = Stop.MEMO_END
            return None
        else:
            t0 = time.monotonic()
            draft = None
            if (st.drafting and st.prompt_done and not st.remaining and st.common >= n - 1
                    and n + self.policy.max_draft < self.model.n_ctx):
                self.cache.truncate(n - 1)
                draft = self._propose(st.req, st.seq, len(st.gen))
            if draft is not None:
                if st.cancelled():
                    raise Cancelled
                accepted = self._verify(st.seq, draft.tokens)
                rec.drafted_tokens += len(draft.tokens)
                rec.accepted_tokens += accepted
                rec.draft_batches += 1
                st.sources[draft.source] = st.sources.get(draft.source, 0) + accepted
                self.policy.record(draft.source, len(draft.tokens), accepted)
            else:
                self._evaluate(st.seq, st.common)
            st.common = n
            if not st.prompt_done:
                rec.prompt_ms = (time.monotonic() - t0) * 1000.0
            live = True
        st.prompt_done = True
        g = self.cache.greedy[n - 1]
        assert g is not None
        return g, live

    def _constrain(self, st: Decoding, greedy: int, live: bool) -> int | None:
        """``greedy``, or the best token that keeps the forced (healed) text and the
        no-leading-newline rule; None when no token can."""
        ban = b"" if st.out else st.ban_leading
        if self._allowed(greedy, st.remaining, ban):
            return greedy
        # Choose among the tokens that keep the constraint, from live logits (recomputed
        # if the greedy choice came from the cache).
        n = len(st.seq)
        if not live or len(self.cache.tokens) != n:
            self._evaluate(st.seq, n - 1)
            st.common = n
        return self._constrained_argmax(st.remaining, ban)

    def _emit(self, st: Decoding, tok: int) -> bool:
        """Append ``tok`` to the output; True when the request stops here."""
        rec = st.rec
        if st.t_first is None:
            st.t_first = time.monotonic()
            rec.ttft_ms = (st.t_first - st.req.created) * 1000.0
        if tok in self.template.stop_ids or self.vocab.is_eog(tok):
            rec.stop = Stop.EOG
            return True
        piece, st.remaining = _past_forced(self.vocab.text_piece(tok), st.remaining)
        n = len(st.seq)
        st.seq.append(tok)
        st.gen.append(tok)
        if st.common == n and n < len(self.cache.tokens) and self.cache.tokens[n] == tok:
            st.common = n + 1
        if piece:
            st.out += piece
            st.text = st.out.decode("utf-8", "ignore")
            cut = st.policy.cut(st.text)
            if cut is not None:
                st.text = st.text[:cut]
                rec.stop = Stop.POLICY
                return True
        return False

    def _allowed(self, tok: int, remaining: bytes, ban: bytes) -> bool:
        """Whether ``tok`` keeps the forced text and starts with none of ``ban``'s bytes."""
        if not remaining and not ban:
            return True
        p = self.vocab.text_piece(tok)
        if not p:
            return False
        if remaining:
            if remaining.startswith(p):
                return True
            if not p.startswith(remaining):
                return False
            p = p[len(remaining):]
        return not (ban and p[:1] in ban)

    def _constrained_argmax(self, remaining: bytes, ban: bytes,
                            logits: npt.NDArray[Any] | None = None) -> int | None:
        """The best allowed token from the last logits (or from ``logits``)."""
        if logits is None:
            logits = self.model.logits(-1)
        if remaining:
            cands = self.vocab.tokens_consistent_with(remaining)
            if ban:
                cands = np.asarray([t for t in cands.tolist()
                                    if self._allowed(int(t), remaining, ban)], dtype=np.int64)
            if len(cands) == 0:
                return None
            return int(cands[int(np.argmax(logits[cands]))])
        masked = np.array(logits, copy=True)
        masked[self.vocab.tokens_starting_with_any(ban)] = -np.inf
        return int(np.argmax(masked))


def _past_forced(piece: bytes, remaining: bytes) -> tuple[bytes, bytes]:
    """What a token's ``piece`` adds past the forced text ``remaining`` (token healing),
    and the forced text still left after it."""
    if not remaining:
        return piece, remaining
    if piece.startswith(remaining):
        return piece[len(remaining):], b""
    return b"", remaining[len(piece):]


def _line_ended(out: bytes | bytearray) -> bool:
    """Whether generated text holds a whole first line: a line end after some text (a
    suggestion that starts on a new line has its first line after that)."""
    head = out.lstrip(b" \t\r\n")
    return b"\n" in head or b"\r" in head
