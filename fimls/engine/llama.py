"""A thin, typed wrapper over llama-cpp-python's low-level C API.

Only what the decode loop needs: load a model, tokenize, render pieces, decode a batch
with logits at chosen positions, read one position's logits as a NumPy view, and trim the
KV cache. The high-level ``llama_cpp.Llama`` class is avoided on purpose: its draft-model
path forces ``logits_all`` (n_ctx x n_vocab floats), and its ``suffix=`` FIM is broken.
"""

from __future__ import annotations

import bisect
import collections
import contextlib
import ctypes
import logging
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import llama_cpp as L
import numpy as np
import numpy.typing as npt

from fimls.engine.api import ModelLoadError, check_gguf_file
from fimls.engine.cpu import extra_buffers_usable
from fimls.engine.device import Placement, placement

__all__ = ["DecodeCall", "LlamaModel", "ModelLoadError", "Vocab", "check_gguf_file"]

log = logging.getLogger(__name__)

_backend_lock = threading.Lock()
_backend_ready = False
_log_callback: Any = None  # keep the ctypes callback alive for the process lifetime
# llama.cpp's last error lines: a failed load returns only NULL, the cause is logged.
_native_errors: collections.deque[str] = collections.deque(maxlen=4)

# ggml_log_level: 1 debug, 2 info, 3 warn, 4 error, 5 continuation. Load-time info and the
# warnings every GGUF triggers (SWA cache size, token types) are chatter for our users.
_LLAMA_LEVELS = {1: logging.DEBUG, 2: logging.DEBUG, 3: logging.INFO, 4: logging.ERROR,
                 5: logging.DEBUG}


_ABORT_NOISE = (b"compute_async failed with error 1", b"failed to compute graph, compute status: 1",
                b"failed to decode, ret = 2")


def _is_abort_noise(text: bytes) -> bool:
    """llama.cpp logs a cancelled batch (our abort callback) as errors; it is routine."""
    return any(s in text for s in _ABORT_NOISE)


def _route_native_logs() -> None:
    """Send llama.cpp's chatter to Python logging (stderr) at debug level, not raw stderr."""
    global _log_callback
    native = logging.getLogger("fimls.native")

    @L.llama_log_callback
    def _cb(level: int, text: bytes, _user: ctypes.c_void_p) -> None:
        lvl = _LLAMA_LEVELS.get(level, logging.DEBUG)
        if lvl >= logging.ERROR and _is_abort_noise(text):
            lvl = logging.DEBUG
        if lvl >= logging.ERROR:
            _native_errors.append(text.decode("utf-8", "replace").strip())
        if native.isEnabledFor(lvl):
            native.log(lvl, "%s", text.decode("utf-8", "replace").rstrip())

    _log_callback = _cb
    L.llama_log_set(_cb, ctypes.c_void_p(0))


def backend_init() -> None:
    """Initialise llama.cpp once per process."""
    global _backend_ready
    with _backend_lock:
        if not _backend_ready:
            _route_native_logs()
            L.llama_backend_init()
            _backend_ready = True


