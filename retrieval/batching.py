"""Dynamic batching: concurrent searches merged into batched ``retriever.search`` calls.

The retrieval server (:mod:`.server`) and its Ray Serve replicas
(:mod:`searchgym.trainers.ray_serve`) put every request through a :class:`DynamicBatcher`,
so that a dense encoder sees a batch instead of one query at a time, and count what it does
in :class:`ServerStats`. Plain asyncio: no HTTP here.
"""

from __future__ import annotations

import asyncio
from collections import Counter, deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from ..error import SearchGymError
from .records import Doc

__all__ = ["DynamicBatcher", "SearchFn", "ServerStats"]

SearchFn = Callable[[Sequence[str], int], list[list[Doc]]]
"""A batched search: ``search(queries, k) -> one list of documents per query``."""


@dataclass
class ServerStats:
    """Counters served at ``GET /stats``."""

    requests: int = 0
    """``/retrieve`` requests received (good or bad)."""
    queries: int = 0
    """Queries searched."""
    batches: int = 0
    """``retriever.search`` calls."""
    errors: Counter[int] = field(default_factory=Counter)
    """Error answers by HTTP status."""
    client_disconnects: int = 0
    """Requests whose client hung up before the answer (not errors of the server)."""
    slow_readers: int = 0
    """Answers dropped (their connection closed) because the client had not read them within
    ``send_timeout_s``."""
    refused_connections: int = 0
    """Connections answered 503 because ``max_connections`` were open, all being answered."""
    closed_idle_connections: int = 0
    """Idle connections, or ones waiting for their body, closed to make room at ``max_connections``."""
    batch_queries: Counter[int] = field(default_factory=Counter)
    """Queries per search call → number of such calls."""
    batch_requests: Counter[int] = field(default_factory=Counter)
    """Requests merged per search call → number of such calls."""

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready copy (integer keys become strings)."""
        return {
            "requests": self.requests,
            "queries": self.queries,
            "batches": self.batches,
            "errors": {str(k): v for k, v in sorted(self.errors.items())},
            "client_disconnects": self.client_disconnects,
            "slow_readers": self.slow_readers,
            "refused_connections": self.refused_connections,
            "closed_idle_connections": self.closed_idle_connections,
            "batch_queries": {str(k): v for k, v in sorted(self.batch_queries.items())},
            "batch_requests": {str(k): v for k, v in sorted(self.batch_requests.items())},
        }


@dataclass
class _Pending:
    queries: Sequence[str]
    k: int
    future: asyncio.Future[list[list[Doc]]]
    arrived: float


def _shutting_down() -> SearchGymError:
    return SearchGymError("The retrieval server is shutting down.")


class DynamicBatcher:
    """Merges concurrent searches into batched calls run on one worker thread.

    A batch closes when it holds ``max_batch_size`` queries, when its oldest request has
    waited ``max_wait_s``, or when every possible batch-mate is already in it: ``peers()``
    gives how many requests could be in a batch at most (the HTTP server passes its number of
    open client connections, since a connection carries one request at a time); by default
    it is the number of :meth:`submit` calls still open. So one client alone never waits,
    and closed-loop clients fill a batch without waiting out the deadline. One batch runs at
    a time; while it runs, the next one fills up, and if its deadline passed meanwhile it
    leaves as soon as the worker is free. Requests are never split, and requests with
    different ``k`` go to separate calls, so each gets exactly what ``search(queries, k)``
    gives. Create it, and call every method, on the event loop that serves the requests.

    Args:
        search: The batched search function (usually ``retriever.search``).
        max_batch_size: Most queries per call. A larger single request forms a call alone.
        max_wait_s: Longest wait for a batch to fill, in seconds.
        batching: False runs each request's search alone.
        stats: Counters to update.
        peers: How many requests could join a batch at most (see above), or None.
    """

    def __init__(
        self,
        search: SearchFn,
        *,
        max_batch_size: int = 64,
        max_wait_s: float = 0.005,
        batching: bool = True,
        stats: ServerStats | None = None,
        peers: Callable[[], int] | None = None,
    ) -> None:
        self._search = search
        self.max_batch_size = max_batch_size
        self.max_wait_s = max_wait_s
        self.batching = batching
        self.stats = stats if stats is not None else ServerStats()
        self._open = 0
        self._peers: Callable[[], int] = peers if peers is not None else (lambda: self._open)
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="searchgym-search")
        self._pending: deque[_Pending] = deque()
        self._pending_queries = 0
        self._busy = False
        self._closed = False
        self._timer: asyncio.Handle | None = None
        self._timer_deadline = 0.0
        self._tasks: set[asyncio.Task[None]] = set()

    async def close(self) -> None:
        """Fail what is still queued, wait for the running batch, and release the worker thread."""
        self._closed = True
        self._cancel_timer()
        while self._pending:
            item = self._pending.popleft()
            if not item.future.done():
                item.future.set_exception(_shutting_down())
        self._pending_queries = 0
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        self._executor.shutdown(wait=False)

    async def submit(self, queries: Sequence[str], k: int) -> list[list[Doc]]:
        """Search ``queries`` with ``k`` documents each, batched with concurrent callers."""
        if not queries:
            return []
        if self._closed:
            raise _shutting_down()
        loop = asyncio.get_running_loop()
        if not self.batching:
            results = await loop.run_in_executor(self._executor, self._search_batch, [queries], k)
            self._count([queries])
            return results
        future: asyncio.Future[list[list[Doc]]] = loop.create_future()
        self._pending.append(_Pending(queries, k, future, loop.time()))
        self._pending_queries += len(queries)
        self._open += 1
        try:
            self._poke()
            return await future
        finally:
            self._open -= 1
            if self._pending:
                self._poke()

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _poke(self) -> None:
        """Start the next batch if it is due; otherwise have a timer fire at its deadline."""
        if self._busy or not self._pending or self._closed:
            return
        loop = asyncio.get_running_loop()
        deadline = self._pending[0].arrived + self.max_wait_s
        if (
            self._pending_queries >= self.max_batch_size
            or loop.time() >= deadline
            or len(self._pending) >= self._peers()
        ):
            self._cancel_timer()
            self._busy = True
            task = loop.create_task(self._dispatch(self._take()))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        elif self._timer is None or self._timer_deadline != deadline:
            self._cancel_timer()
            # (uvloop's handles have no when(), so the deadline is kept beside the handle.)
            self._timer, self._timer_deadline = loop.call_at(deadline, self._on_timer), deadline

    def _on_timer(self) -> None:
        self._timer = None
        self._poke()

    def _take(self) -> list[_Pending]:
        batch: list[_Pending] = []
        size = 0
        while self._pending:
            item = self._pending[0]
            if batch and size + len(item.queries) > self.max_batch_size:
                break
            self._pending.popleft()
            self._pending_queries -= len(item.queries)
            if not item.future.done():  # a cancelled caller needs no search
                batch.append(item)
                size += len(item.queries)
        return batch

    async def _dispatch(self, batch: list[_Pending]) -> None:
        loop = asyncio.get_running_loop()
        try:
            by_k: dict[int, list[_Pending]] = {}
            for item in batch:
                by_k.setdefault(item.k, []).append(item)
            for k, items in by_k.items():
                parts = [item.queries for item in items]
                try:
                    results = await loop.run_in_executor(self._executor, self._search_batch, parts, k)
                except Exception as exc:  # reported to every request of the call
                    for item in items:
                        if not item.future.done():
                            item.future.set_exception(exc)
                    continue
                self._count(parts)
                start = 0
                for item in items:
                    end = start + len(item.queries)
                    if not item.future.done():
                        item.future.set_result(results[start:end])
                    start = end
        finally:
            self._busy = False
            self._poke()

    def _search_batch(self, parts: list[Sequence[str]], k: int) -> list[list[Doc]]:
        """Worker thread: one search call for several requests' queries."""
        queries = [q for part in parts for q in part]
        results = self._search(queries, k)
        if not isinstance(results, list) or len(results) != len(queries):
            got = len(results) if isinstance(results, list) else type(results).__name__
            raise SearchGymError(f"The retriever returned {got} result lists for {len(queries)} queries.")
        return results

    def _count(self, parts: list[Sequence[str]]) -> None:
        """Event-loop thread: record one search call (so /stats never reads a changing dict)."""
        size = sum(len(part) for part in parts)
        stats = self.stats
        stats.batches += 1
        stats.queries += size
        stats.batch_queries[size] += 1
        stats.batch_requests[len(parts)] += 1
