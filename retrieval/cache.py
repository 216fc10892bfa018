"""A bounded cache of search results per ``(query, k)``, shared by the threads of one process.

A GRPO group sends the same question to all its rollouts, and their first searches are often
the same string. :class:`ResultCache` keeps the last ``capacity`` results (least recently used
out first) so that a repeated search costs a dictionary lookup, and :func:`cached_search`
searches only what it does not hold, once per distinct query. Results of a cache hit are the
same :class:`~searchgym.retrieval.records.Doc` records (frozen) in a new list.

Where it is used:

- the retrieval server (:mod:`.service`) keeps one per process, sized by ``ServerConfig.cache_size``
  (``searchgym serve --cache-size``); each ``--workers`` process and each Ray Serve replica has
  its own, and ``GET /stats`` reports the one of the process that answered;
- :func:`searchgym.make_retriever` gives the BM25 and dense backends one (``cache_size=``),
  which the envs search through (:func:`search_with_cache`); a retriever built directly has none.

Only deterministic backends are cached by default: a simulated retriever draws noise per call,
and an HTTP retriever's server has its own cache.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..checks import check_int
from ..error import RetrievalError
from .base import Retriever
from .bm25 import check_search_args
from .records import Doc

__all__ = ["DEFAULT_CACHE_SIZE", "CacheStats", "ResultCache", "cached_search", "search_with_cache"]

DEFAULT_CACHE_SIZE = 4096
"""Entries kept by default: one per distinct ``(query, k)``, each holding ``k`` passages (a few
kB at Search-R1's k = 3, so about 10-20 MB in all)."""

SearchFn = Callable[[Sequence[str], int], list[list[Doc]]]


@dataclass(frozen=True)
class CacheStats:
    """What a :class:`ResultCache` did since it was made.

    Attributes:
        capacity: Most entries kept.
        entries: Entries held now.
        hits: Queries answered without searching (held, or repeated within one call).
        misses: Queries searched.
    """

    capacity: int
    entries: int
    hits: int
    misses: int

    @property
    def hit_rate(self) -> float:
        """``hits / (hits + misses)``; 0.0 before any query."""
        total = self.hits + self.misses
        return self.hits / total if total else 0.0

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready copy, with the hit rate."""
        return {
            "capacity": self.capacity,
            "entries": self.entries,
            "hits": self.hits,
            "misses": self.misses,
            "hit_rate": round(self.hit_rate, 6),
        }


class ResultCache:
    """The last ``capacity`` search results, by ``(query, k)``; thread-safe.

    Args:
        capacity: Most entries kept (at least 1; to cache nothing, keep no cache).

    Raises:
        InvalidArgumentError: ``capacity`` is not a positive int.
    """

    def __init__(self, capacity: int = DEFAULT_CACHE_SIZE) -> None:
        check_int("cache_size", capacity, 1)
        self.capacity = capacity
        self._entries: OrderedDict[tuple[str, int], list[Doc]] = OrderedDict()
        self._lock = threading.Lock()
        self._hits = 0
        self._misses = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __getstate__(self) -> dict[str, Any]:
        return {"capacity": self.capacity}  # a copy (another process) starts empty

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["capacity"])  # type: ignore[misc]

    def stats(self) -> CacheStats:
        """The counters and the size, read together."""
        with self._lock:
            return CacheStats(self.capacity, len(self._entries), self._hits, self._misses)

    def clear(self) -> None:
        """Forget every entry (the counters stay)."""
        with self._lock:
            self._entries.clear()

    def get_all(self, queries: Sequence[str], k: int) -> list[list[Doc]] | None:
        """The results of all ``queries`` when every one is held (counted as hits), else None
        (nothing counted: the caller searches them through :func:`cached_search`)."""
        with self._lock:
            found = [self._entries.get((q, k)) for q in queries]
            if any(docs is None for docs in found):
                return None
            for q in queries:
                self._entries.move_to_end((q, k))
            self._hits += len(queries)
        return [list(docs) for docs in found if docs is not None]

    def _take(self, queries: Sequence[str], k: int) -> tuple[list[list[Doc] | None], list[str]]:
        """Held results (None where missing) and the distinct missing queries, counting both."""
        with self._lock:
            found: list[list[Doc] | None] = []
            missing: dict[str, None] = {}
            for q in queries:
                docs = self._entries.get((q, k))
                if docs is not None:
                    self._entries.move_to_end((q, k))
                    self._hits += 1
                elif q in missing:
                    self._hits += 1  # a repeat within the call: searched once
                else:
                    missing[q] = None
                    self._misses += 1
                found.append(docs)
        return found, list(missing)

    def _put(self, queries: Sequence[str], k: int, results: Sequence[list[Doc]]) -> None:
        with self._lock:
            for q, docs in zip(queries, results, strict=True):
                self._entries[(q, k)] = list(docs)
                self._entries.move_to_end((q, k))
            while len(self._entries) > self.capacity:
                self._entries.popitem(last=False)


def cached_search(search: SearchFn, cache: ResultCache, queries: Sequence[str], k: int) -> list[list[Doc]]:
    """``search(queries, k)`` through ``cache``: held results are reused, and each distinct
    missing query is searched once, in one call, and stored.

    Raises:
        InvalidArgumentError: ``k`` is not a positive int or ``queries`` not a list of str.
        RetrievalError: ``search`` failed (nothing is stored then), or answered the wrong
            number of result lists.
    """
    check_search_args(queries, k)
    found, missing = cache._take(queries, k)
    if missing:
        results = search(missing, k)
        if not isinstance(results, list) or len(results) != len(missing):
            got = len(results) if isinstance(results, list) else type(results).__name__
            raise RetrievalError(f"The retriever returned {got} result lists for {len(missing)} queries.")
        cache._put(missing, k, results)
        fresh = dict(zip(missing, results, strict=True))
        found = [docs if docs is not None else fresh[q] for q, docs in zip(queries, found, strict=True)]
    return [list(docs) for docs in found if docs is not None]


def search_with_cache(retriever: Retriever, queries: Sequence[str], k: int) -> list[list[Doc]]:
    """``retriever.search(queries, k)``, through the retriever's :attr:`~.base.Retriever.result_cache`
    when it has one (see :func:`searchgym.make_retriever`)."""
    cache = retriever.result_cache
    if cache is None:
        return retriever.search(queries, k)
    return cached_search(retriever.search, cache, queries, k)
