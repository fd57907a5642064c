"""Tests for fimls.prompt: FIM template detection and prompt layout within a token budget.

Vocabularies come from the tiny vocab-only GGUFs of tests/ggufs.py (one per FIM family,
with and without the ``tokenizer.ggml.fim_*`` metadata keys), loaded once per module.
Their ids are synthetic, so every expectation looks ids up by role.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import pytest

from fimls.crossfile import ContextChunk
from fimls.engine.llama import LlamaModel, Vocab
from fimls.prompt import (
    SUFFIX_SHARE,
    WINDOW_QUANTUM,
    FimTemplate,
    Prompt,
    PromptInput,
    build_prompt,
    detect_template,
    opening_prompt,
    prefix_window,
    suffix_window,
)
from tests.ggufs import FAMILIES, role_ids, write_vocab_gguf

FIM_FAMILIES = sorted(f for f in FAMILIES if f != "plain")
REPO_FAMILIES = ("starcoder2", "qwen2.5-coder")  # trained with repo-name / file-sep tokens
SPM_FAMILIES = ("codestral",)

Models = dict[tuple[str, bool], LlamaModel]


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Models]:
    """Every family's vocab-only model, with and without FIM metadata, each loaded once."""
    root = tmp_path_factory.mktemp("ggufs")
    loaded: Models = {}
    for family in FAMILIES:
        for meta in (True, False):
            name = f"{family}-{'meta' if meta else 'bare'}.gguf"
            path = write_vocab_gguf(root / name, family, with_metadata=meta)
            loaded[family, meta] = LlamaModel(path, vocab_only=True)
    yield loaded
    for model in loaded.values():
        model.close()


def vocab_of(models: Models, family: str,
             meta: bool = True) -> Vocab:
    """The vocabulary of one loaded family."""
    return models[family, meta].vocab


def decode(vocab: Vocab, tokens: list[int]) -> str:
    """The text ``tokens`` render to (special tokens as their text)."""
    return b"".join(vocab.piece(t) for t in tokens).decode("utf-8", "replace")


