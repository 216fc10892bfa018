"""A retrieval server that speaks Search-R1's ``/retrieve`` API, with dynamic batching.

One process, one asyncio event loop (aiohttp), one worker thread that runs the retriever.
Concurrent requests wait in a queue and are merged into one batched ``retriever.search``
call (:mod:`.batching`), so that a dense encoder sees a batch instead of one query at a time;
the results are split back per request. The routes and their answers (``POST /retrieve``,
``GET /health``, ``GET /stats``) are in :mod:`.service`; this module carries them over HTTP.

Every bad request gets a 4xx JSON answer ``{"error": ...}``, a failing retriever a 500, and
the server keeps serving. Slow or stuck clients cannot pile up: a connection that sends no
whole request head within ``idle_timeout_s`` is closed, a body that takes longer than
``body_timeout_s`` gets a 408, and past ``max_connections`` a new connection closes the
oldest idle one, or else the oldest one still waiting for its body (a 503 answers it only when
every connection has a request being searched or answered), so a normal query is still answered. A
client that hangs up before its answer is counted apart (``client_disconnects``) and logged
in one line. ``searchgym serve`` starts it (see :mod:`searchgym.commands.serve`);
:class:`RetrievalServer` runs it in-process, in a background thread or in the foreground.
aiohttp is used rather than the standard library because its C HTTP parser and event loop
keep the per-request cost low, and many idle keep-alive connections cost no threads.
"""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import threading
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from ..errors import InvalidArgumentError, SearchGymError
from .base import Retriever
from .batching import ServerStats
from .server_protocol import RequestLimits, body_too_large
from .service import RetrievalService, ServerConfig, load_index

__all__ = ["RetrievalServer", "gunicorn_app"]

log = logging.getLogger("searchgym.server")

_LINGER_S = 1.0
"""How long the unread rest of a refused body is read and dropped before the connection closes."""

_ENCODE_OFF_LOOP_DOCS = 1000
"""Answers with more documents are encoded on a thread, so the event loop keeps answering."""

_BACKLOG = 256
"""Connections the kernel queues before the server accepts them (and most accepted in one go)."""

_SPARE_FILES = 128
"""File descriptors kept free beside ``max_connections`` (index files, logs, the listener)."""