class Vocab:
    """Token-level view of a model's vocabulary (tokenize, pieces, special ids)."""

    def __init__(self, model_ptr: Any) -> None:
        self._vocab = L.llama_model_get_vocab(model_ptr)
        self.n_tokens: int = L.llama_vocab_n_tokens(self._vocab)
        self.bos: int = L.llama_vocab_bos(self._vocab)
        self.eos: int = L.llama_vocab_eos(self._vocab)
        self.eot: int = L.llama_vocab_eot(self._vocab)
        self.add_bos: bool = bool(L.llama_vocab_get_add_bos(self._vocab))
        self.fim_pre: int = L.llama_vocab_fim_pre(self._vocab)
        self.fim_suf: int = L.llama_vocab_fim_suf(self._vocab)
        self.fim_mid: int = L.llama_vocab_fim_mid(self._vocab)
        self.fim_pad: int = L.llama_vocab_fim_pad(self._vocab)
        self.fim_rep: int = L.llama_vocab_fim_rep(self._vocab)
        self.fim_sep: int = L.llama_vocab_fim_sep(self._vocab)
        self._piece_cache: dict[int, bytes] = {}
        self._sorted: tuple[list[bytes], list[int]] | None = None
        self._first_byte_ids: dict[bytes, npt.NDArray[np.int64]] = {}

    def tokenize(self, text: str | bytes, *, add_special: bool = False,
                 parse_special: bool = False) -> list[int]:
        """Tokenize ``text``; ``add_special`` adds BOS where the model wants one."""
        data = text.encode("utf-8") if isinstance(text, str) else text
        cap = len(data) + 16
        buf = (L.llama_token * cap)()
        n = L.llama_tokenize(self._vocab, data, len(data), buf, cap, add_special, parse_special)
        if n < 0:
            cap = -n
            buf = (L.llama_token * cap)()
            n = L.llama_tokenize(self._vocab, data, len(data), buf, cap, add_special,
                                 parse_special)
        return list(buf[:n])

    def piece(self, token: int) -> bytes:
        """The bytes a token renders to (special tokens render as their text)."""
        cached = self._piece_cache.get(token)
        if cached is not None:
            return cached
        buf = ctypes.create_string_buffer(64)
        n = L.llama_token_to_piece(self._vocab, token, buf, 64, 0, True)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = L.llama_token_to_piece(self._vocab, token, buf, -n, 0, True)
        out = buf.raw[:n]
        self._piece_cache[token] = out
        return out

    def text_piece(self, token: int) -> bytes:
        """The bytes a token contributes to generated text: nothing for control tokens."""
        if self.is_control(token):
            return b""
        return self.piece(token)

    def token_text(self, token: int) -> str:
        """The vocabulary entry's raw text (as stored in the GGUF)."""
        raw = L.llama_vocab_get_text(self._vocab, token)
        return raw.decode("utf-8", "replace") if raw else ""

    def is_eog(self, token: int) -> bool:
        """End-of-generation token (EOS, EOT, FIM pad/sep...) as llama.cpp classifies it."""
        return bool(L.llama_vocab_is_eog(self._vocab, token))

    def is_control(self, token: int) -> bool:
        """Control (special) token."""
        return bool(L.llama_vocab_is_control(self._vocab, token))

    def single_token(self, text: str) -> int | None:
        """The id of ``text`` when it tokenizes (special tokens parsed) to exactly one token."""
        ids = self.tokenize(text, add_special=False, parse_special=True)
        if len(ids) == 1 and self.piece(ids[0]) == text.encode("utf-8"):
            return ids[0]
        return None

    def _sorted_pieces(self) -> tuple[list[bytes], list[int]]:
        # Built once, lazily: sorted pieces let "all tokens starting with r" be a bisect range.
        if self._sorted is None:
            pairs = []
            for tok in range(self.n_tokens):
                if self.is_control(tok):
                    continue
                p = self.piece(tok)
                if p:
                    pairs.append((p, tok))
            pairs.sort()
            self._sorted = ([p for p, _ in pairs], [t for _, t in pairs])
        return self._sorted

    def _starting_with(self, head: bytes) -> list[int]:
        """Ids of tokens whose piece starts with ``head`` (a bisect range of sorted pieces)."""
        pieces, ids = self._sorted_pieces()
        lo = bisect.bisect_left(pieces, head)
        hi = bisect.bisect_left(pieces, head + b"\xff\xff\xff\xff", lo)
        return ids[lo:hi]

    def tokens_consistent_with(self, constraint: bytes) -> npt.NDArray[np.int64]:
        """Ids of tokens whose piece starts with ``constraint`` or is a prefix of it.

        Used for token healing: the text typed after the last whole token is forced, and
        the model picks its best token among those that agree with it.
        """
        pieces, ids = self._sorted_pieces()
        out = list(self._starting_with(constraint))
        for k in range(1, len(constraint)):
            head = constraint[:k]
            j = bisect.bisect_left(pieces, head)
            if j < len(pieces) and pieces[j] == head:
                out.append(ids[j])
        return np.asarray(out, dtype=np.int64)

    def tokens_starting_with_any(self, first: bytes) -> npt.NDArray[np.int64]:
        """Ids of tokens whose piece starts with one of the bytes of ``first``."""
        ids = self._first_byte_ids.get(first)
        if ids is None:
            out = [t for b in first for t in self._starting_with(bytes([b]))]
            ids = self._first_byte_ids[first] = np.asarray(out, dtype=np.int64)
        return ids



