"""llama-cpp-python's own OpenAI-compatible server, as ``python -m tests.llama_cpp_server``.

The real server (``llama_cpp.server``), with one change: where llama.cpp's extra CPU
kernels (weight repacking, AMX) crash this machine (fimls.engine.cpu finds out), the model
is loaded with the plain kernels, as fimls itself does. Arguments are the server's.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import llama_cpp
import llama_cpp.llama as llama_module

from fimls.engine.cpu import extra_buffers_usable


def main() -> None:
    """Run the server on ``sys.argv``."""
    args = sys.argv[1:]
    model = Path(args[args.index("--model") + 1])
    if not extra_buffers_usable(model):
        default = llama_cpp.llama_model_default_params

        def plain() -> Any:
            params = default()
            params.use_extra_bufts = False
            return params

        llama_cpp.llama_model_default_params = plain
        llama_module.llama_cpp.llama_model_default_params = plain  # type: ignore[attr-defined]
    from llama_cpp.server.__main__ import main as serve

    sys.argv = ["llama_cpp.server", *args]
    serve()


if __name__ == "__main__":
    main()
