"""The remote engine's pieces that need no server: the grammar that forces the text at the
cursor, checked against llama.cpp's own grammar sampler on the real vocabulary, and the
server's vocabulary read over HTTP."""

from __future__ import annotations

import ctypes
import math
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import llama_cpp as L
import pytest

from fimls.engine.core import Engine
from fimls.engine.httpvocab import HttpVocab
from fimls.engine.llama import LlamaModel, Vocab
from fimls.engine.remote import forcing_grammar
from fimls.models import resolve_model
from fimls.prompt import detect_template


@pytest.fixture(scope="module")
def vocab() -> Iterator[Vocab]:
    model = LlamaModel(resolve_model("qwen2.5-coder-0.5b"), vocab_only=True)
    yield model.vocab
    model.close()


def first_tokens(vocab: Vocab, grammar: str) -> set[int]:
    """The tokens llama.cpp's grammar sampler leaves possible as the first output token."""
    smpl = L.llama_sampler_init_grammar(vocab._vocab, grammar.encode(), b"root")
    assert smpl, f"llama.cpp did not parse {grammar!r}"
    try:
        n = vocab.n_tokens
        data = (L.llama_token_data * n)()
        for i in range(n):
            data[i].id, data[i].logit, data[i].p = i, 0.0, 0.0
        cur = L.llama_token_data_array(data=data, size=n, selected=-1, sorted=False)
        L.llama_sampler_apply(smpl, ctypes.byref(cur))
        return {data[i].id for i in range(cur.size) if not math.isinf(data[i].logit)}
    finally:
        L.llama_sampler_free(smpl)


@pytest.mark.parametrize(("forced", "ban"), [("    ", b"\n\r"), ("\n", b"\n\r"), ("ret", b""),
                                             ('"""', b""), ("é\\\"", b""),
                                             ("", b"\n\r \t"), ("", b" \t")])
def test_the_grammar_allows_what_the_engine_here_allows(vocab: Vocab, forced: str,
                                                        ban: bytes) -> None:
    allowed = first_tokens(vocab, forcing_grammar(forced, ban=ban))
    here = SimpleNamespace(vocab=vocab)
    local = {t for t in range(vocab.n_tokens)
             if Engine._allowed(here, t, forced.encode(), ban)}  # type: ignore[arg-type]
    assert allowed and local
    if not forced:
        # With nothing forced the grammar also passes control tokens (no text) and refuses
        # NUL and a byte that starts a character it cannot finish: neither starts a suggestion's
        # text, so the two are compared on the tokens that are whole text.
        text = {t for t in range(vocab.n_tokens) if _whole_text(vocab.text_piece(t))}
        allowed, local = allowed & text, local & text
    assert allowed == local, (sorted(allowed - local)[:10], sorted(local - allowed)[:10])


def _whole_text(piece: bytes) -> bool:
    try:
        return bool(piece.decode("utf-8")) and b"\0" not in piece
    except UnicodeDecodeError:
        return False


def test_the_served_vocabulary_tokenizes_as_the_gguf(vocab: Vocab) -> None:
    # llama-server's /tokenize, /detokenize and /props answered by the same tokenizer (the
    # real server is in tests/test_e2e_remote.py): HttpVocab must read them as the GGUF.
    def post(path: str, body: dict[str, Any]) -> dict[str, Any]:
        if path == "/detokenize":
            return {"content": b"".join(vocab.piece(t) for t in body["tokens"]).decode()}
        assert path == "/tokenize" and body["with_pieces"]
        ids = vocab.tokenize(body["content"], add_special=body["add_special"],
                             parse_special=body["parse_special"])
        out = []
        for t in ids:
            p = vocab.piece(t)
            try:
                out.append({"id": t, "piece": p.decode("utf-8")})
            except UnicodeDecodeError:
                out.append({"id": t, "piece": list(p)})
        return {"tokens": out}

    props = {"bos_token": vocab.piece(vocab.bos).decode() if vocab.bos >= 0 else "",
             "eos_token": vocab.piece(vocab.eos).decode(), "total_slots": 1}
    served = HttpVocab(post, props, vocab.n_tokens)
    assert (served.bos, served.eos, served.add_bos) == (vocab.bos, vocab.eos, vocab.add_bos)
    assert detect_template(served) == detect_template(vocab)
    for text in ("def f(x):\n    return x", "naïve 🙂 <|fim_prefix|>", "\n\n\t  "):
        assert served.tokenize(text) == vocab.tokenize(text)
        assert all(served.piece(t) == vocab.piece(t) for t in vocab.tokenize(text))
    before = served.requests
    served.tokenize("def f(x):\n    return x")  # remembered: no round trip
    assert served.requests == before
