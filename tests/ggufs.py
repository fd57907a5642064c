"""Tiny vocab-only GGUF files that mimic the FIM vocabularies of real code models.

The files written here carry no tensors; llama.cpp loads them only with
``llama_model_params.vocab_only = True``.  They exist so that FIM template detection (and
tokenization around it) can be tested without downloading a real model.

Each family copies the special-token *texts* of a real model family (StarCoder2,
Qwen2.5-Coder, CodeLlama, DeepSeek-Coder, CodeGemma, Codestral) plus a "plain" family that
has no FIM tokens at all.  Token ids are small and synthetic (see :func:`vocab_ids`), so tests
must look ids up instead of hard-coding the ids of the real models.

``with_metadata=True`` writes the ``tokenizer.ggml.fim_*_token_id`` keys (and
``tokenizer.ggml.eot_token_id`` for families with a dedicated end-of-infill token), the way
current convert scripts do.  ``with_metadata=False`` omits them, like older conversions, so
llama.cpp has to find FIM tokens by their text; :data:`LLAMA_CPP_AUTODETECT` replicates the
texts it recognizes (llama.cpp ``src/llama-vocab.cpp``, as vendored in llama-cpp-python
0.3.36) and :func:`expected_llama_ids` predicts what ``llama_vocab_fim_*`` then returns.

Usage::

    path = write_vocab_gguf(tmp_path / "sc2.gguf", "starcoder2", with_metadata=False)
    ids = expected_llama_ids("starcoder2", with_metadata=False)  # {"pre": 1, ..., "rep": -1}
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path

import gguf

__all__ = [
    "FAMILIES",
    "LLAMA_CPP_AUTODETECT",
    "LLAMA_CPP_EOG_TEXTS",
    "ROLES",
    "VocabSpec",
    "expected_eog_ids",
    "expected_llama_ids",
    "role_ids",
    "vocab_ids",
    "vocab_spec",
    "write_vocab_gguf",
]

#: Roles reported by :func:`expected_llama_ids`, in llama.cpp API order.
ROLES: tuple[str, ...] = ("pre", "suf", "mid", "pad", "rep", "sep", "eot", "eos", "bos")

#: family -> role -> token text.  Roles: "pre", "suf", "mid", "pad", "rep", "sep" (the six
#: ``llama_vocab_fim_*`` slots), "eot" (only where the model has a dedicated end-of-infill
#: token), "eos" and "bos".  A role is missing when the model has no such token.
FAMILIES: dict[str, dict[str, str]] = {
    "starcoder2": {
        "pre": "<fim_prefix>",
        "suf": "<fim_suffix>",
        "mid": "<fim_middle>",
        "pad": "<fim_pad>",
        "rep": "<repo_name>",
        "sep": "<file_sep>",
        "eos": "<|endoftext|>",
        "bos": "<|endoftext|>",
    },
    "qwen2.5-coder": {
        "pre": "<|fim_prefix|>",
        "suf": "<|fim_suffix|>",
        "mid": "<|fim_middle|>",
        "pad": "<|fim_pad|>",
        "rep": "<|repo_name|>",
        "sep": "<|file_sep|>",
        "eos": "<|endoftext|>",
        "bos": "<|endoftext|>",
    },
    "codellama": {
        "pre": "▁<PRE>",
        "suf": "▁<SUF>",
        "mid": "▁<MID>",
        "eot": "▁<EOT>",
        "eos": "</s>",
        "bos": "<s>",
    },
    "deepseek-coder": {
        "pre": "<｜fim▁begin｜>",
        "suf": "<｜fim▁hole｜>",
        "mid": "<｜fim▁end｜>",
        "eos": "<｜end▁of▁sentence｜>",
        "bos": "<｜begin▁of▁sentence｜>",
    },
    "codegemma": {
        "pre": "<|fim_prefix|>",
        "suf": "<|fim_suffix|>",
        "mid": "<|fim_middle|>",
        "sep": "<|file_separator|>",
        "eos": "<eos>",
        "bos": "<bos>",
    },
    "codestral": {
        "pre": "[PREFIX]",
        "suf": "[SUFFIX]",
        "mid": "[MIDDLE]",
        "eos": "</s>",
        "bos": "<s>",
    },
    "plain": {
        "eos": "<|endoftext|>",
        "bos": "<|endoftext|>",
    },
}

#: Texts llama.cpp's ``llama_vocab::impl::load`` auto-detects per role when the metadata key
#: is absent.  Note what is *not* here: ``<repo_name>`` / ``<file_sep>`` (StarCoder2),
#: ``<|file_separator|>`` (CodeGemma), ``[PREFIX]`` & co (Codestral), and ``▁<EOT>``
#: (llama.cpp checks ``_<EOT>`` with an ASCII underscore, so CodeLlama's EOT is missed).
LLAMA_CPP_AUTODETECT: dict[str, tuple[str, ...]] = {
    "eot": (
        "<|eot_id|>",
        "<|im_end|>",
        "<|end|>",
        "<end_of_turn>",
        "<|endoftext|>",
        "<|end_of_text|>",
        "<EOT>",
        "_<EOT>",
        "[EOT]",
        "<｜end▁of▁sentence｜>",
        "<end_of_utterance>",
    ),
    "pre": (
        "<|fim_prefix|>",
        "<fim-prefix>",
        "<fim_prefix>",
        "<｜fim▁begin｜>",
        "<PRE>",
        "▁<PRE>",
        "<|code_prefix|>",
        "<|prefix|>",
    ),
    "suf": (
        "<|fim_suffix|>",
        "<fim-suffix>",
        "<fim_suffix>",
        "<｜fim▁hole｜>",
        "<SUF>",
        "▁<SUF>",
        "<|code_suffix|>",
        "<|suffix|>",
    ),
    "mid": (
        "<|fim_middle|>",
        "<fim-middle>",
        "<fim_middle>",
        "<｜fim▁end｜>",
        "<MID>",
        "▁<MID>",
        "<|code_middle|>",
        "<|middle|>",
    ),
    "pad": ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"),
    "rep": ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"),
    "sep": ("<|file_sep|>",),
}

#: Texts llama.cpp always adds to the end-of-generation set (besides fim pad/rep/sep, eos, eot).
LLAMA_CPP_EOG_TEXTS: frozenset[str] = frozenset(
    {
        "<|eot_id|>",
        "<|im_end|>",
        "<|end|>",
        "<|return|>",
        "<|call|>",
        "<|flush|>",
        "<|calls|>",
        "<end_of_turn>",
        "<|endoftext|>",
        "</s>",
        "<|eom_id|>",
        "<EOT>",
        "_<EOT>",
        "[EOT]",
        "[EOS]",
        "<|end_of_text|>",
        "<end_of_utterance>",
        "<eos>",
        "<turn|>",
        "<|tool_response>",
        "<｜end▁of▁sentence｜>",
        "[e~[",
    }
)

_FIM_KEYS: dict[str, str] = {
    "pre": gguf.Keys.Tokenizer.FIM_PRE_ID,
    "suf": gguf.Keys.Tokenizer.FIM_SUF_ID,
    "mid": gguf.Keys.Tokenizer.FIM_MID_ID,
    "pad": gguf.Keys.Tokenizer.FIM_PAD_ID,
    "rep": gguf.Keys.Tokenizer.FIM_REP_ID,
    "sep": gguf.Keys.Tokenizer.FIM_SEP_ID,
    "eot": gguf.Keys.Tokenizer.EOT_ID,
}

_CONTROL = int(gguf.TokenType.CONTROL)
_NORMAL = int(gguf.TokenType.NORMAL)
_BYTE = int(gguf.TokenType.BYTE)
_UNKNOWN = int(gguf.TokenType.UNKNOWN)


@dataclass(frozen=True)
class _Layout:
    """How a family's vocabulary is laid out and configured."""

    arch: str
    name: str
    model: str  # tokenizer.ggml.model: "gpt2" (byte-level BPE) or "llama" (SentencePiece)
    head: tuple[str, ...]  # special tokens before the ordinary ones (ids 0..)
    tail: tuple[str, ...]  # special tokens after the ordinary ones
    pre: str | None = None  # tokenizer.ggml.pre (BPE only)
    add_bos: bool = False
    add_space_prefix: bool | None = None  # SPM only; None leaves llama.cpp's default (True)
    unk: str | None = None
    pad: str | None = None  # tokenizer.ggml.padding_token_id (not the FIM pad)


