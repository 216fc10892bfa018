"""The ``"dense"`` retrieval backend: :func:`make_dense_retriever` and :func:`open_index`.

:func:`make_dense_retriever` is the factory registered with :func:`searchgym.make_retriever`:
from its keywords it builds, resumes, reuses or loads an index and returns a
:class:`~.dense_retriever.DenseRetriever` (re-exported here). :func:`open_index` loads
whatever index a directory holds, dense or BM25.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..error import DataFileError, InvalidArgumentError
from .base import Retriever
from .bm25 import BM25Retriever, is_bm25_index_dir
from .dense_build import META_FILE, build_dense_index, find_dense_meta, read_dense_meta, resolve_prefixes
from .dense_retriever import SEARCH_OPTIONS, DenseRetriever
from .passages import write_docs_jsonl
from .records import Doc

__all__ = ["DenseRetriever", "make_dense_retriever", "open_index"]


def make_dense_retriever(
    *,
    corpus_path: str | os.PathLike[str] | None = None,
    docs: Sequence[Doc] | None = None,
    index_dir: str | os.PathLike[str] | None = None,
    index_path: str | os.PathLike[str] | None = None,
    model: str | os.PathLike[str] | None = None,
    index_type: str | None = None,
    e5: bool = False,
    query_prefix: str | None = None,
    passage_prefix: str | None = None,
    batch_size: int = 64,
    device: str | None = None,
    progress: bool = True,
    mmap: bool = True,
    verify: bool | None = None,
    index_device: str | int = "cpu",
    **index_options: Any,
) -> DenseRetriever:
    """The ``"dense"`` factory of :func:`searchgym.make_retriever`.

    - ``index_path`` + ``corpus_path``: an existing FAISS file and its corpus (Search-R1,
      FlashRAG); ``index_dir``, if given, caches the corpus line offsets.
    - ``corpus_path`` + ``index_dir``: build the index there, or resume or reuse the one there,
      then load it memory-mapped. ``docs`` + ``index_dir``: the same, with the passages written
      to ``index_dir/corpus.jsonl``.
    - ``index_dir`` alone: load the index there (its corpus path is recorded in it).
    - ``corpus_path`` or ``docs`` alone: encode and index in memory, every time.

    Args:
        model: None for all-MiniLM-L6-v2 (offline), a local model directory or a hub name.
        index_type: ``flat`` (exact), ``hnsw`` or ``ivfpq``; None for the one in ``index_dir``, else flat.
        e5: E5's ``"query: "``/``"passage: "`` prefixes (or set ``query_prefix``/``passage_prefix``).
        query_prefix: Put before every query; None for the one recorded with a built index. A
            FAISS file (``index_path``) records none: a model that expects one is refused without it.
        batch_size: Texts per encoder forward pass.
        device: Torch device; None for a GPU when there is one.
        progress: Show progress bars while building.
        mmap: Memory-map FAISS files.
        verify: Check the index files' SHA-256 digests on load (None: when they hold at most 4 GB).
        index_device: Where the FAISS index is searched: ``"cpu"`` (default), a GPU id, or
            ``"all"`` GPUs (faiss-gpu; see :func:`~.faiss_index.to_search_device`).
        **index_options: Index build options (``nlist``, ``pq_m``, ``nbits``, ``hnsw_m``,
            ``ef_construction``, ``train_size``, ``seed``) and search options (``nprobe``, ``ef_search``).

    Raises:
        InvalidArgumentError: A bad combination of keywords or a bad option.
        DataFileError: Missing, corrupt or mismatched index or corpus files.
    """
    if corpus_path is not None and docs is not None:
        raise InvalidArgumentError("Pass corpus_path or docs, not both, to the dense retriever.")
    search_options = {k: v for k, v in index_options.items() if k in SEARCH_OPTIONS}
    common: dict[str, Any] = {"model": model, "device": device, "batch_size": batch_size}
    if index_path is not None:
        if corpus_path is None:
            raise InvalidArgumentError(
                f"index_path={str(index_path)!r} needs corpus_path=<the corpus JSONL the index was built from> "
                "(Search-R1/FlashRAG: wiki-18.jsonl)."
            )
        extra = sorted(set(index_options) - set(SEARCH_OPTIONS))
        extra += [
            name for name, value in (("index_type", index_type), ("passage_prefix", passage_prefix)) if value
        ]
        if extra:
            raise InvalidArgumentError(
                f"index_path loads a finished FAISS file, so the build option(s) {', '.join(extra)} do not apply; "
                "drop them (search options nprobe and ef_search are fine)."
            )
        return DenseRetriever.from_faiss(
            index_path,
            corpus_path,
            e5=e5,
            query_prefix=query_prefix,
            mmap=mmap,
            cache_dir=index_dir,
            index_device=index_device,
            **common,
            **search_options,
        )
    if index_dir is None:
        if corpus_path is None and docs is None:
            raise InvalidArgumentError(
                "The dense retriever needs a corpus or an index: pass corpus_path= (with index_dir= to keep the "
                "index on disk), index_dir= of a built index, or index_path= and corpus_path= of a FAISS file."
            )
        if corpus_path is not None:
            from .corpus import load_corpus

            docs = load_corpus(corpus_path)
        return DenseRetriever.from_docs(
            docs or [],
            index_type=index_type or "flat",
            e5=e5,
            query_prefix=query_prefix,
            passage_prefix=passage_prefix,
            progress=progress,
            index_device=index_device,
            **common,
            **index_options,
        )
    index_dir = Path(index_dir)
    if docs is not None:
        index_dir.mkdir(parents=True, exist_ok=True)
        corpus_path = index_dir / "corpus.jsonl"
        write_docs_jsonl(docs, Path(corpus_path))
    meta = find_dense_meta(index_dir) if corpus_path is not None else read_dense_meta(index_dir)
    if corpus_path is None and meta is not None:
        corpus_path = str(meta["corpus"]["path"])
    kind = index_type or (next(iter(meta["indexes"]), "flat") if meta else "flat")
    ready = (
        meta is not None
        and meta.get("complete")
        and kind in meta["indexes"]
        and set(index_options) <= set(SEARCH_OPTIONS)
        and resolve_prefixes(e5, None, passage_prefix)[1] in (None, meta["passage_prefix"])
    )
    if not ready:  # build, resume, or add an index kind (a finished one is loaded without writing)
        build_dense_index(
            corpus_path or "",
            index_dir,
            index_type=kind,
            e5=e5,
            query_prefix=query_prefix,
            passage_prefix=passage_prefix,
            chunk_size=None,
            progress=progress,
            **common,
            **index_options,
        )
    return DenseRetriever.load(
        index_dir,
        index_type=kind,
        corpus_path=corpus_path,
        query_prefix=resolve_prefixes(e5, query_prefix, None)[0],
        mmap=mmap,
        verify=verify,
        index_device=index_device,
        **common,
        **search_options,
    )


def open_index(index_dir: str | os.PathLike[str], **kwargs: Any) -> Retriever:
    """Load whatever index ``index_dir`` holds: a dense one or a BM25 one (e.g. for ``searchgym serve``).

    Args:
        index_dir: Written by ``searchgym index --backend dense|bm25``.
        **kwargs: Passed to :meth:`DenseRetriever.load` (dense indexes only).

    Raises:
        DataFileError: ``index_dir`` holds neither kind of index, or a broken one.
    """
    directory = Path(index_dir)
    if (directory / META_FILE).is_file():
        return DenseRetriever.load(directory, **kwargs)
    if is_bm25_index_dir(directory):
        return BM25Retriever.load(directory, verify=kwargs.get("verify"))
    raise DataFileError(
        f"{str(directory)!r} holds no searchgym index (neither {META_FILE} nor a BM25 index). Build one with "
        "`searchgym index --corpus FILE --backend dense|bm25 --out DIR`."
    )
