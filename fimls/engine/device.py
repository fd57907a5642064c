"""Where the model runs: the GPU when this llama.cpp build has one, else the CPU.

``nGpuLayers`` defaults to ``auto``. llama.cpp's own test, ``llama_supports_gpu_offload``,
is also true for a build with only the RPC backend and no GPU at all, so ``auto`` asks
ggml for a GPU (or integrated GPU) device as well. What was decided travels as a
:class:`Placement`: the prompt sizer, the cold window and the status read it, never the
option's raw value.
"""

from __future__ import annotations

import ctypes
import functools
import logging
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

AUTO = "auto"
ALL_LAYERS = -1  # llama.cpp: a negative count offloads every layer
# ggml_backend_dev_type (ggml-backend.h)
_DEV_GPU, _DEV_IGPU = 1, 2


@dataclass(frozen=True)
class GpuDevice:
    """One GPU as ggml lists it."""

    backend: str  # the backend's registry name: CUDA, Metal, Vulkan, ROCm, ...
    name: str  # the device's name: CUDA0, Metal, Vulkan0
    description: str  # the card: "NVIDIA H100 80GB HBM3", "Apple M2"


@dataclass(frozen=True)
class Placement:
    """Where one loaded model runs."""

    backend: str = "CPU"  # CPU, or the GPU backend holding the offloaded layers
    device: str = "CPU"  # the GPU's description, or CPU
    gpu_layers: int = 0  # layers (of ``n_layers``, the output layer counted) on the GPU
    n_layers: int = 0

    @property
    def gpu(self) -> bool:
        """Whether any layer runs on a GPU (the sizer's and the draft pricing's question)."""
        return self.gpu_layers > 0

    def describe(self) -> str:
        """For status lines and the log: ``CPU`` or ``CUDA: NVIDIA H100 (29 of 29 layers)``."""
        if not self.gpu:
            return self.backend if self.backend == self.device else f"{self.backend}: {self.device}"
        return f"{self.backend}: {self.device} ({self.gpu_layers} of {self.n_layers} layers)"


def _libggml() -> ctypes.CDLL | None:
    """ggml's shared library, as llama-cpp-python loaded it (its device list is there)."""
    import llama_cpp

    lib_dir = Path(llama_cpp.__file__).parent / "lib"
    for name in ("libggml.so", "libggml.dylib", "ggml.dll"):
        if (lib_dir / name).exists():
            try:
                return ctypes.CDLL(str(lib_dir / name))
            except OSError:
                return None
    return None


@functools.cache
def gpu_devices() -> tuple[GpuDevice, ...]:
    """The GPUs this llama.cpp build can offload to (none on a CPU-only build)."""
    from fimls.engine.llama import backend_init

    backend_init()
    lib = _libggml()
    if lib is None:
        return ()
    try:
        lib.ggml_backend_dev_count.restype = ctypes.c_size_t
        lib.ggml_backend_dev_get.restype = ctypes.c_void_p
        lib.ggml_backend_dev_get.argtypes = [ctypes.c_size_t]
        for fn in ("ggml_backend_dev_name", "ggml_backend_dev_description"):
            getattr(lib, fn).restype = ctypes.c_char_p
            getattr(lib, fn).argtypes = [ctypes.c_void_p]
        lib.ggml_backend_dev_type.restype = ctypes.c_int
        lib.ggml_backend_dev_type.argtypes = [ctypes.c_void_p]
        lib.ggml_backend_dev_backend_reg.restype = ctypes.c_void_p
        lib.ggml_backend_dev_backend_reg.argtypes = [ctypes.c_void_p]
        lib.ggml_backend_reg_name.restype = ctypes.c_char_p
        lib.ggml_backend_reg_name.argtypes = [ctypes.c_void_p]
    except AttributeError:
        return ()
    found = []
    for i in range(lib.ggml_backend_dev_count()):
        dev = lib.ggml_backend_dev_get(i)
        if lib.ggml_backend_dev_type(dev) not in (_DEV_GPU, _DEV_IGPU):
            continue
        reg = lib.ggml_backend_dev_backend_reg(dev)
        found.append(GpuDevice(_text(lib.ggml_backend_reg_name(reg)),
                               _text(lib.ggml_backend_dev_name(dev)),
                               _text(lib.ggml_backend_dev_description(dev))))
    return tuple(found)


def _text(raw: bytes | None) -> str:
    return (raw or b"").decode("utf-8", "replace")


def offload_supported() -> bool:
    """llama.cpp's own answer (true for an RPC-only build too, hence :func:`gpu_devices`)."""
    import llama_cpp

    return bool(llama_cpp.llama_supports_gpu_offload())


def resolve_gpu_layers(option: int | str) -> int:
    """The layer count to load with: an explicit number as given; ``auto``: all where this
    build offloads to a GPU it can see, else 0."""
    if option != AUTO:
        return int(option)
    return ALL_LAYERS if offload_supported() and gpu_devices() else 0


def placement(gpu_layers: int, n_layer: int) -> Placement:
    """Where a model loaded with ``gpu_layers`` (and ``n_layer`` repeating layers) runs:
    llama.cpp offloads the output layer as one more, and nothing without a GPU device."""
    devices = gpu_devices()
    total = n_layer + 1
    on_gpu = 0 if not devices else (total if gpu_layers < 0 else min(gpu_layers, total))
    if not on_gpu:
        return Placement(n_layers=total)
    first = devices[0]
    return Placement(first.backend, first.description or first.name, on_gpu, total)
