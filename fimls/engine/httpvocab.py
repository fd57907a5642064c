"""A llama-server's vocabulary, asked over HTTP: ``--engine`` with no local GGUF.

fimls builds the prompt as token ids, so it needs the tokenizer of the model the server
runs. Given no ``--model``, it asks the server itself: ``/tokenize`` (with each token's
piece), ``/detokenize`` and ``/props`` (BOS and EOS), and finds the FIM tokens by their
text as :func:`fimls.prompt.detect_template` does for a GGUF without FIM metadata. The
laptop then needs no model file at all, and the prompt is always in the server's own
vocabulary.

Tokenizing costs a round trip, so recent texts are remembered: the context chunks, the
repository and file lines and an unchanged suffix are tokenized once, and a keystroke
sends about one request (the prefix window) before the completion.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Any

_CACHED_TEXTS = 256

Post = Callable[[str, dict[str, Any]], dict[str, Any]]


class HttpVocab:
    """:class:`fimls.prompt.VocabLike` over a llama-server's tokenizer endpoints."""

    def __init__(self, post: Post, props: dict[str, Any], n_tokens: int = 0) -> None:
        self._post = post
        self._pieces: dict[int, bytes] = {}
        self._texts: OrderedDict[tuple[str, bool, bool], list[int]] = OrderedDict()
        self.n_tokens = n_tokens
        self.requests = 0  # round trips made, for the tests and the log
        self.bos = self._special(str(props.get("bos_token") or ""))
        self.eos = self._special(str(props.get("eos_token") or ""))
        self.eot = -1
        probe = self.tokenize("a", add_special=True)
        self.add_bos = bool(probe) and self.bos >= 0 and probe[0] == self.bos
        # llama.cpp's FIM metadata is not served: detect_template finds the tokens by text.
        self.fim_pre = self.fim_suf = self.fim_mid = -1
        self.fim_pad = self.fim_rep = self.fim_sep = -1

    def _special(self, text: str) -> int:
        tok = self.single_token(text) if text else None
        return -1 if tok is None else tok

    def tokenize(self, text: str | bytes, *, add_special: bool = False,
                 parse_special: bool = False) -> list[int]:
        """Tokenize ``text`` on the server (remembered for recent texts)."""
        if isinstance(text, bytes):
            # JSON carries only whole characters; half a character is rare at the cursor.
            text = text.decode("utf-8", "replace")
        key = (text, add_special, parse_special)
        hit = self._texts.get(key)
        if hit is not None:
            self._texts.move_to_end(key)
            return list(hit)
        self.requests += 1
        out = self._post("/tokenize", {"content": text, "add_special": add_special,
                                       "parse_special": parse_special, "with_pieces": True})
        ids: list[int] = []
        for item in out.get("tokens", []):
            if isinstance(item, dict):
                tok = int(item["id"])
                piece = item.get("piece", "")
                self._pieces.setdefault(tok, bytes(piece) if isinstance(piece, list)
                                        else str(piece).encode("utf-8"))
            else:
                tok = int(item)
            ids.append(tok)
        self._texts[key] = ids
        while len(self._texts) > _CACHED_TEXTS:
            self._texts.popitem(last=False)
        return list(ids)

    def piece(self, token: int) -> bytes:
        """The bytes a token renders to (special tokens as their text)."""
        hit = self._pieces.get(token)
        if hit is None:
            self.requests += 1
            out = self._post("/detokenize", {"tokens": [token]})
            hit = self._pieces[token] = str(out.get("content", "")).encode("utf-8")
        return hit

    def single_token(self, text: str) -> int | None:
        """The id of ``text`` when it tokenizes (special tokens parsed) to exactly one token."""
        ids = self.tokenize(text, parse_special=True)
        if len(ids) == 1 and self.piece(ids[0]) == text.encode("utf-8"):
            return ids[0]
        return None
