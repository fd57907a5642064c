"""Whether llama.cpp's extra CPU kernels (weight repacking, Intel AMX) run on this machine.

llama-cpp-python compiles llama.cpp for the CPU it is installed on. Where the CPU
advertises AMX, the build includes AMX matrix kernels, and inside some virtual machines
those die with SIGILL on their first matrix multiply (seen on a Sapphire Rapids guest:
every prompt crashed the process). A process cannot survive SIGILL, so a child process
tries the extra kernels once on the model to be loaded; where it dies, the model is loaded
without them (llama.cpp's plain CPU kernels: slower prompt processing, results equal
up to float rounding).
CPUs without AMX are never probed. The answer is remembered per process and, given a
cache file, per machine.
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import signal
import subprocess
import sys
from pathlib import Path

log = logging.getLogger(__name__)

PROBE_TIMEOUT_S = 120.0
PR_SET_PDEATHSIG = 1
_memo: dict[str, bool] = {}


def cpu_flags() -> set[str]:
    """The CPU's feature flags as Linux reports them (empty elsewhere)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def _key(model_path: Path) -> str:
    import llama_cpp

    st = model_path.stat()
    return f"{model_path.resolve()}|{st.st_size}|{st.st_mtime_ns}|{llama_cpp.__version__}"


def extra_buffers_usable(model_path: Path, cache: Path | None = None) -> bool:
    """True when llama.cpp's extra CPU buffer types can be used for ``model_path`` here."""
    if "amx_tile" not in cpu_flags():
        return True
    key = _key(model_path)
    if key in _memo:
        return _memo[key]
    table: dict[str, bool] = {}
    if cache is not None:
        try:
            loaded = json.loads(cache.read_text())
            table = loaded if isinstance(loaded, dict) else {}
        except (OSError, ValueError):
            table = {}
        if isinstance(table.get(key), bool):
            _memo[key] = table[key]
            return table[key]
    ok = _probe(model_path)
    _memo[key] = ok
    if not ok:
        log.warning("llama.cpp's AMX CPU kernels crash on this machine: %s is loaded with "
                    "the plain CPU kernels", model_path.name)
    if cache is not None:
        table[key] = ok
        try:
            cache.parent.mkdir(parents=True, exist_ok=True)
            cache.write_text(json.dumps(table))
        except OSError:
            log.debug("cannot write %s", cache)
    return ok


def _die_with_parent() -> None:
    # A probe stuck on a bad file must not outlive the worker that a timeout kills.
    ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def _probe(model_path: Path) -> bool:
    env = {**os.environ, "GGML_NO_BACKTRACE": "1"}
    try:
        proc = subprocess.run([sys.executable, "-m", "fimls.engine.cpu", str(model_path)],
                              stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, env=env, timeout=PROBE_TIMEOUT_S,
                              check=False,
                              preexec_fn=_die_with_parent if sys.platform == "linux" else None)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return proc.returncode == 0


def _probe_main(path: str) -> int:
    """Load ``path`` with the extra kernels and evaluate one batch (the child's side)."""
    from fimls.engine.llama import LlamaModel

    model = LlamaModel(Path(path), n_ctx=256, n_batch=64, threads=1, extra_buffers=True)
    tokens = model.vocab.tokenize("def probe(values):\n    return sum(values)\n" * 4)[:32]
    ok = model.decode(tokens, 0, [len(tokens) - 1])
    model.close()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(_probe_main(sys.argv[1]))
