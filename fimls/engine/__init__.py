"""The completion engine: everything between a plain request and the model's answer.

It knows nothing of LSP. The server's scheduler hands it a
:class:`~fimls.engine.api.CompletionRequest` (document text around the cursor, limits)
and gets back a :class:`~fimls.engine.api.CompletionResult` (the suggestion and its
latency record). The contract is :class:`~fimls.engine.api.EngineLike`: ``complete``
(polls a ``cancelled`` predicate), ``interrupt``, ``reset``, ``close``, ``model_name``,
``warnings``, ``pid`` and ``on_exit``.

Modules, from the outside in:

* ``api``: the request, result, config and error types, the :class:`EngineLike` protocol
  and :class:`EngineState`. Plain dataclasses: they cross the process boundary pickled.
* ``worker``: :class:`ProcessEngine`, the contract served by a child process that owns
  the model, so a native crash costs a restart, not the editor's server.
* ``core``: :class:`Engine`, the decode loop. It keeps the KV cache's exact token record
  across requests (reuse), aligns typing-what-was-suggested with the cached path (memo),
  heals the last prompt token, drafts and verifies (speculation, priced by
  :class:`fimls.drafting.DraftPolicy` from learned timings), and applies the stop policy.
* ``draft_model``: a small same-vocabulary GGUF as a drafter, on its own context.
* ``llama``: the thin typed wrapper over llama-cpp-python's low-level C API (tokenize,
  pieces, batched decode with logits at chosen positions, one chunked prefill, cache trim).
* ``cpu``: whether llama.cpp's extra CPU kernels run on this machine (probed in a child).

:func:`make_engine` builds the engine the options ask for, in a worker process or in this
one; :func:`engine_config` derives its :class:`EngineConfig` from the options.
"""

from __future__ import annotations

from typing import Any

from fimls.config import Options
from fimls.engine.api import EngineConfig

__all__ = ["EngineConfig", "engine_config", "make_engine"]


def engine_config(options: Options) -> EngineConfig:
    """The engine's settings derived from ``options``: model paths resolved (the embedded
    model is assembled on first use; raises ModelLoadError) and the cost cache placed in
    the user cache directory."""
    from fimls.models import cache_dir, paired_draft, resolve_model

    m, c = options.model, options.completion
    draft = c.draft_model
    if draft is None and c.speculative in ("auto", "model"):
        # A catalogue model's own draft model (the 0.5B for the 1.5B), when installed.
        draft = paired_draft(m.model)
    return EngineConfig(
        model_path=resolve_model(m.model), n_ctx=m.n_ctx, n_batch=m.n_batch,
        prompt_tokens=m.prompt_tokens,
        threads=m.threads, n_gpu_layers=m.n_gpu_layers, fim_order=m.fim_order,
        draft_model=resolve_model(draft) if draft else None,
        draft_max=c.draft_max, ngram_max=c.ngram_max,
        # Plain decoding never drafts: measuring what a draft costs would only delay it.
        measure_costs=c.speculative != "off",
        cost_cache=cache_dir() / "verify-costs.json")


def make_engine(options: Options, *, isolation: str | None = None) -> Any:
    """Build the real llama.cpp engine for ``options`` (raises ModelLoadError): in a worker
    process or in this one, as ``model.isolation`` (or ``isolation``) says."""
    m = options.model
    if m.engine:
        from fimls.engine.remote import remote_engine

        return remote_engine(options)
    cfg = engine_config(options)
    if (isolation or m.isolation) == "process":
        from fimls.engine.worker import ProcessEngine

        return ProcessEngine(cfg, log_level=options.logging.log_level,
                             load_timeout_s=m.load_timeout_s,
                             cancel_grace_s=m.cancel_grace_ms / 1000.0,
                             nice=m.worker_nice)
    from fimls.engine.core import Engine

    return Engine(cfg)
