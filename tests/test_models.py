"""The model catalogue: streamed, verified assembly from chunk packages; `fimls models`."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from fimls.engine.api import ModelLoadError
from fimls.models import (
    CATALOGUE,
    DEFAULT_MODEL,
    NamedModel,
    assemble,
    catalogue_name,
    default_model_name,
    paired_draft,
    resolve_model,
)


def _fake_parts(root: Path, stem: str, chunks: list[bytes]) -> tuple[str, ...]:
    """Install chunk packages the way the PyPI ones are laid out: <module>/data/partNN.bin."""
    modules = []
    for i, chunk in enumerate(chunks, start=1):
        mod = f"{stem}_part{i}"
        (root / mod / "data").mkdir(parents=True)
        (root / mod / "__init__.py").write_text("")
        (root / mod / "data" / f"part{i:02d}.bin").write_bytes(chunk)
        modules.append(mod)
    return tuple(modules)


def _model(modules: tuple[str, ...], whole: bytes, sha256: str | None = None) -> NamedModel:
    return NamedModel(name="fake-model", file_name="fake.gguf",
                      packages=tuple(f"{m.replace('_', '-')}==1.0" for m in modules),
                      modules=modules, size=len(whole),
                      sha256=sha256 or hashlib.sha256(whole).hexdigest(), description="",
                      licence="", source="")


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("FIMLS_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_parts_are_concatenated_in_order_and_verified(tmp_path: Path, cache: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    chunks = [b"GGUF" + bytes(range(256)) * 9000, b"\x01" * 3_000_000, b"tail"]
    modules = _fake_parts(tmp_path / "site", "fake_ordered", chunks)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    model = _model(modules, b"".join(chunks))
    path = assemble(model)
    assert path == cache / "models" / "fake.gguf"
    assert path.read_bytes() == b"".join(chunks)
    # The stamp spares a second pass: the parts are not read again.
    for mod in modules:
        for f in (tmp_path / "site" / mod / "data").iterdir():
            f.unlink()
    assert assemble(model) == path


def test_a_changed_upload_is_refused(tmp_path: Path, cache: Path,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    modules = _fake_parts(tmp_path / "site", "fake_changed", [b"GGUF", b"changed"])
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    model = _model(modules, b"GGUFchanged", sha256="0" * 64)
    with pytest.raises(ModelLoadError, match="refusing a changed upload"):
        assemble(model)
    assert not list((cache / "models").iterdir())  # nothing half-written is left


def test_a_missing_model_names_the_pip_command(cache: Path) -> None:
    model = _model(("fimls_no_such_part1", "fimls_no_such_part2"), b"x")
    with pytest.raises(ModelLoadError) as err:
        assemble(model)
    assert "pip install fimls-no-such-part1==1.0 fimls-no-such-part2==1.0" in str(err.value)


def test_the_default_is_the_qwen_1_5b_paired_with_the_0_5b(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FIMLS_MODEL", raising=False)
    assert DEFAULT_MODEL == default_model_name() == "qwen2.5-coder-1.5b"
    assert resolve_model(None) == resolve_model("qwen2.5-coder-1.5b")
    assert catalogue_name(resolve_model(None)) == "qwen2.5-coder-1.5b"
    assert set(CATALOGUE) == {"gemma-3-270m", "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"}
    assert all(m.installed() for m in CATALOGUE.values())  # all three are dependencies
    assert CATALOGUE["qwen2.5-coder-1.5b"].draft == "qwen2.5-coder-0.5b"
    assert paired_draft(None) == paired_draft("qwen2.5-coder-1.5b") == "qwen2.5-coder-0.5b"
    assert paired_draft("gemma-3-270m") is None
    assert paired_draft("/some/model.gguf") is None
    # FIMLS_MODEL names the model used where nothing else does (the tests pin Gemma so).
    monkeypatch.setenv("FIMLS_MODEL", "gemma-3-270m")
    assert resolve_model(None) == resolve_model("gemma-3-270m")
    assert paired_draft(None) is None
    assert catalogue_name(Path("/elsewhere/gemma-3-270m-q4_k_m.gguf")) is None


def test_fimls_models_lists_the_catalogue(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FIMLS_MODEL", raising=False)
    out = subprocess.run([sys.executable, "-m", "fimls", "models", "--json"],
                         capture_output=True, text=True, check=True, timeout=300).stdout
    rows = {r["name"]: r for r in json.loads(out)}
    assert set(rows) == set(CATALOGUE)
    gemma = rows["gemma-3-270m"]
    assert not gemma["default"] and gemma["installed"] and gemma["n_vocab"] == 262144
    assert gemma["template"] == "continuation/continuation"
    for name in ("qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"):
        row = rows[name]
        assert row["installed"] and row["install"] is None
        assert row["n_vocab"] == 151936 and row["template"] == "fim/qwen2.5-coder"
    assert rows["qwen2.5-coder-1.5b"]["default"]
    assert rows["qwen2.5-coder-1.5b"]["draft"] == "qwen2.5-coder-0.5b"
