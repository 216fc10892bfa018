"""The dense retriever: a sentence-transformers encoder and a FAISS index, searched by cosine.

Three ways to get a :class:`DenseRetriever`:

- from an index directory built by :func:`~searchgym.retrieval.dense_build.build_dense_index`
  or ``searchgym index`` (:meth:`DenseRetriever.load`; the FAISS file and the passage offsets are
  memory-mapped, so loading takes about as long as loading the model);
- from a FAISS file and its corpus as Search-R1 and FlashRAG lay them out, e.g.
  ``e5_Flat.index`` and ``wiki-18.jsonl`` (:meth:`DenseRetriever.from_faiss`);
- from passages in memory, encoded on the spot (:meth:`DenseRetriever.from_docs`).

:func:`~searchgym.retrieval.dense.make_dense_retriever` (the ``"dense"`` backend) picks
one of these from its keywords. faiss, torch and sentence-transformers are imported only when
a retriever is built.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from ..error import DataFileError, InvalidArgumentError, RetrievalError, SearchGymError
from .base import Retriever
from .bm25 import MAX_QUERY_CHARS, check_search_args
from .checksums import verify_checksums
from .dense_build import (
    META_FILE,
    OFFSETS_FILE,
    check_corpus,
    check_model,
    check_passage_prefix,
    index_file,
    read_dense_meta,
    resolve_prefixes,
)
from .encoders import Encoder, expected_query_prefix, load_encoder
from .faiss_index import (
    IndexSpec,
    build_index,
    check_index_device,
    configure_search,
    import_faiss,
    index_bytes,
    read_index,
    to_search_device,
)
from .passages import (
    DocListPassages,
    JsonlPassages,
    PassageStore,
    _bar,
    cached_line_offsets,
    check_line_offsets,
    passage_text,
)
from .records import Doc

__all__ = ["SEARCH_OPTIONS", "DenseRetriever"]

SEARCH_OPTIONS = ("nprobe", "ef_search")
"""The index options that change searching only (the rest change the build)."""


class DenseRetriever(Retriever):
    """Top-k passages by inner product of normalised embeddings (cosine similarity).

    Build it with :meth:`load`, :meth:`from_faiss` or :meth:`from_docs`. Safe to share between
    threads; picklable (a copy reloads from the same files, or re-encodes in-memory passages).

    Attributes:
        encoder: The query encoder.
        query_prefix: Put before every query (E5: ``"query: "``).
        spec: The index kind and its search settings (``nprobe``, ``ef_search``).
        index_device: Where the index is searched: ``"cpu"``, ``"all"`` GPUs or a GPU id
            (see :func:`~.faiss_index.to_search_device`).
        index_bytes: Bytes the index's vectors take (on that device, or over all GPUs together).
    """

    name = "dense"

    def __init__(
        self,
        index: Any,
        passages: PassageStore,
        encoder: Encoder,
        *,
        query_prefix: str = "",
        spec: IndexSpec | None = None,
        batch_size: int = 64,
        recipe: tuple[Any, tuple[Any, ...], dict[str, Any]] | None = None,
        index_device: str | int = "cpu",
    ) -> None:
        self.index_device = check_index_device(index_device)
        self.index_bytes = index_bytes(index)
        index = to_search_device(index, self.index_device)
        self._index = index
        self._passages = passages
        self.encoder = encoder
        self.query_prefix = query_prefix
        self.spec = spec
        self.batch_size = batch_size
        self._recipe = recipe
        self._hnsw = hasattr(import_faiss().downcast_index(index), "hnsw")
        configure_search(index, spec, 1)

    def __len__(self) -> int:
        return len(self._passages)

    @property
    def index(self) -> Any:
        """The FAISS index (memory-mapped when loaded from disk)."""
        return self._index

    @property
    def passages(self) -> PassageStore:
        """The passages by row number of the index."""
        return self._passages

    def __reduce__(self) -> tuple[Any, ...]:
        if self._recipe is None:
            raise TypeError(
                "This DenseRetriever was built from objects that cannot be rebuilt; it cannot be pickled."
            )
        function, args, kwargs = self._recipe
        return (_rebuild, (function, args, kwargs))

    def search(self, queries: Sequence[str], k: int) -> list[list[Doc]]:
        """Top-``k`` passages for each query, best first, scored by cosine similarity.

        All non-empty queries are encoded in one batch and searched in one FAISS call. An
        empty or whitespace-only query gets ``[]``; a query longer than ``MAX_QUERY_CHARS``
        characters is cut (the encoder reads only its first few hundred tokens anyway).

        Raises:
            InvalidArgumentError: ``k`` is not a positive int or ``queries`` not a list of str.
            RetrievalError: Encoding, searching or reading a passage failed.
        """
        check_search_args(queries, k)
        results: list[list[Doc]] = [[] for _ in queries]
        live = [i for i, q in enumerate(queries) if q.strip()]
        if not live:
            return results
        try:
            vectors = self.encoder.encode(
                [self.query_prefix + queries[i][:MAX_QUERY_CHARS] for i in live], batch_size=self.batch_size
            )
            top = min(k, int(self._index.ntotal))
            params = None
            if self._hnsw and self.spec is not None and top > self.spec.ef_search:
                params = import_faiss().SearchParametersHNSW(efSearch=top)
            scores, rows = (
                self._index.search(vectors, top, params=params)
                if params
                else self._index.search(vectors, top)
            )
            for i, row, row_scores in zip(live, rows.tolist(), scores.tolist(), strict=True):
                hits = [(r, s) for r, s in zip(row, row_scores, strict=True) if r >= 0]
                docs = self._passages.get_many([r for r, _ in hits])
                results[i] = [replace(d, score=float(s)) for d, (_, s) in zip(docs, hits, strict=True)]
        except SearchGymError as exc:
            raise RetrievalError(f"Dense search failed for a batch of {len(live)} queries: {exc}") from exc
        except Exception as exc:  # the Retriever contract: backend failures surface as RetrievalError
            raise RetrievalError(f"Dense search failed for a batch of {len(live)} queries: {exc!r}") from exc
        return results

    # -- constructors ----------------------------------------------------------------------

    @classmethod
    def load(
        cls,
        index_dir: str | os.PathLike[str],
        *,
        index_type: str | None = None,
        corpus_path: str | os.PathLike[str] | None = None,
        model: str | os.PathLike[str] | None = None,
        query_prefix: str | None = None,
        device: str | None = None,
        batch_size: int = 64,
        mmap: bool = True,
        verify: bool | None = None,
        index_device: str | int = "cpu",
        **search_options: Any,
    ) -> DenseRetriever:
        """Load a finished index directory, checking its files against their recorded checksums.

        Args:
            index_dir: Built by ``searchgym index`` or :func:`build_dense_index`.
            index_type: Which FAISS index of the directory to use; None for the first built.
            corpus_path: Where the corpus is now, when it moved since the build.
            model: The encoder; None for the one the index was built with. Another model is an error.
            query_prefix: Overrides the recorded query prefix.
            device: Torch device of the query encoder.
            batch_size: Queries per forward pass.
            mmap: Memory-map the FAISS file instead of reading it into memory.
            index_device: Where the index is searched: ``"cpu"``, a GPU id or ``"all"`` (see
                :func:`~.faiss_index.to_search_device`).
            verify: True checks the SHA-256 digests of the offsets and FAISS files, False only
                their sizes, None the digests when they hold at most 4 GB (see :mod:`.checksums`).
                The offsets are checked for order against the corpus either way.
            **search_options: ``nprobe`` (IVF-PQ) or ``ef_search`` (HNSW).

        Raises:
            DataFileError: The directory is not a finished dense index, a file is missing or
                corrupt, or the corpus, model, dimension or sizes disagree (the message names
                the file and the mismatch).
        """
        index_dir = Path(index_dir)
        meta_path = index_dir / META_FILE
        meta = read_dense_meta(index_dir)
        if not meta.get("complete") or not meta["indexes"]:
            raise DataFileError(
                f"The index in {str(index_dir)!r} is not finished (encoding incomplete or no FAISS index built). "
                f"Run `searchgym index --corpus {meta['corpus']['path']} --out {index_dir}` again to resume it."
            )
        kind = index_type or next(iter(meta["indexes"]))
        if kind not in meta["indexes"]:
            raise DataFileError(
                f"{str(index_dir)!r} holds index types {sorted(meta['indexes'])}, not {kind!r}; build it with "
                f"`searchgym index --corpus {meta['corpus']['path']} --out {index_dir} --index-type {kind}`."
            )
        _check_search_options(search_options)
        corpus = Path(corpus_path) if corpus_path is not None else Path(meta["corpus"]["path"])
        check_corpus(meta, corpus, meta_path)
        n, dim = int(meta["corpus"]["num_docs"]), int(meta["model"]["dim"])
        offsets_path = index_dir / OFFSETS_FILE
        if not offsets_path.is_file() or offsets_path.stat().st_size != (n + 1) * 8:
            raise DataFileError(
                f"The offsets file {str(offsets_path)!r} is missing or does not hold {n + 1} offsets."
            )
        offsets = np.memmap(offsets_path, dtype=np.int64, mode="r")
        check_line_offsets(offsets, corpus, offsets_path)
        path = index_file(index_dir, kind)
        index = read_index(path, mmap=mmap)
        _check_index(index, path, dim=dim, num_docs=n, what=f"the metadata {str(meta_path)!r}")
        recorded = meta.get("files")
        if isinstance(recorded, dict):  # indexes built before checksums were recorded have none
            recorded = {name: recorded[name] for name in (OFFSETS_FILE, path.name) if name in recorded}
        rebuild = (
            f"delete {str(index_dir)!r} and run `searchgym index --corpus {corpus} --out {index_dir}` again"
        )
        verify_checksums(index_dir, recorded, verify=verify, rebuild=rebuild)
        encoder = load_encoder(model if model is not None else meta["model"]["name"], device=device)
        check_model(meta, encoder, meta_path)
        spec = IndexSpec(**{**meta["indexes"][kind], **search_options})
        recipe_kwargs = dict(
            index_type=kind,
            corpus_path=str(corpus),
            model=encoder.name,
            query_prefix=query_prefix,
            index_device=index_device,
        )
        return cls(
            index,
            JsonlPassages(corpus, offsets),
            encoder,
            query_prefix=meta["query_prefix"] if query_prefix is None else query_prefix,
            spec=spec,
            batch_size=batch_size,
            index_device=index_device,
            recipe=(
                cls.load,
                (str(index_dir),),
                {**recipe_kwargs, "batch_size": batch_size, **search_options},
            ),
        )

    @classmethod
    def from_faiss(
        cls,
        index_path: str | os.PathLike[str],
        corpus_path: str | os.PathLike[str],
        *,
        model: str | os.PathLike[str] | None = None,
        e5: bool = False,
        query_prefix: str | None = None,
        device: str | None = None,
        batch_size: int = 64,
        mmap: bool = True,
        cache_dir: str | os.PathLike[str] | None = None,
        index_device: str | int = "cpu",
        **search_options: Any,
    ) -> DenseRetriever:
        """Use an existing FAISS index and its corpus, as Search-R1 and FlashRAG lay them out.

        Row ``i`` of the index is the ``i``-th non-blank line of ``corpus_path`` (``id`` and
        ``contents``, or ``id``/``title``/``text``). Search-R1's ``e5_Flat.index`` needs
        ``model="intfloat/e5-base-v2", query_prefix="query: "`` (or ``e5=True``). The corpus is
        scanned once for line offsets (about a minute for the 13 GB wiki-18); with ``cache_dir``
        they are kept there.

        A FAISS file does not record how its passages were encoded, so the query prefix is the
        caller's to give: ``query_prefix`` (``""`` for none) or ``e5=True``. Without either, a
        model that expects a prefix (:func:`~.encoders.expected_query_prefix`: E5, BGE, or a
        model whose configuration names a ``query`` prompt) is refused, and any other model
        searches without one.

        Raises:
            DataFileError: The index file is missing or corrupt, its dimension differs from the
                model's, or its size differs from the number of corpus lines.
            InvalidArgumentError: The model expects a query prefix and none was given.
        """
        qp, _ = resolve_prefixes(e5, query_prefix, None)
        index_path, corpus = Path(index_path), Path(corpus_path)
        index = read_index(index_path, mmap=mmap)
        encoder = load_encoder(model, device=device)
        if int(index.d) != encoder.dim:
            raise DataFileError(
                f"The FAISS index {str(index_path)!r} holds vectors of dimension {index.d}, but the model {encoder.name!r} "
                f"embeds to dimension {encoder.dim}. Pass the model the index was built with (Search-R1's e5_Flat.index: "
                "model='intfloat/e5-base-v2', e5=True)."
            )
        offsets = cached_line_offsets(corpus, cache_dir)
        _check_index(
            index, index_path, dim=encoder.dim, num_docs=len(offsets) - 1, what=f"the corpus {str(corpus)!r}"
        )
        _check_search_options(search_options)
        expected = expected_query_prefix(encoder) if qp is None else None
        if expected:
            raise InvalidArgumentError(
                f"The FAISS file {str(index_path)!r} does not record how its passages were encoded, and the model "
                f"{encoder.name!r} expects queries to begin with {expected!r}: pass query_prefix={expected!r} "
                f"(searchgym serve --query-prefix {shlex.quote(expected)}), or query_prefix='' to search without one."
            )
        spec = IndexSpec(
            kind="hnsw" if hasattr(index, "hnsw") else "ivfpq" if hasattr(index, "nprobe") else "flat"
        )
        spec = replace(spec, **search_options)
        kwargs = dict(
            model=encoder.name,
            query_prefix=qp,
            batch_size=batch_size,
            mmap=mmap,
            cache_dir=cache_dir,
            index_device=index_device,
        )
        return cls(
            index,
            JsonlPassages(corpus, offsets),
            encoder,
            query_prefix=qp or "",
            spec=spec,
            batch_size=batch_size,
            index_device=index_device,
            recipe=(cls.from_faiss, (str(index_path), str(corpus)), {**kwargs, **search_options}),
        )

    @classmethod
    def from_docs(
        cls,
        docs: Sequence[Doc],
        *,
        model: str | os.PathLike[str] | None = None,
        index_type: str = "flat",
        e5: bool = False,
        query_prefix: str | None = None,
        passage_prefix: str | None = None,
        device: str | None = None,
        batch_size: int = 64,
        progress: bool = False,
        index_device: str | int = "cpu",
        **index_options: Any,
    ) -> DenseRetriever:
        """Encode ``docs`` now and index them in memory (nothing is written to disk); searched
        on ``index_device`` (see :func:`~.faiss_index.to_search_device`)."""
        if isinstance(docs, (str, bytes)) or not isinstance(docs, Sequence) or len(docs) == 0:
            raise InvalidArgumentError(f"docs must be a non-empty sequence of Doc, got {docs!r:.80}.")
        bad = next((d for d in docs if not isinstance(d, Doc)), None)
        if bad is not None:
            raise InvalidArgumentError(
                f"docs must hold only Doc records, found {type(bad).__name__}: {bad!r:.80}."
            )
        qp, pp = resolve_prefixes(e5, query_prefix, passage_prefix)
        spec = IndexSpec.from_options(index_type, index_options)
        encoder = load_encoder(model, device=device)
        check_passage_prefix(encoder, pp)
        bar = _bar(progress, len(docs), "encoding passages", "passage")
        texts = [(pp or "") + passage_text(d) for d in docs]
        vectors = encoder.encode(
            texts, batch_size=batch_size, on_batch=bar.update if bar is not None else None
        )
        if bar is not None:
            bar.close()
        index = build_index(vectors, spec, progress=progress)
        kwargs = dict(
            model=encoder.name,
            index_type=index_type,
            query_prefix=qp,
            passage_prefix=pp,
            batch_size=batch_size,
            index_device=index_device,
        )
        return cls(
            index,
            DocListPassages(docs),
            encoder,
            query_prefix=qp or "",
            spec=spec.resolve(len(docs), encoder.dim),
            batch_size=batch_size,
            index_device=index_device,
            recipe=(cls.from_docs, (list(docs),), {**kwargs, **index_options}),
        )


def _check_search_options(options: dict[str, Any]) -> None:
    unknown = sorted(set(options) - set(SEARCH_OPTIONS))
    if unknown:
        raise InvalidArgumentError(f"Unknown search option(s) {unknown}; known: {list(SEARCH_OPTIONS)}.")


def _rebuild(function: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> DenseRetriever:
    return function(*args, **kwargs)


def _check_index(index: Any, path: Path, *, dim: int, num_docs: int, what: str) -> None:
    if int(index.d) != dim:
        raise DataFileError(
            f"The FAISS index {str(path)!r} has dimension {index.d}, but {what} says {dim}; rebuild the index."
        )
    if int(index.ntotal) != num_docs:
        raise DataFileError(
            f"The FAISS index {str(path)!r} holds {index.ntotal} vectors, but {what} has {num_docs} passages; the "
            "index and the corpus do not belong together. Pass the corpus the index was built from, or rebuild it."
        )
