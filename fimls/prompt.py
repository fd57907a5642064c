"""FIM template detection and prompt layout within a token budget.

Two shapes of prompt:

* **FIM** for models with fill-in-the-middle tokens: ``<pre>prefix<suf>suffix<mid>`` (PSM) or
  ``<suf>suffix<pre>prefix<mid>`` (SPM), with repository/file tokens in front when the
  vocabulary has them (StarCoder2/Qwen2.5-Coder style), filled with the real workspace name
  and relative path.
* **Continuation** for models without FIM tokens (the embedded Gemma 3 270M): the prefix
  only; the suffix is used by the decode loop to stop and by post-processing to trim.

A FIM window is the lines just before the cursor and, in a quarter of it
(``SUFFIX_SHARE``), the lines just after: llama-server's ``/infill`` split. Windows are cut
at line boundaries and their starts are quantised, so that typing at the cursor leaves the
prompt's first tokens untouched and the KV cache can be reused.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal, Protocol

from fimls.crossfile.chunks import ContextChunk, sources_of
from fimls.crossfile.names import comment_mark

# Where a window may start moves in steps of this many characters, so a keystroke almost
# never moves it (the KV cache keeps everything before the cursor).
WINDOW_QUANTUM = 1024
CHARS_PER_TOKEN_GUESS = 3  # conservative: code usually packs 3.5-4.5 chars per token
# The share of a FIM window's file tokens that the text after the cursor may take; the text
# before it takes the rest (and what the suffix leaves). llama-server's /infill takes 3/4 of
# its batch before the cursor and 1/4 after.
SUFFIX_SHARE = 0.25
# A window cut at the guessed density that holds less than this share of its budget is
# widened at the text's own density (code often packs 4 characters a token, not 3).
FILL = 0.9


class VocabLike(Protocol):
    """What template detection and prompt building need from a vocabulary."""

    n_tokens: int
    bos: int
    eos: int
    eot: int
    add_bos: bool
    fim_pre: int
    fim_suf: int
    fim_mid: int
    fim_pad: int
    fim_rep: int
    fim_sep: int

    def tokenize(self, text: str | bytes, *, add_special: bool = False,
                 parse_special: bool = False) -> list[int]: ...

    def single_token(self, text: str) -> int | None: ...

    def piece(self, token: int) -> bytes: ...


# Token texts by family, tried when llama.cpp's own FIM ids are missing. Each entry:
# (family, prefix, suffix, middle, pad/eot, repo_name, file_sep, order).
_FALLBACKS: tuple[tuple[str, str, str, str, str | None, str | None, str | None, str], ...] = (
    ("qwen2.5-coder", "<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>", "<|fim_pad|>",
     "<|repo_name|>", "<|file_sep|>", "psm"),
    ("starcoder", "<fim_prefix>", "<fim_suffix>", "<fim_middle>", "<fim_pad>",
     "<repo_name>", "<file_sep>", "psm"),
    ("starcoder-dash", "<fim-prefix>", "<fim-suffix>", "<fim-middle>", "<fim-pad>",
     None, None, "psm"),
    ("codellama", "▁<PRE>", "▁<SUF>", "▁<MID>", "▁<EOT>", None, None, "psm"),
    ("codellama-plain", "<PRE>", "<SUF>", "<MID>", "<EOT>", None, None, "psm"),
    ("deepseek-coder", "<｜fim▁begin｜>", "<｜fim▁hole｜>", "<｜fim▁end｜>", None,
     None, None, "psm"),
    ("codestral", "[PREFIX]", "[SUFFIX]", "[MIDDLE]", None, None, None, "spm"),
)
_FILE_SEP_ALTERNATIVES = ("<|file_sep|>", "<file_sep>", "<|file_separator|>")
_REPO_ALTERNATIVES = ("<|repo_name|>", "<repo_name>")


@dataclass(frozen=True, kw_only=True)
class FimTemplate:
    """How prompts are laid out for one model."""

    kind: Literal["fim", "continuation"]
    family: str = "generic"
    pre: int = -1
    suf: int = -1
    mid: int = -1
    pad: int = -1
    repo_name: int = -1
    file_sep: int = -1
    order: Literal["psm", "spm"] = "psm"
    bos: int = -1  # prepended when >= 0
    stop_ids: frozenset[int] = field(default_factory=frozenset)

    @property
    def has_repo_tokens(self) -> bool:
        """True when the model was trained with repository-level file markers."""
        return self.repo_name >= 0 and self.file_sep >= 0


def _text_of(vocab: VocabLike, tok: int) -> str:
    return vocab.piece(tok).decode("utf-8", "replace") if tok >= 0 else ""


def _first_single_token(vocab: VocabLike, texts: Sequence[str]) -> int:
    """The id of the first of ``texts`` that is one token of ``vocab``; -1 if none is."""
    for text in texts:
        found = vocab.single_token(text)
        if found is not None:
            return found
    return -1


def detect_template(vocab: VocabLike, *, order: str = "auto") -> FimTemplate:
    """Pick the FIM template from the vocabulary: llama.cpp's FIM ids, then known texts."""
    bos = vocab.bos if vocab.add_bos and vocab.bos >= 0 else -1
    stops = {t for t in (vocab.eos, vocab.eot, vocab.fim_pad, vocab.fim_sep) if t >= 0}
    pre, suf, mid = vocab.fim_pre, vocab.fim_suf, vocab.fim_mid
    family = "gguf"
    fam_order = "psm"
    pad, rep, sep = vocab.fim_pad, vocab.fim_rep, vocab.fim_sep
    if min(pre, suf) < 0:
        for fam, tp, ts, tm, tpad, trep, tsep, forder in _FALLBACKS:
            ip, isf = vocab.single_token(tp), vocab.single_token(ts)
            if ip is None or isf is None:
                continue
            im = vocab.single_token(tm)
            if im is None and forder != "spm":
                continue
            pre, suf, mid = ip, isf, (im if im is not None else -1)
            found_pad = vocab.single_token(tpad) if tpad else None
            pad = found_pad if found_pad is not None else pad
            # "is not None", not "or": token id 0 is a valid id.
            found_rep = vocab.single_token(trep) if trep else None
            found_sep = vocab.single_token(tsep) if tsep else None
            rep = found_rep if found_rep is not None else rep
            sep = found_sep if found_sep is not None else sep
            family, fam_order = fam, forder
            break
    if min(pre, suf) < 0 or (mid < 0 and fam_order != "spm"):
        return FimTemplate(kind="continuation", family="continuation", bos=bos,
                           stop_ids=frozenset(stops))
    if family == "gguf":
        # llama.cpp found the ids; name the family from their text for logs and ordering,
        # and take the family's end-of-infill token when llama.cpp has none (it misses
        # CodeLlama's "▁<EOT>" in GGUFs without FIM metadata: generation would not stop).
        pre_text = _text_of(vocab, pre).strip()
        for fam, tp, _ts, _tm, tpad, _trep, _tsep, forder in _FALLBACKS:
            if tp == pre_text:
                family, fam_order = fam, forder
                found_pad = vocab.single_token(tpad) if tpad and pad < 0 else None
                pad = found_pad if found_pad is not None else pad
                break
    if rep < 0:
        rep = _first_single_token(vocab, _REPO_ALTERNATIVES)
    if sep < 0:
        sep = _first_single_token(vocab, _FILE_SEP_ALTERNATIVES)
    if pad >= 0:
        stops.add(pad)
    if sep >= 0:
        stops.add(sep)
    chosen = fam_order if order == "auto" else order
    return FimTemplate(kind="fim", family=family, pre=pre, suf=suf, mid=mid, pad=pad,
                       repo_name=rep, file_sep=sep,
                       order="spm" if chosen == "spm" else "psm", bos=bos,
                       stop_ids=frozenset(stops))


