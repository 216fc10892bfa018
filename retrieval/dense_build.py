"""Building a dense index on disk: stream the corpus, encode in chunks, resume, then build FAISS.

An index directory holds::

    searchgym_dense.json   metadata: corpus fingerprint, model (name, dim, probe vector), prefixes,
                           chunk and batch size, the FAISS indexes built (kind -> options), and
                           the size and SHA-256 of the files a query reads (see :mod:`.checksums`)
    progress.json          chunks encoded so far (rewritten after every chunk)
    offsets.i64            int64 byte offsets of the corpus lines, n + 1 of them (raw, memory-mapped)
    embeddings.f32         float32 embeddings, n x dim (raw, memory-mapped, written chunk by chunk)
    index_<kind>.faiss     one FAISS index per kind built (flat, hnsw, ivfpq)

The corpus is read line by line and never held whole; passages are read back by offset at
query time. An interrupted build resumes at the first chunk not recorded in ``progress.json``;
since each chunk is encoded by one call on the same texts, a resumed build writes the same
bytes as an uninterrupted one.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..checks import check_int
from ..error import DataFileError, InvalidArgumentError
from .checksums import file_checksums
from .encoders import (
    E5_PASSAGE_PREFIX,
    E5_QUERY_PREFIX,
    Encoder,
    expected_query_prefix,
    load_encoder,
    same_model,
)
from .faiss_index import IndexSpec, build_index, write_index
from .passages import file_fingerprint, iter_passages, passage_text, scan_line_offsets

__all__ = [
    "DEFAULT_CHUNK_SIZE",
    "BuildReport",
    "build_dense_index",
    "find_dense_meta",
    "check_corpus",
    "check_model",
    "check_passage_prefix",
    "index_file",
    "read_dense_meta",
    "resolve_prefixes",
]

DEFAULT_CHUNK_SIZE = 4096
"""Passages encoded between two progress records (rounded up to a multiple of the batch size)."""

FORMAT = "searchgym-dense/1"
META_FILE = "searchgym_dense.json"
PROGRESS_FILE = "progress.json"
OFFSETS_FILE = "offsets.i64"
EMBEDDINGS_FILE = "embeddings.f32"
_BUILD_FIELDS = ("kind", "hnsw_m", "ef_construction", "nlist", "pq_m", "nbits", "train_size", "seed")


@dataclass(frozen=True)
class BuildReport:
    """What :func:`build_dense_index` did."""

    index_dir: Path
    num_docs: int
    dim: int
    chunks_done: int
    num_chunks: int
    encoded_now: int
    """Passages encoded by this call (0 when the embeddings were already complete)."""
    encode_seconds: float
    index_seconds: float
    index_type: str
    index_timings: dict[str, float] = field(default_factory=dict)
    """``train_s`` and ``add_s`` of the FAISS build, when this call built one."""

    @property
    def complete(self) -> bool:
        """Whether every chunk is encoded and the FAISS index is written."""
        return self.chunks_done == self.num_chunks

    @property
    def passages_per_second(self) -> float:
        """Encoding speed of this call (0 when nothing was encoded)."""
        return self.encoded_now / self.encode_seconds if self.encode_seconds > 0 else 0.0


def index_file(index_dir: Path, kind: str) -> Path:
    """The FAISS file of index ``kind`` inside ``index_dir``."""
    return index_dir / f"index_{kind}.faiss"


def resolve_prefixes(
    e5: bool, query_prefix: str | None, passage_prefix: str | None
) -> tuple[str | None, str | None]:
    """The query and passage prefixes asked for: explicit ones, else E5's when ``e5``, else None (unset)."""
    for name, value in (("query_prefix", query_prefix), ("passage_prefix", passage_prefix)):
        if value is not None and not isinstance(value, str):
            raise InvalidArgumentError(f"{name} must be a string or None, got {value!r}.")
    if not isinstance(e5, bool):
        raise InvalidArgumentError(f"e5 must be True or False, got {e5!r}.")
    if e5:
        for name, value, wanted in (
            ("query_prefix", query_prefix, E5_QUERY_PREFIX),
            ("passage_prefix", passage_prefix, E5_PASSAGE_PREFIX),
        ):
            if value is not None and value != wanted:
                raise InvalidArgumentError(
                    f"e5=True means {name}={wanted!r}, but {name}={value!r} was also given."
                )
        return E5_QUERY_PREFIX, E5_PASSAGE_PREFIX
    return query_prefix, passage_prefix