def common_prefix_len(a: list[int], b: list[int]) -> int:
    """How many leading tokens ``a`` and ``b`` share."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def long_code(lines: int, tag: str = "v") -> str:
    """A few thousand lines of Python-looking code, each line distinct."""
    out = []
    for i in range(lines):
        if i % 3 == 0:
            out.append(f"def {tag}{i}(x):\n")
        elif i % 3 == 1:
            out.append(f"    return print(x) in [{i}, {i + 1}]\n")
        else:
            out.append(f"# {tag} line {i}\n")
    return "".join(out)


def sections(template: FimTemplate, prompt: Prompt) -> tuple[list[int], list[int], list[int]]:
    """(head, prefix tokens, suffix tokens) of a FIM prompt, split at the marker tokens."""
    toks = prompt.tokens
    i_pre, i_suf = toks.index(template.pre), toks.index(template.suf)
    end = toks.index(template.mid) if template.mid >= 0 else len(toks)
    if template.order == "spm":
        return toks[:i_suf], toks[i_pre + 1:end], toks[i_suf + 1:i_pre]
    return toks[:i_pre], toks[i_pre + 1:i_suf], toks[i_suf + 1:end]


# --- template detection ---------------------------------------------------------------


@pytest.mark.parametrize("meta", [True, False], ids=["metadata", "no-metadata"])
@pytest.mark.parametrize("family", FIM_FAMILIES)
def test_detects_fim_tokens_by_role(models: Models, family: str,
                                    meta: bool) -> None:
    vocab = vocab_of(models, family, meta)
    roles = role_ids(family)
    t = detect_template(vocab)
    assert t.kind == "fim"
    assert (t.pre, t.suf, t.mid) == (roles["pre"], roles["suf"], roles["mid"])
    assert t.repo_name == roles.get("rep", -1)
    assert t.file_sep == roles.get("sep", -1)
    assert t.has_repo_tokens == (family in REPO_FAMILIES)
    assert t.order == ("spm" if family in SPM_FAMILIES else "psm")
    assert t.bos == (roles["bos"] if vocab.add_bos else -1)


@pytest.mark.parametrize("meta", [True, False], ids=["metadata", "no-metadata"])
@pytest.mark.parametrize("family", FIM_FAMILIES)
def test_stop_ids_end_the_infill(models: Models, family: str,
                                 meta: bool) -> None:
    # The end-of-infill token must stop generation whether or not llama.cpp found it:
    # CodeLlama's "▁<EOT>" is not detected by llama.cpp without metadata.
    roles = role_ids(family)
    t = detect_template(vocab_of(models, family, meta))
    assert roles["eos"] in t.stop_ids
    for role in ("eot", "pad", "sep"):
        if role in roles:
            assert roles[role] in t.stop_ids, role
    assert not {roles["pre"], roles["suf"], roles["mid"]} & t.stop_ids


@pytest.mark.parametrize("meta", [True, False], ids=["metadata", "no-metadata"])
def test_plain_vocab_means_continuation(models: Models,
                                        meta: bool) -> None:
    t = detect_template(vocab_of(models, "plain", meta))
    assert t.kind == "continuation"
    assert (t.pre, t.suf, t.mid) == (-1, -1, -1)
    assert role_ids("plain")["eos"] in t.stop_ids


def test_order_argument_overrides_family(models: Models) -> None:
    assert detect_template(vocab_of(models, "starcoder2"), order="spm").order == "spm"
    assert detect_template(vocab_of(models, "codestral"), order="psm").order == "psm"
    assert detect_template(vocab_of(models, "codestral"), order="auto").order == "spm"


@dataclass
class FakeVocab:
    """A VocabLike without llama.cpp FIM ids, whose special tokens are a text -> id table."""

    specials: dict[str, int]
    n_tokens: int = 100
    bos: int = -1
    eos: int = 99
    eot: int = -1
    add_bos: bool = False
    fim_pre: int = -1
    fim_suf: int = -1
    fim_mid: int = -1
    fim_pad: int = -1
    fim_rep: int = -1
    fim_sep: int = -1
    texts: dict[int, str] = field(default_factory=dict)

    def tokenize(self, text: str | bytes, *, add_special: bool = False,
                 parse_special: bool = False) -> list[int]:
        data = text.encode() if isinstance(text, str) else text
        return [10 + b % 50 for b in data]

    def single_token(self, text: str) -> int | None:
        return self.specials.get(text)

    def piece(self, token: int) -> bytes:
        return self.texts.get(token, "?").encode()


def test_fallback_keeps_token_id_zero() -> None:
    # Token texts found by the fallback table; id 0 is a real id, not "missing".
    vocab = FakeVocab(specials={"<fim_prefix>": 1, "<fim_suffix>": 2, "<fim_middle>": 3,
                                "<fim_pad>": 4, "<repo_name>": 0, "<file_sep>": 5})
    t = detect_template(vocab)
    assert (t.kind, t.pre, t.suf, t.mid, t.pad) == ("fim", 1, 2, 3, 4)
    assert t.repo_name == 0
    assert t.file_sep == 5
    assert t.has_repo_tokens


def test_fallback_spm_family_without_metadata(models: Models) -> None:
    # llama.cpp does not know "[PREFIX]"; only the fallback table finds Codestral's tokens.
    vocab = vocab_of(models, "codestral", meta=False)
    assert vocab.fim_pre < 0
    t = detect_template(vocab)
    assert t.family == "codestral"
    assert t.order == "spm"


# --- layout -----------------------------------------------------------------------------


@pytest.mark.parametrize("family", ["starcoder2", "deepseek-coder", "codellama", "codegemma"])
def test_psm_layout(models: Models, family: str) -> None:
    vocab = vocab_of(models, family)
    t = detect_template(vocab)
    prefix, suffix = "def f(x):\n    return ", "\n\nprint(f(1))\n"
    p = build_prompt(t, vocab, PromptInput(prefix=prefix, suffix=suffix), 512)
    head = [t.bos] if t.bos >= 0 else []
    pre = vocab.tokenize(prefix)
    # The text as it is, cut where the cursor cuts it (as llama-server's /infill sends it).
    assert p.tokens == [*head, t.pre, *pre, t.suf, *vocab.tokenize(suffix), t.mid]
    assert p.constraint == b"" and p.heal_tokens == 0
    assert (p.prefix_window, p.suffix_window) == (prefix, suffix)


def test_spm_layout(models: Models) -> None:
    vocab = vocab_of(models, "codestral")
    t = detect_template(vocab)
    prefix, suffix = "def f(x):\n    return ", "\n\nprint(f(1))\n"
    p = build_prompt(t, vocab, PromptInput(prefix=prefix, suffix=suffix), 512)
    pre = vocab.tokenize(prefix)
    assert p.tokens == [t.bos, t.suf, *vocab.tokenize(suffix), t.pre, *pre, t.mid]
    assert p.constraint == b""


def test_order_override_changes_layout(models: Models) -> None:
    vocab = vocab_of(models, "starcoder2")
    t = detect_template(vocab, order="spm")
    p = build_prompt(t, vocab, PromptInput(prefix="a = 1\n", suffix="b = 2\n"), 256)
    assert p.tokens.index(t.suf) < p.tokens.index(t.pre) < p.tokens.index(t.mid)


@pytest.mark.parametrize("meta", [True, False], ids=["metadata", "no-metadata"])
@pytest.mark.parametrize("family", REPO_FAMILIES)
def test_repo_tokens_carry_repo_and_path(models: Models,
                                         family: str, meta: bool) -> None:
    vocab = vocab_of(models, family, meta)
    t = detect_template(vocab)
    inp = PromptInput(prefix="import os\n", suffix="\n", repo_name="myrepo",
                      rel_path="src/app.py")
    p = build_prompt(t, vocab, inp, 512)
    head = p.tokens[: p.tokens.index(t.pre)]
    assert head[0] == t.repo_name
    assert t.file_sep in head
    text = decode(vocab, head)
    names = FAMILIES[family]
    assert text == f"{names['rep']}myrepo\n{names['sep']}src/app.py\n"
    assert "myrepo" in text and "src/app.py" in text


def test_no_repo_token_without_repo_name(models: Models) -> None:
    vocab = vocab_of(models, "qwen2.5-coder")
    t = detect_template(vocab)
    with_path = build_prompt(t, vocab, PromptInput(prefix="x = 1\n", suffix="",
                                                   rel_path="src/app.py"), 256)
    assert t.repo_name not in with_path.tokens
    assert "myrepo" not in decode(vocab, with_path.tokens)
    assert with_path.tokens[0] == t.file_sep
    bare = build_prompt(t, vocab, PromptInput(prefix="x = 1\n", suffix=""), 256)
    assert bare.tokens[0] == t.pre
    assert t.repo_name not in bare.tokens and t.file_sep not in bare.tokens


def test_repo_name_ignored_without_repo_tokens(models: Models) -> None:
    vocab = vocab_of(models, "deepseek-coder")
    t = detect_template(vocab)
    p = build_prompt(t, vocab, PromptInput(prefix="x = 1\n", suffix="", repo_name="myrepo",
                                           rel_path="src/app.py"), 256)
    assert p.tokens[:2] == [t.bos, t.pre]
    assert "myrepo" not in decode(vocab, p.tokens)


# --- budget -----------------------------------------------------------------------------


@pytest.mark.parametrize("budget", [96, 512, 2048])
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_budget_never_exceeded(models: Models, family: str,
                               budget: int) -> None:
    vocab = vocab_of(models, family)
    t = detect_template(vocab)
    inp = PromptInput(prefix=long_code(3000, "p"), suffix=long_code(3000, "s"),
                      repo_name="myrepo", rel_path="src/app.py")
    p = build_prompt(t, vocab, inp, budget)
    assert len(p.tokens) <= budget
    if t.kind == "fim":
        _, pre, suf = sections(t, p)
        assert pre, "the prefix must not be cut away entirely"
        assert suf
    else:
        assert len(p.tokens) > budget // 4


@pytest.mark.parametrize("family", FIM_FAMILIES)
def test_the_suffix_takes_a_quarter_and_the_lines_before_the_cursor_the_rest(
        models: Models, family: str) -> None:
    """llama-server's /infill split: the lines just after the cursor take SUFFIX_SHARE of
    what the file may use, the lines just before it the rest, contiguous up to the cursor
    (no other part of the file); the window is used."""
    vocab = vocab_of(models, family)
    t = detect_template(vocab)
    budget = 4096
    text = long_code(3000, "p")
    cursor = len(text) // 2
    p = build_prompt(t, vocab, PromptInput(prefix=text[:cursor], suffix=text[cursor:],
                                           rel_path="a.py"), budget)
    head, pre, suf = sections(t, p)
    avail = budget - len(head) - 3
    assert avail * SUFFIX_SHARE - 40 <= len(suf) <= avail * SUFFIX_SHARE
    assert text[:cursor].endswith(p.prefix_window)
    assert text[cursor:].startswith(p.suffix_window)
    assert pre == vocab.tokenize(p.prefix_window)
    assert len(p.tokens) >= budget * 0.75  # (less a quantum of the window's start)
    # Near the file's end the suffix is short, and the lines before the cursor take more.
    late = len(text) - 200
    q = build_prompt(t, vocab, PromptInput(prefix=text[:late], suffix=text[late:],
                                           rel_path="a.py"), budget)
    assert len(sections(t, q)[1]) > len(pre) and q.suffix_window == text[late:]


@pytest.mark.parametrize("family", ["starcoder2", "codellama", "codestral"])
def test_windows_cut_at_line_boundaries(models: Models,
                                        family: str) -> None:
    vocab = vocab_of(models, family)
    t = detect_template(vocab)
    prefix, suffix = long_code(3000, "p") + "    ret", long_code(3000, "s")
    p = build_prompt(t, vocab, PromptInput(prefix=prefix, suffix=suffix), 1024)
    assert 0 < len(p.prefix_window) < len(prefix)
    assert prefix.endswith(p.prefix_window)
    assert prefix[len(prefix) - len(p.prefix_window) - 1] == "\n"
    assert 0 < len(p.suffix_window) < len(suffix)
    assert suffix.startswith(p.suffix_window)
    assert p.suffix_window.endswith("\n")
    # The reported windows are exactly what was tokenized, the cursor's word unhealed (a
    # FIM model reads text cut mid-word as llama-server sends it).
    _, pre, suf = sections(t, p)
    assert (pre, p.constraint, p.heal_tokens) == (vocab.tokenize(p.prefix_window), b"", 0)
    assert suf == vocab.tokenize(p.suffix_window)


def test_prefix_window_helper() -> None:
    text = "".join(f"line {i}\n" for i in range(2000))
    assert prefix_window("short\n", 100) == "short\n"
    w = prefix_window(text, 3000)
    assert 0 < len(w) <= 3000 and text.endswith(w)
    assert text[len(text) - len(w) - 1] == "\n"
    # A small budget still leaves some text (the quantum shrinks with the budget).
    small = prefix_window(text, 300)
    assert 0 < len(small) <= 300
    # One enormous line: the cut falls inside it.
    assert 0 < len(prefix_window("x" * 10_000, 3000)) <= 3000


def test_prefix_window_start_moves_rarely() -> None:
    text = "".join(f"line {i}\n" for i in range(2000))
    starts = set()
    for k in range(200):
        typed = text + "y" * k
        starts.add(len(typed) - len(prefix_window(typed, 3 * WINDOW_QUANTUM)))
    assert len(starts) <= 2


def test_suffix_window_helper() -> None:
    text = "".join(f"line {i}\n" for i in range(2000))
    assert suffix_window("ab\ncd", 100) == "ab\ncd"
    w = suffix_window(text, 500)
    assert text.startswith(w) and w.endswith("\n") and 0 < len(w) <= 500
    assert suffix_window("x" * 1000, 10) == "x" * 10


# --- stability while typing -----------------------------------------------------------


TYPED = "    result = compute(value)"


def test_typing_keeps_continuation_prompt_stable(
        models: Models) -> None:
    vocab = vocab_of(models, "plain")
    t = detect_template(vocab)
    prefix = long_code(3000) + "\n"
    prev = build_prompt(t, vocab, PromptInput(prefix=prefix, suffix=""), 1500)
    assert len(prev.prefix_window) < len(prefix)  # the window really is cut
    for ch in TYPED:
        prefix += ch
        cur = build_prompt(t, vocab, PromptInput(prefix=prefix, suffix=""), 1500)
        assert common_prefix_len(prev.tokens, cur.tokens) >= len(prev.tokens) - 3, repr(ch)
        assert len(prev.tokens) > 500
        prev = cur


@pytest.mark.parametrize("family", ["starcoder2", "codellama", "codestral"])
def test_typing_keeps_fim_prompt_stable(models: Models,
                                        family: str) -> None:
    vocab = vocab_of(models, family)
    t = detect_template(vocab)
    prefix, suffix = long_code(3000, "p") + "\n", long_code(3000, "s")

    def build(pre: str) -> Prompt:
        return build_prompt(t, vocab, PromptInput(prefix=pre, suffix=suffix,
                                                  repo_name="r", rel_path="a.py"), 1500)

    prev = build(prefix)
    moved = 0
    for ch in TYPED:
        prefix += ch
        cur = build(prefix)
        # Everything before the cursor's last few tokens is unchanged: for PSM that is the
        # head and the prefix, for SPM also the whole suffix in front of it.
        before_cursor = prev.tokens.index(t.mid if t.order == "spm" else t.suf)
        assert before_cursor > 500
        common = common_prefix_len(prev.tokens, cur.tokens)
        if common < before_cursor - 3:
            # The window's start moves only where typing crosses a quantum of the document.
            moved += 1
        prev = cur
    assert moved <= 1


@pytest.mark.parametrize("family", ["qwen2.5-coder", "plain"])
def test_the_opening_prompt_is_what_requests_near_the_top_start_with(
        models: Models, family: str) -> None:
    """Idle prefill after didOpen evaluates the opening prompt; every request whose cursor
    is in the file's first windowful then finds its prompt's start in the cache."""
    vocab = vocab_of(models, family)
    t = detect_template(vocab)
    text = long_code(400, "o")
    budget = 1500

    def inp(prefix: str, suffix: str = "") -> PromptInput:
        return PromptInput(prefix=prefix, suffix=suffix, repo_name="r", rel_path="a.py")

    opening = opening_prompt(t, vocab, inp(text), budget)
    assert len(opening) <= budget
    from_top = 0
    for cursor in range(100, 6000, 300):
        p = build_prompt(t, vocab, inp(text[:cursor], text[cursor:]), budget)
        if p.prefix_window != text[:cursor]:
            continue  # the window starts lower down: another prompt
        from_top += 1
        head_and_text = p.tokens.index(t.suf) if t.kind == "fim" else len(p.tokens)
        # All of the prompt up to the cursor's (healed) last token or two is there, or
        # all of the opening (but its last line end, which may merge with the next line's).
        assert (common_prefix_len(opening, p.tokens)
                >= min(head_and_text - 3, len(opening) - 1)), cursor
    assert from_top >= 3
    # A cursor far down the file has only the window before it: the header is shared.
    far = build_prompt(t, vocab, inp(text * 4, ""), budget)
    assert common_prefix_len(opening, far.tokens) < 20


# --- token healing ----------------------------------------------------------------------


def test_continuation_heals_last_token(models: Models) -> None:
    vocab = vocab_of(models, "plain")
    t = detect_template(vocab)
    prefix = "def f(x):\n    retu"
    p = build_prompt(t, vocab, PromptInput(prefix=prefix, suffix="rn x\n"), 512)
    full = vocab.tokenize(prefix)
    assert p.heal_tokens == 1
    assert p.constraint == vocab.piece(full[-1]) and p.constraint
    assert p.tokens == full[:-1]
    assert b"".join(vocab.piece(x) for x in p.tokens) + p.constraint == prefix.encode()
    assert p.prefix_window == prefix


def test_healing_reproduces_a_cut_window(models: Models) -> None:
    vocab = vocab_of(models, "plain")
    t = detect_template(vocab)
    prefix = long_code(3000) + "    pri"
    p = build_prompt(t, vocab, PromptInput(prefix=prefix, suffix=""), 700)
    assert len(p.tokens) <= 700
    assert 0 < len(p.prefix_window) < len(prefix) and prefix.endswith(p.prefix_window)
    rendered = b"".join(vocab.piece(x) for x in p.tokens) + p.constraint
    assert rendered == p.prefix_window.encode()
    assert p.constraint == vocab.piece(vocab.tokenize(p.prefix_window)[-1])


def test_healing_empty_prefix(models: Models) -> None:
    vocab = vocab_of(models, "plain")
    p = build_prompt(detect_template(vocab), vocab, PromptInput(prefix="", suffix="x"), 64)
    assert (p.tokens, p.constraint, p.heal_tokens) == ([], b"", 0)


# --- prefix_offset ----------------------------------------------------------------------


def capped(doc: str, cap: int) -> PromptInput:
    """The request the server makes for a cursor at the end of ``doc``, prefix capped."""
    prefix = doc[-cap:]
    return PromptInput(prefix=prefix, suffix="", prefix_offset=len(doc) - len(prefix))


def window_start(inp: PromptInput, p: Prompt) -> int:
    """Where the prompt's prefix window starts, in document coordinates."""
    return inp.prefix_offset + len(inp.prefix) - len(p.prefix_window)


