"""Alternatives on demand: when the user asks explicitly, other suggestions whose first
lines differ, from the prompt the cache already holds.

The first item is the suggestion an automatic request shows. The others branch off its
first line where the model had another likely token: the shown line's tokens are read once
more on a branch of the cache (sequence 1 shares the prompt's cells, so nothing of the
prompt is evaluated again) with logits at every position, the likeliest other tokens are
ranked by the probability of the line up to them, and each goes on greedily to the end of
its line. A branch at the line's first token is often only other indentation: the line
read whole finds where the model really hesitated.

The branches are decoded plainly, one token a step: a lookup draft has little to copy
from for a line the model found less likely (docs/measurements/alternatives.md).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from fimls.engine.decode import Decoding, _line_ended
from fimls.engine.kvmirror import Cancelled
from fimls.engine.parts import EngineParts
from fimls.postprocess import finalize

ALT_TOKENS = 48  # the most tokens of one alternative's line
ALT_TOP = 4  # other tokens considered at each position of the shown line
ALT_TRIES = 6  # branches decoded at most, likeliest first
ALT_MIN_P = 0.02  # a token less likely than this starts no alternative
BRANCH_SEQ = 1


def first_line(text: str) -> str:
    """A suggestion's first line with text (a suggestion may start on a new line), its
    spacing normalised: lines that differ only in spaces are not alternatives."""
    body = text.lstrip("\r\n")
    return " ".join(body.split("\n", 1)[0].split())


def _log_softmax(logits: npt.NDArray[np.float32]) -> npt.NDArray[np.float64]:
    x = logits.astype(np.float64)
    top = float(x.max())
    return x - top - float(np.log(np.exp(x - top).sum()))


class Alternatives(EngineParts):
    """Alternatives (a part of :class:`fimls.engine.core.Engine`)."""

    def _alternatives(self, st: Decoding, shown: str) -> list[str]:
        """Up to ``st.req.alternatives`` suggestions whose first lines differ from
        ``shown``'s and from each other."""
        n0 = len(st.seq) - len(st.gen)
        line = self._line_tokens(st.gen)
        if st.constraint or n0 < 2 or not line or self.cache.tokens[:n0] != st.seq[:n0]:
            return []  # forced text (healing) or a prompt the cache no longer holds
        self.model.branch(n0 - 1, BRANCH_SEQ)
        try:
            seen, out = {first_line(shown)}, []
            points = self._branch_points(st, n0, line)[:ALT_TRIES]
            held = len(line) - 1  # the shown line's tokens the branch holds after the prompt
            for j, tok in points:
                text = self._alt_line(st, n0, line[:j], tok, held)
                held = min(held, j)  # the alternative's own tokens replaced the rest
                first = first_line(text)
                if first and first not in seen:
                    seen.add(first)
                    out.append(text)
                if len(out) >= st.req.alternatives:
                    break
            st.rec.alternatives = len(out)
            return out
        finally:
            self.model.drop_parked()

    def _line_tokens(self, gen: list[int]) -> list[int]:
        """The generated tokens up to the end of the first line."""
        out = bytearray()
        for k, tok in enumerate(gen):
            out += self.vocab.text_piece(tok)
            if _line_ended(out):
                return gen[:k + 1]
        return list(gen)

    def _branch_points(self, st: Decoding, n0: int, line: list[int]) -> list[tuple[int, int]]:
        """(position in the line, other token) pairs, likeliest line-so-far first: the
        shown line read on the branch, with logits after the prompt and each of its
        tokens."""
        batch = [(st.seq[n0 - 1], n0 - 1, BRANCH_SEQ)]
        batch += [(t, n0 + i, BRANCH_SEQ) for i, t in enumerate(line[:-1])]
        if st.cancelled() or not self.model.decode_at(batch, list(range(len(batch)))):
            raise Cancelled
        st.rec.alt_tokens += len(batch)
        ranked: list[tuple[float, int, int]] = []
        head = 0.0  # log-probability of the shown line's tokens before position j
        for j in range(len(line)):
            logp = _log_softmax(self.model.logits(j))
            # The few likeliest tokens, without sorting the whole vocabulary.
            top = np.argpartition(-logp, ALT_TOP)[:ALT_TOP + 1]
            for t in (int(x) for x in top[np.argsort(-logp[top])]):
                if (t != line[j] and logp[t] >= np.log(ALT_MIN_P)
                        and t not in self.template.stop_ids and not self.vocab.is_eog(t)
                        and self._allowed(t, b"", st.ban_leading if j == 0 else b"")):
                    ranked.append((head + float(logp[t]), j, t))
            head += float(logp[line[j]])
        ranked.sort(reverse=True)
        return [(j, t) for _, j, t in ranked]

    def _alt_line(self, st: Decoding, n0: int, head: list[int], first: int,
                  held: int) -> str:
        """The shown line's ``head``, then ``first``, then greedy tokens to the line's end
        (on the branch, which holds the prompt and the shown line's first ``held`` tokens:
        the part of ``head`` an earlier alternative replaced is read again)."""
        keep = min(held, len(head))
        self.model.kv_truncate(n0 + keep, BRANCH_SEQ)
        toks = [*head, first]
        out = bytearray(b"".join(self.vocab.text_piece(t) for t in toks))
        todo = toks[keep:]
        while len(toks) < ALT_TOKENS and not _line_ended(out):
            pos = n0 + len(toks) - len(todo)
            batch = [(t, pos + i, BRANCH_SEQ) for i, t in enumerate(todo)]
            if st.cancelled() or not self.model.decode_at(batch, [len(batch) - 1]):
                raise Cancelled
            st.rec.alt_tokens += len(batch)
            nxt = int(np.argmax(self.model.logits(len(batch) - 1)))
            if nxt in self.template.stop_ids or self.vocab.is_eog(nxt):
                break
            toks.append(nxt)
            todo = [nxt]
            out += self.vocab.text_piece(nxt)
        raw = out.decode("utf-8", "replace")
        lead = len(raw) - len(raw.lstrip("\r\n"))
        cut = raw.find("\n", lead)
        return finalize(raw if cut < 0 else raw[:cut], st.ctx)
