"""Differential sync through ``fimls serve``: random incremental edits, the server's text
must equal the client's after every sequence.

The client side is the reference implementation of tests/test_documents.py, written from
the LSP spec independently of ``fimls.documents`` (line ends are ``\\n``, ``\\r\\n`` and
``\\r`` only; positions count UTF-8 bytes, UTF-16 code units or code points as negotiated;
a character past the end of a line means the end of the line, a line past the end of the
document means its end). The server reports a digest of its copy
(``fimls/documentState``). The characters pygls gets wrong (``\\f``, U+2028, ``\\x85``) are
all in the alphabet, with CRLF, lone CR and non-BMP characters.
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fimls.documents import Pos, coerce_encoding
from tests.figures import report
from tests.test_documents import ref_lines, ref_offset, ref_position, ref_width
from tests.test_e2e_raw import Raw

ALPHABET = ["a", "b", "z", " ", "\t", "\n", "\r", "\r\n", "\f", "\v", "\u2028", "\u2029",
            "\x85", "\x1c", "é", "€", "😀", "𝄞", "中", "\u0301", "\x00"]
ENCODINGS = ("utf-16", "utf-8", "utf-32")
PER_ENCODING = 340  # 1,020 sequences in all


def boundaries(text: str) -> list[int]:
    """Offsets a client can put a cursor at: not between the CR and LF of a CRLF."""
    return [i for i in range(len(text) + 1)
            if not (0 < i < len(text) and text[i - 1] == "\r" and text[i] == "\n")]


def digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


@pytest.fixture(scope="module", params=ENCODINGS)
def peer(request: pytest.FixtureRequest) -> Iterator[tuple[Raw, str]]:
    encoding = request.param
    # No model is needed to keep documents: a missing one keeps the test about the protocol.
    raw = Raw("--model", "/nonexistent/none.gguf")
    reply = raw.request("initialize", {"capabilities": {"general": {
        "positionEncodings": [encoding]}}})
    assert reply["result"]["capabilities"].get("positionEncoding", "utf-16") == encoding
    raw.notify("initialized", {})
    yield raw, encoding
    raw.proc.kill()
    raw.proc.wait(10)


texts = st.lists(st.sampled_from(ALPHABET), max_size=40).map("".join)
_uris = itertools.count()


@given(data=st.data())
@settings(max_examples=PER_ENCODING, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
def test_server_text_equals_client_text(peer: tuple[Raw, str], data: st.DataObject) -> None:
    raw, encoding = peer
    enc = coerce_encoding(encoding)
    uri = f"file:///sync/{next(_uris)}.txt"
    text = data.draw(texts, "initial")
    raw.open(uri, text)
    version = 1
    for _ in range(data.draw(st.integers(1, 12), "edits")):
        changes: list[dict[str, Any]] = []
        # One didChange may carry several changes, applied in order.
        for _ in range(data.draw(st.integers(1, 3), "changes")):
            new = data.draw(texts, "new text")
            if data.draw(st.integers(0, 19), "kind") == 0:
                changes.append({"text": new})  # whole document
                text = new
                continue
            cuts = boundaries(text)
            a, b = sorted((data.draw(st.sampled_from(cuts)), data.draw(st.sampled_from(cuts))))
            start, end = ref_position(text, a, enc), ref_position(text, b, enc)
            if data.draw(st.integers(0, 9), "past end") == 0:
                # Past the end of the line (or the document): the spec clamps.
                lo, hi = ref_lines(text)[end.line]
                end = Pos(end.line + (50 if data.draw(st.booleans()) else 0),
                          sum(ref_width(c, enc) for c in text[lo:hi]) + data.draw(
                              st.integers(1, 5)))
                b = ref_offset(text, end, enc)
            changes.append({"range": {
                "start": {"line": start.line, "character": start.character},
                "end": {"line": end.line, "character": end.character}}, "text": new})
            text = text[:a] + new + text[b:]
        version += 1
        raw.notify("textDocument/didChange", {
            "textDocument": {"uri": uri, "version": version}, "contentChanges": changes})
    state = raw.request("fimls/documentState", {"textDocument": {"uri": uri}})["result"]
    raw.notify("textDocument/didClose", {"textDocument": {"uri": uri}})
    assert state["version"] == version
    assert state["lineCount"] == len(ref_lines(text))
    assert state["length"] == len(text)
    assert state["sha256"] == digest(text), repr(text)
    checked[encoding] += 1


checked = dict.fromkeys(ENCODINGS, 0)


def test_all_sequences_ran() -> None:
    # Module order: this runs after the three parametrized runs above.
    assert sum(checked.values()) >= 1000, checked
    report(f"differential sync through the server: {sum(checked.values())} random edit "
           f"sequences, server text == client text after each ({checked})")