def _fit_connection_limit(wanted: int) -> tuple[int, int]:
    """``(max_connections, accept backlog)`` that fit this process's open-file limit.

    Past the limit, an accept burst (up to the backlog) holds new sockets while the
    connections they replace close a loop turn or two later, so the open-file limit must fit
    ``wanted + 2 × backlog + spare``: it is raised to that when allowed (``ulimit -n`` is often
    1024); otherwise the backlog and then ``max_connections`` shrink to fit, with a warning.
    """
    try:
        import resource
    except ImportError:  # Windows: no such limit to manage
        return wanted, _BACKLOG
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = wanted + 2 * _BACKLOG + _SPARE_FILES
    if soft != resource.RLIM_INFINITY and soft < need:
        target = need if hard == resource.RLIM_INFINITY else min(need, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    if soft == resource.RLIM_INFINITY or soft >= need:
        return wanted, _BACKLOG
    backlog = max(16, min(_BACKLOG, soft // 8))
    allowed = max(1, min(wanted, soft - 2 * backlog - _SPARE_FILES))
    if allowed < wanted:
        log.warning(
            "max_connections=%d does not fit the open-file limit %d (ulimit -n); serving at most %d connections.",
            wanted,
            soft,
            allowed,
        )
    return allowed, backlog


class _Refusal(asyncio.Protocol):
    """A connection past the limit: answer 503 with a JSON message, then close."""

    def __init__(self, answer: bytes) -> None:
        self._answer = answer
        self._transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        transport.write(self._answer)
        # Close once the request has arrived (closing with it unread could reset the answer away).
        asyncio.get_running_loop().call_later(1.0, transport.close)

    def data_received(self, data: bytes) -> None:
        if self._transport is not None and b"\r\n\r\n" in data:
            self._transport.close()

    def eof_received(self) -> bool:
        return False


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
        reuse_port: Bind with ``SO_REUSEPORT``, so that several server processes share
            one port and the kernel spreads connections over them (``--workers``).

    Example::

        with RetrievalServer(BM25Retriever.load("bm25_index"), ServerConfig(port=0)) as server:
            print(server.url)  # http://127.0.0.1:<free port>
    """

    def __init__(
        self,
        retriever: Retriever,
        config: ServerConfig | None = None,
        *,
        backend: str | None = None,
        reuse_port: bool = False,
    ):
        self.service = RetrievalService(retriever, config, backend=backend)
        """The routes' answers and counters."""
        self.port: int | None = None
        """The bound port, once started."""
        self._reuse_port = reuse_port
        self._runner: web.AppRunner | None = None
        self._listener: asyncio.Server | None = None
        self._in_progress: set[object] = set()  # transports with a request being handled
        self._reading: set[object] = set()  # ... of which those still waiting for their body
        self._evicted: set[object] = set()  # transports closed to make room (not hang-ups)
        self._live: dict[Any, None] = {}  # open connections' handlers, oldest first
        self._closing: set[Any] = set()  # handlers closed to make room, until their socket is released
        self._max_connections = self.config.max_connections
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop_event: asyncio.Event | None = None
        self._thread: threading.Thread | None = None

    @property
    def retriever(self) -> Retriever:
        """What is served."""
        return self.service.retriever

    @property
    def config(self) -> ServerConfig:
        """Host, port, batching and caps."""
        return self.service.config

    @property
    def backend(self) -> str:
        """Name reported by ``/health``."""
        return self.service.backend

    @property
    def stats(self) -> ServerStats:
        """Counters served at ``/stats``."""
        return self.service.stats

    @property
    def url(self) -> str:
        """``http://host:port`` of the running server."""
        if self.port is None:
            raise SearchGymError("The server is not running: call start() first.")
        return self.config.url_at(self.port)

    # -- request handlers ----------------------------------------------------------------

    def _app(self) -> web.Application:
        app = web.Application(client_max_size=self.config.limits.max_body_bytes, middlewares=[self._errors])
        app.router.add_post("/retrieve", self._retrieve)
        app.router.add_get("/health", self._health)
        app.router.add_get("/stats", self._stats)
        return app

    @web.middleware
    async def _errors(self, request: web.Request, handler: Any) -> web.StreamResponse:
        transport = request.transport
        self._in_progress.add(transport)
        try:
            return await handler(request)
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            return _json(
                self.service.refuse(exc.status, exc.reason, request.method, request.path), exc.status
            )
        except Exception as exc:  # a server never dies on a request
            # aiohttp reports a lost connection as ConnectionResetError or RuntimeError("Connection closed.")
            if isinstance(exc, ConnectionError) or request.protocol.transport is None:
                if transport in self._evicted:  # closed to make room while it waited for its body
                    self._evicted.discard(transport)
                else:  # the client hung up
                    self.service.client_gone(request.method, request.path)
                return web.Response(status=400)  # never sent; raising would make aiohttp log a traceback
            return _json(self.service.internal_error(exc, request.method, request.path), 500)
        finally:
            self._in_progress.discard(transport)

    async def _retrieve(self, request: web.Request) -> web.Response:
        async def read_body() -> bytes:
            self._reading.add(request.transport)
            try:
                return await request.read()
            except web.HTTPRequestEntityTooLarge:  # a body without Content-Length, over the cap
                raise body_too_large(self.config.limits) from None
            finally:
                self._reading.discard(request.transport)

        status, payload = await self.service.retrieve(request.content_length, read_body)
        if status == 200 and sum(len(docs) for docs in payload["result"]) > _ENCODE_OFF_LOOP_DOCS:
            body = await asyncio.get_running_loop().run_in_executor(None, json.dumps, payload)
            response = web.Response(text=body, content_type="application/json")
        else:
            response = _json(payload, status)
        if status == 408:  # the rest of the body may still come: start afresh on a new connection
            response.force_close()
        return response

    async def _health(self, request: web.Request) -> web.Response:
        return _json(self.service.health_payload())

    async def _stats(self, request: web.Request) -> web.Response:
        return _json(self.service.stats_payload())

    # -- connections -------------------------------------------------------------------------

    def _new_connection(self) -> asyncio.BaseProtocol:
        """The protocol of an accepted connection: aiohttp's, or a 503 past ``max_connections``."""
        assert self._runner is not None and self._runner.server is not None
        if len(self._live) + len(self._closing) >= self._max_connections:
            victim = self._room()
            if victim is None:
                self.stats.refused_connections += 1
                message = (
                    f"The server holds max_connections={self._max_connections} connections, all being answered. "
                    "Retry shortly, or restart the server with a larger --max-connections."
                )
                body = json.dumps({"error": message, "cap": "max_connections"}).encode()
                head = (
                    f"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
                    f"Content-Length: {len(body)}\r\nConnection: close\r\nRetry-After: 1\r\n\r\n"
                )
                return _Refusal(head.encode() + body)
            del self._live[victim]
            self._closing.add(victim)
            self.stats.closed_idle_connections += 1
            victim.force_close()
        handler = self._runner.server()
        self._live[handler] = None
        return handler

    def _room(self) -> Any:
        """The connection to close for a new one: the oldest idle, else the oldest waiting for its body."""
        waiting = None
        for handler in self._live:
            transport = handler.transport
            if transport is None:  # not yet connected
                continue
            if transport not in self._in_progress:
                return handler
            if waiting is None and transport in self._reading:
                waiting = handler
        if waiting is not None:
            self._evicted.add(waiting.transport)
        return waiting

    def _connection_lost(self, handler: Any) -> None:
        self._live.pop(handler, None)
        self._closing.discard(handler)

    # -- life cycle ------------------------------------------------------------------------

    def make_runner(self) -> web.AppRunner:
        """The aiohttp runner of this server's app, with its timeouts (not yet set up)."""
        # In-flight requests get 5 s to finish when the server stops; idle connections close at once.
        # keepalive_timeout closes a connection that sends no whole request head for that long;
        # lingering_time bounds how long the rest of a refused body is read (10 s by default).
        return web.AppRunner(
            self._app(),
            access_log=None,
            handle_signals=False,
            shutdown_timeout=5.0,
            keepalive_timeout=self.config.idle_timeout_s,
            lingering_time=_LINGER_S,
        )

    async def _open(self) -> None:
        config = self.config
        self._stop_event = asyncio.Event()
        self._max_connections, backlog = _fit_connection_limit(config.max_connections)
        runner = self.make_runner()
        await runner.setup()
        self._runner = runner
        self.service.open(peers=lambda: len(runner.server.connections) if runner.server is not None else 0)
        server = runner.server
        assert server is not None
        aiohttp_lost = server.connection_lost

        def connection_lost(handler: Any, exc: BaseException | None) -> None:  # each handler calls it once
            self._connection_lost(handler)
            aiohttp_lost(handler, exc)

        server.connection_lost = connection_lost  # type: ignore[method-assign,assignment]
        try:
            self._listener = await asyncio.get_running_loop().create_server(
                self._new_connection,
                config.host,
                config.port,
                backlog=backlog,
                reuse_address=True,
                reuse_port=self._reuse_port or None,
            )
        except OSError as exc:
            await self._close()
            raise InvalidArgumentError(
                f"Cannot listen on {config.host}:{config.port} ({exc.strerror or exc}). Choose another --port "
                "(0 picks a free one) or stop the process that holds it."
            ) from exc
        self.port = int(self._listener.sockets[0].getsockname()[1])

    async def _close(self) -> None:
        if self._listener is not None:
            self._listener.close()
            self._listener = None
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        await self.service.close()

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


def gunicorn_app(
    index: str, backend: str | None = None, **config: Any
) -> Callable[[], Awaitable[web.AppRunner]]:
    """The server's app for gunicorn's aiohttp worker, which calls the result in each worker.

    Each worker loads ``index`` and serves it with the same routes, batching, caps and
    timeouts as ``searchgym serve``. gunicorn binds the port and manages the workers, and its
    aiohttp worker accepts connections itself, so ``max_connections`` cannot apply and is
    refused (see ``docs/hardening.md``). For example::

        gunicorn --worker-class aiohttp.GunicornWebWorker --workers 2 --bind 127.0.0.1:8000 \\
            'searchgym.envs.retrieval.server:gunicorn_app("bm25_index", max_batch_size=64)'

    Args:
        index: What each worker loads (see :func:`~.service.load_index`).
        backend: Index kind, or None to detect it.
        **config: Fields of :class:`ServerConfig` but ``max_connections`` (host and port are
            gunicorn's ``--bind``); ``limits`` may be a dict of :class:`RequestLimits` fields.

    Raises:
        InvalidArgumentError: A setting is invalid, or ``max_connections`` is given.
    """
    if "max_connections" in config:
        raise InvalidArgumentError(
            "max_connections cannot apply under gunicorn: its aiohttp worker accepts the connections. "
            "Use searchgym serve --workers N for a connection cap."
        )
    if isinstance(config.get("limits"), dict):
        config["limits"] = RequestLimits(**config["limits"])
    server_config = ServerConfig(**config)  # bad settings fail at import, in gunicorn's master

    async def runner() -> web.AppRunner:
        server = RetrievalServer(load_index(index, backend), server_config)
        app_runner = server.make_runner()
        server.service.open(
            peers=lambda: len(app_runner.server.connections) if app_runner.server is not None else 0
        )

        async def close(app: web.Application) -> None:
            await server.service.close()

        app_runner.app.on_cleanup.append(close)
        return app_runner

    return runner
