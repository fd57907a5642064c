"""FIM template detection and prompt layout within a token budget.

Two shapes of prompt:

* **FIM** for models with fill-in-the-middle tokens: ``<pre>prefix<suf>suffix<mid>`` (PSM) or
  ``<suf>suffix<pre>prefix<mid>`` (SPM), with repository/file tokens in front when the
  vocabulary has them (StarCoder2/Qwen2.5-Coder style), filled with the real workspace name
  and relative path.
* **Continuation** for models without FIM tokens (the embedded Gemma 3 270M): the prefix
  only; the suffix is used by the decode loop to stop and by post-processing to trim.

Windows are cut at line boundaries and their starts are quantised, so that typing at the
cursor leaves the prompt's first tokens untouched and the KV cache can be reused.

In a file longer than its window, a PSM prompt's prefix is the file's opening, a gap
comment, then the lines just before the cursor: the opening does not depend on the cursor,
so it is evaluated once (while the user reads, after didOpen) and serves every cursor in
the file; a new cursor costs only the small share that depends on it (``LOCAL_SHARE``).
A cold prompt (nothing cached, no time to read the opening) holds the file's import lines
instead, then more of the lines before the cursor.
"""

from __future__ import annotations

import re
import weakref
from dataclasses import dataclass, field, replace
from typing import Any, Literal, Protocol

from fimls.context import ContextChunk, comment_mark, sources_of

# Where a window may start moves in steps of this many characters, so a keystroke almost
# never moves it (the KV cache keeps everything before the cursor).
WINDOW_QUANTUM = 1024
CHARS_PER_TOKEN_GUESS = 3  # conservative: code usually packs 3.5-4.5 chars per token
# A FIM window's share that depends on the cursor: the suffix and, in a file longer than
# the window, the prefix's tail. The rest of a long file's window is its opening, which
# does not depend on the cursor and is evaluated while the user reads (idle prefill): a
# cursor at a new place then costs only this share (about 1.2 s of the window's ~6 s).
LOCAL_SHARE = 0.2
# The most of a cold prompt's prefix (see build_prompt's ``cold``) the file's import lines
# take: they name what the code near the cursor calls, the rest is the lines before it.
IMPORT_SHARE = 0.25
# A statement that names what a file takes from elsewhere, at a line's start: Python,
# JavaScript/TypeScript, C/C++/Objective-C, Rust, PHP, Perl, Go, Java/Kotlin/Scala, C#,
# Ruby, Lua. Its continuation lines are those up to where its brackets close. Indented ones
# are left out: they are a function's own, not what the file as a whole uses.
_IMPORT_LINE = re.compile(
    r"(?:from[ \t]+[\w.]+[ \t]+import\b|import\b|#[ \t]*(?:include|import)\b"
    r"|use[ \t]+[\w:\\{]|using[ \t]+[\w.]|package[ \t]+[\w.]+[ \t]*;?\s*$"
    r"|extern[ \t]+crate\b|require(?:_relative)?\b"
    r"|(?:const|let|var|local)[ \t]+[\w{}, \t]+=[ \t]*require\b)")
_IMPORT_MAX_LINES = 40  # one statement's continuation lines, at most


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
        for text in _REPO_ALTERNATIVES:
            found = vocab.single_token(text)
            if found is not None:
                rep = found
                break
    if sep < 0:
        for text in _FILE_SEP_ALTERNATIVES:
            found = vocab.single_token(text)
            if found is not None:
                sep = found
                break
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
    # The document's first characters when ``prefix`` does not start at its top
    # (``prefix_offset`` > 0); empty: only a window of ``prefix`` is laid out.
    opening: str = ""


