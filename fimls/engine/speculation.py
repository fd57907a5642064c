"""Which draft a request verifies next: prompt lookup over the last suggestion, the prompt,
the suffix and other buffers, or the draft model, each only where it pays (see
:mod:`fimls.drafting`); and the engine's side of a verification."""

from __future__ import annotations

import time
from typing import Any

from fimls.drafting import Draft
from fimls.engine.api import CompletionRequest
from fimls.engine.parts import EngineParts

# The draft model drafts only when its context is at most this many tokens behind the main
# model's: catching up on a new prompt (hundreds of tokens) costs more than drafting one
# suggestion can save, and cannot be stopped by a newer request. It catches up at idle.
DRAFT_SYNC_MAX = 64


class Speculation(EngineParts):
    """Drafting (a part of :class:`fimls.engine.core.Engine`)."""

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

    def _verify(self, seq: list[int], draft: list[int]) -> int:
        """Evaluate ``[seq[-1]] + draft`` in one batch and keep the agreeing prefix (see
        :meth:`fimls.engine.kvmirror.KvMirror.verify`); the batch's time teaches the
        policy what verifying costs."""
        accepted, dt = self.cache.verify(seq, draft)
        self.policy.observe(len(draft), dt)
        return accepted

    def _remember(self, uri: str, generated: list[int]) -> None:
        """Keep the last suggestion's tokens per document: the best draft source there is."""
        if not generated:
            return
        self.prev_gen.pop(uri, None)
        self.prev_gen[uri] = list(generated)
        while len(self.prev_gen) > 64:
            self.prev_gen.pop(next(iter(self.prev_gen)))
