"""``fimls doctor`` on a broken install (no model run): a truncated catalogue file is a
problem with a clear message and a non-zero exit, and is not repaired behind the user's
back. The real run on the default model is in ``test_e2e_doctor.py``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from fimls.models import CATALOGUE


def doctor(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "fimls", "doctor", *args], env=env,
                          capture_output=True, text=True, timeout=120, check=False)


def test_a_truncated_model_file_is_reported_and_left_alone(tmp_path: Path) -> None:
    gemma = CATALOGUE["gemma-3-270m"]
    cache = tmp_path / "cache"
    target = cache / "models" / gemma.file_name
    target.parent.mkdir(parents=True)
    with gemma.target().open("rb") as whole:
        target.write_bytes(whole.read(1 << 20))
    env = {**os.environ, "FIMLS_CACHE_DIR": str(cache)}
    res = doctor("--no-run", env=env)
    assert res.returncode == 1, res.stderr
    assert (f"model gemma-3-270m: {target} is truncated (1,048,576 of {gemma.size:,} "
            f"bytes): delete it") in res.stdout
    assert res.stdout.rstrip().endswith("1 problem(s)")
    assert target.stat().st_size == 1 << 20
    report = json.loads(doctor("--no-run", "--json", env=env).stdout)
    assert [m["intact"] for m in report["models"] if m["name"] == "gemma-3-270m"] == [False]
    assert len(report["problems"]) == 1 and "truncated" in report["problems"][0]


def test_a_model_path_that_is_not_a_gguf_is_a_problem(tmp_path: Path) -> None:
    bad = tmp_path / "model.gguf"
    bad.write_bytes(b"GGU")
    res = doctor("--no-run", "--model", str(bad), env=dict(os.environ))
    assert res.returncode == 1
    assert f"PROBLEM: not a GGUF file (bad magic b'GGU'): {bad}" in res.stdout
