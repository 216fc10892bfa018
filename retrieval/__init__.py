"""Retrieval backends behind one interface, chosen by name.

Every backend is a factory registered in :data:`RETRIEVERS` under a name. A factory takes the
keywords ``corpus_path``, ``docs`` and ``index_dir`` (each possibly None) plus its own options,
and returns a :class:`Retriever`. It may be given as a callable or, so that heavy imports
(faiss, an HTTP client) wait until first use, as a ``"module:attribute"`` string::

    register_retriever("dense", "searchgym.retrieval.dense:make_dense_retriever")

:func:`make_retriever` keeps one retriever per backend, corpus and options for the whole
process, so every env worker in a process shares one index, and (BM25 and dense) one cache of
results per ``(query, k)`` that the envs search through (see :mod:`.cache`).
"""

from __future__ import annotations

import importlib
import os
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ..error import DataFileError, InvalidArgumentError, did_you_mean
from .base import Retriever
from .bm25 import BM25Retriever, corpus_fingerprint, make_bm25_retriever
from .cache import DEFAULT_CACHE_SIZE, CacheStats, ResultCache, search_with_cache
from .corpus import load_corpus
from .dense import DenseRetriever
from .records import Doc
from .simulated import SimulatedRetriever

__all__ = [
    "CACHED_BACKENDS",
    "DEFAULT_CACHE_SIZE",
    "RETRIEVERS",
    "BM25Retriever",
    "CacheStats",
    "DenseRetriever",
    "Retriever",
    "ResultCache",
    "RetrieverFactory",
    "SimulatedRetriever",
    "clear_retriever_cache",
    "make_retriever",
    "register_retriever",
    "search_with_cache",
    # the passage record and the corpus loader
    "Doc",
    "load_corpus",
]

RetrieverFactory = Callable[..., Retriever]
"""``factory(*, corpus_path, docs, index_dir, **options) -> Retriever``."""

RETRIEVERS: dict[str, RetrieverFactory | str] = {
    "bm25": make_bm25_retriever,
    "http": "searchgym.retrieval.http_client:make_http_retriever",
    "dense": "searchgym.retrieval.dense:make_dense_retriever",
}
"""Backend name -> factory, or ``"module:attribute"`` naming one."""

CACHED_BACKENDS = ("bm25", "dense")
"""Backends whose results :func:`make_retriever` caches by default (the same query always gets
the same answer from them; a simulated retriever draws noise, a server keeps its own cache)."""

_URL_SCHEMES = ("http://", "https://")

_CACHE: dict[tuple[Any, ...], Retriever] = {}
_KEY_LOCKS: dict[tuple[Any, ...], threading.Lock] = {}
_GUARD = threading.Lock()


def register_retriever(name: str, factory: RetrieverFactory | str) -> None:
    """Register (or replace) the backend ``name``.

    Args:
        name: The backend name that :func:`make_retriever` accepts.
        factory: A callable taking ``corpus_path``, ``docs``, ``index_dir`` and options as
            keywords, or a ``"module:attribute"`` string naming one (imported on first use).

    Raises:
        InvalidArgumentError: ``name`` is empty or ``factory`` is neither callable nor a
            ``"module:attribute"`` string.
    """
    if not isinstance(name, str) or not name:
        raise InvalidArgumentError(f"A retriever backend name must be a non-empty string, got {name!r}.")
    if isinstance(factory, str):
        if factory.count(":") != 1 or not all(factory.split(":")):
            raise InvalidArgumentError(
                f"A factory string must look like 'package.module:function', got {factory!r}."
            )
    elif not callable(factory):
        raise InvalidArgumentError(
            f"factory must be callable or a 'module:function' string, got {factory!r}."
        )
    RETRIEVERS[name] = factory


def clear_retriever_cache() -> None:
    """Forget every cached retriever (the next :func:`make_retriever` call builds afresh)."""
    with _GUARD:
        _CACHE.clear()
        _KEY_LOCKS.clear()


def _resolve(name: str) -> RetrieverFactory:
    factory = RETRIEVERS[name]
    if isinstance(factory, str):
        module_name, attribute = factory.split(":")
        try:
            factory = getattr(importlib.import_module(module_name), attribute)
        except (ImportError, AttributeError) as exc:
            raise InvalidArgumentError(
                f"Retriever backend {name!r} is registered as {RETRIEVERS[name]!r}, which cannot be imported "
                f"({exc}). Install the backend's extra (e.g. pip install 'searchgym[retrieval]')."
            ) from exc
    return factory


