"""``fimls doctor`` on the default model, as a user runs it on a fresh clone: the build,
the models (sha256 checked), real measured speeds and the window, exit 0."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from tests.figures import report


def test_doctor_measures_the_default_model_here() -> None:
    env = {k: v for k, v in os.environ.items() if k != "FIMLS_MODEL"}
    t0 = time.monotonic()
    res = subprocess.run([sys.executable, "-m", "fimls", "doctor", "--json"], env=env,
                         capture_output=True, text=True, timeout=600, check=False)
    took = time.monotonic() - t0
    assert res.returncode == 0, res.stdout + res.stderr
    r = json.loads(res.stdout)
    assert r["problems"] == [] and r["llama_cpp"] == "0.3.36"
    assert "AVX" in r["cpu_features"] or "NEON" in r["cpu_features"]
    assert r["model"].endswith("qwen2.5-coder-1.5b-instruct-q4_k_m.gguf")
    assert r["draft_model"].endswith("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf")
    assert {m["name"]: m["intact"] for m in r["models"]} == {
        "gemma-3-270m": True, "qwen2.5-coder-1.5b": True, "qwen2.5-coder-0.5b": True}
    s = r["speeds"]
    assert s["prompt_tokens"] > 100 and s["prefill_tokens_per_s"] > 0
    assert s["decode_tokens_per_s"] > 0 and s["drafted_tokens_per_s"] > 0
    assert s["window_tokens"] >= 1024
    assert r["device"] == ("CPU" if not r["gpu_devices"] else r["device"])
    assert set(r["editors"]) == {"VS Code", "Neovim 0.11+", "any LSP client"}
    report(f"fimls doctor on the default model: {took:.1f} s; prefill "
           f"{s['prefill_tokens_per_s']:.0f} tokens/s, decode {s['decode_tokens_per_s']:.1f} "
           f"tokens/s, with the draft model {s['draft_speedup']:.2f}x, window "
           f"{s['window_tokens']} tokens, on {r['device']}")