_LAYOUTS: dict[str, _Layout] = {
    "starcoder2": _Layout(
        arch="starcoder2",
        name="starcoder2-vocab",
        model="gpt2",
        pre="starcoder",
        head=(
            "<|endoftext|>",
            "<fim_prefix>",
            "<fim_middle>",
            "<fim_suffix>",
            "<fim_pad>",
            "<repo_name>",
            "<file_sep>",
            "<issue_start>",
        ),
        tail=(),
    ),
    "qwen2.5-coder": _Layout(
        arch="qwen2",
        name="qwen2.5-coder-vocab",
        model="gpt2",
        pre="qwen2",
        head=(),
        tail=(
            "<|endoftext|>",
            "<|im_start|>",
            "<|fim_prefix|>",
            "<|fim_middle|>",
            "<|fim_suffix|>",
            "<|fim_pad|>",
            "<|repo_name|>",
            "<|file_sep|>",
        ),
    ),
    "codellama": _Layout(
        arch="llama",
        name="codellama-vocab",
        model="llama",
        add_bos=True,
        add_space_prefix=True,
        head=("<unk>", "<s>", "</s>"),
        tail=("▁<PRE>", "▁<SUF>", "▁<MID>", "▁<EOT>"),
        unk="<unk>",
    ),
    "deepseek-coder": _Layout(
        arch="llama",
        name="deepseek-coder-vocab",
        model="gpt2",
        pre="deepseek-coder",
        add_bos=True,
        head=(),
        tail=(
            "<｜begin▁of▁sentence｜>",
            "<｜end▁of▁sentence｜>",
            "<｜fim▁hole｜>",
            "<｜fim▁begin｜>",
            "<｜fim▁end｜>",
        ),
    ),
    "codegemma": _Layout(
        arch="gemma",
        name="codegemma-vocab",
        model="llama",
        add_bos=True,
        add_space_prefix=False,
        head=(
            "<pad>",
            "<eos>",
            "<bos>",
            "<unk>",
            "<|fim_prefix|>",
            "<|fim_middle|>",
            "<|fim_suffix|>",
            "<|file_separator|>",
        ),
        tail=(),
        unk="<unk>",
        pad="<pad>",
    ),
    "codestral": _Layout(
        arch="llama",
        name="codestral-vocab",
        model="llama",
        add_bos=True,
        add_space_prefix=True,
        head=("<unk>", "<s>", "</s>", "[INST]", "[/INST]", "[PREFIX]", "[MIDDLE]", "[SUFFIX]"),
        tail=(),
        unk="<unk>",
    ),
    "plain": _Layout(
        arch="llama",
        name="plain-vocab",
        model="gpt2",
        pre="gpt-2",
        head=(),
        tail=("<|endoftext|>",),
    ),
}