@pytest.mark.parametrize("family", ["plain", "starcoder2"])
def test_prefix_offset_keeps_window_start(models: Models,
                                          family: str) -> None:
    vocab = vocab_of(models, family)
    t = detect_template(vocab)
    doc = long_code(3000) + "\n"
    cap = 20_000
    starts = []
    for ch in "x = 1":
        doc += ch
        inp = capped(doc, cap)
        assert inp.prefix_offset > 0
        p = build_prompt(t, vocab, inp, 1500)
        assert len(p.prefix_window) < cap
        starts.append(window_start(inp, p))
        # Same prompt as for the whole, uncapped prefix.
        full = build_prompt(t, vocab, PromptInput(prefix=doc, suffix=""), 1500)
        assert full.tokens == p.tokens
    assert len(set(starts)) == 1
    assert doc[starts[0] - 1] == "\n"


def test_prefix_window_offset_matches_uncapped() -> None:
    doc = "".join(f"row {i} = {i * i}\n" for i in range(3000))
    for budget in (500, 3000, 9000):
        whole = prefix_window(doc, budget)
        for cap in (budget + 1, budget + 777, 20_000):
            assert prefix_window(doc[-cap:], budget, len(doc) - cap) == whole, (budget, cap)
    # Without the offset the grid is the capped prefix's own, and the window differs.
    assert any(prefix_window(doc[-cap:], 3000) != prefix_window(doc, 3000)
               for cap in range(3001, 3001 + 2 * WINDOW_QUANTUM, 97))


