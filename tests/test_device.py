"""Where the model runs: ``nGpuLayers`` auto, an explicit count, the CPU fallback.

No GPU is needed: the build's offload support and its device list are simulated, and the
model-load call is observed (the weights behind it are scripted).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import fimls.engine.core as core
import fimls.engine.device as device
import fimls.engine.draft_model as draft_model
import fimls.engine.llama as llama
from fimls.config import Options, apply_dict
from fimls.engine.api import EngineConfig
from fimls.engine.core import Engine
from fimls.engine.device import GpuDevice, Placement
from fimls.sizing import prior_rate
from tests.scripted_model import ScriptedModel, continuing, scripted_vocab

H100 = GpuDevice("CUDA", "CUDA0", "NVIDIA H100 80GB HBM3")


@pytest.fixture(scope="module")
def vocab_path(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Any]]:
    yield scripted_vocab(tmp_path_factory.mktemp("vocab"))


def simulate(monkeypatch: pytest.MonkeyPatch, *, supported: bool,
             devices: tuple[GpuDevice, ...]) -> None:
    """This build's offload support and GPU list, as llama.cpp and ggml would say."""
    monkeypatch.setattr(device, "offload_supported", lambda: supported)
    monkeypatch.setattr(device, "gpu_devices", lambda: devices)


class Loads:
    """Every model load the engine asks for, with its keyword arguments (scripted models
    come back, placed where llama.cpp would place a 28-layer model)."""

    def __init__(self, vocab: Any) -> None:
        self.vocab = vocab
        self.calls: list[dict[str, Any]] = []

    def __call__(self, path: Path, **kw: Any) -> ScriptedModel:
        self.calls.append(kw)
        model = ScriptedModel(self.vocab, continuing("x"))
        if not kw.get("vocab_only"):
            model.placement = device.placement(kw.get("n_gpu_layers", 0), 28)
        return model

    def weights(self) -> list[int]:
        """The layer counts of the loads that read weights (not the vocabulary probe)."""
        return [kw["n_gpu_layers"] for kw in self.calls if not kw.get("vocab_only")]


def engine(monkeypatch: pytest.MonkeyPatch, vocab_path: tuple[Path, Any],
           layers: int | str) -> tuple[Engine, Loads]:
    path, vocab = vocab_path
    loads = Loads(vocab)
    monkeypatch.setattr(core, "LlamaModel", loads)
    monkeypatch.setattr(draft_model, "LlamaModel", loads)
    cfg = EngineConfig(model_path=path, draft_model=path, n_gpu_layers=layers,
                       measure_costs=False)
    return Engine(cfg), loads


def test_auto_offloads_every_layer_of_both_models_where_the_build_has_a_gpu(
        monkeypatch: pytest.MonkeyPatch, vocab_path: tuple[Path, Any]) -> None:
    simulate(monkeypatch, supported=True, devices=(H100,))
    eng, loads = engine(monkeypatch, vocab_path, "auto")
    assert loads.weights() == [device.ALL_LAYERS, device.ALL_LAYERS]
    assert eng.placement == Placement("CUDA", "NVIDIA H100 80GB HBM3", 29, 29)
    assert eng.draft_model is not None and eng.draft_model.model.placement.gpu
    assert eng.placement.describe() == "CUDA: NVIDIA H100 80GB HBM3 (29 of 29 layers)"


def test_auto_is_the_cpu_where_the_build_cannot_offload(
        monkeypatch: pytest.MonkeyPatch, vocab_path: tuple[Path, Any]) -> None:
    simulate(monkeypatch, supported=False, devices=())
    eng, loads = engine(monkeypatch, vocab_path, "auto")
    assert loads.weights() == [0, 0]
    assert not eng.placement.gpu and eng.placement.describe() == "CPU"