# Byte-level BPE merges ("left right"), in rank order; spelled in GPT-2's byte-to-unicode
# alphabet (Ġ = space, Ċ = newline).
_BPE_MERGES: tuple[str, ...] = (
    "Ġ Ġ",
    "ĠĠ ĠĠ",
    "d e",
    "de f",
    "r e",
    "t u",
    "r n",
    "re tu",
    "retu rn",
    "Ġ f",
    "Ġ x",
    "Ġ return",
    "i n",
    "Ġ in",
    "p r",
    "pr in",
    "prin t",
)

# SentencePiece pieces (besides <0xNN> bytes), best score first.
_SPM_PIECES: tuple[str, ...] = (
    "▁▁▁▁",
    "▁▁",
    "▁return",
    "▁def",
    "▁print",
    "return",
    "def",
    "print",
    "▁f",
    "▁x",
    "▁in",
    "re",
    "in",
    "▁",
    *"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789",
    *"()[]{}:;.,=+-*/_'\"#<>!?",
)


@cache
def _gpt2_byte_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable unicode character map."""
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    chars = printable[:]
    n = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(printable, chars, strict=True)}


@dataclass(frozen=True)
class VocabSpec:
    """Everything written into the tokenizer part of a family's GGUF."""

    family: str
    tokens: tuple[str, ...]
    token_types: tuple[int, ...]
    scores: tuple[float, ...]
    merges: tuple[str, ...]


def _ordinary_tokens(model: str) -> tuple[list[str], list[int], list[float], list[str]]:
    if model == "gpt2":
        b2u = _gpt2_byte_to_unicode()
        tokens = [b2u[b] for b in range(256)]
        for merge in _BPE_MERGES:
            merged = merge.replace(" ", "")
            if merged not in tokens:
                tokens.append(merged)
        return tokens, [_NORMAL] * len(tokens), [0.0] * len(tokens), list(_BPE_MERGES)
    tokens = [f"<0x{b:02X}>" for b in range(256)]
    types = [_BYTE] * 256
    scores = [0.0] * 256
    for rank, piece in enumerate(_SPM_PIECES):
        tokens.append(piece)
        types.append(_NORMAL)
        scores.append(-float(rank))
    return tokens, types, scores, []


def _check_family(family: str) -> _Layout:
    try:
        return _LAYOUTS[family]
    except KeyError:
        raise ValueError(f"unknown family {family!r}; expected one of {sorted(_LAYOUTS)}") from None


