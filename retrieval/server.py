"""A retrieval server that speaks Search-R1's ``/retrieve`` API, with dynamic batching.

One process, one asyncio event loop (aiohttp), one worker thread that runs the retriever.
Concurrent requests wait in a queue and are merged into one batched ``retriever.search``
call (:mod:`.batching`), so that a dense encoder sees a batch instead of one query at a time;
the results are split back per request. The routes and their answers (``POST /retrieve``,
``GET /health``, ``GET /stats``) are in :mod:`.service`, their aiohttp plumbing in
:mod:`.server_app`, and the connection cap in :mod:`.connections`; this module runs them.

Every bad request gets a 4xx JSON answer ``{"error": ...}``, a failing retriever a 500, and
the server keeps serving. Slow or stuck clients cannot pile up: a connection that sends no
whole request head within ``idle_timeout_s`` is closed, a body that takes longer than
``body_timeout_s`` gets a 408, and past ``max_connections`` a new connection closes the
oldest idle one, or else the oldest one still waiting for its body (a 503 answers it only when
every connection has a request being searched or answered), so a normal query is still answered. A
client that hangs up before its answer is counted apart (``client_disconnects``) and logged
in one line. ``searchgym serve`` starts it (see :mod:`searchgym.commands.serve`; with
``--workers N``, :mod:`.server_workers` runs one in each gunicorn worker);
:class:`RetrievalServer` runs it in-process, in a background thread or in the foreground.
aiohttp is used rather than the standard library because its C HTTP parser and event loop
keep the per-request cost low, and many idle keep-alive connections cost no threads.
"""

from __future__ import annotations

import asyncio
import signal
import socket
import threading
from collections.abc import Callable, Sequence

from aiohttp import web

from ..error import InvalidArgumentError, SearchGymError
from .base import Retriever
from .batching import ServerStats
from .connections import ConnectionGuard, fit_connection_limit
from .server_app import RetrievalApp
from .service import RetrievalService, ServerConfig

__all__ = ["RetrievalServer"]


class RetrievalServer:
    """The HTTP server around one retriever.

    Use it as a context manager or with :meth:`start`/:meth:`stop` to run it in a background
    thread (tests, notebooks), or call :meth:`serve_forever` to run it in the foreground
    until SIGINT or SIGTERM (``searchgym serve``). A process that manages its own event loop
    (a gunicorn worker) awaits :meth:`open` and :meth:`close` instead.

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
        self.service = RetrievalService(retriever, config, backend=backend)
        """The routes' answers and counters."""
        self.port: int | None = None
        """The bound port, once started."""
        self._app = RetrievalApp(self.service)
        self._runner: web.AppRunner | None = None
        self._listeners: list[asyncio.Server] = []
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

    # -- life cycle ------------------------------------------------------------------------

    async def open(self, sockets: Sequence[socket.socket] = ()) -> None:
        """Start serving on the running event loop: on ``config.host:config.port``, or on
        ``sockets`` already bound and listening (a gunicorn worker's, shared with its siblings).

        Raises:
            InvalidArgumentError: The port cannot be bound.
        """
        config = self.config
        max_connections, backlog = fit_connection_limit(config.max_connections)
        runner = self._app.runner()
        await runner.setup()
        self._runner = runner
        server = runner.server
        assert server is not None
        self._app.guard = guard = ConnectionGuard(server, max_connections, self.stats)
        self.service.open(peers=lambda: len(server.connections))
        loop = asyncio.get_running_loop()
        try:
            if sockets:
                for sock in sockets:
                    self._listeners.append(await loop.create_server(guard.accept, sock=sock, backlog=backlog))
            else:
                self._listeners.append(
                    await loop.create_server(
                        guard.accept, config.host, config.port, backlog=backlog, reuse_address=True
                    )
                )
        except OSError as exc:
            await self.close()
            raise InvalidArgumentError(
                f"Cannot listen on {config.host}:{config.port} ({exc.strerror or exc}). Choose another --port "
                "(0 picks a free one) or stop the process that holds it."
            ) from exc
        self.port = int(self._listeners[0].sockets[0].getsockname()[1])

    async def close(self) -> None:
        """Stop listening, let in-flight requests finish (5 s at most), stop the batcher."""
        for listener in self._listeners:
            listener.close()
        self._listeners = []
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
            self._stop_event = asyncio.Event()
            try:
                loop.run_until_complete(self.open())
            except BaseException as exc:
                failure.append(exc)
                ready.set()
                loop.close()
                return
            ready.set()
            loop.run_until_complete(self._stop_event.wait())
            loop.run_until_complete(self.close())
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
            stop = asyncio.Event()
            await self.open()
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGINT, signal.SIGTERM):
                try:
                    loop.add_signal_handler(sig, stop.set)
                except (NotImplementedError, RuntimeError):  # not the main thread, or Windows
                    pass
            if on_ready is not None:
                on_ready(self)
            try:
                await stop.wait()
            finally:
                await self.close()

        asyncio.run(main())