def _freeze(value: Any) -> Any:
    """A hashable stand-in for an option value, for the cache key."""
    if isinstance(value, dict):
        return tuple(sorted((str(k), _freeze(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return tuple(_freeze(v) for v in value)
    try:
        hash(value)
    except TypeError:
        return ("id", id(value))
    return value


def _corpus_key(corpus_path: str | os.PathLike[str] | None, docs: Sequence[Doc] | None) -> tuple[Any, ...]:
    if corpus_path is not None:
        path = Path(corpus_path)
        if not path.is_file():
            problem = "is a directory" if path.is_dir() else "does not exist"
            raise DataFileError(
                f"corpus_path={str(path)!r} {problem}. Pass corpus_path=<a .jsonl file with id/title/text "
                "or FlashRAG's id/contents per line>, e.g. ../shared/data/corpus.jsonl beside the checkout."
            )
        stat = path.stat()
        return ("path", str(path.resolve()), stat.st_size, stat.st_mtime_ns)
    if docs is not None:
        bad = next((d for d in docs if not isinstance(d, Doc)), None)
        if bad is not None:
            raise InvalidArgumentError(
                f"docs must hold only Doc records, found {type(bad).__name__}: {bad!r:.80}."
            )
        return ("docs", len(docs), corpus_fingerprint(docs))
    return ("none",)


def make_retriever(
    backend: str | Retriever = "bm25",
    *,
    corpus_path: str | os.PathLike[str] | None = None,
    docs: Sequence[Doc] | None = None,
    index_dir: str | os.PathLike[str] | None = None,
    cache_size: int | None = None,
    **kwargs: Any,
) -> Retriever:
    """Build a retriever, or return the one already built in this process for the same corpus.

    Callers that ask for the same backend, corpus and options share one object. A corpus
    file is identified by its resolved path, size and modification time (so an edited file
    is re-indexed); an in-memory corpus by a hash of its documents; with neither, the resolved
    ``index_dir``. Otherwise ``index_dir`` is not part of the identity: a cached retriever is
    returned without touching ``index_dir``. Thread-safe:
    concurrent callers wait for one build instead of building twice.

    Args:
        backend: A registered backend name (see :data:`RETRIEVERS`), a retrieval server's URL
            (``"http://host:port"``: an :class:`~.http_client.HTTPRetriever`, one per URL and
            options; ``corpus_path``, ``docs`` and ``index_dir`` are then ignored, as the
            server holds the index), or a ready :class:`Retriever`, which is returned unchanged.
        corpus_path: A corpus JSON Lines file (see :func:`searchgym.retrieval.corpus.load_corpus`).
        docs: An in-memory corpus, instead of ``corpus_path``.
        index_dir: Where the backend may cache its index on disk (BM25: loaded when it was built
            from the same corpus and options, otherwise built and saved there).
        cache_size: Most ``(query, k)`` results kept in the retriever's
            :attr:`~.base.Retriever.result_cache`, which the envs search through; 0 keeps none.
            None: :data:`DEFAULT_CACHE_SIZE` for the :data:`CACHED_BACKENDS`, none for others.
        **kwargs: Backend options, e.g. ``k1``, ``b``, ``stopwords`` for BM25.

    Raises:
        UnknownNameError: ``backend`` is not registered.
        DataFileError: ``corpus_path`` is missing or unreadable.
        InvalidArgumentError: Bad options, or (BM25) both or neither of ``corpus_path``/``docs``.
    """
    if isinstance(backend, Retriever):
        return backend
    if not isinstance(backend, str):
        raise InvalidArgumentError(
            f"backend must be a backend name such as 'bm25' or a Retriever, got {type(backend).__name__}."
        )
    if backend.startswith(_URL_SCHEMES):
        return make_retriever("http", url=backend, cache_size=cache_size, **kwargs)
    if backend not in RETRIEVERS:
        raise did_you_mean("retriever backend", backend, RETRIEVERS)
    if cache_size is None:
        cache_size = DEFAULT_CACHE_SIZE if backend in CACHED_BACKENDS else 0
    if isinstance(cache_size, bool) or not isinstance(cache_size, int) or cache_size < 0:
        raise InvalidArgumentError(
            f"cache_size must be a non-negative int (0 caches nothing), got {cache_size!r}."
        )
    corpus_key = _corpus_key(corpus_path, docs)
    if corpus_path is None and docs is None and index_dir is not None:
        corpus_key = ("index_dir", str(Path(index_dir).resolve()))  # the index is the corpus
    key = (backend, corpus_key, _freeze(kwargs), cache_size)
    with _GUARD:
        if key in _CACHE:
            return _CACHE[key]
        key_lock = _KEY_LOCKS.setdefault(key, threading.Lock())
    with key_lock:
        with _GUARD:
            if key in _CACHE:
                return _CACHE[key]
        retriever = _resolve(backend)(corpus_path=corpus_path, docs=docs, index_dir=index_dir, **kwargs)
        if cache_size:
            retriever.result_cache = ResultCache(cache_size)
        with _GUARD:
            _CACHE[key] = retriever
    return retriever


register_retriever("simulated", "searchgym.retrieval.simulated:make_simulated_retriever")