def test_auto_is_the_cpu_for_an_rpc_only_build(monkeypatch: pytest.MonkeyPatch) -> None:
    """llama_supports_gpu_offload is true with only the RPC backend compiled in."""
    simulate(monkeypatch, supported=True, devices=())
    assert device.resolve_gpu_layers("auto") == 0


def test_an_explicit_count_wins(monkeypatch: pytest.MonkeyPatch,
                                vocab_path: tuple[Path, Any]) -> None:
    simulate(monkeypatch, supported=True, devices=(H100,))
    eng, loads = engine(monkeypatch, vocab_path, 0)
    assert loads.weights() == [0, 0] and not eng.placement.gpu
    eng, loads = engine(monkeypatch, vocab_path, 10)
    assert loads.weights() == [10, 10]
    assert eng.placement.describe() == "CUDA: NVIDIA H100 80GB HBM3 (10 of 29 layers)"


def test_the_sizer_treats_an_auto_cpu_machine_as_a_cpu(
        monkeypatch: pytest.MonkeyPatch, vocab_path: tuple[Path, Any]) -> None:
    path = vocab_path[0]
    simulate(monkeypatch, supported=False, devices=())
    eng, _ = engine(monkeypatch, vocab_path, "auto")
    size = path.stat().st_size
    assert eng.sizer.rate == prior_rate(size, eng.model.threads, gpu=False)
    assert prior_rate(size, eng.model.threads, gpu=True) != prior_rate(
        size, eng.model.threads, gpu=False)
    simulate(monkeypatch, supported=True, devices=(H100,))
    eng, _ = engine(monkeypatch, vocab_path, "auto")
    assert eng.sizer.rate == prior_rate(size, eng.model.threads, gpu=True)


def test_a_failed_offload_loads_again_on_the_cpu_with_one_warning(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    asked: list[int] = []

    def load(path: bytes, mp: Any) -> object | None:
        asked.append(mp.n_gpu_layers)
        if mp.n_gpu_layers:
            llama._native_errors.append("ggml_backend_cuda_buffer_type_alloc_buffer: "
                                        "allocating 1.2 GiB on device 0: out of memory")
            return None
        return object()

    monkeypatch.setattr(llama.L, "llama_model_load_from_file", load)
    mp = llama.L.llama_model_default_params()
    with caplog.at_level(logging.WARNING, logger="fimls.engine.llama"):
        model, warning = llama._load_weights(Path("/m/qwen.gguf"), mp, device.ALL_LAYERS)
    assert model is not None and asked == [device.ALL_LAYERS, 0] and mp.n_gpu_layers == 0
    assert warning is not None and "out of memory" in warning and "runs on the CPU" in warning
    assert [r.getMessage() for r in caplog.records] == [warning]


def test_a_cpu_load_that_fails_is_not_tried_again(monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[int] = []

    def load(path: bytes, mp: Any) -> None:
        asked.append(mp.n_gpu_layers)

    monkeypatch.setattr(llama.L, "llama_model_load_from_file", load)
    model, warning = llama._load_weights(Path("/m/bad.gguf"),
                                         llama.L.llama_model_default_params(), 0)
    assert (model, warning, asked) == (None, None, [0])


def test_the_option_takes_auto_or_a_count() -> None:
    assert Options().model.n_gpu_layers == "auto"
    opts, errors = apply_dict(Options(), {"nGpuLayers": 12})
    assert (opts.model.n_gpu_layers, errors) == (12, [])
    opts, errors = apply_dict(Options(), {"nGpuLayers": "auto"})
    assert (opts.model.n_gpu_layers, errors) == ("auto", [])
    opts, errors = apply_dict(Options(), {"nGpuLayers": "all"})
    assert opts.model.n_gpu_layers == "auto" and len(errors) == 1


def test_this_build_lists_its_gpus_without_failing() -> None:
    """The real device query (ctypes over ggml) runs; a CPU build lists none."""
    devices = device.gpu_devices()
    assert all(d.backend and d.name for d in devices)
    assert bool(devices) <= device.offload_supported()