@dataclass(frozen=True, kw_only=True)
class PromptInput:
    """The text around the cursor and where it lives; no LSP types."""

    prefix: str
    suffix: str
    prefix_offset: int = 0  # where ``prefix`` starts in the document (it may be capped)
    repo_name: str | None = None
    rel_path: str = ""
    # Chunks of other buffers, most useful first, and the most tokens they may take.
    context: tuple[ContextChunk, ...] = ()
    context_tokens: int = 0


@dataclass(frozen=True, kw_only=True)
class Prompt:
    """Tokens to evaluate, plus the text the output must start with (token healing)."""

    tokens: list[int]
    constraint: bytes = b""
    prefix_window: str = ""  # the text just before the cursor
    suffix_window: str = ""
    heal_tokens: int = 0
    context_tokens: int = 0  # tokens of other buffers' chunks at the front
    context_start: int = 0  # where those tokens start in ``tokens``
    context_sources: str = ""  # e.g. "definition:2,ring:1"
    window: int = 0  # the token budget it was laid out in

    def without_context(self) -> list[int]:
        """The same prompt without the other buffers' chunks: the current file as the
        model reads it alone (same window, header and cursor)."""
        return (self.tokens[:self.context_start]
                + self.tokens[self.context_start + self.context_tokens:])


