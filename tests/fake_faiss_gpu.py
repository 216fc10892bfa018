"""A stand-in for faiss-gpu's Python API over the installed faiss-cpu, for machines without GPUs.

faiss-gpu cannot be installed here, and faiss-cpu lacks its GPU functions. This fake adds them
to the real faiss module, behaving as faiss-gpu's do (read in faiss' ``gpu_wrappers.py``,
``GpuClonerOptions.h`` and ``GpuCloner.cpp``):

- ``get_num_gpus()``; ``StandardGpuResources()``;
- ``GpuClonerOptions`` with the fields of the C++ struct (``useFloat16``, ...), and
  ``GpuMultipleClonerOptions`` adding ``shard``, ``shard_type``, ``common_ivf_quantizer``;
- ``index_cpu_to_gpu(provider, device, index, options=None)``: the whole index on ``device``;
  an index kind without a GPU version (HNSW) or a device faiss does not see raises
  RuntimeError, as the C++ cloner does;
- ``index_cpu_to_all_gpus(index, co=None, ngpu=-1)``: one copy per GPU, or with ``co.shard`` the
  rows split over the GPUs as ``IndexShards`` splits them (``i * n // ngpu`` boundaries).

Every copy is charged to its GPU in :attr:`FakeGpuFaiss.allocated` (bytes per device, the
index's vectors, codes and ids), and a copy past ``memory_per_gpu`` raises as a failed
``cudaMalloc`` does. Searching a GPU index searches the CPU index it came from. Everything
else is the real faiss module.
"""

from __future__ import annotations

import types
from typing import Any

import numpy as np

__all__ = ["FakeGpuFaiss", "FakeGpuIndex"]

_GPU_FUNCTIONS = ("StandardGpuResources", "index_cpu_to_gpu", "GpuClonerOptions")


def _row_bytes(real: Any, index: Any) -> float:
    base = real.downcast_index(index)
    if hasattr(base, "nlist"):
        return float(base.code_size) + 8  # codes and 64-bit ids (INDICES_64_BIT)
    return float(base.code_size)


class _Resources:
    """``faiss.StandardGpuResources``: scratch memory settings (their effect is not modelled)."""

    def __init__(self) -> None:
        self.temp_memory: int | None = None

    def setTempMemory(self, size: int) -> None:  # noqa: N802 (faiss' name)
        self.temp_memory = int(size)

    def noTempMemory(self) -> None:  # noqa: N802
        self.temp_memory = 0


class _ClonerOptions:
    """``faiss.GpuClonerOptions``: the fields of the C++ struct, with their defaults."""

    def __init__(self) -> None:
        self.indicesOptions = 1  # INDICES_64_BIT
        self.useFloat16CoarseQuantizer = False
        self.useFloat16 = False
        self.usePrecomputed = False
        self.reserveVecs = 0
        self.storeTransposed = False
        self.verbose = False
        self.use_cuvs = False
        self.allowCpuCoarseQuantizer = False


class _MultipleClonerOptions(_ClonerOptions):
    """``faiss.GpuMultipleClonerOptions``."""

    def __init__(self) -> None:
        super().__init__()
        self.shard = False
        self.shard_type = 1
        self.common_ivf_quantizer = False


class FakeGpuIndex:
    """A GPU index (``GpuIndexFlat``, ``GpuIndexIVFPQ``, or shards/replicas of them)."""

    def __init__(self, cpu_index: Any, devices: list[int], options: _ClonerOptions | None) -> None:
        self.cpu_index = cpu_index
        self.devices = devices
        self.options = options
        self.d = int(cpu_index.d)
        self.ntotal = int(cpu_index.ntotal)
        self.metric_type = cpu_index.metric_type
        if hasattr(cpu_index, "nlist"):
            self.nlist = int(cpu_index.nlist)
            self.nprobe = int(cpu_index.nprobe)

    def getDevice(self) -> int:  # noqa: N802 (faiss' name)
        if len(self.devices) != 1:
            raise RuntimeError("an IndexShards/IndexReplicas has no single device")
        return self.devices[0]

    def search(self, x: np.ndarray, k: int, params: Any = None) -> tuple[np.ndarray, np.ndarray]:
        if hasattr(self, "nprobe"):
            self.cpu_index.nprobe = self.nprobe
        return self.cpu_index.search(np.ascontiguousarray(x, dtype=np.float32), k)


class FakeGpuFaiss(types.ModuleType):
    """The real ``faiss`` module with faiss-gpu's GPU functions on ``gpus`` fake devices.

    Args:
        real: The installed faiss module, which must lack the GPU functions (where it has
            them, test against it instead).
        gpus: Visible GPUs.
        memory_per_gpu: Bytes each GPU can hold.
    """

    def __init__(self, real: Any, gpus: int, memory_per_gpu: int = 80 * 10**9) -> None:
        present = [name for name in _GPU_FUNCTIONS if hasattr(real, name)]
        if present:
            raise RuntimeError(
                f"the installed faiss has GPU functions ({present}): test against it, not this fake"
            )
        super().__init__("faiss")
        self._real = real
        self._gpus = gpus
        self.memory_per_gpu = memory_per_gpu
        self.allocated: dict[int, int] = {}
        """Bytes placed on each GPU so far."""
        self.StandardGpuResources = _Resources
        self.GpuClonerOptions = _ClonerOptions
        self.GpuMultipleClonerOptions = _MultipleClonerOptions

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def get_num_gpus(self) -> int:
        return self._gpus

    def downcast_index(self, index: Any) -> Any:
        return index if isinstance(index, FakeGpuIndex) else self._real.downcast_index(index)

    def _charge(self, device: int, nbytes: int) -> None:
        if not 0 <= device < self._gpus:
            raise RuntimeError(f"Error in getDeviceProperties: invalid device ordinal {device}")
        if self.allocated.get(device, 0) + nbytes > self.memory_per_gpu:
            raise RuntimeError(
                f"Error: cudaMalloc error out of memory [2] on device {device} (asked for {nbytes} bytes)"
            )
        self.allocated[device] = self.allocated.get(device, 0) + nbytes

    def _check_kind(self, index: Any) -> None:
        base = self._real.downcast_index(index)
        if hasattr(base, "hnsw"):
            raise RuntimeError("Error in index_cpu_to_gpu: This index type is not implemented on GPU.")

    def index_cpu_to_gpu(self, provider: Any, device: int, index: Any, options: Any = None) -> FakeGpuIndex:
        if not isinstance(provider, _Resources):
            raise TypeError(
                "in method 'index_cpu_to_gpu', argument 1 of type 'faiss::gpu::GpuResourcesProvider *'"
            )
        self._check_kind(index)
        self._charge(int(device), round(int(index.ntotal) * _row_bytes(self._real, index)))
        return FakeGpuIndex(index, [int(device)], options)

    def index_cpu_to_all_gpus(self, index: Any, co: Any = None, ngpu: int = -1) -> FakeGpuIndex:
        self._check_kind(index)
        devices = list(range(self._gpus if ngpu == -1 else ngpu))
        n, row = int(index.ntotal), _row_bytes(self._real, index)
        shard = bool(co is not None and co.shard)
        for i, device in enumerate(devices):
            rows = (i + 1) * n // len(devices) - i * n // len(devices) if shard else n
            self._charge(device, round(rows * row))
        return FakeGpuIndex(index, devices, co)