@cache
def vocab_spec(family: str) -> VocabSpec:
    """The token list, token types, scores and merges written for ``family``."""
    layout = _check_family(family)
    tokens, types, scores, merges = _ordinary_tokens(layout.model)

    def special(text: str) -> tuple[str, int, float]:
        return text, (_UNKNOWN if text == layout.unk else _CONTROL), 0.0

    head = [special(t) for t in layout.head]
    tail = [special(t) for t in layout.tail]
    rows = [*head, *zip(tokens, types, scores, strict=True), *tail]
    texts = tuple(r[0] for r in rows)
    if len(set(texts)) != len(texts):  # pragma: no cover - guards edits to the tables above
        raise AssertionError(f"duplicate token text in family {family!r}")
    missing = set(FAMILIES[family].values()) - set(texts)
    if missing:  # pragma: no cover
        raise AssertionError(f"family {family!r} lacks role tokens {missing}")
    return VocabSpec(
        family=family,
        tokens=texts,
        token_types=tuple(r[1] for r in rows),
        scores=tuple(r[2] for r in rows),
        merges=tuple(merges),
    )


def vocab_ids(family: str) -> dict[str, int]:
    """Token text -> id for every token of ``family``'s vocabulary."""
    return {text: i for i, text in enumerate(vocab_spec(family).tokens)}


def role_ids(family: str) -> dict[str, int]:
    """Role -> token id for the roles of :data:`FAMILIES` ``[family]`` (missing roles omitted)."""
    ids = vocab_ids(family)
    return {role: ids[text] for role, text in FAMILIES[family].items()}


def expected_llama_ids(family: str, *, with_metadata: bool = True) -> dict[str, int]:
    """Ids llama.cpp reports for each of :data:`ROLES` (-1 = ``LLAMA_TOKEN_NULL``).

    ``fim_*``/``eot`` come from the metadata keys when ``with_metadata`` is true, otherwise
    from llama.cpp's detection by token text; ``eos``/``bos`` are always written.
    """
    _check_family(family)
    ids = vocab_ids(family)
    roles = role_ids(family)
    out: dict[str, int] = {}
    for role in ROLES:
        if role in ("eos", "bos") or (with_metadata and role in roles):
            out[role] = roles.get(role, -1)
            continue
        found = [ids[t] for t in LLAMA_CPP_AUTODETECT.get(role, ()) if t in ids]
        if len(found) > 1:  # pragma: no cover - llama.cpp's choice would be unordered
            raise AssertionError(f"{family}: ambiguous auto-detection for {role}: {found}")
        out[role] = found[0] if found else -1
    return out


def expected_eog_ids(family: str, *, with_metadata: bool = True) -> set[int]:
    """Ids for which llama.cpp's ``llama_vocab_is_eog`` should return true."""
    got = expected_llama_ids(family, with_metadata=with_metadata)
    eog = {got[r] for r in ("pad", "rep", "sep", "eos", "eot") if got[r] >= 0}
    eog |= {i for t, i in vocab_ids(family).items() if t in LLAMA_CPP_EOG_TEXTS}
    return eog


def write_vocab_gguf(path: Path, family: str, *, with_metadata: bool = True) -> Path:
    """Write a tensor-less GGUF for ``family`` to ``path`` and return ``path``.

    Load it with ``vocab_only=True``.  With ``with_metadata`` the FIM token id keys
    (``tokenizer.ggml.fim_{pre,suf,mid,pad,rep,sep}_token_id``, plus ``eot_token_id`` where
    the family has an "eot" role) are written for every role the family has.
    """
    layout = _check_family(family)
    spec = vocab_spec(family)
    ids = vocab_ids(family)
    roles = role_ids(family)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)

    writer = gguf.GGUFWriter(path, layout.arch)
    try:
        writer.add_name(layout.name)
        # Hyperparameters are ignored for vocab_only loads; written so the file looks sane.
        writer.add_context_length(4096)
        writer.add_embedding_length(64)
        writer.add_block_count(1)
        writer.add_feed_forward_length(128)
        writer.add_head_count(1)

        writer.add_tokenizer_model(layout.model)
        if layout.pre is not None:
            writer.add_tokenizer_pre(layout.pre)
        writer.add_token_list(list(spec.tokens))
        writer.add_token_types(list(spec.token_types))
        if layout.model == "llama":
            writer.add_token_scores(list(spec.scores))
        if spec.merges:
            writer.add_token_merges(list(spec.merges))
        if layout.add_space_prefix is not None:
            writer.add_add_space_prefix(layout.add_space_prefix)

        writer.add_bos_token_id(roles["bos"])
        writer.add_eos_token_id(roles["eos"])
        if layout.unk is not None:
            writer.add_unk_token_id(ids[layout.unk])
        if layout.pad is not None:
            writer.add_pad_token_id(ids[layout.pad])
        writer.add_add_bos_token(layout.add_bos)
        writer.add_add_eos_token(False)

        if with_metadata:
            for role, key in _FIM_KEYS.items():
                if role in roles:
                    writer.add_uint32(key, roles[role])

        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
    finally:
        writer.close()
    return path