# --- other buffers' chunks (context) --------------------------------------------------

HELPER = ContextChunk(path="lib/util.py", text="def helper(x, *, scale=2):\n    return x\n",
                      source="definition", uri="file:///w/lib/util.py", line=0)
OTHER = ContextChunk(path="lib/other.py", text="VALUE = 3\n", source="recent",
                     uri="file:///w/lib/other.py", line=5)


def test_context_as_repository_files(models: Models) -> None:
    """Qwen2.5-Coder's repository layout: each buffer a file after the repository name,
    its chunks in the file's order, the file of the most useful chunk nearest the current
    file, which comes last, then the FIM sections; the prompt reports what it holds."""
    vocab = vocab_of(models, "qwen2.5-coder")
    t = detect_template(vocab)
    later = replace(HELPER, text="def later():\n    pass\n", line=40)
    inp = PromptInput(prefix="y = ", suffix="\n", repo_name="myrepo", rel_path="src/app.py",
                      context=(later, OTHER, HELPER), context_tokens=400)
    p = build_prompt(t, vocab, inp, 1024)
    names = FAMILIES["qwen2.5-coder"]
    head = decode(vocab, p.tokens[: p.tokens.index(t.pre)])
    assert head == (f"{names['rep']}myrepo\n{names['sep']}lib/other.py\n{OTHER.text}"
                    f"{names['sep']}lib/util.py\n{HELPER.text}{later.text}"
                    f"{names['sep']}src/app.py\n")
    assert p.context_sources == "definition:2,recent:1"
    assert 0 < p.context_tokens < p.tokens.index(t.pre)


