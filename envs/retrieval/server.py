"""A retrieval server that speaks Search-R1's ``/retrieve`` API, with dynamic batching.

One process, one asyncio event loop (aiohttp), one worker thread that runs the retriever.
Concurrent requests wait in a queue and are merged into one batched ``retriever.search``
call, so that a dense encoder sees a batch instead of one query at a time; the results are
split back per request. Routes:

- ``POST /retrieve``: ``{"queries": [...], "topk": k, "return_scores": bool}`` →
  ``{"result": [[{"document": {"id", "contents"}, "score"}, ...], ...]}`` (the format and
  the caps are in :mod:`.server_protocol`);
- ``GET /health``: ``{"status": "ok", "backend", "num_docs"}``;
- ``GET /stats``: request, query and error counts, and how many search calls merged how
  many queries and requests (``batch_queries`` and ``batch_requests``: size → count).

Every bad request gets a 4xx JSON answer ``{"error": ...}``, a failing retriever a 500, and
the server keeps serving. ``searchgym serve`` starts it (see :mod:`searchgym.commands.serve`);
:class:`RetrievalServer` runs it in-process, in a background thread or in the foreground.
aiohttp is used rather than the standard library because its C HTTP parser and event loop
keep the per-request cost low, and many idle keep-alive connections cost no threads.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import threading
from collections import Counter, deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

from ..errors import DataFileError, InvalidArgumentError, SearchGymError
from ..records import Doc
from .base import Retriever
from .server_protocol import (
    RequestError,
    RequestLimits,
    check_body_size,
    error_payload,
    format_response,
    parse_retrieve_request,
)

__all__ = ["DynamicBatcher", "RetrievalServer", "ServerConfig", "ServerStats", "load_index"]

log = logging.getLogger("searchgym.server")

SearchFn = Callable[[Sequence[str], int], list[list[Doc]]]


def _check_int(name: str, value: object, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise InvalidArgumentError(f"{name} must be an int >= {low}, got {value!r}.")
    return value


@dataclass(frozen=True)
class ServerConfig:
    """Settings of a :class:`RetrievalServer`.

    Attributes:
        host: Interface to bind; loopback unless told otherwise (the server has no auth).
        port: TCP port; 0 picks a free one (read it back from :attr:`RetrievalServer.port`).
        max_batch_size: Most queries merged into one ``retriever.search`` call. A single
            request with more queries is searched alone, in one call.
        max_wait_ms: Longest a request waits for others to join its batch. The batch also
            leaves early when it is full, or when every open client connection has a request
            in it (see :class:`DynamicBatcher`).
        batching: False searches each request alone (for comparison).
        default_topk: ``topk`` of a request that gives none (Search-R1's default is 3).
        limits: Caps on one request.
    """

    host: str = "127.0.0.1"
    port: int = 8000
    max_batch_size: int = 64
    max_wait_ms: float = 5.0
    batching: bool = True
    default_topk: int = 3
    limits: RequestLimits = field(default_factory=RequestLimits)

    def __post_init__(self) -> None:
        if not isinstance(self.host, str) or not self.host:
            raise InvalidArgumentError(f"host must be a non-empty string, got {self.host!r}.")
        _check_int("port", self.port, 0)
        if self.port > 65535:
            raise InvalidArgumentError(f"port must be in [0, 65535], got {self.port}.")
        _check_int("max_batch_size", self.max_batch_size, 1)
        _check_int("default_topk", self.default_topk, 1)
        wait = self.max_wait_ms
        if isinstance(wait, bool) or not isinstance(wait, (int, float)) or not 0 <= wait <= 10_000:
            raise InvalidArgumentError(f"max_wait_ms must be a number in [0, 10000], got {wait!r}.")
        if not isinstance(self.batching, bool):
            raise InvalidArgumentError(f"batching must be True or False, got {self.batching!r}.")
        if not isinstance(self.limits, RequestLimits):
            raise InvalidArgumentError(f"limits must be a RequestLimits, got {self.limits!r}.")


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
            "batch_queries": {str(k): v for k, v in sorted(self.batch_queries.items())},
            "batch_requests": {str(k): v for k, v in sorted(self.batch_requests.items())},
        }


@dataclass
class _Pending:
    queries: Sequence[str]
    k: int
    future: asyncio.Future[list[list[Doc]]]
    arrived: float


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
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        while self._pending:
            item = self._pending.popleft()
            if not item.future.done():
                item.future.set_exception(SearchGymError("The retrieval server is shutting down."))
        self._pending_queries = 0
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        self._executor.shutdown(wait=False)

    async def submit(self, queries: Sequence[str], k: int) -> list[list[Doc]]:
        """Search ``queries`` with ``k`` documents each, batched with concurrent callers."""
        if not queries:
            return []
        if self._closed:
            raise SearchGymError("The retrieval server is shutting down.")
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
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            self._busy = True
            task = loop.create_task(self._dispatch(self._take()))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        elif self._timer is None or self._timer_deadline != deadline:
            if self._timer is not None:
                self._timer.cancel()
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


def _json(payload: dict[str, Any], status: int = 200) -> web.Response:
    return web.Response(body=json.dumps(payload).encode(), status=status, content_type="application/json")


class RetrievalServer:
    """The HTTP server around one retriever.

    Use it as a context manager or with :meth:`start`/:meth:`stop` to run it in a background
    thread (tests, notebooks), or call :meth:`serve_forever` to run it in the foreground
    until SIGINT or SIGTERM (``searchgym serve``).

    Args:
        retriever: What to serve.
        config: Host, port, batching and caps.
        backend: Name reported by ``/health`` (default: ``retriever.name``).

    Example::

        with RetrievalServer(BM25Retriever.load("bm25_index"), ServerConfig(port=0)) as server:
            print(server.url)  # http://127.0.0.1:<free port>
    """

    def __init__(
        self, retriever: Retriever, config: ServerConfig | None = None, *, backend: str | None = None
    ):
        if not isinstance(retriever, Retriever):
            raise InvalidArgumentError(f"retriever must be a Retriever, got {type(retriever).__name__}.")
        self.retriever = retriever
        self.config = config if config is not None else ServerConfig()
        if not isinstance(self.config, ServerConfig):
            raise InvalidArgumentError(f"config must be a ServerConfig, got {type(self.config).__name__}.")
        self.backend = backend or retriever.name or type(retriever).__name__
        self.stats = ServerStats()
        self.port: int | None = None
        """The bound port, once started."""
        self._batcher: DynamicBatcher | None = None
        self._runner: web.AppRunner | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop_event: asyncio.Event | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """``http://host:port`` of the running server."""
        if self.port is None:
            raise SearchGymError("The server is not running: call start() first.")
        host = self.config.host
        if host in ("0.0.0.0", ""):
            host = "127.0.0.1"
        elif ":" in host:
            host = f"[{host}]"
        return f"http://{host}:{self.port}"

    # -- request handlers ----------------------------------------------------------------

    def _app(self) -> web.Application:
        app = web.Application(client_max_size=self.config.limits.max_body_bytes, middlewares=[self._errors])
        app.router.add_post("/retrieve", self._retrieve)
        app.router.add_get("/health", self._health)
        app.router.add_get("/stats", self._stats)
        return app

    @web.middleware
    async def _errors(self, request: web.Request, handler: Any) -> web.StreamResponse:
        try:
            return await handler(request)
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            self.stats.errors[exc.status] += 1
            message = f"{exc.reason} ({request.method} {request.path})."
            if exc.status in (404, 405):
                message += " This server answers POST /retrieve, GET /health and GET /stats."
            return _json(error_payload(message), exc.status)
        except Exception as exc:  # a server never dies on a request
            log.exception("unexpected error on %s %s", request.method, request.path)
            self.stats.errors[500] += 1
            return _json(error_payload(f"Internal server error: {exc!r}"), 500)

    async def _retrieve(self, request: web.Request) -> web.Response:
        self.stats.requests += 1
        limits = self.config.limits
        try:
            check_body_size(request.content_length, limits)
            try:
                body = await request.read()
            except web.HTTPRequestEntityTooLarge:
                raise RequestError(
                    413,
                    f"The request body is over the server's cap max_body_bytes={limits.max_body_bytes}. "
                    "Split the request, or restart the server with a larger --max-body-bytes.",
                    cap="max_body_bytes",
                    limit=limits.max_body_bytes,
                ) from None
            parsed = parse_retrieve_request(body, limits, self.config.default_topk)
        except RequestError as exc:
            self.stats.errors[exc.status] += 1
            return _json(exc.payload, exc.status)
        assert self._batcher is not None  # set before the site opens
        try:
            results = await self._batcher.submit(parsed.queries, parsed.topk)
        except Exception as exc:  # the retriever failed: answer 500 and keep serving
            log.warning("retriever failed on %d queries: %r", len(parsed.queries), exc)
            self.stats.errors[500] += 1
            return _json(error_payload(f"The retriever failed: {exc}"), 500)
        return _json(format_response(results, parsed.return_scores))

    async def _health(self, request: web.Request) -> web.Response:
        try:
            num_docs: int | None = len(self.retriever)
        except Exception:  # len() is optional for a Retriever
            num_docs = None
        return _json({"status": "ok", "backend": self.backend, "num_docs": num_docs})

    async def _stats(self, request: web.Request) -> web.Response:
        config = self.config
        return _json(
            {
                **self.stats.to_dict(),
                "batching": config.batching,
                "max_batch_size": config.max_batch_size,
                "max_wait_ms": config.max_wait_ms,
            }
        )

    # -- life cycle ------------------------------------------------------------------------

    async def _open(self) -> None:
        config = self.config
        self._stop_event = asyncio.Event()
        # In-flight requests get 5 s to finish when the server stops; idle connections close at once.
        runner = web.AppRunner(self._app(), access_log=None, handle_signals=False, shutdown_timeout=5.0)
        await runner.setup()
        self._runner = runner
        self._batcher = DynamicBatcher(
            self.retriever.search,
            max_batch_size=config.max_batch_size,
            max_wait_s=config.max_wait_ms / 1000,
            batching=config.batching,
            stats=self.stats,
            peers=lambda: len(runner.server.connections) if runner.server is not None else 0,
        )
        site = web.TCPSite(self._runner, config.host, config.port, backlog=1024, reuse_address=True)
        try:
            await site.start()
        except OSError as exc:
            await self._close()
            raise InvalidArgumentError(
                f"Cannot listen on {config.host}:{config.port} ({exc.strerror or exc}). Choose another --port "
                "(0 picks a free one) or stop the process that holds it."
            ) from exc
        self.port = int(self._runner.addresses[0][1])

    async def _close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self._batcher is not None:
            await self._batcher.close()
            self._batcher = None

    def start(self) -> RetrievalServer:
        """Serve from a background thread; returns once the port is bound.

        Raises:
            InvalidArgumentError: The port cannot be bound.
        """
        if self._thread is not None:
            raise SearchGymError("The server is already running.")
        ready = threading.Event()
        failure: list[BaseException] = []

        def main() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            try:
                loop.run_until_complete(self._open())
            except BaseException as exc:
                failure.append(exc)
                ready.set()
                loop.close()
                return
            ready.set()
            assert self._stop_event is not None
            loop.run_until_complete(self._stop_event.wait())
            loop.run_until_complete(self._close())
            loop.close()

        self._thread = threading.Thread(target=main, name="searchgym-server", daemon=True)
        self._thread.start()
        ready.wait()
        if failure:
            self._thread.join()
            self._thread = None
            raise failure[0]
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Stop a server started with :meth:`start` (closing its connections)."""
        if self._thread is None:
            return
        if self._loop is not None and self._stop_event is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._stop_event.set)
        self._thread.join(timeout)
        self._thread = None
        self.port = None

    def __enter__(self) -> RetrievalServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def serve_forever(self, on_ready: Callable[[RetrievalServer], None] | None = None) -> None:
        """Serve in the foreground until SIGINT or SIGTERM.

        Args:
            on_ready: Called once the port is bound (e.g. to print the URL).
        """

        async def main() -> None:
            await self._open()
            assert self._stop_event is not None
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGINT, signal.SIGTERM):
                try:
                    loop.add_signal_handler(sig, self._stop_event.set)
                except (NotImplementedError, RuntimeError):  # not the main thread, or Windows
                    pass
            if on_ready is not None:
                on_ready(self)
            try:
                await self._stop_event.wait()
            finally:
                await self._close()

        asyncio.run(main())


def load_index(
    index: str | os.PathLike[str],
    backend: str | None = None,
    *,
    corpus_path: str | os.PathLike[str] | None = None,
    **options: Any,
) -> Retriever:
    """Load a saved index to serve.

    Args:
        index: A directory written by ``searchgym index`` (or ``BM25Retriever.save``), or a
            FAISS index file laid out as Search-R1 and FlashRAG do (``e5_Flat.index``; give
            its corpus JSONL as ``corpus_path``).
        backend: ``"bm25"``, ``"dense"`` or another registered backend; None picks ``"bm25"``
            for a directory holding a searchgym BM25 index and ``"dense"`` otherwise.
        corpus_path: The corpus of a FAISS file, or of a dense index kept apart from it.
        **options: Passed to a non-BM25 backend (e.g. ``model``).

    Raises:
        DataFileError: ``index`` is missing or is not a readable index.
        UnknownNameError: ``backend`` is not registered.
        InvalidArgumentError: A FAISS file was given without ``corpus_path``, or with ``backend="bm25"``.
    """
    from . import make_retriever
    from .bm25 import BM25Retriever, read_index_meta

    path = Path(index)
    if path.is_file():
        if backend not in (None, "dense"):
            raise InvalidArgumentError(
                f"--index {str(path)!r} is a file, which only the dense backend reads (a FAISS index); "
                f"got --backend {backend}. Pass a BM25 index directory instead."
            )
        if corpus_path is None:
            raise InvalidArgumentError(
                f"--index {str(path)!r} is a FAISS index file: also pass its corpus with --corpus "
                "(e.g. wiki-18.jsonl beside e5_Flat.index)."
            )
        return make_retriever("dense", index_path=path, corpus_path=corpus_path, **options)
    if not path.is_dir():
        raise DataFileError(
            f"--index {str(path)!r} is not a directory or a FAISS index file. Build an index with "
            "`searchgym index --corpus FILE --backend bm25 --out DIR` and pass that DIR."
        )
    if backend is None:
        backend = "bm25" if read_index_meta(path) is not None else "dense"
    if backend == "bm25":
        return BM25Retriever.load(path)
    return make_retriever(backend, index_dir=path, corpus_path=corpus_path, **options)
