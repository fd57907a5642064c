"""Context beyond the current file: which other files' text goes at the front of the
prompt (:mod:`.store`, :mod:`.sources`), cut how (:mod:`.chunks`), for which names
(:mod:`.names`), and which workspace files may be read from disk (:mod:`.workspace`,
:mod:`.ignore`). No lsprotocol here: the server feeds plain text and line numbers."""

from fimls.crossfile.chunks import ContextChunk, definitions, sources_of
from fimls.crossfile.names import NEAR_AFTER, NEAR_BEFORE, comment_mark
from fimls.crossfile.store import CHARS_PER_TOKEN, ContextStore

__all__ = ["CHARS_PER_TOKEN", "NEAR_AFTER", "NEAR_BEFORE", "ContextChunk", "ContextStore",
           "comment_mark", "definitions", "sources_of"]
