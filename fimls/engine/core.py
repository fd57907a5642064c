"""The decode loop and the KV state it keeps between requests.

The engine holds one llama.cpp context and remembers exactly which tokens its KV cache
holds (``kv``) and, for positions where logits were computed, which token greedy decoding
picks next (``nxt``). A new request then:

1. builds its prompt (FIM or continuation, token-healed at the cursor);
2. for continuation prompts, aligns the prompt with the token path already in the cache
   (the previous prompt plus what the model generated), so that typing what was suggested
   needs no recomputation at all: the greedy choices along that path are already known;
3. evaluates only the tokens after the longest common prefix with the cache, in
   ``n_batch`` chunks with logits only at the last position;
4. decodes greedily, forcing the healed text, checking stop rules and cancellation after
   every token; where a drafter has a proposal worth verifying (see ``fimls.drafting``),
   the last token and the draft go through the model in one batch, the longest agreeing
   prefix is kept, and the cache is rolled back past the first disagreement.
5. with other files' chunks in a FIM prompt, once the first line is written, reads the
   prompt a second time without the chunks: where that reading writes another line, the
   prompt with the chunks scores it, and the likelier line is shown (see ``_second_line``).

Evaluation is lazy: a token is decoded into the cache only when the logits after it are
needed, so a request that stops never pays for its last token.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt

from fimls.drafting import Draft, DraftPolicy, PromptLookupDraft, common_prefix_len, monotone
from fimls.engine.api import CompletionRequest, CompletionResult, EngineConfig, gate
from fimls.engine.cpu import extra_buffers_usable
from fimls.engine.llama import LlamaModel, ModelLoadError
from fimls.latency import LatencyRecord
from fimls.memo import SuggestionMemo
from fimls.models import catalogue_name
from fimls.postprocess import (
    CursorContext,
    StopPolicy,
    banned_first_bytes,
    cut_to_budget,
    finalize,
)
from fimls.prompt import (
    FimTemplate,
    Prompt,
    PromptInput,
    build_prompt,
    detect_template,
    opening_prompt,
)
from fimls.sizing import PromptSizer, prior_rate

__all__ = ["Cancelled", "Engine", "EngineConfig"]

log = logging.getLogger(__name__)

_P = TypeVar("_P")


MIN_MEMO_SUGGESTION = 8  # replayed tokens that make a follow-up suggestion worth showing
# The suffix's first tokens (<suf> and about a line) are evaluated again after an edit
# before the cursor: they say most about what the gap holds, and kept from the cache they
# would still describe the old gap. Only the rest of the suffix is moved.
SUFFIX_FRESH_TOKENS = 16
# Idle prefill evaluates this many tokens per batch: a real request aborts the batch in
# flight, so smaller batches waste less; much smaller ones prefill slower.
IDLE_PREFILL_CHUNK = 128
# The draft model drafts only when its context is at most this many tokens behind the main
# model's: catching up on a new prompt (hundreds of tokens) costs more than drafting one
# suggestion can save, and cannot be stopped by a newer request. It catches up at idle.
DRAFT_SYNC_MAX = 64
MAX_PATH_REMAINDER = 32  # bytes of typed text that may be forced after the cached path
# The cache sequence that holds the prompt read without other files' chunks (the second
# reading; 0 is the prompt as built, 1 parks entries or holds a branch, see LlamaModel).
SECOND_SEQ = 2
# Reading the prompt without the chunks as well is worth it where it costs no more than the
# request costs anyway (a new place: both are read from scratch), or this little (a GPU,
# or both readings cached): see Engine._second_plan.
SECOND_FREE_SECONDS = 0.25


class Cancelled(Exception):
    """The request was cancelled or superseded while the engine worked on it."""


@dataclass(kw_only=True)
class _Decoding:
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


class Engine:
    """Owns one model and its context; not thread-safe (one worker thread calls it)."""

    def __init__(self, cfg: EngineConfig) -> None:
        self.cfg = cfg
        kernels_cache = cfg.cost_cache.with_name("cpu-kernels.json") if cfg.cost_cache else None
        self.model = LlamaModel(cfg.model_path, n_ctx=cfg.n_ctx, n_batch=cfg.n_batch,
                                threads=cfg.threads, n_gpu_layers=cfg.n_gpu_layers,
                                extra_buffers=extra_buffers_usable(cfg.model_path,
                                                                   kernels_cache))
        self.vocab = self.model.vocab
        self.template: FimTemplate = detect_template(self.vocab, order=cfg.fim_order)
        # A FIM engine answers typing its shown suggestion from its memo (see _run); the
        # scheduler answers those from its copy without waiting for this engine.
        self.typed_from_memo = self.template.kind == "fim"
        self.model_name = catalogue_name(cfg.model_path) or cfg.model_path.name
        self.kv: list[int] = []
        self.nxt: list[int | None] = []
        self.alt: list[int] = []  # what cache sequence SECOND_SEQ holds
        # Tests set a list here to see what each second reading computed. None costs nothing.
        self.second_log: list[SecondLine] | None = None
        # Probability of the greedy token after each position, where nxt was computed:
        # every place that sets an nxt entry sets this one too (via _greedy_at).
        self.nprob: dict[int, float] = {}
        self._fresh_from = 0
        self._evaluated = 0
        # Sorting every token's piece once makes token healing a bisect, not a vocab scan.
        self.vocab.tokens_consistent_with(b"x")
        self.lookup = PromptLookupDraft(max_ngram_size=cfg.ngram_max,
                                        num_pred_tokens=cfg.draft_max)
        self.policy = DraftPolicy(max_draft=min(cfg.draft_max, self.model.n_batch // 2 - 1))
        self.prev_gen: dict[str, list[int]] = {}
        self.memo = SuggestionMemo()
        # Only a PSM FIM prompt has its suffix after the text that changes.
        self._can_shift = (self.template.kind == "fim" and self.template.order == "psm"
                           and self.model.can_shift())
        self.sizer = PromptSizer(
            prior_rate(cfg.model_path.stat().st_size, self.model.threads,
                       gpu=cfg.n_gpu_layers != 0),
            fixed=cfg.prompt_tokens)
        self._unbuilt_sources: CompletionRequest | None = None
        self._buffer_tokens: dict[str, list[int]] = {}
        self.draft_model: Any = None
        if cfg.measure_costs:
            self.policy.prior = self._prior_costs()
        self.warnings: list[str] = []
        if cfg.draft_model is not None:
            from fimls.engine.draft_model import ModelDraft

            try:
                self.draft_model = ModelDraft(cfg.draft_model, self.vocab, self.model_name,
                                              n_ctx=cfg.n_ctx, n_batch=cfg.n_batch,
                                              threads=cfg.threads,
                                              n_gpu_layers=cfg.n_gpu_layers,
                                              kernels_cache=kernels_cache)
            except ModelLoadError as exc:
                # A bad drafter must not cost the user their completions: refuse it, say
                # so, and carry on without it.
                log.error("%s", exc)
                self.warnings.append(f"{exc}; continuing without a draft model")
            else:
                if cfg.measure_costs:
                    self.policy.draft_step_prior = self._measure_draft_step()
        log.info("model %s loaded: n_vocab=%d n_ctx=%d template=%s/%s", self.model_name,
                 self.vocab.n_tokens, self.model.n_ctx, self.template.kind,
                 self.template.family)

    def close(self) -> None:
        """Free native resources; keep what this run learned of verify costs as the next
        run's prior."""
        step = self.policy.timings.get(0)
        learned = [t for k, t in self.policy.timings.items() if k and t.samples]
        if (self.cfg.measure_costs and step is not None
                and step.samples >= DraftPolicy.FULL_WEIGHT and learned):
            self._write_cost_cache(self.policy.batch_cost)
        if self.draft_model is not None:
            self.draft_model.close()
        self.model.close()

    # -- EngineLike: an in-process engine has no process of its own to die or to interrupt.

    on_exit: Callable[[str], None] | None = None  # never called: nothing to exit

    @property
    def pid(self) -> int | None:
        """None: the model runs in the server's own process."""
        return None

    def interrupt(self, request_id: str) -> None:
        """Nothing to do: ``cancelled`` is polled on this process's own thread."""

    # -- cost model -----------------------------------------------------------------------

    def _probe_tokens(self) -> list[int]:
        text = "def probe(values):\n    total = 0\n    for v in values:\n        total += v\n"
        head = [self.vocab.bos] if self.vocab.bos >= 0 else []
        return (head + self.vocab.tokenize(text * 4))[:64]

    def _cost_key(self) -> str:
        st = self.cfg.model_path.stat()
        return (f"{self.cfg.model_path.resolve()}|{st.st_size}|{st.st_mtime_ns}|"
                f"{self.cfg.threads}|{self.cfg.n_gpu_layers}|{self.cfg.n_batch}|"
                f"{self.policy.max_draft}")

    def _read_cost_cache(self) -> dict[str, Any]:
        path = self.cfg.cost_cache
        if path is None:
            return {}
        try:
            table = json.loads(path.read_text())
        except (OSError, ValueError):
            return {}
        return table if isinstance(table, dict) else {}

    def _prior_costs(self) -> dict[int, float]:
        """The starting cost table: cached from an earlier run (measured at its start, or
        learned during it), else measured now. Real timings then refine it."""
        entry = self._read_cost_cache().get(self._cost_key())
        if isinstance(entry, dict):
            try:
                return {int(k): float(v) for k, v in entry.items()}
            except (TypeError, ValueError):
                pass
        costs = self.measure_batch_costs()
        self._write_cost_cache(costs)
        return costs

    def _write_cost_cache(self, costs: dict[int, float]) -> None:
        path = self.cfg.cost_cache
        if path is None:
            return
        table = self._read_cost_cache()
        table[self._cost_key()] = {str(k): round(v, 4) for k, v in sorted(costs.items())}
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(table))
        except OSError:
            log.debug("cannot cache verify costs at %s", path)

    def measure_batch_costs(self) -> dict[int, float]:
        """Time verify batches of k+1 positions against one step, on this machine.

        Matrix kernels change with the batch size (on a CPU, 5 positions can cost less
        than 3), so every draft length up to the maximum is timed, in interleaved rounds
        (the median of three), so a burst of load hits every length alike.
        """
        base = self._probe_tokens()
        n = len(base)
        self.model.kv_truncate(0)
        self.model.prefill(base, 0)
        extra = (base[1:] * 2)[:self.policy.max_draft + 1]
        lengths = [k for k in range(self.policy.max_draft + 1) if k + 1 <= self.model.n_batch // 2]
        samples: dict[int, list[float]] = {k: [] for k in lengths}
        for _ in range(3):
            for k in lengths:
                self.model.kv_truncate(n)
                t0 = time.perf_counter()
                self.model.decode(extra[:k + 1], n, list(range(k + 1)))
                for i in range(k + 1):
                    int(np.argmax(self.model.logits(i)))
                samples[k].append(time.perf_counter() - t0)
        self.model.kv_truncate(0)
        self.kv, self.nxt = [], []
        times = {k: sorted(v)[1] for k, v in samples.items()}
        costs = monotone({k: t / times[0] for k, t in times.items()})
        log.info("verify cost (x one step) by draft length: %s",
                 ", ".join(f"{k}:{c:.2f}" for k, c in sorted(costs.items())))
        return costs

    def _measure_draft_step(self) -> float:
        """The draft model's single step, relative to the main model's (a prior: real
        proposals refine it)."""
        dm = self.draft_model
        base = self._probe_tokens()

        def step(model: LlamaModel) -> float:
            model.kv_truncate(0)
            model.prefill(base, 0)
            best = float("inf")
            for _ in range(3):
                model.kv_truncate(len(base))
                t0 = time.perf_counter()
                model.decode(base[1:2], len(base), [0])
                int(np.argmax(model.logits(0)))
                best = min(best, time.perf_counter() - t0)
            model.kv_truncate(0)
            return best

        ratio = step(dm.model) / step(self.model)
        dm.kv = []
        self.kv, self.nxt = [], []
        log.info("draft model step costs %.2f main steps", ratio)
        return ratio

    def reset(self) -> None:
        """Forget the KV cache (after an error the cache contents are unknown)."""
        self.model.kv_truncate(0)
        self.model.kv_truncate(0, SECOND_SEQ)
        self.kv = []
        self.nxt = []
        self.alt = []
        self.nprob.clear()
        self.memo = SuggestionMemo()

    # -- prompt -------------------------------------------------------------------------

    def prompt_budget(self, max_tokens: int) -> int:
        """Tokens the prompt may use: sized by time (see fimls.sizing), and so that prompt
        plus output fit the context."""
        return self.sizer.budget(self._prompt_cap(max_tokens))

    def _prompt_cap(self, max_tokens: int) -> int:
        """The most tokens a prompt can have with ``max_tokens`` of output after it."""
        return self.model.n_ctx - max_tokens - 8

    def _observe_prefill(self, tokens: int, seconds: float) -> None:
        if self.sizer.observe(tokens, seconds):
            log.info("prefill runs at %.0f tokens/s here: prompts will be %d tokens "
                     "from the next one not in the cache", self.sizer.rate, self.sizer.tokens)

    def _sized(self, make: Callable[[int], _P], tokens: Callable[[_P], list[int]],
               max_tokens: int, built: _P | None = None) -> _P:
        """``make(budget)`` (``built``: already made with the current window), with a newly
        measured window only where the cache is lost anyway.

        The window's size decides its start: changing it under a prompt the cache holds
        would recompute the whole prompt for nothing. So the old window stays while it
        reuses at least half of the cache's prompt, and the new one is adopted at the first
        prompt that would be mostly evaluated anyway.
        """
        if built is None:
            built = make(self.prompt_budget(max_tokens))
        if self.sizer.pending:
            toks = tokens(built)
            if common_prefix_len(toks, self.kv) < max(1, len(toks) // 2):
                self.sizer.adopt()
                built = make(self.prompt_budget(max_tokens))
        return built

    def build(self, req: CompletionRequest) -> Prompt:
        """The prompt for a request, in the window the sizer gives (see :meth:`_sized`)."""
        inp = PromptInput(prefix=req.prefix, suffix=req.suffix, prefix_offset=req.prefix_offset,
                          repo_name=req.repo_name, rel_path=req.rel_path,
                          context=tuple(req.context), context_tokens=req.context_tokens)

        def make(budget: int) -> Prompt:
            return build_prompt(self.template, self.vocab, inp, budget)

        return self._sized(make, lambda p: p.tokens, req.max_tokens)

    def _align_with_path(self, prompt: Prompt) -> tuple[list[int], bytes]:
        """Re-express the prompt along the cached token path when that covers more text.

        The path is the cached tokens plus the greedy token predicted after them. If the
        user typed what was suggested, the new text is a prefix of the path's text: use the
        path's tokens (all cached, greedy choices known) and force only the remainder.
        """
        if not self.kv:
            return prompt.tokens, prompt.constraint
        piece = self.vocab.text_piece
        full = b"".join(piece(t) for t in prompt.tokens) + prompt.constraint
        canonical_cover = len(full) - len(prompt.constraint)
        path = list(self.kv)
        if self.nxt and self.nxt[-1] is not None:
            path.append(self.nxt[-1])
        if not path or path[0] != (prompt.tokens[0] if prompt.tokens else None):
            return prompt.tokens, prompt.constraint
        off = 0
        j = 0
        while j < len(path):
            p = piece(path[j])
            if full[off:off + len(p)] != p or off + len(p) > len(full):
                break
            off += len(p)
            j += 1
        # Prefer the path even when canonical tokenization covers a little more: the text
        # left over is forced while decoding, and along the path its tokens are known. But
        # only where the path gives more cached tokens than the canonical prompt shares
        # with the cache anyway: a short unrelated prompt must not be forced from BOS.
        if j == 0:
            return prompt.tokens, prompt.constraint
        if off < canonical_cover and (len(full) - off > MAX_PATH_REMAINDER
                                      or j <= common_prefix_len(path, prompt.tokens)):
            return prompt.tokens, prompt.constraint
        return path[:j], full[off:]

    # -- evaluation ---------------------------------------------------------------------

    def _reuse_suffix(self, tokens: list[int], common: int, rec: LatencyRecord,
                      cancelled: Callable[[], bool]) -> int:
        """After an edit before the cursor, move the cached suffix instead of recomputing it.

        A PSM prompt is ``... <pre> prefix <suf> suffix <mid>``: typing changes the prefix's
        last tokens, so the cache agrees with the new prompt only up to the cursor, yet the
        suffix's entries are there, at positions off by the edit's length. Everything from
        the first difference on is parked aside (llama.cpp evaluates a sequence only after
        its last position), the new prefix and the suffix's first ``SUFFIX_FRESH_TOKENS``
        are evaluated in the gap, the rest of the suffix is moved back to its new
        positions, and ``<mid>`` is evaluated for its logits. Stopped in the gap, the cache
        is put back as it was. Returns how many leading prompt tokens the cache now holds.
        The moved entries attended to the old prefix: an approximation, off with
        ``reuseSuffix: false``.
        """
        suf, mid = self.template.suf, self.template.mid
        n = len(tokens)
        try:
            new_at = tokens.index(suf, common)
            old_at = self.kv.index(suf, common)
        except ValueError:
            return common
        if mid < 0 or tokens[-1] != mid:
            return common
        length = n - 1 - new_at  # <suf> and the suffix; <mid> is evaluated again
        fresh = min(length, SUFFIX_FRESH_TOKENS)
        if (length - fresh < SUFFIX_FRESH_TOKENS
                or self.kv[old_at:old_at + length] != tokens[new_at:new_at + length]):
            return common  # little to keep, or the suffix changed
        if cancelled():
            raise Cancelled
        self._truncate(old_at + length)
        self.model.park(common, old_at + length)
        todo = tokens[common:new_at + fresh]
        t0 = time.perf_counter()
        try:
            done = self.model.prefill(todo, common, logits_last=False)
        except BaseException:
            self.model.drop_parked()
            self._truncate(common)
            raise
        if done < len(todo):
            # Stopped in the gap: the cache as it was (nothing was moved yet).
            self.model.kv_truncate(common)
            self.model.unpark(0)
            raise Cancelled
        self._evaluated += done
        self._observe_prefill(done, time.perf_counter() - t0)
        self.model.drop_parked(common, old_at + fresh)  # replaced by what was just evaluated
        self.model.unpark(new_at - old_at)
        # llama.cpp applies the move in the next decode, re-rotating the keys layer by
        # layer in place: aborted half-way, some layers would be rotated twice on the next
        # try. So this one decode (one token) cannot be aborted.
        with self.model.unabortable():
            ok = self.model.decode([mid], n - 1, [0])
        if not ok:
            self.model.kv_truncate(common)
            self._truncate(common)
            raise Cancelled
        self._evaluated += 1
        self._fresh_from = min(self._fresh_from, common)
        self.kv = list(tokens)
        self.nxt = self.nxt[:common] + [None] * (n - common)
        self.nxt[n - 1] = self._greedy_at(n - 1, self.model.logits(0))
        rec.shifted_tokens = length - fresh
        rec.prompt_ms = (time.perf_counter() - t0) * 1000.0
        return n

    def _truncate(self, n: int) -> None:
        """Make the cache (and our record of it) hold only the first ``n`` positions."""
        if n < len(self.kv):
            self._fresh_from = min(self._fresh_from, n)
            self.model.kv_truncate(n)
            del self.kv[n:]
            del self.nxt[n:]

    def _evaluate(self, seq: list[int], common: int, chunk: int | None = None) -> None:
        """Make the cache hold exactly ``seq`` with logits at its last position (in
        batches of ``chunk`` tokens, each kept as it is done)."""
        n = len(seq)
        start = min(common, n - 1)
        self._truncate(start)
        t0 = time.perf_counter()
        done = self.model.prefill(seq[start:], start, chunk=chunk)
        dt = time.perf_counter() - t0
        self.kv.extend(seq[start:start + done])
        self.nxt.extend([None] * done)
        self._evaluated += done
        if done < n - start:
            raise Cancelled
        self.nxt[n - 1] = self._greedy_at(n - 1, self.model.logits(-1))
        if done == 1:
            self.policy.observe(0, dt)
        else:
            self._observe_prefill(done, dt)

    def _greedy_at(self, pos: int, logits: npt.NDArray[np.float32]) -> int:
        """The greedy token after position ``pos``; its probability goes to ``nprob``
        (the suggestion's confidence is made of these)."""
        tok = int(np.argmax(logits))
        top = float(logits[tok])
        self.nprob[pos] = 1.0 / float(np.sum(np.exp(logits - top, dtype=np.float32)))
        return tok

    def _verify(self, seq: list[int], draft: list[int]) -> int:
        """Evaluate ``[seq[-1]] + draft`` in one batch; keep the agreeing prefix.

        Precondition: the cache holds exactly ``seq[:-1]``. Afterwards it holds ``seq`` plus
        the accepted draft tokens, with the greedy choice after each of them in ``nxt``.
        """
        n = len(seq)
        batch = [seq[-1], *draft]
        t0 = time.perf_counter()
        if not self.model.decode(batch, n - 1, list(range(len(batch)))):
            self.model.kv_truncate(n - 1)
            raise Cancelled
        self._evaluated += len(batch)
        preds = [self._greedy_at(n - 1 + i, self.model.logits(i)) for i in range(len(batch))]
        self.policy.observe(len(draft), time.perf_counter() - t0)
        a = 0
        while a < len(draft) and preds[a] == draft[a]:
            a += 1
        self.kv.extend(batch[:a + 1])
        self.nxt.extend(preds[:a + 1])
        # Roll the cache back past the first disagreement.
        self.model.kv_truncate(n + a)
        return a

    # -- the request --------------------------------------------------------------------

    def complete(self, req: CompletionRequest, cancelled: Callable[[], bool]) -> CompletionResult:
        """Run one request to completion (or cancellation) and return its result."""
        # ts and model_ms span the same interval: the wall clock is read beside t_start,
        # not later in the record's constructor (a thread switch there skews the span).
        t_start, wall = time.monotonic(), time.time()
        rec = LatencyRecord(ts=wall, uri=req.uri, version=req.version, request_id=req.request_id,
                            model=self.model_name,
                            queue_ms=(t_start - req.created) * 1000.0)
        self.model.set_abort(cancelled)
        try:
            if req.prefill == "next":
                # The suggestion after accepting the shown one: generated, remembered
                # (FIM: in the memo; continuation: along the KV path), not returned.
                self._run(req, rec, cancelled)
                self._catch_up_draft(req, self.kv, cancelled)
                text = ""
            elif req.prefill:
                self._prefill_idle(req, rec, cancelled)
                text = ""
            else:
                # Likely wrong: not shown. The memo keeps it, so typing it anyway still
                # finds it (a suggestion the user writes out is shown then).
                text = gate(self._run(req, rec, cancelled), rec, req.min_confidence)
        except Cancelled:
            rec.outcome = "cancelled"
            text = ""
        finally:
            self.model.set_abort(None)
        t_end = time.monotonic()
        rec.total_ms = (t_end - req.created) * 1000.0
        rec.model_ms = (t_end - t_start) * 1000.0
        if req.prefill:
            rec.outcome = "prefill" if rec.outcome != "cancelled" else "prefill_stopped"
        elif rec.outcome not in ("cancelled", "gated"):
            rec.outcome = "returned" if text else "empty"
        return CompletionResult(text=text, record=rec)

    def _prefill_idle(self, req: CompletionRequest, rec: LatencyRecord,
                      cancelled: Callable[[], bool]) -> None:
        """Evaluate, while the user is idle, the prompt the next request most likely needs.

        ``open``: the file's opening (the cursor is not known yet); ``cursor``: the whole
        prompt at the cursor. Small batches, each kept as soon as it is done: a real request
        stops this at once (mid-batch, through the abort callback) and loses only the batch
        in flight, and reuses whatever was evaluated before it.
        """
        alt: list[int] | None = None
        if req.prefill == "cursor":
            st = self._start(req, rec, cancelled)
            if st is None:
                return
            tokens, common, alt = st.seq, st.common, st.alt
            rec.evaluated_tokens = self._evaluated  # (moving the suffix evaluates the gap)
        else:
            inp = PromptInput(prefix=req.prefix, suffix="", repo_name=req.repo_name,
                              rel_path=req.rel_path, context=tuple(req.context),
                              context_tokens=req.context_tokens)
            tokens = self._sized(
                lambda budget: opening_prompt(self.template, self.vocab, inp, budget),
                lambda t: t, req.max_tokens)
            room = self.model.n_ctx - 2 * req.max_tokens - 16
            if len(tokens) + len(self.alt) > room:
                self._truncate_alt(0)  # (as in _second_plan)
            if (req.second_reading and self.template.kind == "fim" and req.context
                    and 2 * len(tokens) <= room):
                # The second reading's opening too (see _second_plan), once the first's is
                # read.
                alt = opening_prompt(self.template, self.vocab, inp,
                                     self.prompt_budget(req.max_tokens), without_context=True)
            common = common_prefix_len(tokens, self.kv)
            rec.prompt_tokens = len(tokens)
            rec.reused_tokens = common
            self._evaluated = 0
        if req.prefill == "cursor":
            # Also the greedy choice after the prompt: the request then starts decoding.
            t0 = time.perf_counter()
            try:
                if common < len(tokens):
                    self._evaluate(tokens, common, chunk=IDLE_PREFILL_CHUNK)
                if alt is not None:
                    # The second reading too, so that the request here finds both read.
                    rec.second_tokens += self._evaluate_alt(alt, chunk=IDLE_PREFILL_CHUNK)
            finally:
                rec.evaluated_tokens = self._evaluated
                rec.prompt_ms = (time.perf_counter() - t0) * 1000.0
            self._catch_up_draft(req, tokens, cancelled)
            return
        if common < len(tokens):
            self._truncate(common)
            t0 = time.perf_counter()
            done = self.model.prefill(tokens[common:], common, logits_last=False,
                                      chunk=IDLE_PREFILL_CHUNK)
            dt = time.perf_counter() - t0
            self.kv.extend(tokens[common:common + done])
            self.nxt.extend([None] * done)
            rec.evaluated_tokens = done
            rec.prompt_ms = dt * 1000.0
            if done < len(tokens) - common:
                raise Cancelled
            self._observe_prefill(done, dt)
        if alt is not None:
            rec.second_tokens += self._evaluate_alt(alt, chunk=IDLE_PREFILL_CHUNK)
        self._catch_up_draft(req, tokens, cancelled)

    def _catch_up_draft(self, req: CompletionRequest, tokens: list[int],
                        cancelled: Callable[[], bool]) -> None:
        """After the main model's idle work, the draft model evaluates the same tokens
        (stopped by a request like the rest), so the next request may draft with it."""
        dm = self.draft_model
        if dm is None or req.speculative not in ("auto", "model") or not tokens:
            return
        try:
            dm.catch_up(tokens, cancelled, IDLE_PREFILL_CHUNK)
        except Exception:
            log.exception("the draft model's idle catch-up failed")
            dm.reset()

    def _setup_drafters(self, req: CompletionRequest, prompt_tokens: list[int]) -> bool:
        """Prepare the lookup sources for this request; False when nothing may be drafted.

        Sources that need tokenizing (the suffix, other buffers) are built only when a draft
        is first asked for: most keystrokes are served from the cache and never draft.
        """
        mode = req.speculative
        self.lookup.clear()
        self._unbuilt_sources = None
        if mode == "off":
            return False
        if mode in ("auto", "lookup"):
            tail = self.prev_gen.get(req.uri)
            if tail:
                self.lookup.set_source("tail", tail)
            self.lookup.set_source("context", prompt_tokens)
            self._unbuilt_sources = req
        return bool(self.lookup.sources) or (self.draft_model is not None
                                             and mode in ("auto", "model"))

    def _build_lazy_sources(self) -> None:
        """Tokenize the suffix and other buffers for lookup, keeping source priority."""
        req = self._unbuilt_sources
        if req is None:
            return
        self._unbuilt_sources = None
        built = dict(self.lookup.sources)
        ordered: dict[str, Any] = {}
        if "tail" in built:
            ordered["tail"] = built["tail"]
        if self.template.kind == "continuation" and req.suffix:
            # FIM prompts already hold the suffix; continuation prompts do not.
            ordered["suffix"] = self.vocab.tokenize(req.suffix[:4096])
        ordered["context"] = built["context"]
        if req.neighbors:
            ordered["buffers"] = [t for text in req.neighbors for t in self._tokens_of(text)]
        # Only the buffers open now: no text of a closed one stays in this cache.
        keep = {text[:8192] for text in req.neighbors}
        for key in [k for k in self._buffer_tokens if k not in keep]:
            del self._buffer_tokens[key]
        self.lookup.clear()
        for name, toks in ordered.items():
            self.lookup.set_source(name, toks)

    def _tokens_of(self, text: str) -> list[int]:
        """Tokens of another buffer's head, cached: those buffers rarely change."""
        key = text[:8192]
        toks = self._buffer_tokens.get(key)
        if toks is None:
            toks = self.vocab.tokenize(key)
            self._buffer_tokens[key] = toks
            while len(self._buffer_tokens) > 16:
                self._buffer_tokens.pop(next(iter(self._buffer_tokens)))
        return toks

    def _propose(self, req: CompletionRequest, seq: list[int], generated: int) -> Draft | None:
        """The draft worth verifying now (already cut to the length worth it), or None."""
        mode = req.speculative
        force = mode in ("lookup", "model")
        budget = self.policy.max_draft
        if mode in ("auto", "lookup"):
            self._build_lazy_sources()
            d = self.lookup.propose(seq, budget, tail_pos=generated)
            if d is not None and (d.source == "tail" or self.draft_model is None
                                  or mode == "lookup"):
                k = self.policy.choose(d.source, len(d.tokens), d.match_len, force=force)
                if k > 0:
                    return Draft(d.tokens[:k], d.source, d.match_len)
        if (self.draft_model is not None and mode in ("auto", "model")
                and (mode == "model" or self.draft_model.behind(seq) <= DRAFT_SYNC_MAX)):
            k = self.policy.choose("model", budget, extra_cost=self.policy.draft_step_cost,
                                   force=force)
            if k > 0:
                t0 = time.perf_counter()
                d = self.draft_model.propose(seq, k)
                if d is not None:
                    self.policy.observe_draft(time.perf_counter() - t0, len(d.tokens))
                return d
        return None

    def _run(self, req: CompletionRequest, rec: LatencyRecord,
             cancelled: Callable[[], bool]) -> str:
        """The decode loop: next token (memo, draft or evaluate), constraint, emit."""
        fim = self.template.kind == "fim"
        if fim and req.speculative != "off":
            # Continuation prompts replay a typed suggestion along the KV path (see
            # _align_with_path); a FIM prompt changes before the suffix, so the text is
            # remembered instead.
            rest = self.memo.recall(req.uri, req.prefix, req.prefix_offset, req.suffix)
            if rest is not None:
                rec.stop = "memo"
                rec.ttft_ms = (time.monotonic() - req.created) * 1000.0
                return rest
        st = self._start(req, rec, cancelled)
        if st is None:
            return ""
        rec.stop = "max_tokens"
        while len(st.gen) < req.max_tokens:
            if cancelled():
                raise Cancelled
            if (req.max_time_ms and st.t_first is not None
                    and (time.monotonic() - st.t_first) * 1000.0 >= req.max_time_ms
                    and (cut := cut_to_budget(st.text)) is not None):
                rec.stop = "max_time"
                st.text = cut
                break
            if len(st.seq) >= self.model.n_ctx - 1:
                # A tiny context (or a huge max_tokens): stop before llama.cpp runs out.
                rec.stop = "context_full"
                break
            greedy = self._next_greedy(st)
            if greedy is None:
                break
            tok = self._constrain(st, *greedy)
            if tok is None:
                rec.stop = "no_token"
                break
            at = len(st.seq) - 1
            if not st.line_done and tok == greedy[0] and not st.remaining:
                # Forced (healed) text is the user's, not the model's guess: not counted.
                st.line_probs.append(self.nprob.get(at, 1.0))
            stop = self._emit(st, tok)
            if not st.line_done:
                st.line_done = _line_ended(st.out)
            if st.alt is not None and (st.line_done or stop):
                # The first line is written: the reading without the chunks may propose
                # another (a stop mid-line by the stop rules leaves nothing to compare).
                stop = (self._second_line(st, stop) if st.line_done or rec.stop == "eog"
                        else stop)
                st.alt = None
            if stop:
                break
        rec.generated_tokens = len(st.gen)
        rec.evaluated_tokens = self._evaluated
        if st.line_probs:
            rec.confidence = round(min(st.line_probs), 4)
            rec.confidence_mean = round(sum(st.line_probs) / len(st.line_probs), 4)
        if st.sources:
            rec.draft = max(st.sources, key=lambda k: st.sources[k])
        if st.t_first is not None:
            rec.decode_ms = (time.monotonic() - st.t_first) * 1000.0
        self._remember(req.uri, st.gen)
        text = finalize(st.text, st.ctx)
        if fim:
            self.memo.remember(req.uri, req.prefix, req.prefix_offset, req.suffix, text,
                               keep=req.prefill == "next")
        return text

    def _start(self, req: CompletionRequest, rec: LatencyRecord,
               cancelled: Callable[[], bool]) -> _Decoding | None:
        """Build and align the prompt, prepare the drafters; None if the prompt is empty."""
        spec = req.speculative != "off"
        if not spec:
            # Plain greedy decoding: nothing computed for an earlier request is reused but
            # the cache itself (no replay of earlier suggestions).
            self.nxt = [None] * len(self.kv)
        prompt = self.build(req)
        tokens, constraint = prompt.tokens, prompt.constraint
        if spec and self.template.kind == "continuation":
            tokens, constraint = self._align_with_path(prompt)
        rec.prompt_tokens = len(tokens)
        rec.context_tokens = prompt.context_tokens
        rec.context_sources = prompt.context_sources
        rec.window_tokens = prompt.window
        self._fresh_from = len(self.kv)  # nxt below this index predates the request
        self._evaluated = 0
        if not tokens:
            # Nothing to condition on (a model without BOS, an empty prefix): the logits
            # at hand belong to some earlier request.
            rec.stop = "empty_prompt"
            return None
        ctx = CursorContext.from_text(req.prefix, req.suffix)
        common = common_prefix_len(tokens, self.kv)
        if req.reuse_suffix and self._can_shift:
            common = self._reuse_suffix(tokens, common, rec, cancelled)
        rec.reused_tokens = min(common, len(tokens))
        alt = self._second_plan(req, prompt, tokens, common)
        return _Decoding(
            alt=alt, constraint=constraint,
            req=req, rec=rec, cancelled=cancelled, seq=list(tokens), common=common,
            remaining=constraint, ctx=ctx, policy=StopPolicy(ctx=ctx, max_lines=req.max_lines),
            drafting=self._setup_drafters(req, tokens),
            ban_leading=banned_first_bytes(ctx.mode, ctx.line_prefix))

    def _second_plan(self, req: CompletionRequest, prompt: Prompt, tokens: list[int],
                     common: int) -> list[int] | None:
        """The prompt without the chunks when this request's first line is to be read a
        second time (see :meth:`_second_line`), else None.

        The second reading is priced like a draft: it is read only where it costs at most
        what the request costs anyway (a new place: both prompts are read from scratch; on
        a GPU, little), and where both fit the cache together.
        """
        room = self.model.n_ctx - 2 * req.max_tokens - 16
        if len(tokens) + len(self.alt) > room:
            self._truncate_alt(0)  # its entries would crowd this prompt out of the cache
        if (not req.second_reading or self.template.kind != "fim"
                or prompt.context_tokens <= 0 or tokens != prompt.tokens):
            return None
        alt = prompt.without_context()
        if len(tokens) + len(alt) > room:
            return None
        cached = min(common_prefix_len(alt, self.alt), len(alt) - 1)
        extra = self.sizer.seconds(len(alt) - cached)
        if extra > max(self.sizer.seconds(len(tokens) - common), SECOND_FREE_SECONDS):
            return None
        return alt

    def _truncate_alt(self, n: int) -> None:
        """Make sequence SECOND_SEQ (and our record of it) hold only its first ``n``."""
        if n < len(self.alt):
            self.model.kv_truncate(n, SECOND_SEQ)
            del self.alt[n:]

    def _evaluate_alt(self, seq: list[int], chunk: int | None = None) -> int:
        """Make sequence SECOND_SEQ hold exactly ``seq``, with logits at its last position;
        returns how many tokens that evaluated."""
        n = len(seq)
        start = min(common_prefix_len(seq, self.alt), n - 1)
        self._truncate_alt(start)
        t0 = time.perf_counter()
        done = self.model.prefill(seq[start:], start, chunk=chunk, seq=SECOND_SEQ)
        self.alt.extend(seq[start:start + done])
        if done < n - start:
            raise Cancelled
        if done > 1:
            self._observe_prefill(done, time.perf_counter() - t0)
        return done

    def _second_line(self, st: _Decoding, stopped: bool) -> bool:
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
        alt, rec = st.alt, st.rec
        assert alt is not None
        line = list(st.gen)
        n0 = len(st.seq) - len(line)  # the prompt's length
        m = len(alt)
        rec.second_tokens += self._evaluate_alt(alt)
        views = [np.array(self.model.logits(-1), dtype=np.float32)]
        if len(line) > 1:
            if st.cancelled():
                raise Cancelled
            if not self.model.decode_at([(t, m + i, SECOND_SEQ) for i, t in
                                         enumerate(line[:-1])], list(range(len(line) - 1))):
                self.model.kv_truncate(m, SECOND_SEQ)
                raise Cancelled
            self.alt.extend(line[:-1])
            rec.second_tokens += len(line) - 1
            views += [self.model.logits(i) for i in range(len(line) - 1)]
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
        # Its own line from there, one token a step.
        self._truncate_alt(m + at)
        second = [*line[:at], own]
        reader.add(own)
        while not reader.done and len(second) < st.req.max_tokens:
            if st.cancelled():
                raise Cancelled
            pos = m + len(second) - 1
            if not self.model.decode_at([(second[-1], pos, SECOND_SEQ)], [0]):
                self.model.kv_truncate(pos, SECOND_SEQ)
                raise Cancelled
            self.alt.append(second[-1])
            rec.second_tokens += 1
            nxt = reader.choose(self.model.logits(0))
            if nxt is None:
                break
            second.append(nxt)
            reader.add(nxt)
        # Both lines' differing tokens as the prompt with the chunks sees them: the first
        # line's from its decoding (each the greedy choice), the second's in one batch on
        # a branch of the cache.
        p = n0 + at - 1  # the position whose logits chose token ``at``
        first_logp = 0.0
        for i in range(at, len(line)):
            if self.nxt[n0 + i - 1] != line[i] or (n0 + i - 1) not in self.nprob:
                first_logp = float("nan")  # a forced token: its probability is not known
                break
            first_logp += float(np.log(max(self.nprob[n0 + i - 1], 1e-30)))
        if not reader.done or math.isnan(first_logp):
            return self._second_done(st, "kept", line, second, at, first_logp, nan, stopped)
        self.model.branch(p)
        batch = [(st.seq[p], p, 1)] + [(t, p + 1 + i, 1) for i, t in enumerate(second[at:-1])]
        if not self.model.decode_at(batch, list(range(len(batch)))):
            self.model.drop_parked()
            raise Cancelled
        rec.second_tokens += len(batch)
        logits = [self.model.logits(i) for i in range(len(batch))]
        lps = [_logprob(lg, t) for lg, t in zip(logits, second[at:], strict=True)]
        if sum(lps) <= first_logp:
            self.model.drop_parked()
            return self._second_done(st, "kept", line, second, at, first_logp, sum(lps),
                                     stopped)
        # Show the second line: the branch becomes the cache, the decoding state goes back
        # to the prompt and takes the line's tokens again (forced text and stop rules
        # as for any token), with what the prompt with the chunks gave each.
        preds = [self._greedy_at(p + i, lg) for i, lg in enumerate(logits)]
        self.model.take_branch(p)
        del self.kv[p:]
        del self.nxt[p:]
        self.kv += [st.seq[p], *second[at:-1]]
        self.nxt += preds
        self._fresh_from = min(self._fresh_from, p)
        st.seq, st.gen, st.common = st.seq[:n0], [], n0
        st.out, st.text, st.remaining = bytearray(), "", st.constraint
        st.line_probs, st.line_done = [], False
        rec.stop = "max_tokens"  # (the first line's own stop no longer holds)
        stop = False
        for i, tok in enumerate(second):
            if not st.remaining:
                # Forced text is the user's, and a token the stop rules put in place of
                # the greedy one is not the model's guess (as in _run): not counted.
                if i >= at:
                    st.line_probs.append(float(np.exp(lps[i - at])))
                elif self.nxt[n0 + i - 1] == tok:
                    st.line_probs.append(self.nprob.get(n0 + i - 1, 1.0))
            stop = self._emit(st, tok)
            if stop:
                break
        st.line_done = _line_ended(st.out)
        return self._second_done(st, "taken", line, second, at, first_logp, sum(lps), stop)

    def _second_done(self, st: _Decoding, outcome: str, first: list[int], second: list[int],
                     at: int, first_logp: float, second_logp: float, stop: bool) -> bool:
        """Record what the second reading came to; returns ``stop``."""
        st.rec.second_line = outcome
        if self.second_log is not None:
            self.second_log.append(SecondLine(tuple(first), tuple(second), at, first_logp,
                                              second_logp, outcome))
        return stop

    def _next_greedy(self, st: _Decoding) -> tuple[int, bool] | None:
        """The greedy token after ``st.seq``, and whether its logits are live (just
        computed) rather than remembered; None when the request should stop here."""
        n = len(st.seq)
        rec = st.rec
        live = False
        if st.common >= n and self.nxt[n - 1] is not None:
            # Known from this request's verification, or (speculative modes) from the
            # generation that produced this token path: no compute at all.
            if n - 1 < self._fresh_from:
                rec.memo_tokens += 1
        elif (rec.memo_tokens >= MIN_MEMO_SUGGESTION and self._evaluated == 0
              and not st.remaining and st.out.strip()):
            # The user is typing the previous suggestion: its rest is shown as it was
            # rather than grown by one model step per keystroke.
            rec.stop = "memo_end"
            return None
        else:
            t0 = time.monotonic()
            draft = None
            if (st.drafting and st.prompt_done and not st.remaining and st.common >= n - 1
                    and n + self.policy.max_draft < self.model.n_ctx):
                self._truncate(n - 1)
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
        g = self.nxt[n - 1]
        assert g is not None
        return g, live

    def _constrain(self, st: _Decoding, greedy: int, live: bool) -> int | None:
        """``greedy``, or the best token that keeps the forced (healed) text and the
        no-leading-newline rule; None when no token can."""
        ban = b"" if st.out else st.ban_leading
        if self._allowed(greedy, st.remaining, ban):
            return greedy
        # Choose among the tokens that keep the constraint, from live logits (recomputed
        # if the greedy choice came from the cache).
        n = len(st.seq)
        if not live or len(self.kv) != n:
            self._evaluate(st.seq, n - 1)
            st.common = n
        return self._constrained_argmax(st.remaining, ban)

    def _emit(self, st: _Decoding, tok: int) -> bool:
        """Append ``tok`` to the output; True when the request stops here."""
        rec = st.rec
        if st.t_first is None:
            st.t_first = time.monotonic()
            rec.ttft_ms = (st.t_first - st.req.created) * 1000.0
        if tok in self.template.stop_ids or self.vocab.is_eog(tok):
            rec.stop = "eog"
            return True
        piece, st.remaining = _past_forced(self.vocab.text_piece(tok), st.remaining)
        n = len(st.seq)
        st.seq.append(tok)
        st.gen.append(tok)
        if st.common == n and n < len(self.kv) and self.kv[n] == tok:
            st.common = n + 1
        if piece:
            st.out += piece
            st.text = st.out.decode("utf-8", "ignore")
            cut = st.policy.cut(st.text)
            if cut is not None:
                st.text = st.text[:cut]
                rec.stop = "policy"
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

    def _remember(self, uri: str, generated: list[int]) -> None:
        """Keep the last suggestion's tokens per document: the best draft source there is."""
        if not generated:
            return
        self.prev_gen.pop(uri, None)
        self.prev_gen[uri] = list(generated)
        while len(self.prev_gen) > 64:
            self.prev_gen.pop(next(iter(self.prev_gen)))


class _LineReader:
    """Greedy choices along one line under the engine's rules for forced (healed) text and
    a leading newline, outside the decoding state (for the second reading)."""

    def __init__(self, engine: Engine, st: _Decoding) -> None:
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


def _logprob(logits: npt.NDArray[Any], tok: int) -> float:
    """log p(tok) under ``logits``."""
    x = np.asarray(logits, dtype=np.float64)
    top = float(np.max(x))
    return float(x[tok] - top - np.log(np.sum(np.exp(x - top))))
