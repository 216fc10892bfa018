"""FAISS indexes over normalised embeddings: choose a kind, build from a memory map, save, load.

Three kinds, all scoring by inner product (cosine, since embeddings are unit vectors):

- ``flat``: exact search (``IndexFlatIP``); 4·dim bytes per passage, all of it searched.
- ``hnsw``: a graph index (``IndexHNSWFlat``); full vectors plus the graph, fast approximate search.
- ``ivfpq``: inverted lists with product-quantised codes (``IndexIVFPQ``); ``pq_m·nbits/8`` bytes
  per passage, the choice for the 21M-passage Wikipedia case. Trained on a random sample.

faiss is imported inside the functions. Every build runs on the CPU. Where an index is searched
is the caller's choice (:func:`to_search_device`): on the CPU by default, or, with faiss-gpu, a
flat or IVF-PQ index copied whole to one GPU, or sharded over every visible GPU; the index's size
in bytes is logged where it is placed.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np

from ..checks import check_int
from ..error import DataFileError, InvalidArgumentError

__all__ = [
    "INDEX_DEVICES",
    "INDEX_TYPES",
    "IndexSpec",
    "build_index",
    "check_index_device",
    "import_faiss",
    "index_bytes",
    "read_index",
    "to_search_device",
    "write_index",
]

log = logging.getLogger("searchgym.retrieval")

INDEX_TYPES = ("flat", "hnsw", "ivfpq")
_ADD_ROWS = 65_536  # rows copied from the memory map per faiss add() call
_MIN_POINTS_PER_CENTROID = 39  # below this faiss' k-means warns that training is unreliable


def import_faiss() -> Any:
    """The ``faiss`` module, or an error that says how to install it."""
    try:
        import faiss
    except ImportError as exc:
        raise InvalidArgumentError(
            "Dense retrieval needs faiss: pip install 'searchgym[retrieval]' (faiss-cpu), or faiss-gpu on a GPU machine."
        ) from exc
    return faiss


@dataclass(frozen=True)
class IndexSpec:
    """Which FAISS index to build and how to search it.

    Fields left None are worked out from the corpus size and dimension by :meth:`resolve`.
    """

    kind: str = "flat"
    """``flat``, ``hnsw`` or ``ivfpq``."""
    hnsw_m: int = 32
    """HNSW: neighbours per node."""
    ef_construction: int = 80
    """HNSW: candidate list size while building (larger: better graph, slower build)."""
    ef_search: int = 64
    """HNSW: candidate list size while searching (raised to k when k is larger)."""
    nlist: int | None = None
    """IVF-PQ: inverted lists. Default: the power of two nearest 4·sqrt(n), at most n/39."""
    pq_m: int | None = None
    """IVF-PQ: sub-quantisers (bytes per code at 8 bits). Default: the largest divisor of dim <= dim/8."""
    nbits: int | None = None
    """IVF-PQ: bits per sub-quantiser code. Default 8, fewer when the training sample is too small."""
    nprobe: int = 32
    """IVF-PQ: inverted lists visited per query."""
    train_size: int | None = None
    """IVF-PQ: training sample size. Default: min(n, max(64·nlist, 256·39))."""
    seed: int = 0
    """IVF-PQ: seed of the training sample and of k-means."""

    def __post_init__(self) -> None:
        if self.kind not in INDEX_TYPES:
            from ..error import did_you_mean

            raise did_you_mean("index type", self.kind, INDEX_TYPES)
        for name in ("hnsw_m", "ef_construction", "ef_search", "nprobe"):
            check_int(name, getattr(self, name), 1)
        for name in ("nlist", "pq_m", "train_size"):
            check_int(name, getattr(self, name), 1, optional=True)
        if self.nbits is not None and (isinstance(self.nbits, bool) or self.nbits not in range(1, 17)):
            raise InvalidArgumentError(f"nbits must be an int from 1 to 16 or None, got {self.nbits!r}.")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise InvalidArgumentError(f"seed must be an int, got {self.seed!r}.")

    @classmethod
    def from_options(cls, kind: str, options: dict[str, Any]) -> IndexSpec:
        """Build a spec from ``index_type`` and keyword options, rejecting unknown keys."""
        known = {f.name for f in fields(cls)} - {"kind"}
        unknown = sorted(set(options) - known)
        if unknown:
            raise InvalidArgumentError(
                f"Unknown index option(s) {', '.join(map(repr, unknown))}; known: {', '.join(sorted(known))}."
            )
        return cls(kind=kind, **options)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def resolve(self, n: int, dim: int) -> IndexSpec:
        """A copy with the IVF-PQ sizes filled in for ``n`` vectors of dimension ``dim``."""
        if self.kind != "ivfpq":
            return self
        nlist = self.nlist or max(
            1, min(2 ** round(math.log2(4 * math.sqrt(n))), n // _MIN_POINTS_PER_CENTROID)
        )
        pq_m = self.pq_m or max(m for m in range(1, max(1, dim // 8) + 1) if dim % m == 0)
        if dim % pq_m:
            raise InvalidArgumentError(f"pq_m must divide the embedding dimension {dim}, got pq_m={pq_m}.")
        train_size = min(n, self.train_size or max(64 * nlist, 256 * _MIN_POINTS_PER_CENTROID))
        nbits = self.nbits or max(1, min(8, int(math.log2(max(2, train_size // _MIN_POINTS_PER_CENTROID)))))
        if nlist > n or 2**nbits > train_size:
            raise InvalidArgumentError(
                f"IVF-PQ with nlist={nlist} and nbits={nbits} needs at least {max(nlist, 2**nbits)} training vectors, "
                f"but there are {train_size}; lower nlist/nbits or use index_type='flat' for a corpus this small."
            )
        return IndexSpec(
            **{**asdict(self), "nlist": nlist, "pq_m": pq_m, "nbits": nbits, "train_size": train_size}
        )


def build_index(
    vectors: np.ndarray, spec: IndexSpec, *, progress: bool = True, timings: dict[str, float] | None = None
) -> Any:
    """Build ``spec``'s index over ``vectors`` (``(n, dim)`` float32, a memory map is fine), on the CPU.

    Rows are added in slices of 65,536, so only the index itself (not a copy of ``vectors``)
    must fit in memory. ``timings``, when given, receives ``train_s`` and ``add_s``.
    """
    started = time.perf_counter()
    faiss = import_faiss()
    n, dim = vectors.shape
    spec = spec.resolve(n, dim)
    if spec.kind == "flat":
        index = faiss.IndexFlatIP(dim)
    elif spec.kind == "hnsw":
        index = faiss.IndexHNSWFlat(dim, spec.hnsw_m, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = spec.ef_construction
    else:
        quantizer = faiss.IndexFlatIP(dim)
        index = faiss.IndexIVFPQ(
            quantizer, dim, spec.nlist, spec.pq_m, spec.nbits, faiss.METRIC_INNER_PRODUCT
        )
        index.cp.seed = spec.seed
        index.pq.cp.seed = spec.seed
        assert spec.train_size is not None  # filled in by resolve()
        rows = np.sort(np.random.default_rng(spec.seed).choice(n, size=spec.train_size, replace=False))
        index.train(np.ascontiguousarray(vectors[rows], dtype=np.float32))
    trained = time.perf_counter()
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=n, desc=f"building {spec.kind} index", unit="vec", dynamic_ncols=True)
    for start in range(0, n, _ADD_ROWS):
        index.add(np.ascontiguousarray(vectors[start : start + _ADD_ROWS], dtype=np.float32))
        if bar is not None:
            bar.update(min(_ADD_ROWS, n - start))
    if bar is not None:
        bar.close()
    if timings is not None:
        timings.update(train_s=trained - started, add_s=time.perf_counter() - trained)
    return index


def write_index(index: Any, path: str | os.PathLike[str]) -> None:
    """Write ``index`` to ``path`` atomically (a temporary file renamed into place)."""
    faiss = import_faiss()
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    faiss.write_index(index, str(tmp))
    tmp.replace(path)


def read_index(path: str | os.PathLike[str], *, mmap: bool = True) -> Any:
    """Read a FAISS index file, memory-mapped when ``mmap`` (flat, HNSW and IVF-PQ all allow it).

    Raises:
        DataFileError: The file is missing or is not a FAISS index (the message names it).
    """
    faiss = import_faiss()
    path = Path(path)
    if not path.is_file():
        raise DataFileError(f"The FAISS index file {str(path)!r} does not exist (or is not a file).")
    try:
        return faiss.read_index(str(path), faiss.IO_FLAG_MMAP | faiss.IO_FLAG_READ_ONLY if mmap else 0)
    except RuntimeError as exc:
        if mmap and "mmap" in str(exc).lower():  # an index kind without mmap support: read it whole
            return faiss.read_index(str(path))
        first = str(exc).strip().splitlines()[-1] if str(exc).strip() else repr(exc)
        raise DataFileError(
            f"The FAISS index file {str(path)!r} is corrupt or not a FAISS index ({first[:300]}). Rebuild it."
        ) from exc


def configure_search(index: Any, spec: IndexSpec | None, k: int) -> None:
    """Set the search-time knobs of ``index`` (HNSW ``efSearch``, IVF ``nprobe``) for top-``k``."""
    faiss = import_faiss()
    base = faiss.downcast_index(index) if hasattr(faiss, "downcast_index") else index
    if hasattr(base, "hnsw"):
        base.hnsw.efSearch = max(k, spec.ef_search if spec else 64)
    if hasattr(base, "nprobe"):
        base.nprobe = min(base.nlist, spec.nprobe if spec else 32)


INDEX_DEVICES = ("cpu", "all", "<GPU id>")
"""Where an index is searched: ``"cpu"`` (the default), a GPU id (``0``, ``"1"``, ``"cuda:1"``:
the whole index on that GPU), or ``"all"`` (sharded over every visible GPU)."""

_GPU_RESOURCES: dict[int, Any] = {}  # one faiss StandardGpuResources per GPU, kept for the process
_GPU_LOCK = threading.Lock()


def check_index_device(device: object) -> str | int:
    """``device`` read as ``"cpu"``, ``"all"`` or a GPU id (an int).

    Raises:
        InvalidArgumentError: ``device`` is none of these.
    """
    if isinstance(device, int) and not isinstance(device, bool) and device >= 0:
        return device
    if isinstance(device, str):
        text = device.strip().lower()
        if text in ("cpu", "all"):
            return text
        number = text[5:] if text.startswith("cuda:") else text
        if number.isdigit():
            return int(number)
    raise InvalidArgumentError(
        f"index_device must be 'cpu', 'all' or a GPU id such as 0 or 'cuda:0', got {device!r}."
    )


def index_bytes(index: Any) -> int:
    """Bytes that ``index``'s vectors and lists take in memory (what a GPU copy holds, before faiss'
    scratch memory): ``ntotal x code size``, plus 8-byte ids and the coarse centroids of an IVF index,
    plus the links of an HNSW graph."""
    faiss = import_faiss()
    base = faiss.downcast_index(index)
    n, d = int(base.ntotal), int(base.d)
    if hasattr(base, "nlist") and hasattr(base, "code_size"):  # IVF: codes, ids, coarse centroids
        return n * (int(base.code_size) + 8) + int(base.nlist) * d * 4
    if hasattr(base, "hnsw"):
        return n * d * 4 + n * int(base.hnsw.nb_neighbors(0)) * 4
    code_size = int(base.code_size) if hasattr(base, "code_size") else d * 4
    return n * code_size


def _size(nbytes: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if nbytes < 1000 or unit == "GB":
            return f"{nbytes:.0f} {unit}" if unit == "B" else f"{nbytes:.1f} {unit}"
        nbytes /= 1000
    return f"{nbytes:.1f} GB"


def _gpu_resources(faiss: Any, gpu: int) -> Any:
    with _GPU_LOCK:
        if gpu not in _GPU_RESOURCES:
            _GPU_RESOURCES[gpu] = faiss.StandardGpuResources()
        return _GPU_RESOURCES[gpu]


def to_search_device(index: Any, device: str | int = "cpu") -> Any:
    """``index`` placed where it is to be searched; its size is logged (``searchgym.retrieval``, INFO).

    Args:
        index: A CPU index (memory-mapped is fine).
        device: ``"cpu"``: searched where it is (no copy). A GPU id: the whole index copied to
            that GPU, :func:`index_bytes` of it, plus faiss' scratch memory there. ``"all"``: the
            vectors sharded over every visible GPU, about ``1/n`` of the bytes on each. A GPU
            needs faiss-gpu, and a flat or IVF-PQ index (faiss has no GPU HNSW).

    Raises:
        InvalidArgumentError: ``device`` is not a place, names a GPU that faiss does not see,
            asks for a GPU without faiss-gpu, or for an HNSW index.
    """
    faiss = import_faiss()
    where = check_index_device(device)
    size = index_bytes(index)
    if where == "cpu":
        log.info("FAISS index: %d bytes (%s), searched on the CPU", size, _size(size))
        return index
    if not all(hasattr(faiss, name) for name in ("StandardGpuResources", "index_cpu_to_gpu")):
        raise InvalidArgumentError(
            f"index_device={device!r} needs faiss-gpu, but the faiss installed has no GPU support; "
            "install faiss-gpu, or search on the CPU (index_device='cpu')."
        )
    base = faiss.downcast_index(index)
    if hasattr(base, "hnsw"):
        raise InvalidArgumentError(
            f"index_device={device!r}: faiss has no GPU version of an HNSW index; use index_device='cpu', "
            "or build a flat or IVF-PQ index."
        )
    gpus = int(faiss.get_num_gpus())
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    seen = f"faiss sees {gpus} GPU(s)" + (f" (CUDA_VISIBLE_DEVICES={visible})" if visible is not None else "")
    if gpus < 1 or (where != "all" and int(where) >= gpus):
        raise InvalidArgumentError(
            f"index_device={device!r}: {seen}. Pass a GPU id below {gpus}, or 'cpu'."
            if gpus
            else f"index_device={device!r}: {seen}. Pass 'cpu'."
        )
    ivfpq = hasattr(base, "pq") and hasattr(base, "nlist")
    if where == "all":
        options = faiss.GpuMultipleClonerOptions()
        options.shard = True  # split the vectors across GPUs rather than copying them to each
        options.useFloat16 = ivfpq  # IVF-PQ: float16 lookup tables (needed with many sub-quantisers)
        log.info(
            "FAISS index: %d bytes (%s), sharded over %d GPUs (about %s each)",
            size,
            _size(size),
            gpus,
            _size(size / gpus),
        )
        return faiss.index_cpu_to_all_gpus(index, co=options)
    options = faiss.GpuClonerOptions()
    options.useFloat16 = ivfpq
    log.info("FAISS index: %d bytes (%s), copied to GPU %d", size, _size(size), where)
    return faiss.index_cpu_to_gpu(_gpu_resources(faiss, int(where)), int(where), index, options)
