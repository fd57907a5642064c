"""A small GGUF model as a drafter: greedy tokens on its own context, with its own KV reuse.

The draft model must share the main model's vocabulary (drafts cross over by token id);
that is checked once at load, and a mismatch is refused with a message naming both models.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from fimls.drafting import Draft, check_vocab_compatible, common_prefix_len, top_probability
from fimls.engine.cpu import extra_buffers_usable
from fimls.engine.llama import LlamaModel, ModelLoadError, Vocab


def vocab_texts(vocab: Vocab) -> list[bytes]:
    """Every token's stored text, in id order (what compatibility is judged on)."""
    return [vocab.token_text(i).encode("utf-8", "surrogatepass") for i in range(vocab.n_tokens)]


class ModelDraft:
    """Greedy drafts from a second model that sees the same token history."""

    def __init__(self, path: Path, main_vocab: Vocab, main_name: str, *, n_ctx: int,
                 n_batch: int, threads: int | None, n_gpu_layers: int,
                 p_min: float = 0.5, kernels_cache: Path | None = None,
                 vocab_known: bool = False) -> None:
        """``vocab_known``: an earlier start checked this pair's vocabularies."""
        if not vocab_known:
            self._check_vocab(path, main_vocab, main_name)
        self.model = LlamaModel(path, n_ctx=n_ctx, n_batch=n_batch, threads=threads,
                                n_gpu_layers=n_gpu_layers,
                                extra_buffers=extra_buffers_usable(path, kernels_cache))
        self.name = path.name
        self.p_min = p_min
        self.kv: list[int] = []

    @staticmethod
    def _check_vocab(path: Path, main_vocab: Vocab, main_name: str) -> None:
        """Refuse a model whose vocabulary differs, before any of its weights load."""
        probe = LlamaModel(path, vocab_only=True)
        try:
            why = check_vocab_compatible(main_name, vocab_texts(main_vocab), path.name,
                                         vocab_texts(probe.vocab))
        finally:
            probe.close()
        if why:
            raise ModelLoadError(f"refusing draft model: {why}")

    def close(self) -> None:
        """Free the draft model."""
        self.model.close()

    def reset(self) -> None:
        """Forget the draft context (its contents are unknown after an error)."""
        self.model.kv_truncate(0)
        self.kv = []

    def behind(self, history: Sequence[int]) -> int:
        """How many tokens of ``history`` the draft context would have to evaluate."""
        common = common_prefix_len(history, self.kv)
        return len(history) - min(common, len(history) - 1) if history else 0

    def _sync(self, history: Sequence[int], chunk: int | None = None) -> bool:
        """Make the draft context hold ``history`` with logits at its end; False when the
        abort predicate stopped it (the context then holds what was evaluated)."""
        hist = list(history)
        start = len(hist) - self.behind(hist)
        self.model.kv_truncate(start)
        del self.kv[start:]
        done = self.model.prefill(hist[start:], start, chunk=chunk)
        self.kv.extend(hist[start:start + done])
        return done == len(hist) - start

    def catch_up(self, history: Sequence[int], cancelled: Callable[[], bool],
                 chunk: int) -> bool:
        """Evaluate ``history`` at idle, in batches of ``chunk``, stopping as soon as
        ``cancelled`` says so (what was evaluated is kept). True when it is all held."""
        self.model.set_abort(cancelled)
        try:
            return self._sync(history, chunk)
        finally:
            self.model.set_abort(None)

    def propose(self, history: Sequence[int], n: int) -> Draft | None:
        """Up to ``n`` greedy tokens; stops early when the top probability is below p_min."""
        if n <= 0 or not history or len(history) + n >= self.model.n_ctx:
            return None
        if not self._sync(history):
            raise RuntimeError("draft decode aborted")
        out: list[int] = []
        pos = len(self.kv)
        for _ in range(n):
            tok, p = top_probability(np.asarray(self.model.logits(-1)))
            if p < self.p_min or self.model.vocab.is_eog(tok):
                break
            out.append(tok)
            if len(out) == n:
                break
            if not self.model.decode([tok], pos, [0]):
                break
            self.kv.append(tok)
            pos += 1
        return Draft(out, "model", 0) if out else None