def test_a_chunk_is_tokenized_once_while_its_set_stands(models: Models) -> None:
    """Prompts built while the user types reuse the chunks' tokens, for this vocabulary
    only, and lay out the same tokens as a fresh tokenization."""
    vocab = vocab_of(models, "qwen2.5-coder")
    t = detect_template(vocab)
    seen: list[str] = []

    class Counting:
        def __init__(self, inner: Vocab) -> None:
            self._inner = inner

        def __getattr__(self, name: str) -> Any:
            return getattr(self._inner, name)

        def tokenize(self, text: str | bytes, **kw: Any) -> list[int]:
            seen.append(text if isinstance(text, str) else text.decode())
            return self._inner.tokenize(text, **kw)

    counting = Counting(vocab)
    inp = PromptInput(prefix="y = ", suffix="\n", repo_name="r", rel_path="src/app.py",
                      context=(HELPER,), context_tokens=400)
    first = build_prompt(t, counting, inp, 1024)  # type: ignore[arg-type]
    again = build_prompt(t, counting, replace(inp, prefix="y = h"), 1024)  # type: ignore[arg-type]
    assert seen.count(HELPER.text) == 1
    assert first.tokens[:first.context_tokens] == again.tokens[:again.context_tokens]
    assert build_prompt(t, vocab, inp, 1024).tokens == first.tokens  # another vocab object
    assert seen.count(HELPER.text) == 1


