"""The retrieval service apart from its transport: settings, routes, answers, index loading.

:class:`RetrievalService` answers the three routes of the retrieval server as ``(status,
JSON body)`` pairs, so that the aiohttp server (:mod:`.server`) and the Ray Serve replicas
(:mod:`searchgym.trainers.ray_serve`) answer alike; each only adds its HTTP plumbing:

- ``POST /retrieve``: ``{"queries": [...], "topk": k, "return_scores": bool}`` →
  ``{"result": [[{"document": {"id", "contents"}, "score"}, ...], ...]}`` (the format and
  the caps are in :mod:`.server_protocol`), searched through a :class:`~.batching.DynamicBatcher`;
- ``GET /health``: ``{"status": "ok", "backend", "num_docs"}``;
- ``GET /stats``: request, query and error counts, how many search calls merged how
  many queries and requests (``batch_queries`` and ``batch_requests``: size → count), and the
  result cache's ``capacity``, ``entries``, ``hits``, ``misses`` and ``hit_rate`` (``cache``,
  null when it is off).

With ``cache_size`` above 0, results are kept per ``(query, topk)`` (:mod:`.cache`): a request
whose queries are all held is answered at once, without the batcher; otherwise each distinct
query of a batch that is not held is searched once. Each server process has its own cache.

Every bad request gets a 4xx JSON answer ``{"error": ...}``, a failing retriever a 500.
Nothing here imports aiohttp or Ray.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..checks import check_int, check_number, check_string
from ..error import DataFileError, InvalidArgumentError
from .base import Retriever
from .batching import DynamicBatcher, SearchFn, ServerStats
from .cache import DEFAULT_CACHE_SIZE, ResultCache, cached_search
from .records import Doc
from .server_protocol import (
    RequestError,
    RequestLimits,
    check_body_size,
    check_response_size,
    error_payload,
    format_response,
    host_port,
    parse_retrieve_request,
)

__all__ = ["ROUTES", "RetrievalService", "ServerConfig", "listening_message", "load_index"]

log = logging.getLogger("searchgym.server")

ROUTES = {"/retrieve": "POST", "/health": "GET", "/stats": "GET"}
"""Path → the one method it answers."""


@dataclass(frozen=True)
class ServerConfig:
    """Settings of a retrieval server (:class:`~.server.RetrievalServer`, or each Ray Serve replica).

    Attributes:
        host: Interface to bind; loopback unless told otherwise (the server has no auth).
        port: TCP port; 0 picks a free one (read it back from :attr:`.server.RetrievalServer.port`).
        max_batch_size: Most queries merged into one ``retriever.search`` call. A request
            with more queries, or more than :data:`SLICE_CHARS` characters of them, is
            searched in slices, one after another, so that small requests that arrive
            meanwhile are searched between its slices.
        max_wait_ms: Longest a request waits for others to join its batch. The batch also
            leaves early when it is full, or when every open client connection has a request
            in it (see :class:`~.batching.DynamicBatcher`).
        batching: False searches each request alone (for comparison).
        default_topk: ``topk`` of a request that gives none (Search-R1's default is 3).
        limits: Caps on one request.
        idle_timeout_s: A connection that sends no whole request head (request line and
            headers) for this long, since it opened or since its last answer, is closed.
        body_timeout_s: A request whose body does not arrive in this long gets a 408 and
            its connection is closed.
        send_timeout_s: An answer the client has not read whole in this long is dropped
            and its connection closed (a client that never reads holds no memory or slot
            longer than this).
        max_connections: Most open client connections. A new one past it closes the oldest
            idle connection, or else the oldest one still waiting for its request body; when
            every connection has a request being searched or answered, it gets a 503.
        cache_size: Most ``(query, topk)`` results kept (least recently used out first);
            0 turns the cache off.
    """

    host: str = "127.0.0.1"
    port: int = 8000
    max_batch_size: int = 64
    max_wait_ms: float = 5.0
    batching: bool = True
    default_topk: int = 3
    limits: RequestLimits = field(default_factory=RequestLimits)
    idle_timeout_s: float = 60.0
    body_timeout_s: float = 30.0
    send_timeout_s: float = 30.0
    max_connections: int = 1000
    cache_size: int = DEFAULT_CACHE_SIZE

    def __post_init__(self) -> None:
        check_string("host", self.host)
        check_int("port", self.port, 0, 65535)
        check_int("max_batch_size", self.max_batch_size, 1)
        check_int("default_topk", self.default_topk, 1)
        check_number("max_wait_ms", self.max_wait_ms, 0, 10_000)
        if not isinstance(self.batching, bool):
            raise InvalidArgumentError(f"batching must be True or False, got {self.batching!r}.")
        check_number("idle_timeout_s", self.idle_timeout_s, 1e-3, 86_400)
        check_number("body_timeout_s", self.body_timeout_s, 1e-3, 86_400)
        check_number("send_timeout_s", self.send_timeout_s, 1e-3, 86_400)
        check_int("max_connections", self.max_connections, 1)
        check_int("cache_size", self.cache_size, 0)
        if not isinstance(self.limits, RequestLimits):
            raise InvalidArgumentError(f"limits must be a RequestLimits, got {self.limits!r}.")

    def url_at(self, port: int) -> str:
        """The URL that reaches this server from this machine once bound to ``port``."""
        host = "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host
        return f"http://{host_port(host, port)}"


def listening_message(url: str, details: str) -> str:
    """The line ``searchgym serve`` prints once it answers at ``url``."""
    return f"searchgym serve: listening on {url} ({details}); POST /retrieve, GET /health, GET /stats. Ctrl-C stops."


SLICE_CHARS = 16_384
"""Most query characters in one slice of a large request (the work of a search call grows with them)."""


def _slices(queries: list[str], max_queries: int) -> list[list[str]]:
    """``queries`` cut into runs of at most ``max_queries`` queries and about :data:`SLICE_CHARS` characters."""
    slices: list[list[str]] = []
    current: list[str] = []
    chars = 0
    for query in queries:
        if current and (len(current) >= max_queries or chars + len(query) > SLICE_CHARS):
            slices.append(current)
            current, chars = [], 0
        current.append(query)
        chars += len(query)
    if current:
        slices.append(current)
    return slices


class RetrievalService:
    """The answers of a retrieval server around one retriever, whatever carries the HTTP.

    Each route method returns the JSON body to send (and :meth:`retrieve` its status too)
    and updates :attr:`stats`; none raises for a bad request or a failing retriever. Call
    the async methods on the event loop that serves the requests.

    Args:
        retriever: What to serve.
        config: Batching and caps (its host and port are the transport's business).
        backend: Name reported by ``/health`` (default: ``retriever.name``).

    Raises:
        InvalidArgumentError: ``retriever`` is not a Retriever or ``config`` not a ServerConfig.
    """

    def __init__(
        self, retriever: Retriever, config: ServerConfig | None = None, *, backend: str | None = None
    ) -> None:
        if not isinstance(retriever, Retriever):
            raise InvalidArgumentError(f"retriever must be a Retriever, got {type(retriever).__name__}.")
        if config is None:
            config = ServerConfig()
        if not isinstance(config, ServerConfig):
            raise InvalidArgumentError(f"config must be a ServerConfig, got {type(config).__name__}.")
        self.retriever = retriever
        self.config = config
        self.backend = backend or retriever.name or type(retriever).__name__
        self.stats = ServerStats()
        self.cache = ResultCache(config.cache_size) if config.cache_size else None
        """Results per ``(query, topk)``, or None when ``config.cache_size`` is 0."""
        self._batcher: DynamicBatcher | None = None

    def open(self, peers: Callable[[], int] | None = None) -> DynamicBatcher:
        """Start the batcher on the running event loop (the first request does it otherwise).

        Args:
            peers: How many requests could join a batch at most (see :class:`DynamicBatcher`).
        """
        config = self.config
        self._batcher = DynamicBatcher(
            self._search_fn(),
            max_batch_size=config.max_batch_size,
            max_wait_s=config.max_wait_ms / 1000,
            batching=config.batching,
            stats=self.stats,
            peers=peers,
        )
        return self._batcher

    def _search_fn(self) -> SearchFn:
        """What the batcher's worker thread calls: the retriever, through the cache when there is one."""
        retriever, cache = self.retriever, self.cache
        if cache is None:
            return retriever.search
        return functools.partial(cached_search, retriever.search, cache)

    async def close(self) -> None:
        """Stop the batcher: fail what is queued, wait for the running batch."""
        batcher, self._batcher = self._batcher, None
        if batcher is not None:
            await batcher.close()

    async def retrieve(
        self, content_length: int | None, read_body: Callable[[], Awaitable[bytes]]
    ) -> tuple[int, dict[str, Any]]:
        """Answer ``POST /retrieve``: ``(HTTP status, JSON body)``.

        Args:
            content_length: The declared body size, checked before reading (None: unknown).
            read_body: Reads the body; it may raise :class:`RequestError` (e.g. 413).
        """
        self.stats.requests += 1
        config = self.config
        limits = config.limits
        try:
            check_body_size(content_length, limits)
            try:
                body = await asyncio.wait_for(read_body(), config.body_timeout_s)
            except asyncio.TimeoutError:
                raise RequestError(
                    408,
                    f"The request body did not arrive within body_timeout_s={config.body_timeout_s:g} s.",
                    cap="body_timeout_s",
                    limit=config.body_timeout_s,
                ) from None
            parsed = parse_retrieve_request(body, limits, config.default_topk)
        except RequestError as exc:
            self.stats.errors[exc.status] += 1
            return exc.status, exc.payload
        batcher = self._batcher if self._batcher is not None else self.open()
        held = self.cache.get_all(parsed.queries, parsed.topk) if self.cache is not None else None
        results: list[list[Doc]] = held if held is not None else []
        try:  # slice by slice, so that small requests are searched in between
            for part in _slices(parsed.queries, config.max_batch_size) if held is None else []:
                results += await batcher.submit(part, parsed.topk)
        except Exception as exc:  # the retriever failed: answer 500 and keep serving
            log.warning("retriever failed on %d queries: %r", len(parsed.queries), exc)
            self.stats.errors[500] += 1
            return 500, error_payload(f"The retriever failed: {exc}")
        try:
            check_response_size(results, limits)
        except RequestError as exc:
            self.stats.errors[exc.status] += 1
            return exc.status, exc.payload
        return 200, format_response(results, parsed.return_scores)

    def num_docs(self) -> int | None:
        """Number of passages served, or None when the retriever does not say."""
        try:
            return len(self.retriever)
        except Exception:  # len() is optional for a Retriever
            return None

    def health_payload(self) -> dict[str, Any]:
        """The answer to ``GET /health``."""
        return {"status": "ok", "backend": self.backend, "num_docs": self.num_docs()}

    def stats_payload(self) -> dict[str, Any]:
        """The answer to ``GET /stats``: the counters, the batching settings and the server's pid."""
        config = self.config
        return {
            **self.stats.to_dict(),
            "pid": os.getpid(),
            "batching": config.batching,
            "max_batch_size": config.max_batch_size,
            "max_wait_ms": config.max_wait_ms,
            "cache": self.cache.stats().to_dict() if self.cache is not None else None,
        }

    def refuse(self, status: int, reason: str, method: str, path: str) -> dict[str, Any]:
        """Count and answer an HTTP error raised before any route ran (404, 405, ...)."""
        self.stats.errors[status] += 1
        message = f"{reason} ({method} {path})."
        if status in (404, 405):
            message += " This server answers POST /retrieve, GET /health and GET /stats."
        return error_payload(message)

    def client_gone(self, method: str, path: str) -> None:
        """Count and log, in one line, a client that hung up before its answer."""
        self.stats.client_disconnects += 1
        log.info("client hung up before the answer to %s %s", method, path)

    def too_slow_reader(self, method: str, path: str, limit: float) -> None:
        """Count and log, in one line, an answer dropped because its client did not read it in time."""
        self.stats.slow_readers += 1
        log.info(
            "dropped the answer to %s %s: the client had not read it within send_timeout_s=%g s",
            method,
            path,
            limit,
        )

    def internal_error(self, exc: BaseException, method: str, path: str) -> dict[str, Any]:
        """Log, count and answer (500) an unexpected error: a server never dies on a request."""
        log.error("unexpected error on %s %s", method, path, exc_info=exc)
        self.stats.errors[500] += 1
        return error_payload(f"Internal server error: {exc!r}")


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
        **options: Passed to a non-BM25 backend (e.g. ``model``, ``query_prefix``,
            ``index_device``); ``verify`` (True, False or None) to every saved index: whether to
            check its files' SHA-256 digests on load.

    Raises:
        DataFileError: ``index`` is missing or is not a readable index.
        UnknownNameError: ``backend`` is not registered.
        InvalidArgumentError: A FAISS file was given without ``corpus_path``, or with ``backend="bm25"``;
            a dense-only option was given for a BM25 index; a FAISS file's model expects a query
            prefix and none was given.
    """
    from . import make_retriever
    from .bm25 import BM25Retriever, is_bm25_index_dir

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
        return make_retriever("dense", index_path=path, corpus_path=corpus_path, cache_size=0, **options)
    if not path.is_dir():
        raise DataFileError(
            f"--index {str(path)!r} is not a directory or a FAISS index file. Build an index with "
            "`searchgym index --corpus FILE --backend bm25 --out DIR` and pass that DIR."
        )
    if backend is None:
        backend = "bm25" if is_bm25_index_dir(path) else "dense"
    if backend == "bm25":
        dense_only = sorted(name for name in ("query_prefix", "index_device") if name in options)
        if dense_only:
            flags = ", ".join("--" + name.replace("_", "-") for name in dense_only)
            raise InvalidArgumentError(
                f"{flags} apply to a dense index; {str(path)!r} is a BM25 index: drop them."
            )
        return BM25Retriever.load(path, verify=options.get("verify"))
    return make_retriever(backend, index_dir=path, corpus_path=corpus_path, cache_size=0, **options)
