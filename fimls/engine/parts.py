"""What the engine's parts may use of one another.

:class:`fimls.engine.core.Engine` is assembled from parts, one module each: the decode loop
(:mod:`.decode`), the second reading (:mod:`.second`), idle work and suffix reuse
(:mod:`.idle`), drafting (:mod:`.speculation`) and verify-cost calibration (:mod:`.costs`).
Each part's methods take ``self`` as :class:`EngineParts`: the state and the methods of the
other parts they may call are exactly those listed here, and the KV cache's contents
change only through :class:`fimls.engine.kvmirror.KvMirror`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import numpy.typing as npt

if TYPE_CHECKING:
    from fimls.drafting import Draft, DraftPolicy, PromptLookupDraft
    from fimls.engine.api import CompletionRequest, EngineConfig
    from fimls.engine.decode import Decoding
    from fimls.engine.device import Placement
    from fimls.engine.kvmirror import KvMirror
    from fimls.engine.llama import LlamaModel, Vocab
    from fimls.engine.second import SecondLine
    from fimls.latency import LatencyRecord
    from fimls.memo import SuggestionMemo
    from fimls.prompt import FimTemplate, Prompt
    from fimls.sizing import PromptSizer

_P = TypeVar("_P")


class EngineParts(Protocol):
    """The engine as its parts see it."""

    cfg: EngineConfig
    model: LlamaModel
    placement: Placement
    vocab: Vocab
    template: FimTemplate
    cache: KvMirror
    sizer: PromptSizer
    policy: DraftPolicy
    lookup: PromptLookupDraft
    draft_model: Any
    memo: SuggestionMemo
    prev_gen: dict[str, list[int]]
    second_log: list[SecondLine] | None
    _can_shift: bool
    _unbuilt_sources: CompletionRequest | None
    _buffer_tokens: dict[str, list[int]]

    # The prompt (core)
    def build(self, req: CompletionRequest) -> Prompt: ...
    def prompt_budget(self, max_tokens: int) -> int: ...
    def _sized(self, make: Callable[[int], _P], tokens: Callable[[_P], list[int]],
               max_tokens: int, built: _P | None = None) -> _P: ...
    def _observe_prefill(self, tokens: int, seconds: float) -> None: ...
    def _align_with_path(self, prompt: Prompt) -> tuple[list[int], bytes]: ...

    # The decode loop (decode)
    def _start(self, req: CompletionRequest, rec: LatencyRecord,
               cancelled: Callable[[], bool]) -> Decoding | None: ...
    def _evaluate(self, seq: list[int], common: int, chunk: int | None = None) -> None: ...
    def _emit(self, st: Decoding, tok: int) -> bool: ...
    def _allowed(self, tok: int, remaining: bytes, ban: bytes) -> bool: ...
    def _constrained_argmax(self, remaining: bytes, ban: bytes,
                            logits: npt.NDArray[Any] | None = None) -> int | None: ...

    # The second reading (second)
    def _second_plan(self, req: CompletionRequest, prompt: Prompt, tokens: list[int],
                     common: int) -> list[int] | None: ...
    def _second_line(self, st: Decoding, stopped: bool) -> bool: ...
    def _evaluate_alt(self, seq: list[int], chunk: int | None = None) -> int: ...

    # Idle work and suffix reuse (idle)
    def _reuse_suffix(self, tokens: list[int], common: int, rec: LatencyRecord,
                      cancelled: Callable[[], bool]) -> int: ...
    def _catch_up_draft(self, req: CompletionRequest, tokens: list[int],
                        cancelled: Callable[[], bool]) -> None: ...

    # Drafting (speculation)
    def _setup_drafters(self, req: CompletionRequest, prompt_tokens: list[int]) -> bool: ...
    def _propose(self, req: CompletionRequest, seq: list[int],
                 generated: int) -> Draft | None: ...
    def _verify(self, seq: list[int], draft: list[int]) -> int: ...
    def _remember(self, uri: str, generated: list[int]) -> None: ...