@dataclass(frozen=True, kw_only=True)
class Prompt:
    """Tokens to evaluate, plus the text the output must start with (token healing)."""

    tokens: list[int]
    constraint: bytes = b""
    prefix_window: str = ""  # the text just before the cursor
    suffix_window: str = ""
    opening_window: str = ""  # a long file's opening, in front of ``prefix_window``
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
    document positions even when the first guess (CHARS_PER_TOKEN_GUESS) holds too many
    tokens: a keystroke at the cursor then still leaves the window's start in place.
    """
    chars = budget * CHARS_PER_TOKEN_GUESS
    step = _quantum(chars)  # fixed by the budget, not by this text's length
    while True:
        text = prefix_window(prefix, chars, prefix_offset, step)
        toks = vocab.tokenize(text)
        if len(toks) <= budget or not text:
            return text, toks
        # Drop at least the excess at this text's own density; prefix_window then rounds
        # the new start up to the next quantum and line start (so each pass moves it).
        chars = len(text) - -(-(len(toks) - budget) * len(text) // len(toks))


def _fit_suffix(vocab: VocabLike, suffix: str, budget: int,
                guess: float = CHARS_PER_TOKEN_GUESS) -> tuple[str, list[int]]:
    """The head of ``suffix`` that tokenizes within ``budget`` tokens, and its tokens
    (the first cut at ``guess`` characters per token, then shrunk to fit)."""
    text = suffix_window(suffix, int(budget * guess))
    while True:
        toks = vocab.tokenize(text)
        if len(toks) <= budget or not text:
            return text, toks
        keep = len(text) - -(-(len(toks) - budget) * len(text) // len(toks))
        nl = text.rfind("\n", 0, keep)
        text = text[: nl + 1] if nl >= 0 else text[: max(0, keep)]


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
# prefetch after each suggestion, the cold and whole layouts compared) would tokenize it
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


def _shares(avail: int, budget: int) -> tuple[int, int]:
    """(suffix budget, cursor-dependent budget) of a FIM window of ``budget`` tokens with
    ``avail`` left for the file. The cursor's share is of the whole window (what a new
    place costs), not of what other files' chunks leave: it takes at most half of that."""
    local = min(max(48, avail // 2), max(48, int(budget * LOCAL_SHARE)))
    return max(16, local // 3), local


def _opening(vocab: VocabLike, text: str, avail: int, budget: int) -> tuple[str, list[int]]:
    """The opening of a long file in a FIM window of ``budget`` tokens (``avail`` for the
    file): its first lines within the share that does not depend on the cursor, and their
    tokens. The same function serves the idle prefill and the requests, so the tokens
    are the same."""
    _, local = _shares(avail, budget)
    return _fit_suffix(vocab, text, avail - local, guess=5)


def _import_statements(text: str) -> list[tuple[int, str]]:
    """The top-level import statements of ``text``, each with its continuation lines, and
    the offset in ``text`` where each ends."""
    out: list[tuple[int, str]] = []
    lines = text.splitlines(keepends=True)
    pos = i = 0
    while i < len(lines):
        if not _IMPORT_LINE.match(lines[i]):
            pos += len(lines[i])
            i += 1
            continue
        depth, j = 0, i
        while j < len(lines) and j < i + _IMPORT_MAX_LINES:
            depth += sum(lines[j].count(c) for c in "([{") - sum(lines[j].count(c) for c in ")]}")
            j += 1
            if depth <= 0:
                break
        stmt = "".join(lines[i:j])
        pos += len(stmt)
        out.append((pos, stmt))
        i = j
    return out


def _joined(statements: list[tuple[int, str]]) -> str:
    text = "".join(stmt for _end, stmt in statements)
    return text if not text or text.endswith(("\n", "\r")) else text + "\n"


def import_lines(text: str) -> str:
    """The import statements of ``text`` (the top of a file), in order, with their
    continuation lines; empty when it has none."""
    return _joined(_import_statements(text))


def _gap(vocab: VocabLike, path: str) -> list[int]:
    """The comment that stands for the lines left out between two parts of a prefix."""
    return vocab.tokenize(f"{comment_mark(path)} ...\n")


def _with_imports(vocab: VocabLike, inp: PromptInput, top: str,
                  pre_budget: int) -> tuple[str, str, list[int]] | None:
    """A cold prompt's prefix: the file's import lines above the window, a gap, and the
    lines just before the cursor; (imports, neighbourhood, tokens), or None when no
    import line lies above the lines the window holds anyway.

    ``top`` is the document from its start (``inp.prefix`` or ``inp.opening``). The
    imports are taken only from above the cursor's window, so they stay the same while
    the user types at the cursor (the window's start is quantised). When they do not all
    fit, the last ones are kept: by convention the project's own modules are imported
    after the standard library's and third parties', and they are what other open files
    define.
    """
    cursor = inp.prefix_offset + len(inp.prefix)
    statements = _import_statements(top[:cursor])
    if not statements:
        return None
    gap = _gap(vocab, inp.rel_path)
    most = int(pre_budget * IMPORT_SHARE)
    imp_text, imp_toks = _fit_prefix(vocab, _joined(statements), most, 0)
    near_text, near_toks = _fit_prefix(vocab, inp.prefix,
                                       max(16, pre_budget - len(imp_toks) - len(gap)),
                                       inp.prefix_offset)
    start = cursor - len(near_text)
    above = [st for st in statements if st[0] <= start]
    if not above:
        return None
    if len(above) < len(statements):
        imp_text, imp_toks = _fit_prefix(vocab, _joined(above), most, 0)
    if not imp_toks:
        return None
    return imp_text, near_text, imp_toks + gap + near_toks


def _with_opening(vocab: VocabLike, inp: PromptInput, opening: str, avail: int, budget: int,
                  pre_budget: int) -> tuple[str, str, list[int]] | None:
    """A long file's prefix: its opening (cached since the file was opened), a gap, and
    the cursor's neighbourhood; (opening, neighbourhood, tokens), or None when the two
    would overlap (the file is barely longer than the window)."""
    head_text, open_toks = _opening(vocab, opening, avail, budget)
    gap = _gap(vocab, inp.rel_path)
    near_text, near_toks = _fit_prefix(vocab, inp.prefix,
                                       max(16, pre_budget - len(open_toks) - len(gap)),
                                       inp.prefix_offset)
    if inp.prefix_offset + len(inp.prefix) - len(near_text) < len(head_text):
        return None
    return head_text, near_text, open_toks + gap + near_toks


def opening_prompt(template: FimTemplate, vocab: VocabLike, inp: PromptInput,
                   budget_tokens: int, *, without_context: bool = False) -> list[int]:
    """The first tokens of every prompt for ``inp.prefix``'s document, whatever the cursor.

    When a file is opened the cursor is not known yet. A FIM prompt in a file longer than
    its window starts with the header and the file's opening (see :func:`build_prompt`),
    and a cursor within the first window also starts with the file's first lines. These
    tokens, evaluated while the user reads, are the cache the first request reuses.
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
        out = [*head, template.pre, *_opening(vocab, inp.prefix, avail, budget_tokens)[1]]
    if without_context:
        del out[at:at + n_ctx]
    return out


def build_prompt(template: FimTemplate, vocab: VocabLike, inp: PromptInput,
                 budget_tokens: int, *, share_of: int | None = None,
                 cold: bool = False) -> Prompt:
    """Lay out the prompt for ``template`` within ``budget_tokens`` tokens.

    ``share_of``: the window whose suffix share this prompt keeps when it is cut below
    that window. ``cold``: a prompt nothing is cached for (see the engine's cold
    prompts), which spends its tokens nearest the cursor: never a long file's opening,
    only its import lines (at most ``IMPORT_SHARE`` of the prefix), then the lines just
    before the cursor.
    """
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
    shares = share_of or budget_tokens
    suf_budget, _ = _shares(avail, shares)
    suf_text, suf_toks = _fit_suffix(vocab, inp.suffix, suf_budget)
    pre_budget = avail - len(suf_toks)
    opening = inp.prefix if inp.prefix_offset == 0 else inp.opening
    split = None
    # A prefix longer than this cannot be one window (see _fit_prefix): no need to fit it.
    if template.order == "psm" and opening and (
            inp.prefix_offset > 0 or len(inp.prefix) > pre_budget * CHARS_PER_TOKEN_GUESS):
        split = (_with_imports(vocab, inp, opening, pre_budget) if cold
                 else _with_opening(vocab, inp, opening, avail, shares, pre_budget))
    if split is None:
        pre_text, pre_toks = _fit_prefix(vocab, inp.prefix, pre_budget, inp.prefix_offset)
        if (template.order == "psm" and opening and not cold and inp.prefix_offset == 0
                and pre_budget * CHARS_PER_TOKEN_GUESS >= len(inp.prefix) > len(pre_text)):
            split = _with_opening(vocab, inp, opening, avail, shares, pre_budget)
    open_text = ""
    if split is not None:
        open_text, pre_text, pre_toks = split
    pre_toks, constraint = _heal(vocab, pre_toks)
    if template.order == "spm":
        body = [template.suf, *suf_toks, template.pre, *pre_toks]
    else:
        body = [template.pre, *pre_toks, template.suf, *suf_toks]
    if template.mid >= 0:
        body.append(template.mid)
    return Prompt(tokens=head + body, constraint=constraint, prefix_window=pre_text,
                  suffix_window=suf_text, opening_window=open_text,
                  heal_tokens=int(bool(constraint)), **extra)
