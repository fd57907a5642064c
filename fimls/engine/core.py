"""The engine: one model, its context and what it keeps between requests.

The engine holds one llama.cpp context and mirrors exactly which tokens its KV cache holds
and, for positions where logits were computed, which token greedy decoding picks next
(:class:`fimls.engine.kvmirror.KvMirror`). A new request then:

1. builds its prompt (FIM or continuation; a continuation prompt is token-healed at the
   cursor);
2. for continuation prompts, aligns the prompt with the token path already in the cache
   (the previous prompt plus what the model generated), so that typing what was suggested
   needs no recomputation at all: the greedy choices along that path are already known;
3. evaluates only the tokens after the longest common prefix with the cache, in
   ``n_batch`` chunks with logits only at the last position (after an edit before the
   cursor, a FIM prompt's suffix is moved rather than recomputed: :mod:`.idle`);
4. decodes greedily (:mod:`.decode`), forcing the healed text, checking stop rules and
   cancellation after every token; where a drafter has a proposal worth verifying
   (:mod:`.speculation`), the last token and the draft go through the model in one batch,
   the longest agreeing prefix is kept, and the cache is rolled back past the first
   disagreement;
5. with other files' chunks in a FIM prompt, once the first line is written, reads the
   prompt a second time without the chunks (:mod:`.second`).

Evaluation is lazy: a token is decoded into the cache only when the logits after it are
needed, so a request that stops never pays for its last token. At idle the engine evaluates
the prompt the next request most likely needs (:mod:`.idle`); what a verify batch costs is
measured once per machine (:mod:`.costs`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, TypeVar

from fimls.drafting import DraftPolicy, PromptLookupDraft, common_prefix_len
from fimls.engine.alternatives import Alternatives
from fimls.engine.api import CompletionRequest, CompletionResult, EngineConfig, Prefill
from fimls.engine.costs import CostCalibration
from fimls.engine.cpu import extra_buffers_usable
from fimls.engine.decode import Decoder
from fimls.engine.device import resolve_gpu_layers
from fimls.engine.finish import set_outcome
from fimls.engine.idle import SUFFIX_FRESH_TOKENS, IdleWork
from fimls.engine.kvmirror import Cancelled, KvMirror
from fimls.engine.llama import LlamaModel, ModelLoadError
from fimls.engine.scoring import Scoring
from fimls.engine.second import SecondLine, SecondReading
from fimls.engine.speculation import Speculation
from fimls.latency import LatencyRecord, Outcome
from fimls.memo import SuggestionMemo
from fimls.models import catalogue_name
from fimls.prompt import FimTemplate, Prompt, PromptInput, build_prompt, detect_template
from fimls.sizing import PromptSizer, prior_rate

__all__ = ["SUFFIX_FRESH_TOKENS", "Cancelled", "Engine", "EngineConfig", "SecondLine"]

log = logging.getLogger(__name__)

_P = TypeVar("_P")

MAX_PATH_REMAINDER = 32  # bytes of typed text that may be forced after the cached path


class Engine(Decoder, Alternatives, Scoring, SecondReading, IdleWork, Speculation,
             CostCalibration):
    """Owns one model and its context; not thread-safe (one worker thread calls it)."""

    def __init__(self, cfg: EngineConfig, model: LlamaModel | None = None) -> None:
        """``model``: the loaded model to run (tests pass a scripted one); None loads
        ``cfg.model_path``."""
        self.cfg = cfg
        kernels_cache = cfg.cost_cache.with_name("cpu-kernels.json") if cfg.cost_cache else None
        self.gpu_layers = resolve_gpu_layers(cfg.n_gpu_layers)
        self.model = model if model is not None else LlamaModel(
            cfg.model_path, n_ctx=cfg.n_ctx, n_batch=cfg.n_batch, threads=cfg.threads,
            n_gpu_layers=self.gpu_layers,
            extra_buffers=extra_buffers_usable(cfg.model_path, kernels_cache))
        self.placement = self.model.placement
        self.warnings: list[str] = [w for w in [self.model.load_warning] if w]
        self.vocab = self.model.vocab
        self.template: FimTemplate = detect_template(self.vocab, order=cfg.fim_order)
        # A FIM engine answers typing its shown suggestion from its memo (see _run); the
        # scheduler answers those from its copy without waiting for this engine.
        self.typed_from_memo = self.template.kind == "fim"
        self.model_name = catalogue_name(cfg.model_path) or cfg.model_path.name
        self.cache = KvMirror(self.model)
        # Tests set a list here to see what each second reading computed. None costs nothing.
        self.second_log: list[SecondLine] | None = None
        # Sorting every token's piece once makes token healing a bisect, not a vocab scan.
        # Only continuation prompts are healed: a FIM engine sorts on the rare first need
        # (typed text forced after a cached path) rather than delaying every (re)start.
        if self.template.kind != "fim":
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
                       gpu=self.placement.gpu),
            fixed=cfg.prompt_tokens)
        self._unbuilt_sources: CompletionRequest | None = None
        self._buffer_tokens: dict[str, list[int]] = {}
        self.draft_model: Any = None
        if cfg.measure_costs:
            self.policy.prior = self._prior_costs()
        if cfg.draft_model is not None:
            self._load_draft_model(kernels_cache)
        log.info("model %s loaded: n_vocab=%d n_ctx=%d template=%s/%s", self.model_name,
                 self.vocab.n_tokens, self.model.n_ctx, self.template.kind,
                 self.template.family)

    def _load_draft_model(self, kernels_cache: Any) -> None:
        """The draft model of ``cfg``; a bad drafter must not cost the user their
        completions: it is refused, said so, and the engine carries on without it."""
        from fimls.engine.draft_model import ModelDraft

        cfg = self.cfg
        assert cfg.draft_model is not None
        known = self._vocab_checked()
        try:
            self.draft_model = ModelDraft(cfg.draft_model, self.vocab, self.model_name,
                                          n_ctx=cfg.n_ctx, n_batch=cfg.n_batch,
                                          threads=cfg.threads,
                                          # Where the main model fell back to the CPU,
                                          # its drafter follows, without a second warning.
                                          n_gpu_layers=self.gpu_layers if self.placement.gpu
                                          else 0,
                                          kernels_cache=kernels_cache, vocab_known=known)
        except ModelLoadError as exc:
            log.error("%s", exc)
            self.warnings.append(f"{exc}; continuing without a draft model")
        else:
            if not known:
                self._vocab_passed()
            if cfg.measure_costs:
                self.policy.draft_step_prior = self._draft_step_prior()

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

    def reset(self) -> None:
        """Forget the KV cache (after an error the cache contents are unknown)."""
        self.cache.reset()
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
            if common_prefix_len(toks, self.cache.tokens) < max(1, len(toks) // 2):
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

        if req.window:
            return make(min(req.window, self._prompt_cap(req.max_tokens)))
        return self._sized(make, lambda p: p.tokens, req.max_tokens)

    def _align_with_path(self, prompt: Prompt) -> tuple[list[int], bytes]:
        """Re-express the prompt along the cached token path when that covers more text.

        The path is the cached tokens plus the greedy token predicted after them. If the
        user typed what was suggested, the new text is a prefix of the path's text: use the
        path's tokens (all cached, greedy choices known) and force only the remainder.
        """
        if not self.cache.tokens:
            return prompt.tokens, prompt.constraint
        piece = self.vocab.text_piece
        full = b"".join(piece(t) for t in prompt.tokens) + prompt.constraint
        canonical_cover = len(full) - len(prompt.constraint)
        path = self.cache.path()
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

    # -- the request --------------------------------------------------------------------


    def complete(self, req: CompletionRequest, cancelled: Callable[[], bool]) -> CompletionResult:
        """Run one request to completion (or cancellation) and return its result."""
        # ts and model_ms span the same interval: the wall clock is read beside t_start,
        # not later in the record's constructor (a thread switch there skews the span).
        t_start, wall = time.monotonic(), time.time()
        alternatives: list[str] = []
        scores: list[float] = []
        rec = LatencyRecord(ts=wall, uri=req.uri, version=req.version, request_id=req.request_id,
                            model=self.model_name, backend=self.placement.backend,
                            gpu_layers=self.placement.gpu_layers,
                            queue_ms=(t_start - req.created) * 1000.0)
        self.model.set_abort(cancelled)
        try:
            if req.prefill == Prefill.NEXT:
                # The suggestion after accepting the shown one: generated, remembered
                # (FIM: in the memo; continuation: along the KV path), not returned.
                self._run(req, rec, cancelled)
                self._catch_up_draft(req, self.cache.tokens, cancelled)
                text = ""
            elif req.prefill:
                self._prefill_idle(req, rec, cancelled)
                text = ""
            elif req.score:
                scores = self._score_middles(req, rec, cancelled)
                text = ""
            else:
                text, st = self._decode(req, rec, cancelled)  # (gated: fimls.engine.finish)
                if req.alternatives and text and st is not None:
                    alternatives = self._alternatives(st, text)
        except Cancelled:
            rec.outcome = Outcome.CANCELLED
            text = ""
        finally:
            self.model.set_abort(None)
        t_end = time.monotonic()
        rec.total_ms = (t_end - req.created) * 1000.0
        rec.model_ms = (t_end - t_start) * 1000.0
        if req.prefill:
            rec.outcome = (Outcome.PREFILL if rec.outcome != Outcome.CANCELLED
                           else Outcome.PREFILL_STOPPED)
        elif req.score and rec.outcome != Outcome.CANCELLED:
            rec.outcome = Outcome.SCORED
        else:
            set_outcome(rec, text)
        return CompletionResult(text=text, record=rec, alternatives=alternatives,
                                scores=scores)