def test_context_as_plain_header_without_repo_tokens(models: Models) -> None:
    """A continuation model reads the chunks as commented file headers before the file."""
    vocab = vocab_of(models, "plain")
    t = detect_template(vocab)
    inp = PromptInput(prefix="y = helper(", suffix="", rel_path="src/app.py",
                      context=(HELPER,), context_tokens=400)
    text = decode(vocab, build_prompt(t, vocab, inp, 1024).tokens)
    assert text.lstrip().startswith(f"# lib/util.py\n{HELPER.text}\n")
    assert text.rstrip().endswith("y = helper")  # the healed cursor token is forced later


def test_context_within_its_budget_and_half_the_window(models: Models) -> None:
    vocab = vocab_of(models, "qwen2.5-coder")
    t = detect_template(vocab)
    big = ContextChunk(path="big.py", text=long_code(60), source="ring", uri="u", line=0)
    base = PromptInput(prefix=long_code(300), suffix=long_code(50, "s"), repo_name="r",
                       rel_path="a.py", context=(big, HELPER), context_tokens=64)
    p = build_prompt(t, vocab, base, 1024)
    # The big chunk does not fit 64 tokens: it is left out, the small one after it is kept.
    assert p.context_sources == "definition:1"
    assert len(p.tokens) <= 1024
    wide = build_prompt(t, vocab, replace(base, context_tokens=100_000), 512)
    assert wide.context_tokens <= 256 and len(wide.tokens) <= 512
    none = build_prompt(t, vocab, replace(base, context=()), 1024)
    assert none.context_tokens == 0 and none.context_sources == ""


@pytest.mark.parametrize("family", ["qwen2.5-coder", "codellama", "plain"])
def test_the_prompt_without_its_chunks_is_the_file_alone(models: Models, family: str) -> None:
    """The second reading's prompt: the same prompt less exactly the chunks'
    tokens, which is the prompt laid out without them (same window, same file text)."""
    vocab = vocab_of(models, family)
    t = detect_template(vocab)
    inp = PromptInput(prefix="import lib\n\ny = ", suffix="\nprint(y)\n", repo_name="r",
                      rel_path="src/app.py", context=(HELPER, OTHER), context_tokens=400)
    with_chunks = build_prompt(t, vocab, inp, 1024)
    alone = build_prompt(t, vocab, replace(inp, context=()), 1024)
    assert with_chunks.context_tokens > 0
    start, n = with_chunks.context_start, with_chunks.context_tokens
    assert decode(vocab, with_chunks.tokens[start:start + n]).count("lib/util.py") == 1
    assert with_chunks.without_context() == alone.tokens
    assert alone.without_context() == alone.tokens
