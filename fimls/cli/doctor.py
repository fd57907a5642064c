"""``fimls doctor``: what fimls will do on this machine (see :mod:`fimls.doctor`)."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from typing import Any

from fimls.cli.common import add_option_flags, options_from_args


def register(sub: Any) -> None:
    """The subcommand's parser."""
    d = sub.add_parser("doctor", help="what fimls will do here: llama.cpp's build and "
                       "devices, the models and their integrity, measured speeds, the "
                       "prompt window, editor setup; exits 1 when something is broken")
    d.add_argument("--json", action="store_true", help="machine-readable output")
    d.add_argument("--no-run", action="store_true",
                   help="only the build and the model files: load and time no model")
    add_option_flags(d)
    d.set_defaults(func=cmd_doctor)


def _lines(r: Any) -> list[str]:
    """The report as text, one finding a line."""
    out = [f"llama-cpp-python {r.llama_cpp}; threads: {r.threads}",
           f"CPU features: {r.cpu_features}",
           "extra CPU kernels (repacked, AMX): "
           + ("used" if r.extra_cpu_kernels else "not used: the AMX probe crashed here"),
           f"GPU offload in this build: {'yes' if r.gpu_offload else 'no'}; devices: "
           + (", ".join(r.gpu_devices) or "none")]
    for m in r.models:
        state = ("intact (sha256 checked)" if m.intact else m.problem if m.intact is False
                 else "installed, not assembled yet" if m.installed else m.problem)
        out.append(f"model {m.name}: {state}")
    if r.model:
        out.append(f"runs: {r.model} (draft: {r.draft_model or 'none'}) on {r.device}")
    s = r.speeds
    if s is not None:
        out.append(f"measured: prefill {s.prefill_tokens_per_s:.0f} tokens/s "
                   f"({s.prompt_tokens} tokens), decode {s.decode_tokens_per_s:.1f} tokens/s")
        if s.draft_speedup is not None:
            out.append(f"draft model: decode {s.drafted_tokens_per_s:.1f} tokens/s, "
                       f"{s.draft_speedup:.2f}x plain decoding (speculative auto drafts "
                       f"only where the measured costs say it pays)")
        out.append(f"prompt window: {s.window_tokens} tokens (sized so that a prompt nothing "
                   f"of which is cached costs about 6 s here)")
    out += [f"editor, {name}: {how}" for name, how in r.editors.items()]
    out += [f"warning: {w}" for w in r.warnings]
    out += [f"PROBLEM: {p}" for p in r.problems]
    out.append("all good" if not r.problems else f"{len(r.problems)} problem(s)")
    return out


def cmd_doctor(args: argparse.Namespace) -> int:
    """Print the report; 1 when something is broken."""
    from fimls.doctor import examine

    logging.basicConfig(stream=sys.stderr, level=logging.ERROR)
    report = examine(options_from_args(args), run_model=not args.no_run)
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
    else:
        print("\n".join(_lines(report)))
    return 1 if report.problems else 0
