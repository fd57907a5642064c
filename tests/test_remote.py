"""The remote engine's pieces that need no server: the grammar that forces the text at the
cursor, checked against llama.cpp's own grammar sampler on the real vocabulary."""

from __future__ import annotations

import ctypes
import math
from collections.abc import Iterator
from types import SimpleNamespace

import llama_cpp as L
import pytest

from fimls.engine.core import Engine
from fimls.engine.llama import LlamaModel, Vocab
from fimls.engine.remote import forcing_grammar
from fimls.models import resolve_model


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


@pytest.mark.parametrize(("forced", "ban"), [("    ", True), ("\n", True), ("ret", False),
                                             ('"""', False), ("é\\\"", False)])
def test_the_grammar_allows_what_the_engine_here_allows(vocab: Vocab, forced: str,
                                                        ban: bool) -> None:
    allowed = first_tokens(vocab, forcing_grammar(forced, ban_newline=ban))
    here = SimpleNamespace(vocab=vocab)
    local = {t for t in range(vocab.n_tokens)
             if Engine._allowed(here, t, forced.encode(), ban)}  # type: ignore[arg-type]
    assert allowed and local
    assert allowed == local, (sorted(allowed - local)[:10], sorted(local - allowed)[:10])
