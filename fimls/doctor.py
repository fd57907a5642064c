"""``fimls doctor``: what fimls will do on this machine, measured here.

It reads llama.cpp's build (CPU features, GPU backends and devices, the AMX probe's
verdict), checks every catalogue model file against its sha256, and then runs the model the
options choose, in a worker process as the server does (a crashing library is reported,
not fatal): one request with plain decoding and, with the draft model, the same request
drafted. The speeds, the draft's speed-up and the prompt window come from those runs.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from fimls.config import Options

_BLOCK = 1 << 22
# A function body to write: long enough (about 40 tokens) for a decode speed.
EXAMPLE_PROMPT = (
    "def is_prime(n: int) -> bool:\n    \"\"\"Whether n is a prime number.\"\"\"\n"
    "    if n < 2:\n        return False\n    for d in range(2, int(n ** 0.5) + 1):\n"
    "        if n % d == 0:\n            return False\n    return True\n\n\n"
    "def primes_below(limit: int) -> list[int]:\n    \"\"\"Every prime below limit, in "
    "order, by the sieve of Eratosthenes.\"\"\"\n")
EXAMPLE_SUFFIX = "\n\n\nprint(primes_below(30))\n"
EDITORS = {
    "VS Code": "cd editor-configs/vscode && npm install && npx vsce package "
               "--allow-missing-repository --skip-license -o fimls.vsix && "
               "code --install-extension fimls.vsix",
    "Neovim 0.11+": "add editor-configs/nvim to the runtime path, then "
                    "require('fimls').setup({ cmd = { 'fimls', 'serve' } })",
    "any LSP client": "start `fimls serve` over stdio (inline completion, LSP 3.18)",
}


@dataclass
class ModelFile:
    """One catalogue model as installed here."""

    name: str
    installed: bool  # its packages are there
    path: str | None = None
    intact: bool | None = None  # sha256 of the assembled file (None: not assembled yet)
    problem: str | None = None


@dataclass
class Speeds:
    """What one real request of each kind measured on the chosen model."""

    prompt_tokens: int
    prefill_tokens_per_s: float
    decode_tokens_per_s: float
    drafted_tokens_per_s: float | None  # the same request with the draft model
    window_tokens: int  # the prompt window the sizer chooses after that prefill

    @property
    def draft_speedup(self) -> float | None:
        """Decode speed with the draft model over plain decoding."""
        if self.drafted_tokens_per_s is None or not self.decode_tokens_per_s:
            return None
        return self.drafted_tokens_per_s / self.decode_tokens_per_s


@dataclass
class Report:
    """Everything the doctor found; ``problems`` non-empty means broken."""

    llama_cpp: str = ""
    cpu_features: str = ""
    gpu_offload: bool = False
    gpu_devices: list[str] = field(default_factory=list)
    extra_cpu_kernels: bool = True
    threads: int = 0
    models: list[ModelFile] = field(default_factory=list)
    model: str = ""
    draft_model: str | None = None
    device: str = ""
    speeds: Speeds | None = None
    warnings: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    editors: dict[str, str] = field(default_factory=lambda: dict(EDITORS))

    def to_dict(self) -> dict[str, Any]:
        """The report for ``--json``."""
        d = asdict(self)
        if self.speeds is not None:
            d["speeds"]["draft_speedup"] = self.speeds.draft_speedup
        return d


def sha256_of(path: Path) -> str:
    """The file's sha256, read in blocks."""
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while block := fh.read(_BLOCK):
            digest.update(block)
    return digest.hexdigest()


def check_model_file(name: str) -> ModelFile:
    """A catalogue model's assembled file against the catalogue's size and sha256; it is
    not repaired here (the server reassembles a changed file on its next load)."""
    from fimls.models import CATALOGUE

    m = CATALOGUE[name]
    row = ModelFile(name, m.installed())
    target = m.target()
    if not target.exists():
        if not row.installed:
            row.problem = m.missing_message()
        return row
    row.path = str(target)
    size = target.stat().st_size
    if size != m.size:
        row.intact = False
        row.problem = (f"{target} is {'truncated' if size < m.size else 'too long'} "
                       f"({size:,} of {m.size:,} bytes): delete it, and fimls assembles it "
                       f"again from the installed packages")
    elif sha256_of(target) != m.sha256:
        row.intact = False
        row.problem = (f"{target} is corrupt (its sha256 is not the catalogue's): delete "
                       f"it, and fimls assembles it again from the installed packages")
    else:
        row.intact = True
    return row


