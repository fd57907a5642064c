"""Alternatives on demand: when the user asks explicitly, other suggestions whose first
lines differ, from the prompt the cache already holds.

The first item is the suggestion an automatic request shows. Each alternative starts
with another of the likeliest first tokens at the prompt's end and goes on greedily to the
end of its first line, on a branch of the cache (sequence 1 shares the prompt's cells:
nothing of the prompt is evaluated again). On a CPU the branches are decoded plainly, one
token a step: a draft has nothing to copy from for a line the model found less likely, and
a verify batch of guesses costs more than the step it would save.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from fimls.engine.decode import Decoding, _line_ended
from fimls.engine.kvmirror import Cancelled
from fimls.engine.parts import EngineParts
from fimls.postprocess import finalize

ALT_TOKENS = 48  # the most tokens of one alternative's line
ALT_CANDIDATES = 6  # first tokens tried, likeliest first
ALT_MIN_P = 0.01  # a first token less likely than this starts no alternative
BRANCH_SEQ = 1


def first_line(text: str) -> str:
    """A suggestion's first line with text (a suggestion may start on a new line), its
    spacing normalised: lines that differ only in spaces are not alternatives."""
    body = text.lstrip("\r\n")
    return " ".join(body.split("\n", 1)[0].split())


class Alternatives(EngineParts):
    """Alternatives (a part of :class:`fimls.engine.core.Engine`)."""

    def _alternatives(self, st: Decoding, shown: str) -> list[str]:
        """Up to ``st.req.alternatives`` suggestions whose first lines differ from
        ``shown``'s and from each other."""
        n0 = len(st.seq) - len(st.gen)
        if st.constraint or n0 < 2 or self.cache.tokens[:n0] != st.seq[:n0]:
            return []  # forced text (healing) or a prompt the cache no longer holds
        p = n0 - 1
        self.model.branch(p, BRANCH_SEQ)
        try:
            logits = self._alt_decode(st, st.seq[p], p)
            seen, out = {first_line(shown)}, []
            for tok in self._alt_candidates(logits, st.ban_leading):
                if st.gen and tok == st.gen[0]:
                    continue  # the shown suggestion's own first token
                text = self._alt_line(st, p, tok)
                line = first_line(text)
                if line.strip() and line not in seen:
                    seen.add(line)
                    out.append(text)
                if len(out) >= st.req.alternatives:
                    break
            st.rec.alternatives = len(out)
            return out
        finally:
            self.model.drop_parked()

    def _alt_decode(self, st: Decoding, tok: int, pos: int) -> npt.NDArray[np.float32]:
        """Evaluate ``tok`` at ``pos`` on the branch; the logits after it (a copy)."""
        if st.cancelled() or not self.model.decode_at([(tok, pos, BRANCH_SEQ)], [0]):
            raise Cancelled
        st.rec.alt_tokens += 1
        return np.array(self.model.logits(0), copy=True)

    def _alt_candidates(self, logits: npt.NDArray[np.float32], ban: bytes) -> list[int]:
        """The likeliest first tokens that may begin a suggestion here."""
        order = np.argsort(-logits)[:ALT_CANDIDATES * 4]
        top = float(logits[order[0]])
        norm = top + float(np.log(np.exp(logits - top).sum()))
        out = []
        for t in (int(x) for x in order):
            if float(logits[t]) - norm < np.log(ALT_MIN_P):
                break
            if t in self.template.stop_ids or self.vocab.is_eog(t):
                continue
            if self._allowed(t, b"", ban):
                out.append(t)
            if len(out) >= ALT_CANDIDATES:
                break
        return out

    def _alt_line(self, st: Decoding, p: int, first: int) -> str:
        """``first`` after the prompt, then greedy tokens to the end of the first line."""
        self.model.kv_truncate(p + 1, BRANCH_SEQ)
        toks, out = [first], bytearray(self.vocab.text_piece(first))
        while len(toks) < ALT_TOKENS and not _line_ended(out):
            nxt = int(np.argmax(self._alt_decode(st, toks[-1], p + len(toks))))
            if nxt in self.template.stop_ids or self.vocab.is_eog(nxt):
                break
            toks.append(nxt)
            out += self.vocab.text_piece(nxt)
        raw = out.decode("utf-8", "replace")
        lead = len(raw) - len(raw.lstrip("\r\n"))
        cut = raw.find("\n", lead)
        return finalize(raw if cut < 0 else raw[:cut], st.ctx)