def prefix_window(prefix: str, char_budget: int, prefix_offset: int = 0,
                  quantum: int | None = None) -> str:
    """The tail of ``prefix`` within ``char_budget``, starting at a line start.

    The start is quantised to ``quantum`` characters of the document (``prefix_offset``
    is where ``prefix`` starts in it), so it moves only every ~1k characters of typing,
    not on every keystroke. The default quantum is WINDOW_QUANTUM, or a quarter of
    ``char_budget`` when that is smaller (else rounding could empty a small window).
    """
    if len(prefix) <= char_budget:
        return prefix
    step = quantum or _quantum(char_budget)
    over = prefix_offset + len(prefix) - char_budget
    q = max(0, -(-over // step) * step - prefix_offset)
    nl = prefix.find("\n", q - 1) if q > 0 else -1
    if nl < 0:
        # One enormous line: fall back to the quantised cut itself.
        return prefix[q:]
    return prefix[nl + 1:]


def _quantum(char_budget: int) -> int:
    return min(WINDOW_QUANTUM, max(1, char_budget // 4))


def suffix_window(suffix: str, char_budget: int) -> str:
    """The head of ``suffix`` within ``char_budget``, ending at a line end."""
    if len(suffix) <= char_budget:
        return suffix
    cut = suffix.rfind("\n", 0, char_budget)
    return suffix[: cut + 1] if cut >= 0 else suffix[:char_budget]


def _fit_prefix(vocab: VocabLike, prefix: str, budget: int,
                prefix_offset: int) -> tuple[str, list[int]]:
    """The tail of ``prefix`` that tokenizes within ``budget`` tokens, and its tokens.

    Every candidate is a :func:`prefix_window`, so the start stays on the quantised grid of
    document positions: a keystroke at the cursor then still leaves the window's start in
    place. The first cut assumes CHARS_PER_TOKEN_GUESS; one that fills less than
    :data:`FILL` of the budget is widened once at its own density, then shrunk to fit.
    """
    chars = budget * CHARS_PER_TOKEN_GUESS
    step = _quantum(chars)  # fixed by the budget, not by this text's length
    widened = False
    while True:
        text = prefix_window(prefix, chars, prefix_offset, step)
        toks = vocab.tokenize(text)
        if not widened and toks and len(text) < len(prefix) and len(toks) < budget * FILL:
            widened = True
            chars = len(text) * budget // len(toks)
            continue
        if len(toks) <= budget or not text:
            return text, toks
        # Drop at least the excess at this text's own density; prefix_window then rounds
        # the new start up to the next quantum and line start (so each pass moves it).
        chars = len(text) - -(-(len(toks) - budget) * len(text) // len(toks))


def _fit_suffix(vocab: VocabLike, suffix: str, budget: int) -> tuple[str, list[int]]:
    """The head of ``suffix`` that tokenizes within ``budget`` tokens, and its tokens (the
    first cut at CHARS_PER_TOKEN_GUESS, widened once at its own density when it fills less
    than :data:`FILL` of the budget, then shrunk to fit)."""
    text = suffix_window(suffix, budget * CHARS_PER_TOKEN_GUESS)
    toks = vocab.tokenize(text)
    if toks and len(text) < len(suffix) and len(toks) < budget * FILL:
        text = suffix_window(suffix, len(text) * budget // len(toks))
        toks = vocab.tokenize(text)
    while len(toks) > budget and text:
        keep = len(text) - -(-(len(toks) - budget) * len(text) // len(toks))
        nl = text.rfind("\n", 0, keep)
        text = text[: nl + 1] if nl >= 0 else text[: max(0, keep)]
        toks = vocab.tokenize(text)
    return text, toks


def _heal(vocab: VocabLike, toks: list[int]) -> tuple[list[int], bytes]:
    """Token healing: drop the last token before the cursor and return its text to force.

    A cursor inside a word or after indentation cuts a token the model never saw cut, and
    it answers by writing the word's last letters or the indentation again. Forced as the
    start of the output instead, the model picks its best token that agrees with it.
    """
    if not toks:
        return toks, b""
    return toks[:-1], vocab.piece(toks[-1])


def _context(template: FimTemplate, vocab: VocabLike,
             inp: PromptInput) -> tuple[list[int], list[ContextChunk]]:
    """The other buffers' chunks as tokens, within ``inp.context_tokens``.

    Models trained on repository-level prompts (Qwen2.5-Coder) get each buffer as a file of
    the repository (``<|file_sep|>path`` then its chunks, in the file's order); the others
    get a plain-text header, each buffer under a comment naming it. Whole chunks only,
    most useful first while they fit. The file with the most useful chunk comes last,
    nearest the cursor's file.
    """
    repo = template.kind == "fim" and template.has_repo_tokens
    mark = comment_mark(inp.rel_path or (inp.context[0].path if inp.context else ""))
    # Each chunk and each file's header is tokenized once; a file costs its header once.
    heads: dict[str, list[int]] = {}
    chunks: dict[str, list[tuple[int, tuple[int, ...]]]] = {}
    used: list[ContextChunk] = []
    total = 0 if repo else 1  # the blank line after a plain header
    for chunk in inp.context:
        toks = _tokens_of_chunk(vocab, chunk.text.rstrip("\n") + "\n")
        head = heads.get(chunk.path)
        if head is None:
            head = ([template.file_sep, *_tokens_of_chunk(vocab, f"{chunk.path}\n")] if repo
                    else list(_tokens_of_chunk(vocab, f"{mark} {chunk.path}\n")))
        cost = len(toks) + (0 if chunk.path in heads else len(head))
        if total + cost > inp.context_tokens:
            continue  # a smaller chunk later may still fit
        heads[chunk.path] = head
        chunks.setdefault(chunk.path, []).append((chunk.line, toks))
        used.append(chunk)
        total += cost
    out: list[int] = []
    for path in reversed(heads):
        out += heads[path]
        for _line, toks in sorted(chunks[path], key=lambda lt: lt[0]):
            out += toks
    if out and not repo:
        out += vocab.tokenize("\n")
    return out, used


# Chunk (and chunk header) text -> tokens, per vocabulary. A set of chunks stays the same
# while the user types (fimls.server), and every prompt built meanwhile (each request, the
# prefetch after each suggestion, ...) would tokenize it
# again: 0.8 ms for 1.5 KB.
_CHUNK_TOKENS: weakref.WeakKeyDictionary[Any, dict[str, tuple[int, ...]]] = (
    weakref.WeakKeyDictionary())
CHUNK_CACHE_SIZE = 256


def _tokens_of_chunk(vocab: VocabLike, text: str) -> tuple[int, ...]:
    """``vocab.tokenize(text)``, remembered for the chunks seen last."""
    try:
        cache = _CHUNK_TOKENS.setdefault(vocab, {})
    except TypeError:  # a vocabulary that cannot be weakly referenced
        return tuple(vocab.tokenize(text))
    toks = cache.get(text)
    if toks is None:
        toks = cache[text] = tuple(vocab.tokenize(text))
        if len(cache) > CHUNK_CACHE_SIZE:
            del cache[next(iter(cache))]
    return toks


def _head(template: FimTemplate, vocab: VocabLike,
          inp: PromptInput) -> tuple[list[int], list[ContextChunk], int, int]:
    """BOS, the other buffers' chunks, and for FIM models with repository tokens the
    repository and file header; with the chunks used, their tokens and where they start."""
    head: list[int] = [template.bos] if template.bos >= 0 else []
    ctx, chosen = _context(template, vocab, inp) if inp.context else ([], [])
    at = len(head)
    if template.kind == "continuation" or not template.has_repo_tokens:
        head += ctx
    if template.kind == "continuation":
        return head, chosen, len(ctx), at
    if template.has_repo_tokens and (inp.repo_name is not None or ctx):
        head += [template.repo_name, *vocab.tokenize((inp.repo_name or "workspace") + "\n")]
        at = len(head)
        head += ctx
    if template.file_sep >= 0 and (inp.rel_path or (ctx and template.has_repo_tokens)):
        head += [template.file_sep, *vocab.tokenize((inp.rel_path or "current") + "\n")]
    return head, chosen, len(ctx), at


def suffix_budget(avail: int) -> int:
    """The most tokens the text after the cursor takes of ``avail`` for the file."""
    return max(16, int(avail * SUFFIX_SHARE))


def opening_prompt(template: FimTemplate, vocab: VocabLike, inp: PromptInput,
                   budget_tokens: int, *, without_context: bool = False) -> list[int]:
    """The first tokens of every prompt for ``inp.prefix``'s document with the cursor
    within its first window, whatever the cursor.

    When a file is opened the cursor is not known yet; editors mostly open a file at its
    top. These tokens, evaluated while the user reads, are the cache such a request reuses.
    ``inp.prefix`` is the whole text; the suffix is not used. ``without_context``: the
    same tokens less the other buffers' chunks (what :meth:`Prompt.without_context` of
    the prompts that follow starts with).
    """
    if inp.context:
        inp = replace(inp, context_tokens=min(inp.context_tokens, budget_tokens // 2))
    head, _, n_ctx, at = _head(template, vocab, inp)
    if template.kind == "continuation":
        room = budget_tokens - len(head)
        toks = vocab.tokenize(inp.prefix[: room * CHARS_PER_TOKEN_GUESS])[:room]
        # The last token may be cut mid-word by the cursor (then healed): leave it out.
        out = head + toks[:-1]
    elif template.order != "psm":
        out = [*head, template.suf]  # SPM: the suffix, which depends on the cursor, comes first
    else:
        avail = max(16, budget_tokens - len(head) - 3)
        room = avail - suffix_budget(avail)
        # The file's first lines, as a prompt with the cursor below them starts; the
        # last may be cut by the cursor, so it is left out.
        text = suffix_window(inp.prefix, room * CHARS_PER_TOKEN_GUESS)
        toks = vocab.tokenize(text)[:room]
        out = [*head, template.pre, *toks[:-1]]
    if without_context:
        del out[at:at + n_ctx]
    return out


def build_prompt(template: FimTemplate, vocab: VocabLike, inp: PromptInput,
                 budget_tokens: int) -> Prompt:
    """Lay out the prompt for ``template`` within ``budget_tokens`` tokens: the header, other
    buffers' chunks (at most half the window), then for FIM models the lines just after the
    cursor (at most :data:`SUFFIX_SHARE` of what the file may take) and as many of the lines
    just before it as the rest holds."""
    if inp.context:
        # The chunks take at most half the window: the file itself matters most.
        inp = replace(inp, context_tokens=min(inp.context_tokens, budget_tokens // 2))
    head, used, ctx_tokens, ctx_start = _head(template, vocab, inp)
    extra: dict[str, Any] = {"context_tokens": ctx_tokens, "context_sources": sources_of(used),
                             "context_start": ctx_start, "window": budget_tokens}
    if template.kind == "continuation":
        window, toks = _fit_prefix(vocab, inp.prefix, budget_tokens - len(head),
                                   inp.prefix_offset)
        toks, constraint = _heal(vocab, toks)
        return Prompt(tokens=head + toks, constraint=constraint, prefix_window=window,
                      heal_tokens=int(bool(constraint)), **extra)

    avail = max(16, budget_tokens - len(head) - 3)
    suf_text, suf_toks = _fit_suffix(vocab, inp.suffix, suffix_budget(avail))
    pre_text, pre_toks = _fit_prefix(vocab, inp.prefix, avail - len(suf_toks),
                                     inp.prefix_offset)
    if template.order == "spm":
        body = [template.suf, *suf_toks, template.pre, *pre_toks]
    else:
        body = [template.pre, *pre_toks, template.suf, *suf_toks]
    if template.mid >= 0:
        body.append(template.mid)
    return Prompt(tokens=head + body, prefix_window=pre_text, suffix_window=suf_text,
                  **extra)