def read_build(report: Report, opts: Options) -> None:
    """llama.cpp's build: version, CPU features, GPU backends, the AMX probe, threads."""
    import llama_cpp

    from fimls.cli.common import default_threads
    from fimls.engine.device import gpu_devices, offload_supported

    report.llama_cpp = str(llama_cpp.__version__)
    report.cpu_features = llama_cpp.llama_print_system_info().decode("utf-8", "replace").strip()
    report.gpu_offload = offload_supported()
    report.gpu_devices = [f"{d.backend} {d.name}: {d.description}" for d in gpu_devices()]
    report.threads = default_threads(opts)


def _model_choice(report: Report, opts: Options) -> Any:
    """The engine settings the options give, or None with the problem recorded."""
    from fimls.engine import engine_config
    from fimls.engine.api import ModelLoadError, check_gguf_file

    try:
        cfg = engine_config(opts)
        check_gguf_file(cfg.model_path)
        if cfg.draft_model is not None:
            check_gguf_file(cfg.draft_model)
    except ModelLoadError as exc:
        report.problems.append(str(exc))
        return None
    report.model = str(cfg.model_path)
    report.draft_model = str(cfg.draft_model) if cfg.draft_model else None
    return cfg


def _request(speculative: str, tag: str) -> Any:
    from fimls.engine.api import CompletionRequest

    return CompletionRequest(uri=f"doctor://{tag}", version=1, prefix=EXAMPLE_PROMPT,
                             suffix=EXAMPLE_SUFFIX, max_tokens=48, max_lines=12,
                             speculative=speculative)


def _rate(tokens: int, ms: float) -> float:
    return tokens / (ms / 1000.0) if ms > 0 else 0.0


def measure(report: Report, opts: Options, cfg: Any) -> None:
    """Load the chosen model in a worker process and time real requests on it: the draft
    model's figure is the same cold request's, its own reading of the prompt included."""
    from fimls.engine.api import EngineError
    from fimls.engine.worker import ProcessEngine
    from fimls.sizing import PromptSizer, prior_rate

    try:
        engine = ProcessEngine(cfg, log_level="ERROR", load_timeout_s=opts.model.load_timeout_s)
    except EngineError as exc:
        report.problems.append(f"the model did not load: {exc}")
        return
    try:
        report.device = engine.placement.describe()
        report.warnings += engine.warnings
        plain = engine.complete(_request("off", "plain"), lambda: False).record
        drafted = None
        if cfg.draft_model is not None:
            engine.reset()
            drafted = engine.complete(_request("model", "draft"), lambda: False).record
    except EngineError as exc:
        report.problems.append(f"the model failed on a request: {exc}")
        return
    finally:
        engine.close()
    sizer = PromptSizer(prior_rate(cfg.model_path.stat().st_size, report.threads,
                                   gpu=engine.placement.gpu), fixed=cfg.prompt_tokens)
    sizer.observe(plain.evaluated_tokens, plain.prompt_ms / 1000.0)
    report.speeds = Speeds(
        prompt_tokens=plain.evaluated_tokens,
        prefill_tokens_per_s=_rate(plain.evaluated_tokens, plain.prompt_ms),
        decode_tokens_per_s=_rate(plain.generated_tokens, plain.decode_ms),
        drafted_tokens_per_s=(_rate(drafted.generated_tokens, drafted.decode_ms)
                              if drafted is not None else None),
        window_tokens=sizer.tokens)


def examine(opts: Options, *, run_model: bool = True) -> Report:
    """The whole report for ``opts``."""
    from fimls.engine.cpu import extra_buffers_usable
    from fimls.models import CATALOGUE, cache_dir

    report = Report()
    read_build(report, opts)
    report.models = [check_model_file(name) for name in CATALOGUE]
    broken = [m for m in report.models if m.intact is False]
    report.problems += [m.problem for m in broken if m.problem]
    chosen = opts.model.model or os.environ.get("FIMLS_MODEL")
    # A broken catalogue file is reported, not repaired (loading it would reassemble it).
    cfg = _model_choice(report, opts) if not broken else None
    if cfg is not None and run_model:
        measure(report, opts, cfg)
    if report.model:
        report.extra_cpu_kernels = extra_buffers_usable(Path(report.model),
                                                        cache_dir() / "cpu-kernels.json")
    elif chosen is None and not any(m.installed for m in report.models):
        report.problems.append("no catalogue model is installed: pip install -e . again")
    return report
