"""The suggestion memo: typing the start of the shown suggestion gives its rest."""

from __future__ import annotations

from fimls.memo import SuggestionMemo

PREFIX = "def primes(limit):\n    out = []\n    for n in range(2, limit):\n        "
SUFFIX = "\n    return out\n"
SHOWN = "if is_prime(n):\n            out.append(n)"


def _memo() -> SuggestionMemo:
    memo = SuggestionMemo()
    memo.remember("u", PREFIX, 0, SUFFIX, SHOWN)
    return memo


def test_typing_the_start_of_the_suggestion_gives_its_rest() -> None:
    memo = _memo()
    for k in range(len(SHOWN) - 1):
        rest = memo.recall("u", PREFIX + SHOWN[:k], 0, SUFFIX)
        assert rest == SHOWN[k:], k
    # The memo stays with the suggestion as shown, whatever was asked in between.
    assert memo.recall("u", PREFIX + SHOWN[:3], 0, SUFFIX) == SHOWN[3:]


def test_a_windowed_prefix_is_matched_by_document_offset() -> None:
    memo = SuggestionMemo()
    memo.remember("u", PREFIX[10:], 10, SUFFIX, SHOWN)
    assert memo.recall("u", PREFIX[20:] + "if", 20, SUFFIX) == SHOWN[2:]
    assert memo.recall("u", PREFIX[20:] + "if", 21, SUFFIX) is None  # the cursor moved on


def test_anything_else_asks_the_model() -> None:
    memo = _memo()
    assert memo.recall("u", PREFIX + "iff", 0, SUFFIX) is None  # typed something else
    assert memo.recall("u", PREFIX + "if", 0, ")" + SUFFIX) is None  # suffix changed
    assert memo.recall("u", PREFIX.replace("out", "acc") + "if", 0, SUFFIX) is None
    assert memo.recall("u", PREFIX[:-1], 0, SUFFIX) is None  # the cursor went back
    assert memo.recall("v", PREFIX + "if", 0, SUFFIX) is None  # another document
    # Typed all of it but whitespace: nothing is left to show from memory.
    assert memo.recall("u", PREFIX + SHOWN.rstrip("n)"), 0, SUFFIX) == "n)"
    assert memo.recall("u", PREFIX + SHOWN, 0, SUFFIX) is None


def test_an_empty_suggestion_or_forget_clears_the_document() -> None:
    memo = _memo()
    memo.remember("u", PREFIX, 0, SUFFIX, "  \n")
    assert memo.recall("u", PREFIX, 0, SUFFIX) is None
    memo = _memo()
    memo.forget("u")
    assert memo.recall("u", PREFIX + "i", 0, SUFFIX) is None


def test_a_prefetched_suggestion_is_kept_beside_the_shown_one() -> None:
    memo = SuggestionMemo()
    memo.remember("u", PREFIX, 0, SUFFIX, SHOWN)
    nxt = "    return out\n"
    memo.remember("u", PREFIX + SHOWN, 0, SUFFIX, nxt, keep=True)
    # Typing the shown suggestion still answers from it...
    assert memo.recall("u", PREFIX + SHOWN[:2], 0, SUFFIX) == SHOWN[2:]
    # ...and once it is all accepted, the prefetched one is the answer, then its rest.
    assert memo.recall("u", PREFIX + SHOWN, 0, SUFFIX) == nxt
    assert memo.recall("u", PREFIX + SHOWN + nxt[:6], 0, SUFFIX) == nxt[6:]
    # A new shown suggestion replaces both.
    memo.remember("u", PREFIX, 0, SUFFIX, "pass\n")
    assert memo.recall("u", PREFIX + SHOWN, 0, SUFFIX) is None
