"""A scripted stand-in for the llama.cpp model: the engine's own code runs on it, with a real
vocabulary and logits a test writes.

The vocabulary is llama.cpp's, loaded from a tiny vocab-only GGUF (``tests/ggufs.py``, the
Qwen2.5-Coder family: its FIM tokens and byte tokens, so any text tokenizes). The model
keeps a cache per sequence (position -> token) with llama.cpp's operations on it (truncate,
park, unpark, branch, take the branch), so the engine's mirror can be checked against it.
The logits at a position are the script's: a function of the token text the sequence holds
up to and including that position. No weights, no arithmetic: a unit test runs in
milliseconds and asserts what the engine computed from known logits.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt

from fimls.engine.device import Placement
from fimls.engine.llama import LlamaModel, Vocab
from tests.ggufs import write_vocab_gguf

# What comes after a text: {token text: probability}; the rest share what is left.
Script = Callable[[bytes], dict[bytes, float]]


def scripted_vocab(tmp: Path) -> tuple[Path, Vocab]:
    """A tiny Qwen2.5-Coder-like GGUF (vocabulary only) and its llama.cpp vocabulary."""
    path = write_vocab_gguf(tmp / "qwen-vocab.gguf", "qwen2.5-coder")
    return path, LlamaModel(path, vocab_only=True).vocab


class ScriptedModel:
    """The parts of :class:`fimls.engine.llama.LlamaModel` the engine uses."""

    def __init__(self, vocab: Vocab, script: Script, *, n_ctx: int = 2048,
                 n_batch: int = 256) -> None:
        self.vocab = vocab
        self.n_vocab = vocab.n_tokens
        self.script = script
        self.n_ctx, self.n_batch, self.threads = n_ctx, n_batch, 1
        self.cells: dict[int, dict[int, int]] = {0: {}, 1: {}, 2: {}}
        self._logits: list[npt.NDArray[np.float32]] = []
        self._abort_flag: Callable[[], bool] | None = None
        self.decoded = 0  # tokens evaluated, all sequences
        self.decode_log = None
        self.placement = Placement()
        self.load_warning: str | None = None

    # -- what the engine calls -----------------------------------------------------------

    # llama.cpp's side is scripted; the engine-facing plumbing above it is LlamaModel's own.
    set_abort = LlamaModel.set_abort
    unabortable = LlamaModel.unabortable
    decode = LlamaModel.decode
    prefill = LlamaModel.prefill

    def can_shift(self) -> bool:
        return True

    def decode_at(self, items: Sequence[tuple[int, int, int]], logits_at: Sequence[int]) -> bool:
        if len(items) > self.n_batch:
            raise ValueError(f"batch of {len(items)} exceeds n_batch {self.n_batch}")
        if self._abort_flag is not None and self._abort_flag():
            return False
        for tok, pos, seq in items:
            cells = self.cells[seq]
            if pos > 0 and pos - 1 not in cells:
                raise AssertionError(f"sequence {seq}: position {pos} decoded after a gap")
            cells[pos] = tok
        self.decoded += len(items)
        want = set(logits_at)
        self._logits = [self._logits_after(seq, pos) if i in want else self._none()
                        for i, (_tok, pos, seq) in enumerate(items)]
        return True

    def logits(self, i: int) -> npt.NDArray[np.float32]:
        return self._logits[i]

    def kv_len(self, seq: int = 0) -> int:
        cells = self.cells[seq]
        return max(cells) + 1 if cells else 0

    def kv_truncate(self, n_keep: int, seq: int = 0) -> None:
        self.cells[seq] = {p: t for p, t in self.cells[seq].items() if p < n_keep}

    def park(self, p0: int, p1: int) -> None:
        self.cells[1] = {p: t for p, t in self.cells[0].items() if p0 <= p < p1}
        self.cells[0] = {p: t for p, t in self.cells[0].items() if not p0 <= p < p1}

    def unpark(self, delta: int) -> None:
        self.cells[0].update({p + delta: t for p, t in self.cells[1].items()})
        self.cells[1] = {}

    def drop_parked(self, p0: int = -1, p1: int = -1) -> None:
        if p0 < 0:
            self.cells[1] = {}
        else:
            self.cells[1] = {p: t for p, t in self.cells[1].items() if not p0 <= p < p1}

    def branch(self, p: int, seq: int = 1) -> None:
        self.cells[seq] = {q: t for q, t in self.cells[0].items() if q < p}

    def take_branch(self, p: int, seq: int = 1) -> None:
        kept = {q: t for q, t in self.cells[0].items() if q < p}
        kept.update({q: t for q, t in self.cells[seq].items() if q >= p})
        self.cells[0], self.cells[seq] = kept, {}

    def close(self) -> None:
        pass

    # -- the script ----------------------------------------------------------------------

    def text_of(self, seq: int, upto: int) -> bytes:
        """The text sequence ``seq`` holds at positions 0..upto (special tokens as their
        text: a script may look for ``<|fim_middle|>``)."""
        cells = self.cells[seq]
        return b"".join(self.vocab.piece(cells[p]) for p in range(upto + 1) if p in cells)

    def _logits_after(self, seq: int, pos: int) -> npt.NDArray[np.float32]:
        probs = self.script(self.text_of(seq, pos))
        out = np.full(self.n_vocab, -30.0, dtype=np.float32)
        rest = max(1e-6, 1.0 - sum(probs.values()))
        out[:] = np.log(rest / self.n_vocab)
        for text, p in probs.items():
            tok = self.vocab.single_token(text.decode()) if text else None
            if tok is None:
                ids = self.vocab.tokenize(text)
                if len(ids) != 1:
                    raise ValueError(f"script's {text!r} is not one token: {ids}")
                tok = ids[0]
            out[tok] = np.log(p)
        return out

    def _none(self) -> npt.NDArray[np.float32]:
        return np.zeros(self.n_vocab, dtype=np.float32)


def continuing(text: str, *, after: str = "", p: float = 0.9,
               then: bytes | None = None) -> Script:
    """A script that writes ``text`` one byte token at a time once the sequence ends with
    ``after`` followed by the part of ``text`` written so far (each byte with probability
    ``p``); at its end ``then`` (None: the end of text token, ``<|endoftext|>``)."""
    data = text.encode()
    key = after.encode()

    def script(seen: bytes) -> dict[bytes, float]:
        for k in range(len(data), -1, -1):
            if seen.endswith(key + data[:k]):
                if k < len(data):
                    return {data[k:k + 1]: p}
                return {then if then is not None else b"<|endoftext|>": p}
        return {}
    return script