@dataclass(frozen=True)
class DecodeCall:
    """One ``decode`` as the engine issued it, and the argmax at each logits position."""

    tokens: list[int]
    start_pos: int
    logits_at: list[int]
    argmax: list[int]
    top2_gap: list[float]  # best logit minus the runner-up's, per logits position
    seqs: tuple[int, ...] = ()  # each token's sequence (0: the prompt as built)


def _load_weights(path: Path, mp: Any, n_gpu_layers: int) -> tuple[Any, str | None]:
    """The model loaded with ``n_gpu_layers`` offloaded; where that fails with layers
    offloaded (too little GPU memory, a broken driver), loaded again on the CPU, with the
    warning to show. NULL when even that fails."""
    mp.n_gpu_layers = n_gpu_layers
    _native_errors.clear()
    model = L.llama_model_load_from_file(str(path).encode("utf-8"), mp)
    if model or n_gpu_layers == 0:
        return model, None
    cause = _native_errors[-1] if _native_errors else "llama.cpp gave no reason"
    mp.n_gpu_layers = 0
    model = L.llama_model_load_from_file(str(path).encode("utf-8"), mp)
    if not model:
        return model, None
    warning = (f"{path.name} could not be loaded with its layers on the GPU ({cause}); "
               f"it runs on the CPU (set nGpuLayers to 0 to say so, or fewer layers)")
    log.warning("%s", warning)
    return model, warning


