"""The retriever interface: batched search over a passage corpus."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import TYPE_CHECKING

from .records import Doc

if TYPE_CHECKING:
    from .cache import ResultCache

__all__ = ["Retriever"]


class Retriever(ABC):
    """Batched retrieval: ``search(queries, k)`` returns the top-``k`` documents per query.

    Backends (BM25 here; dense, HTTP and simulated ones later) implement :meth:`search`.
    One call carries a whole batch so that backends can vectorise it. An empty query gets
    an empty list; a backend failure raises :class:`~searchgym.error.RetrievalError`.
    """

    name: str = ""

    result_cache: ResultCache | None = None
    """Results kept per ``(query, k)`` for the envs' searches (:func:`~.cache.search_with_cache`);
    :func:`searchgym.make_retriever` gives the BM25 and dense backends one, a retriever built
    directly has none. :meth:`search` itself never reads it."""

    @abstractmethod
    def search(self, queries: Sequence[str], k: int) -> list[list[Doc]]:
        """Top-``k`` documents for each query, best first."""

    def __len__(self) -> int:
        """Number of passages in the corpus."""
        raise NotImplementedError
