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

Evaluation is lazy: a token is decoded into the cache only when the logits after it are
needed, so a request that stops never pays for its last token.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from fimls.drafting import Draft, DraftPolicy, PromptLookupDraft
from fimls.engine.api import CompletionRequest, CompletionResult, EngineConfig
from fimls.engine.llama import LlamaModel, ModelLoadError
from fimls.latency import LatencyRecord
from fimls.postprocess import CursorContext, StopPolicy, finalize
from fimls.prompt import FimTemplate, Prompt, PromptInput, build_prompt, detect_template

__all__ = ["Cancelled", "Engine", "EngineConfig"]

log = logging.getLogger(__name__)


MIN_MEMO_SUGGESTION = 8  # replayed tokens that make a follow-up suggestion worth showing
MAX_PATH_REMAINDER = 32  # bytes of typed text that may be forced after the cached path


class Cancelled(Exception):
    """The request was cancelled or superseded while the engine worked on it."""


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
        self._fresh_from = 0
        self._evaluated = 0
        # Sorting every token's piece once makes token healing a bisect, not a vocab scan.
        self.vocab.tokens_consistent_with(b"x")
        self.lookup = PromptLookupDraft(max_ngram_size=cfg.ngram_max,
                                        num_pred_tokens=cfg.draft_max)
        self.policy = DraftPolicy(max_draft=min(cfg.draft_max, self.model.n_batch // 2 - 1))
        self.prev_gen: dict[str, list[int]] = {}
        self._unbuilt_sources: CompletionRequest | None = None
        self._buffer_tokens: dict[str, list[int]] = {}
        self.draft_model: Any = None
        if cfg.measure_costs:
            self.policy.batch_cost = self._cached_costs()
        self.warnings: list[str] = []
        self.draft_step_cost = 0.0
        if cfg.draft_model is not None:
            from fimls.engine.draft_model import ModelDraft

            try:
                self.draft_model = ModelDraft(cfg.draft_model, self.vocab, self.model_name,
                                              n_ctx=cfg.n_ctx, n_batch=cfg.n_batch,
                                              threads=cfg.threads,
                                              n_gpu_layers=cfg.n_gpu_layers)
            except ModelLoadError as exc:
                # A bad drafter must not cost the user their completions: refuse it, say
                # so, and carry on without it.
                log.error("%s", exc)
                self.warnings.append(f"{exc}; continuing without a draft model")
            else:
                self.draft_step_cost = (self._measure_draft_step() if cfg.measure_costs
                                        else 1.0)
        log.info("model %s loaded: n_vocab=%d n_ctx=%d template=%s/%s", self.model_name,
                 self.vocab.n_tokens, self.model.n_ctx, self.template.kind,
                 self.template.family)

    def close(self) -> None:
        """Free native resources."""
        if self.draft_model is not None:
            self.draft_model.close()
        self.model.close()

    # -- cost model -----------------------------------------------------------------------

    def _probe_tokens(self) -> list[int]:
        text = "def probe(values):\n    total = 0\n    for v in values:\n        total += v\n"
        head = [self.vocab.bos] if self.vocab.bos >= 0 else []
        return (head + self.vocab.tokenize(text * 4))[:64]

    def _cached_costs(self) -> dict[int, float]:
        """Batch costs for this model and settings, measured once per machine and cached."""
        import json

        from fimls.models import cache_dir

        st = self.cfg.model_path.stat()
        key = (f"{self.cfg.model_path.resolve()}|{st.st_size}|{st.st_mtime_ns}|"
               f"{self.cfg.threads}|{self.cfg.n_gpu_layers}|{self.cfg.n_batch}|{self.policy.max_draft}")
        path = cache_dir() / "verify-costs.json"
        try:
            table = json.loads(path.read_text())
        except (OSError, ValueError):
            table = {}
        if isinstance(table, dict) and isinstance(table.get(key), dict):
            try:
                return {int(k): float(v) for k, v in table[key].items()}
            except (TypeError, ValueError):
                pass
        costs = self.measure_batch_costs()
        if not isinstance(table, dict):
            table = {}
        table[key] = costs
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(table))
        except OSError:
            log.debug("cannot cache verify costs at %s", path)
        return costs

    def measure_batch_costs(self) -> dict[int, float]:
        """Time verify batches of k+1 positions against one step, on this machine.

        Matrix kernels change with the batch size (on a CPU, 5 positions can cost less
        than 3), so every draft length up to the maximum is timed.
        """
        base = self._probe_tokens()
        n = len(base)
        self.model.kv_truncate(0)
        self.model.decode(base, 0, [n - 1])
        times: dict[int, float] = {}
        extra = (base[1:] * 2)[:self.policy.max_draft + 1]
        for k in range(self.policy.max_draft + 1):
            if k + 1 > self.model.n_batch // 2:
                break
            best = float("inf")
            for _ in range(2 if k else 5):
                self.model.kv_truncate(n)
                t0 = time.perf_counter()
                self.model.decode(extra[:k + 1], n, list(range(k + 1)))
                for i in range(k + 1):
                    int(np.argmax(self.model.logits(i)))
                best = min(best, time.perf_counter() - t0)
            times[k] = best
        self.model.kv_truncate(0)
        self.kv, self.nxt = [], []
        costs = {k: t / times[0] for k, t in times.items()}
        log.info("verify cost (x one step) by draft length: %s",
                 ", ".join(f"{k}:{c:.2f}" for k, c in sorted(costs.items())))
        return costs

    def _measure_draft_step(self) -> float:
        """The draft model's single step, relative to the main model's."""
        dm = self.draft_model
        base = self._probe_tokens()

        def step(model: LlamaModel) -> float:
            model.kv_truncate(0)
            model.decode(base, 0, [len(base) - 1])
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
        self.kv = []
        self.nxt = []

    # -- prompt -------------------------------------------------------------------------

    def prompt_budget(self, max_tokens: int) -> int:
        """Tokens the prompt may use so that prompt plus output fit the context."""
        return max(8, self.model.n_ctx - max_tokens - 8)

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
        # Prefer the path even when canonical tokenization covers a little more: the text
        # left over is forced while decoding, and along the path its tokens are known. But
        # only where the path gives more cached tokens than the canonical prompt shares
        # with the cache anyway: a short unrelated prompt must not be forced from BOS.
        if j == 0:
            return prompt.tokens, prompt.constraint
        if off < canonical_cover and (len(full) - off > MAX_PATH_REMAINDER
                                      or j <= _lcp(path, prompt.tokens)):
            return prompt.tokens, prompt.constraint
        return path[:j], full[off:]

    # -- evaluation ---------------------------------------------------------------------

    def _evaluate(self, seq: list[int], common: int, cancelled: Callable[[], bool]) -> None:
        """Make the cache hold exactly ``seq`` with logits at its last position."""
        n = len(seq)
        start = min(common, n - 1)
        self._fresh_from = min(self._fresh_from, start)
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
            self._evaluated += len(chunk)
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
            text = self._run(req, rec, cancelled)
        except Cancelled:
            rec.outcome = "cancelled"
            text = ""
        finally:
            self.model.set_abort(None)
        t_end = time.monotonic()
        rec.total_ms = (t_end - req.created) * 1000.0
        rec.model_ms = (t_end - t_start) * 1000.0
        if rec.outcome != "cancelled":
            rec.outcome = "returned" if text else "empty"
        return CompletionResult(text=text, record=rec)

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

    def _propose(self, req: CompletionRequest, seq: list[int]) -> tuple[Draft, int] | None:
        """The draft worth verifying now and how many of its tokens, or None."""
        mode = req.speculative
        force = mode in ("lookup", "model")
        budget = self.policy.max_draft
        if mode in ("auto", "lookup"):
            self._build_lazy_sources()
            d = self.lookup.propose(seq, budget)
            if d is not None and (d.source == "tail" or self.draft_model is None
                                  or mode == "lookup"):
                k = self.policy.choose(d.source, len(d.tokens), d.match_len, force=force)
                if k > 0:
                    return Draft(d.tokens[:k], d.source, d.match_len), k
        if self.draft_model is not None and mode in ("auto", "model"):
            k = self.policy.choose("model", budget, extra_cost=self.draft_step_cost,
                                   force=force)
            if k > 0:
                d = self.draft_model.propose(seq, k)
                if d is not None:
                    return d, len(d.tokens)
        return None

    def _verify(self, seq: list[int], draft: list[int], cancelled: Callable[[], bool]) -> int:
        """Evaluate ``[seq[-1]] + draft`` in one batch; keep the agreeing prefix.

        Precondition: the cache holds exactly ``seq[:-1]``. Afterwards it holds ``seq`` plus
        the accepted draft tokens, with the greedy choice after each of them in ``nxt``.
        """
        n = len(seq)
        batch = [seq[-1], *draft]
        if cancelled():
            raise Cancelled
        if not self.model.decode(batch, n - 1, list(range(len(batch)))):
            self.model.kv_truncate(n - 1)
            raise Cancelled
        self._evaluated += len(batch)
        preds = [int(np.argmax(self.model.logits(i))) for i in range(len(batch))]
        a = 0
        while a < len(draft) and preds[a] == draft[a]:
            a += 1
        self.kv.extend(batch[:a + 1])
        self.nxt.extend(preds[:a + 1])
        # Roll the cache back past the first disagreement.
        self.model.kv_truncate(n + a)
        return a

    def _run(self, req: CompletionRequest, rec: LatencyRecord,
             cancelled: Callable[[], bool]) -> str:
        spec = req.speculative != "off"
        if not spec:
            # Plain greedy decoding: nothing computed for an earlier request is reused but
            # the cache itself (no replay of earlier suggestions).
            self.nxt = [None] * len(self.kv)
        prompt = self.build(req)
        tokens, constraint = prompt.tokens, prompt.constraint
        if spec and self.template.kind == "continuation":
            tokens, constraint = self._align_with_path(prompt)
        drafting = self._setup_drafters(req, tokens)
        ctx = CursorContext.from_text(req.prefix, req.suffix)
        policy = StopPolicy(ctx=ctx, max_lines=req.max_lines)
        # On a blank line a suggestion never starts with a newline (it would be invisible
        # ghost text); ruling it out while decoding, rather than trimming it afterwards,
        # keeps the shown text identical to the model's token path, so typing it reuses it.
        ban_leading_newline = ctx.mode != "line" and not ctx.line_prefix.strip()
        stop_ids = self.template.stop_ids
        vocab = self.vocab

        seq = list(tokens)
        common = _lcp(seq, self.kv)
        self._fresh_from = len(self.kv)  # nxt below this index predates the request
        self._evaluated = 0
        rec.prompt_tokens = len(seq)
        rec.reused_tokens = min(common, len(seq))
        out = bytearray()
        remaining = constraint
        text = ""
        prompt_done = False
        t_first: float | None = None
        gen_tokens: list[int] = []
        sources: dict[str, int] = {}
        rec.stop = "max_tokens"
        while len(gen_tokens) < req.max_tokens:
            if cancelled():
                raise Cancelled
            n = len(seq)
            if n >= self.model.n_ctx - 1:
                # A tiny context (or a huge max_tokens): stop before llama.cpp runs out.
                rec.stop = "context_full"
                break
            live = False
            if common >= n and self.nxt[n - 1] is not None:
                # Known from this request's verification, or (speculative modes) from the
                # generation that produced this token path: no compute at all.
                if n - 1 < self._fresh_from:
                    rec.memo_tokens += 1
            elif (rec.memo_tokens >= MIN_MEMO_SUGGESTION and self._evaluated == 0
                  and not remaining and out.strip()):
                # The user is typing the previous suggestion: its rest is shown as it was
                # rather than grown by one model step per keystroke.
                rec.stop = "memo_end"
                break
            else:
                t0 = time.monotonic()
                proposal = None
                if (drafting and prompt_done and not remaining and common >= n - 1
                        and n + self.policy.max_draft < self.model.n_ctx):
                    if len(self.kv) > n - 1:
                        self._fresh_from = min(self._fresh_from, n - 1)
                        self.model.kv_truncate(n - 1)
                        del self.kv[n - 1:]
                        del self.nxt[n - 1:]
                    proposal = self._propose(req, seq)
                if proposal is not None:
                    draft, _k = proposal
                    accepted = self._verify(seq, draft.tokens, cancelled)
                    rec.drafted_tokens += len(draft.tokens)
                    rec.accepted_tokens += accepted
                    rec.draft_batches += 1
                    sources[draft.source] = sources.get(draft.source, 0) + accepted
                    self.policy.record(draft.source, len(draft.tokens), accepted)
                else:
                    self._evaluate(seq, common, cancelled)
                common = n
                if not prompt_done:
                    rec.prompt_ms = (time.monotonic() - t0) * 1000.0
                live = True
            prompt_done = True
            g = self.nxt[n - 1]
            assert g is not None
            tok = g
            no_newline = not out and ban_leading_newline
            if not self._allowed(g, remaining, no_newline):
                # The greedy token breaks a constraint: choose among the tokens that keep
                # it, from live logits (recomputed if the choice came from the cache).
                if not live or len(self.kv) != n:
                    self._evaluate(seq, n - 1, cancelled)
                    common = n
                pick = self._constrained_argmax(remaining, no_newline)
                if pick is None:
                    rec.stop = "no_token"
                    break
                tok = pick
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
            gen_tokens.append(tok)
            if common == n and n < len(self.kv) and self.kv[n] == tok:
                common = n + 1
            if piece:
                out += piece
                text = out.decode("utf-8", "ignore")
                cut = policy.cut(text)
                if cut is not None:
                    text = text[:cut]
                    rec.stop = "policy"
                    break
        rec.generated_tokens = len(gen_tokens)
        rec.evaluated_tokens = self._evaluated
        if sources:
            rec.draft = max(sources, key=lambda k: sources[k])
        if t_first is not None:
            rec.decode_ms = (time.monotonic() - t_first) * 1000.0
        self._remember(req.uri, gen_tokens)
        return finalize(text, ctx)

    def _allowed(self, tok: int, remaining: bytes, no_newline: bool) -> bool:
        """Whether ``tok`` keeps the forced text and the no-leading-newline rule."""
        if not remaining and not no_newline:
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
        return not (no_newline and p[:1] in (b"\n", b"\r"))

    def _constrained_argmax(self, remaining: bytes, no_newline: bool) -> int | None:
        """The best allowed token from the last logits."""
        logits = self.model.logits(-1)
        if remaining:
            cands = self.vocab.tokens_consistent_with(remaining)
            if no_newline:
                cands = np.asarray([t for t in cands.tolist()
                                    if self._allowed(int(t), remaining, True)], dtype=np.int64)
            if len(cands) == 0:
                return None
            return int(cands[int(np.argmax(logits[cands]))])
        masked = np.array(logits, copy=True)
        masked[self.vocab.tokens_starting_with_newline()] = -np.inf
        return int(np.argmax(masked))

    def _remember(self, uri: str, generated: list[int]) -> None:
        """Keep the last suggestion's tokens per document: the best draft source there is."""
        if not generated:
            return
        self.prev_gen.pop(uri, None)
        self.prev_gen[uri] = list(generated)
        while len(self.prev_gen) > 64:
            self.prev_gen.pop(next(iter(self.prev_gen)))