class LlamaModel:
    """One loaded GGUF model and its single inference context (sequence 0)."""

    def __init__(self, path: Path, *, n_ctx: int = 4096, n_batch: int = 512,
                 threads: int | None = None, n_gpu_layers: int = 0,
                 vocab_only: bool = False, extra_buffers: bool | None = None) -> None:
        """``extra_buffers``: use llama.cpp's repacked / AMX CPU kernels; None: where they
        run on this machine (see :mod:`fimls.engine.cpu`)."""
        backend_init()
        check_gguf_file(path)
        self.path = path
        mp = L.llama_model_default_params()
        mp.vocab_only = vocab_only
        if not vocab_only:
            mp.use_extra_bufts = (extra_buffers_usable(path) if extra_buffers is None
                                  else extra_buffers)
        self._model, self.load_warning = _load_weights(path, mp, 0 if vocab_only
                                                       else n_gpu_layers)
        if not self._model:
            raise ModelLoadError(f"llama.cpp could not load the model file (truncated or "
                                 f"unsupported GGUF?): {path}")
        self.placement: Placement = (Placement() if vocab_only else
                                     placement(mp.n_gpu_layers, L.llama_model_n_layer(self._model)))
        self.vocab = Vocab(self._model)
        self.n_vocab = self.vocab.n_tokens
        self._ctx: Any = None
        self._batch: Any = None
        self._abort_cb: Any = None
        self._abort_flag: Callable[[], bool] | None = None
        self.n_ctx = 0
        self.n_batch = 0
        # Tests set a list here to record every decode (see DecodeCall); None costs nothing.
        self.decode_log: list[DecodeCall] | None = None
        if not vocab_only:
            self._init_context(n_ctx, n_batch, threads)

    def _init_context(self, n_ctx: int, n_batch: int, threads: int | None) -> None:
        """The inference context, its batch and its abort callback."""
        nthreads = threads or max(1, min(8, os.cpu_count() or 1))
        self.threads = nthreads
        cp = L.llama_context_default_params()
        cp.n_ctx = n_ctx
        cp.n_batch = n_batch
        cp.n_ubatch = n_batch
        cp.n_threads = nthreads
        cp.n_threads_batch = nthreads
        # Sequence 1 parks cache entries while new ones are evaluated below them (see
        # park), or holds a branch of sequence 0 (see branch); sequence 2 holds the prompt
        # read without other files' chunks (the second reading, see fimls.engine.second).
        # One unified cache: its n_ctx positions are shared, so sequence 0 may use all of
        # them when the others hold nothing.
        cp.n_seq_max = 3
        cp.kv_unified = True
        self._ctx = L.llama_init_from_model(self._model, cp)
        if not self._ctx:
            L.llama_model_free(self._model)
            self._model = None
            raise ModelLoadError(f"could not create a context (n_ctx={n_ctx}) for {self.path}")
        self.n_ctx = L.llama_n_ctx(self._ctx)
        # llama.cpp caps the batch at n_ctx (and asserts, aborting the process, if a
        # larger one is decoded): use what the context actually took.
        self.n_batch = min(n_batch, int(L.llama_n_batch(self._ctx)), self.n_ctx)
        self._batch = L.llama_batch_init(self.n_batch, 0, 1)
        self._mem = L.llama_get_memory(self._ctx)

        @L.ggml_abort_callback
        def _abort(_data: ctypes.c_void_p) -> bool:
            flag = self._abort_flag
            return bool(flag is not None and flag())

        self._abort_cb = _abort
        L.llama_set_abort_callback(self._ctx, _abort, ctypes.c_void_p(0))

    def set_abort(self, flag: Callable[[], bool] | None) -> None:
        """Install the predicate llama.cpp polls during a decode; true aborts the batch."""
        self._abort_flag = flag

    @contextlib.contextmanager
    def unabortable(self) -> Iterator[None]:
        """Decodes inside cannot be aborted (the predicate is set aside meanwhile)."""
        saved, self._abort_flag = self._abort_flag, None
        try:
            yield
        finally:
            self._abort_flag = saved

    def decode(self, tokens: Sequence[int], start_pos: int, logits_at: Sequence[int],
               seq: int = 0) -> bool:
        """Evaluate ``tokens`` at positions ``start_pos...`` of sequence ``seq``; logits
        only at ``logits_at``.

        Returns False when the abort predicate stopped the computation.
        """
        return self.decode_at([(tok, start_pos + i, seq) for i, tok in enumerate(tokens)],
                              logits_at)

    def decode_at(self, items: Sequence[tuple[int, int, int]], logits_at: Sequence[int]) -> bool:
        """Evaluate ``(token, position, sequence)`` items in one batch; logits only at the
        batch indices ``logits_at``. One token in each of two sequences costs about one
        step on a CPU (the weights are read once), not two.

        Returns False when the abort predicate stopped the computation.
        """
        b = self._batch
        n = len(items)
        if n > self.n_batch:
            raise ValueError(f"batch of {n} exceeds n_batch {self.n_batch}")
        want = set(logits_at)
        b.n_tokens = n
        for i, (tok, pos, seq) in enumerate(items):
            b.token[i] = tok
            b.pos[i] = pos
            b.n_seq_id[i] = 1
            b.seq_id[i][0] = seq
            b.logits[i] = 1 if i in want else 0
        rc = L.llama_decode(self._ctx, b)
        if rc == 2:
            return False
        if rc != 0:
            raise RuntimeError(f"llama_decode failed with code {rc}")
        if self.decode_log is not None:
            at = [i for i in range(n) if i in want]
            top2 = [np.partition(self.logits(i), -2)[-2:] for i in at]
            self.decode_log.append(DecodeCall(
                [it[0] for it in items], items[0][1] if items else 0, at,
                [int(np.argmax(self.logits(i))) for i in at],
                [float(t[1] - t[0]) for t in top2], tuple(it[2] for it in items)))
        return True

    def prefill(self, tokens: Sequence[int], start_pos: int, *,
                logits_last: bool = True, chunk: int | None = None, seq: int = 0) -> int:
        """Evaluate ``tokens`` from ``start_pos`` in ``n_batch`` chunks, logits only at the
        last position (when ``logits_last``). The one chunked-prefill path of the engine,
        the draft model and the tests.

        ``chunk`` (at most n_batch) makes the batches smaller: an abort mid-batch loses the
        whole batch. Returns how many tokens were evaluated: fewer than ``len(tokens)``
        when the abort predicate stopped it (checked before every chunk, and by llama.cpp
        within one); the cache then holds exactly the positions before ``start_pos`` plus
        that count.
        """
        nb = min(chunk or self.n_batch, self.n_batch)
        done = 0
        n = len(tokens)
        while done < n:
            flag = self._abort_flag
            if flag is not None and flag():
                break
            part = tokens[done:done + nb]
            last = done + len(part) == n
            if not self.decode(part, start_pos + done,
                               [len(part) - 1] if last and logits_last else [], seq):
                self.kv_truncate(start_pos + done, seq)
                break
            done += len(part)
        return done

    def kv_len(self, seq: int = 0) -> int:
        """How many positions sequence ``seq`` holds (its highest position plus one)."""
        return int(L.llama_memory_seq_pos_max(self._mem, seq)) + 1

    def logits(self, i: int) -> npt.NDArray[np.float32]:
        """A view (no copy) of the logits at batch index ``i`` of the last decode (-1: last)."""
        ptr = L.llama_get_logits_ith(self._ctx, i)
        return np.ctypeslib.as_array(ptr, shape=(self.n_vocab,))

    def kv_truncate(self, n_keep: int, seq: int = 0) -> None:
        """Drop every cached position >= n_keep of sequence ``seq``."""
        L.llama_memory_seq_rm(self._mem, seq, n_keep, -1)

    def kv_remove(self, p0: int, p1: int) -> None:
        """Drop the cached positions in [p0, p1) of sequence 0."""
        if p1 > p0:
            L.llama_memory_seq_rm(self._mem, 0, p0, p1)

    def park(self, p0: int, p1: int) -> None:
        """Set the cached positions [p0, p1) of sequence 0 aside (in sequence 1).

        llama.cpp evaluates a sequence only at positions after its last cached one; parking
        the entries above a gap lets the gap be evaluated (without seeing them), and
        :meth:`unpark` puts them back, moved.
        """
        L.llama_memory_seq_rm(self._mem, 1, -1, -1)
        L.llama_memory_seq_cp(self._mem, 0, 1, p0, p1)
        L.llama_memory_seq_rm(self._mem, 0, p0, p1)

    def unpark(self, delta: int) -> None:
        """Move the parked entries by ``delta`` and return them to sequence 0."""
        if delta:
            L.llama_memory_seq_add(self._mem, 1, -1, -1, delta)
        L.llama_memory_seq_cp(self._mem, 1, 0, -1, -1)
        L.llama_memory_seq_rm(self._mem, 1, -1, -1)

    def drop_parked(self, p0: int = -1, p1: int = -1) -> None:
        """Forget the parked entries (those at positions [p0, p1), by default all)."""
        L.llama_memory_seq_rm(self._mem, 1, p0, p1)

    def branch(self, p: int, seq: int = 1) -> None:
        """Make sequence ``seq`` hold sequence 0's first ``p`` positions (the same cells,
        nothing is copied), so that other tokens can be evaluated after them beside
        sequence 0's own (see :meth:`take_branch`, :meth:`drop_parked`)."""
        L.llama_memory_seq_rm(self._mem, seq, -1, -1)
        L.llama_memory_seq_cp(self._mem, 0, seq, 0, p)

    def take_branch(self, p: int, seq: int = 1) -> None:
        """Sequence 0 keeps its first ``p`` positions and takes sequence ``seq``'s from
        ``p`` on; sequence ``seq`` is emptied."""
        L.llama_memory_seq_rm(self._mem, 0, p, -1)
        L.llama_memory_seq_cp(self._mem, seq, 0, p, -1)
        L.llama_memory_seq_rm(self._mem, seq, -1, -1)

    def can_shift(self) -> bool:
        """Whether the cache supports moving positions (RoPE models with a plain cache)."""
        return bool(L.llama_memory_can_shift(self._mem))

    def close(self) -> None:
        """Free the context and the model."""
        if self._batch is not None:
            L.llama_batch_free(self._batch)
            self._batch = None
        if self._ctx:
            L.llama_free(self._ctx)
            self._ctx = None
        if self._model:
            L.llama_model_free(self._model)
            self._model = None
