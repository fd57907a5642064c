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
   every token.

Evaluation is lazy: a token is decoded into the cache only when the logits after it are
needed, so a request that stops never pays for its last token.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fimls.engine.api import CompletionRequest, CompletionResult
from fimls.engine.llama import LlamaModel
from fimls.latency import LatencyRecord
from fimls.postprocess import CursorContext, StopPolicy, finalize
from fimls.prompt import FimTemplate, Prompt, PromptInput, build_prompt, detect_template

log = logging.getLogger(__name__)


class Cancelled(Exception):
    """The request was cancelled or superseded while the engine worked on it."""


@dataclass(kw_only=True)
class EngineConfig:
    """Model and context settings the engine is built with."""

    model_path: Path
    n_ctx: int = 4096
    n_batch: int = 512
    threads: int | None = None
    n_gpu_layers: int = 0
    fim_order: str = "auto"


def _lcp(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class Engine:
    """Owns one model and its context; not thread-safe (one worker thread calls it)."""

    def __init__(self, cfg: EngineConfig) -> None:
        self.cfg = cfg
        self.model = LlamaModel(cfg.model_path, n_ctx=cfg.n_ctx, n_batch=cfg.n_batch,
                                threads=cfg.threads, n_gpu_layers=cfg.n_gpu_layers)
        self.vocab = self.model.vocab
        self.template: FimTemplate = detect_template(self.vocab, order=cfg.fim_order)
        self.model_name = cfg.model_path.name
        self.kv: list[int] = []
        self.nxt: list[int | None] = []
        # Sorting every token's piece once makes token healing a bisect, not a vocab scan.
        self.vocab.tokens_consistent_with(b"x")
        log.info("model %s loaded: n_vocab=%d n_ctx=%d template=%s/%s", self.model_name,
                 self.vocab.n_tokens, self.model.n_ctx, self.template.kind,
                 self.template.family)

    def close(self) -> None:
        """Free native resources."""
        self.model.close()

    def reset(self) -> None:
        """Forget the KV cache (after an error the cache contents are unknown)."""
        self.model.kv_truncate(0)
        self.kv = []
        self.nxt = []

    # -- prompt -------------------------------------------------------------------------

    def prompt_budget(self, max_tokens: int) -> int:
        """Tokens the prompt may use so that prompt plus output fit the context."""
        return max(32, self.model.n_ctx - max_tokens - 8)

    def build(self, req: CompletionRequest) -> Prompt:
        """The canonical prompt for a request."""
        inp = PromptInput(prefix=req.prefix, suffix=req.suffix, prefix_offset=req.prefix_offset,
                          repo_name=req.repo_name,
                          rel_path=req.rel_path)
        return build_prompt(self.template, self.vocab, inp, self.prompt_budget(req.max_tokens))

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
        if j == 0 or off < canonical_cover:
            return prompt.tokens, prompt.constraint
        return path[:j], full[off:]

    # -- evaluation ---------------------------------------------------------------------

    def _evaluate(self, seq: list[int], common: int, cancelled: Callable[[], bool]) -> None:
        """Make the cache hold exactly ``seq`` with logits at its last position."""
        n = len(seq)
        start = min(common, n - 1)
        if start < len(self.kv):
            self.model.kv_truncate(start)
            del self.kv[start:]
            del self.nxt[start:]
        nb = self.model.n_batch
        pos = start
        while pos < n:
            if cancelled():
                raise Cancelled
            chunk = seq[pos:pos + nb]
            last = pos + len(chunk) == n
            ok = self.model.decode(chunk, pos, [len(chunk) - 1] if last else [])
            if not ok:
                self.model.kv_truncate(pos)
                raise Cancelled
            self.kv.extend(chunk)
            self.nxt.extend([None] * len(chunk))
            pos += len(chunk)
        self.nxt[n - 1] = int(np.argmax(self.model.logits(-1)))

    # -- the request --------------------------------------------------------------------

    def complete(self, req: CompletionRequest, cancelled: Callable[[], bool]) -> CompletionResult:
        """Run one request to completion (or cancellation) and return its result."""
        t_start = time.monotonic()
        rec = LatencyRecord(uri=req.uri, version=req.version, request_id=req.request_id,
                            model=self.model_name,
                            queue_ms=(t_start - req.created) * 1000.0)
        self.model.set_abort(cancelled)
        try:
            text = self._run(req, rec, cancelled, t_start)
        except Cancelled:
            rec.outcome = "cancelled"
            text = ""
        finally:
            self.model.set_abort(None)
        t_end = time.monotonic()
        rec.total_ms = (t_end - req.created) * 1000.0
        if rec.outcome != "cancelled":
            rec.outcome = "returned" if text else "empty"
        return CompletionResult(text=text, record=rec)

    def _run(self, req: CompletionRequest, rec: LatencyRecord, cancelled: Callable[[], bool],
             t_start: float) -> str:
        use_memo = req.speculative != "off"
        prompt = self.build(req)
        tokens, constraint = prompt.tokens, prompt.constraint
        if use_memo and self.template.kind == "continuation":
            tokens, constraint = self._align_with_path(prompt)
        ctx = CursorContext.from_text(req.prefix, req.suffix)
        policy = StopPolicy(ctx=ctx, max_lines=req.max_lines)
        stop_ids = self.template.stop_ids
        vocab = self.vocab

        seq = list(tokens)
        common = _lcp(seq, self.kv)
        rec.prompt_tokens = len(seq)
        rec.reused_tokens = min(common, len(seq))
        out = bytearray()
        remaining = constraint
        text = ""
        prompt_done = False
        t_first: float | None = None
        gen = 0
        rec.stop = "max_tokens"
        while gen < req.max_tokens:
            if cancelled():
                raise Cancelled
            n = len(seq)
            g: int | None = None
            if use_memo and common >= n and self.nxt[n - 1] is not None:
                g = self.nxt[n - 1]
                rec.memo_tokens += 1
                live = False
            else:
                t0 = time.monotonic()
                self._evaluate(seq, common, cancelled)
                common = n
                if not prompt_done:
                    rec.prompt_ms = (time.monotonic() - t0) * 1000.0
                g = self.nxt[n - 1]
                live = True
            prompt_done = True
            assert g is not None
            tok = g
            if remaining:
                p = vocab.text_piece(g)
                if not p or not (p.startswith(remaining) or remaining.startswith(p)):
                    if not live:
                        self._evaluate(seq, n - 1, cancelled)
                        common = n
                    cands = vocab.tokens_consistent_with(remaining)
                    if len(cands) == 0:
                        rec.stop = "no_token"
                        break
                    logits = self.model.logits(-1)
                    tok = int(cands[int(np.argmax(logits[cands]))])
            if t_first is None:
                t_first = time.monotonic()
                rec.ttft_ms = (t_first - req.created) * 1000.0
            if tok in stop_ids or vocab.is_eog(tok):
                rec.stop = "eog"
                break
            piece = vocab.text_piece(tok)
            if remaining:
                if piece.startswith(remaining):
                    piece = piece[len(remaining):]
                    remaining = b""
                else:
                    remaining = remaining[len(piece):]
                    piece = b""
            seq.append(tok)
            if common == n and n < len(self.kv) and self.kv[n] == tok:
                common = n + 1
            gen += 1
            if piece:
                out += piece
                text = out.decode("utf-8", "ignore")
                cut = policy.cut(text)
                if cut is not None:
                    text = text[:cut]
                    rec.stop = "policy"
                    break
        rec.generated_tokens = gen
        if t_first is not None:
            rec.decode_ms = (time.monotonic() - t_first) * 1000.0
        return finalize(text, ctx)
