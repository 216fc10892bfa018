"""The retriever interface: batched search over a passage corpus."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence

from ..records import Doc

__all__ = ["Retriever"]


class Retriever(ABC):
    """Batched retrieval: ``search(queries, k)`` returns the top-``k`` documents per query.

    Backends (BM25 here; dense, HTTP and simulated ones later) implement :meth:`search`.
    One call carries a whole batch so that backends can vectorise it. An empty query gets
    an empty list; a backend failure raises :class:`~searchgym.error.RetrievalError`.
    """

    name: str = ""

    @abstractmethod
    def search(self, queries: Sequence[str], k: int) -> list[list[Doc]]:
        """Top-``k`` documents for each query, best first."""

    def __len__(self) -> int:
        """Number of passages in the corpus."""
        raise NotImplementedError