def check_passage_prefix(encoder: Encoder, passage_prefix: str | None) -> None:
    """Refuse to encode passages without a prefix (``passage_prefix`` None, not given) for a model
    that expects E5's ``"passage: "``: its vectors would match no prefixed query well.

    Raises:
        InvalidArgumentError: naming the flag and the argument that choose a prefix.
    """
    if passage_prefix is None and expected_query_prefix(encoder) == E5_QUERY_PREFIX:
        raise InvalidArgumentError(
            f"{encoder.name!r} expects passages to begin with {E5_PASSAGE_PREFIX!r} (and queries with "
            f"{E5_QUERY_PREFIX!r}): pass e5=True (searchgym index --e5), or passage_prefix='' to encode "
            "without one."
        )


def _write_json(path: Path, value: dict[str, Any]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(value, indent=1), encoding="utf-8")
    tmp.replace(path)


def find_dense_meta(index_dir: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The metadata of a dense index directory, or None when it holds none.

    Raises:
        DataFileError: The metadata file is there but unreadable or not a searchgym dense index.
    """
    if not (Path(index_dir) / META_FILE).is_file():
        return None
    return read_dense_meta(index_dir)


def read_dense_meta(index_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """The metadata of a dense index directory.

    Raises:
        DataFileError: The metadata file is missing, unreadable or not a searchgym dense index.
    """
    path = Path(index_dir) / META_FILE
    if not path.is_file():
        raise DataFileError(
            f"{str(Path(index_dir))!r} holds no {META_FILE}, so it is not a searchgym dense index. Build one with "
            "`searchgym index --corpus FILE --backend dense --out DIR`."
        )
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
        keys = {
            "format",
            "corpus",
            "model",
            "query_prefix",
            "passage_prefix",
            "chunk_size",
            "batch_size",
            "indexes",
        }
        if not isinstance(meta, dict) or meta.get("format") != FORMAT or not keys <= meta.keys():
            raise ValueError(
                f"format {meta.get('format') if isinstance(meta, dict) else None!r}, expected {FORMAT!r}"
            )
        num_docs, dim = int(meta["corpus"]["num_docs"]), int(meta["model"]["dim"])
        if num_docs < 1 or dim < 1 or len(meta["model"]["probe"]) != dim:
            raise ValueError(f"num_docs={num_docs}, dim={dim}, probe of {len(meta['model']['probe'])} values")
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError) as exc:
        raise DataFileError(
            f"The index metadata {str(path)!r} is unreadable or damaged ({exc}); rebuild the index."
        ) from exc
    return meta


def check_corpus(meta: dict[str, Any], corpus: Path, meta_path: Path) -> None:
    """Raise unless ``corpus`` is the file the index in ``meta`` was built from."""
    if not corpus.is_file():
        raise DataFileError(
            f"The corpus {str(corpus)!r} that the index {str(meta_path)!r} reads its passages from does not exist. "
            "Pass corpus_path=<its new location> (or --corpus)."
        )
    recorded = {k: meta["corpus"].get(k) for k in ("size", "sha256")}
    actual = {k: v for k, v in file_fingerprint(corpus).items() if k in recorded}
    if actual != recorded:
        raise DataFileError(
            f"The corpus {str(corpus)!r} ({actual['size']} bytes) is not the file the index {str(meta_path)!r} was built "
            f"from ({recorded['size']} bytes, {meta['corpus']['num_docs']} passages, {meta['corpus'].get('path')!r}); "
            "its passages would not match the vectors. Rebuild the index or pass the original corpus."
        )


def check_model(meta: dict[str, Any], encoder: Encoder, meta_path: Path) -> None:
    """Raise unless ``encoder`` is the model that embedded the index in ``meta``."""
    built = meta["model"]
    if encoder.dim != int(built["dim"]) or not same_model(built["probe"], encoder):
        raise DataFileError(
            f"The index {str(meta_path)!r} was built with the model {built['name']!r} (dim {built['dim']}), but "
            f"the model given is {encoder.name!r} (dim {encoder.dim}), which embeds text differently. Pass "
            f"model={built['name']!r} (or leave model unset), or rebuild the index with the new model."
        )


@contextlib.contextmanager
def _build_lock(index_dir: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``index_dir`` so two builders never write the same files."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows: no lock
        yield
        return
    try:
        handle = (index_dir / ".build.lock").open("a")
    except OSError as exc:
        raise DataFileError(f"Cannot write to the index directory {str(index_dir)!r}: {exc}.") from exc
    with handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            raise DataFileError(
                f"Another process is building the index in {str(index_dir)!r}; wait for it or use another directory."
            ) from exc
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _start(
    index_dir: Path,
    corpus: Path,
    encoder: Encoder,
    prefixes: tuple[str, str],
    batch_size: int,
    chunk_size: int,
    progress: bool,
) -> dict[str, Any]:
    """Scan the corpus, create the offsets and embedding files, and write fresh metadata."""
    offsets = scan_line_offsets(corpus, progress=progress)
    n = len(offsets) - 1
    offsets.tofile(index_dir / OFFSETS_FILE)
    with (index_dir / EMBEDDINGS_FILE).open("wb") as handle:  # a sparse file of the final size
        handle.truncate(n * encoder.dim * 4)
    meta = {
        "format": FORMAT,
        "corpus": {"path": str(corpus.resolve()), "num_docs": n, **file_fingerprint(corpus)},
        "model": {"name": encoder.name, "dim": encoder.dim, "probe": [float(x) for x in encoder.probe()]},
        "query_prefix": prefixes[0],
        "passage_prefix": prefixes[1],
        "chunk_size": chunk_size,
        "batch_size": batch_size,
        "complete": False,
        "indexes": {},
    }
    _write_json(index_dir / PROGRESS_FILE, {"chunks_done": 0})
    _write_json(index_dir / META_FILE, meta)
    return meta


def _chunks_done(index_dir: Path) -> int:
    try:
        done = json.loads((index_dir / PROGRESS_FILE).read_text(encoding="utf-8"))["chunks_done"]
        return int(done)
    except (OSError, ValueError, KeyError, TypeError):
        return 0  # no readable record: start encoding from the first chunk again


def build_dense_index(
    corpus_path: str | os.PathLike[str],
    index_dir: str | os.PathLike[str],
    *,
    model: str | os.PathLike[str] | None = None,
    index_type: str = "flat",
    e5: bool = False,
    query_prefix: str | None = None,
    passage_prefix: str | None = None,
    batch_size: int = 64,
    chunk_size: int | None = None,
    device: str | None = None,
    progress: bool = True,
    max_chunks: int | None = None,
    **index_options: Any,
) -> BuildReport:
    """Encode ``corpus_path`` into ``index_dir`` and build a FAISS index, resuming an unfinished build.

    Calling it again on a finished directory only builds index kinds that are not there yet
    (from the stored embeddings, without encoding again), so it is cheap to call before every load.

    Args:
        corpus_path: A JSON Lines corpus (id/title/text or FlashRAG's id/contents).
        index_dir: The output directory (created if needed).
        model: The sentence-transformers model; None for all-MiniLM-L6-v2, or, when resuming, the
            model the build started with.
        index_type: ``flat``, ``hnsw`` or ``ivfpq``.
        e5: Use E5's ``"query: "``/``"passage: "`` prefixes.
        query_prefix: Put before every query at search time (recorded for loading).
        passage_prefix: Put before every passage when encoding.
        batch_size: Texts per forward pass.
        chunk_size: Passages per recorded step (default :data:`DEFAULT_CHUNK_SIZE`); a resumed
            build keeps the chunk and batch size it started with.
        device: Torch device for encoding.
        progress: Show progress bars.
        max_chunks: Encode at most this many chunks in this call, then return an incomplete
            report (for tests and for spreading a long build over several jobs).
        **index_options: :class:`~searchgym.retrieval.faiss_index.IndexSpec` fields
            (``nlist``, ``pq_m``, ``nbits``, ``hnsw_m``, ...).

    Raises:
        DataFileError: The corpus is unreadable, or ``index_dir`` holds an index of another
            corpus, model or passage prefix.
        InvalidArgumentError: A bad option.
    """
    corpus, index_dir = Path(corpus_path), Path(index_dir)
    check_int("batch_size", batch_size, 1)
    check_int("chunk_size", chunk_size, 1, optional=True)
    check_int("max_chunks", max_chunks, 1, optional=True)
    spec = IndexSpec.from_options(index_type, index_options)
    qp, pp = resolve_prefixes(e5, query_prefix, passage_prefix)
    if not corpus.is_file():
        raise DataFileError(f"The corpus file {str(corpus)!r} does not exist (or is a directory).")
    index_dir.mkdir(parents=True, exist_ok=True)
    with _build_lock(index_dir):
        meta = find_dense_meta(index_dir)
        if meta is None:
            encoder = load_encoder(model, device=device)
            check_passage_prefix(encoder, pp)
            size = -(-(chunk_size or DEFAULT_CHUNK_SIZE) // batch_size) * batch_size
            meta = _start(index_dir, corpus, encoder, (qp or "", pp or ""), batch_size, size, progress)
        else:
            meta_path = index_dir / META_FILE
            encoder = load_encoder(model if model is not None else meta["model"]["name"], device=device)
            check_model(meta, encoder, meta_path)
            check_corpus(meta, corpus, meta_path)
            if pp is not None and pp != meta["passage_prefix"]:
                raise DataFileError(
                    f"The index {str(meta_path)!r} encoded passages with passage_prefix={meta['passage_prefix']!r}, "
                    f"not {pp!r}; use another index directory for another prefix."
                )
        return _finish(index_dir, corpus, meta, encoder, spec, index_options, progress, max_chunks)


def _finish(
    index_dir: Path,
    corpus: Path,
    meta: dict[str, Any],
    encoder: Encoder,
    spec: IndexSpec,
    given: dict[str, Any],
    progress: bool,
    max_chunks: int | None,
) -> BuildReport:
    n, dim, chunk = int(meta["corpus"]["num_docs"]), encoder.dim, int(meta["chunk_size"])
    num_chunks = math.ceil(n / chunk)
    offsets = np.fromfile(index_dir / OFFSETS_FILE, dtype=np.int64)
    if offsets.shape != (n + 1,) or (index_dir / EMBEDDINGS_FILE).stat().st_size != n * dim * 4:
        raise DataFileError(
            f"The offsets or embeddings file in {str(index_dir)!r} does not hold {n} passages of dim {dim}; "
            "delete the directory and build again."
        )
    done = min(_chunks_done(index_dir), num_chunks)
    stop = num_chunks if max_chunks is None else min(num_chunks, done + max_chunks)
    encoded, t0 = 0, time.perf_counter()
    if done < stop:
        vectors = np.memmap(index_dir / EMBEDDINGS_FILE, dtype=np.float32, mode="r+", shape=(n, dim))
        bar = _bar(progress, n, done * chunk, "encoding passages")
        prefix = meta["passage_prefix"]
        for c in range(done, stop):
            lo, hi = c * chunk, min(n, (c + 1) * chunk)
            texts = [prefix + passage_text(doc) for doc in iter_passages(corpus, offsets, lo, hi)]
            vectors[lo:hi] = encoder.encode(
                texts, batch_size=int(meta["batch_size"]), on_batch=bar.update if bar is not None else None
            )
            vectors.flush()
            _write_json(index_dir / PROGRESS_FILE, {"chunks_done": c + 1})
            encoded += hi - lo
        if bar is not None:
            bar.close()
        del vectors
    encode_seconds = time.perf_counter() - t0
    report: dict[str, Any] = dict(
        index_dir=index_dir, num_docs=n, dim=dim, num_chunks=num_chunks, encoded_now=encoded
    )
    if stop < num_chunks:
        return BuildReport(
            chunks_done=stop, encode_seconds=encode_seconds, index_seconds=0.0, index_type=spec.kind, **report
        )
    if not meta.get("complete"):
        meta["complete"] = True
        _write_json(index_dir / META_FILE, meta)
    t0 = time.perf_counter()
    recorded = meta["indexes"].get(spec.kind)
    if recorded is not None:  # options not given now keep their recorded values
        spec = IndexSpec(**{**recorded, **given, "kind": spec.kind})
    wanted = spec.resolve(n, dim)
    same = recorded is not None and all(recorded.get(f) == getattr(wanted, f) for f in _BUILD_FIELDS)
    timings: dict[str, float] = {}
    if not (same and index_file(index_dir, spec.kind).is_file()):
        vectors = np.memmap(index_dir / EMBEDDINGS_FILE, dtype=np.float32, mode="r", shape=(n, dim))
        write_index(
            build_index(vectors, wanted, progress=progress, timings=timings), index_file(index_dir, spec.kind)
        )
        del vectors
    meta["indexes"][spec.kind] = wanted.to_dict()
    meta["files"] = {
        **meta.get("files", {}),
        **file_checksums(index_dir, [OFFSETS_FILE, index_file(index_dir, spec.kind).name]),
    }
    _write_json(index_dir / META_FILE, meta)
    return BuildReport(
        chunks_done=num_chunks,
        encode_seconds=encode_seconds,
        index_seconds=time.perf_counter() - t0,
        index_type=spec.kind,
        index_timings=timings,
        **report,
    )


def _bar(enabled: bool, total: int, initial: int, desc: str):  # noqa: ANN202 - tqdm or None
    if not enabled:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=min(initial, total), desc=desc, unit="passage", dynamic_ncols=True)
