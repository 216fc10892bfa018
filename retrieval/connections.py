"""The retrieval server's connection table: ``max_connections``, and who makes room past it.

:class:`ConnectionGuard` is the protocol factory that a listening socket hands accepted
connections to (``loop.create_server(guard.accept, ...)``). It keeps every open connection,
oldest first. Past ``max_connections`` a new connection closes the oldest idle one (one that
has sent no request, including one accepted in the same burst and not yet started), or else
the oldest one still waiting for its request body; only when every connection has a request
being searched or answered does the new one get a 503 naming the cap, so a normal query is
still answered. A request that aiohttp's parser refuses (a malformed head, huge headers, both
``Content-Length`` and ``Transfer-Encoding``, a bad chunk size) is answered in the same JSON
shape as every other error: ``{"error": ...}``. The app's middleware tells the guard which connections have a request in
hand (:meth:`ConnectionGuard.handling`, :meth:`ConnectionGuard.reading_body`).

One guard serves one process: the single server and each ``--workers`` worker have their own.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from aiohttp import web
from aiohttp.web_protocol import RequestHandler

from .batching import ServerStats
from .server_protocol import error_payload

__all__ = ["ConnectionGuard", "fit_connection_limit"]

log = logging.getLogger("searchgym.server")

BACKLOG = 256
"""Connections the kernel queues before the server accepts them (and most accepted in one go)."""

_SPARE_FILES = 128
"""File descriptors kept free beside ``max_connections`` (index files, logs, the listener)."""

_REFUSAL_LINGER_S = 1.0
"""How long a refused connection stays open for its request to arrive before it is closed."""


def fit_connection_limit(wanted: int) -> tuple[int, int]:
    """``(max_connections, accept backlog)`` that fit this process's open-file limit.

    Past the limit, an accept burst (up to the backlog) holds new sockets while the
    connections they replace close a loop turn or two later, so the open-file limit must fit
    ``wanted + 2 × backlog + spare``: it is raised to that when allowed (``ulimit -n`` is often
    1024); otherwise the backlog and then ``max_connections`` shrink to fit, with a warning.
    """
    try:
        import resource
    except ImportError:  # Windows: no such limit to manage
        return wanted, BACKLOG
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = wanted + 2 * BACKLOG + _SPARE_FILES
    if soft != resource.RLIM_INFINITY and soft < need:
        target = need if hard == resource.RLIM_INFINITY else min(need, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    if soft == resource.RLIM_INFINITY or soft >= need:
        return wanted, BACKLOG
    backlog = max(16, min(BACKLOG, soft // 8))
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
        asyncio.get_running_loop().call_later(_REFUSAL_LINGER_S, transport.close)

    def data_received(self, data: bytes) -> None:
        if self._transport is not None and b"\r\n\r\n" in data:
            self._transport.close()

    def eof_received(self) -> bool:
        return False


def _refusal_answer(max_connections: int) -> bytes:
    message = (
        f"The server holds max_connections={max_connections} connections, all being answered. "
        "Retry shortly, or restart the server with a larger --max-connections."
    )
    body = json.dumps({"error": message, "cap": "max_connections"}).encode()
    head = (
        f"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\nRetry-After: 1\r\n\r\n"
    )
    return head.encode() + body


class _JsonErrors(RequestHandler):
    """aiohttp's connection handler, whose own error answers (a request its parser refuses) are JSON."""

    __slots__ = ()

    stats: ServerStats | None = None

    def handle_error(
        self, request: Any, status: int = 500, exc: BaseException | None = None, message: str | None = None
    ) -> web.StreamResponse:
        if request.writer.output_size > 0:  # as aiohttp: an answer began, none can follow
            raise ConnectionError(
                "Response is sent already, cannot send another response with the error message"
            )
        what = (
            getattr(exc, "message", None) or message or (str(exc) if exc is not None else "") or "bad request"
        )
        what = " ".join(str(what).split())  # aiohttp's message spans lines, with a caret under the fault
        text = f"Bad HTTP request: {what}." if status < 500 else f"Internal server error: {what}."
        if status >= 500:
            log.error("%s", text, exc_info=exc)
        else:
            log.info("refused %d: %s", status, text)
        if self.stats is not None:
            self.stats.errors[status] += 1
        response = web.Response(
            body=json.dumps(error_payload(text)).encode(), status=status, content_type="application/json"
        )
        response.force_close()
        return response


class ConnectionGuard:
    """Accepts connections for an aiohttp server up to ``max_connections``.

    Args:
        server: The aiohttp low-level server of a set-up ``web.AppRunner`` (``runner.server``):
            it makes the protocol of each accepted connection.
        max_connections: The cap (already fitted with :func:`fit_connection_limit`).
        stats: Where ``refused_connections`` and ``closed_idle_connections`` are counted.
    """

    def __init__(self, server: web.Server, max_connections: int, stats: ServerStats) -> None:
        self.max_connections = max_connections
        self._server = server
        self._stats = stats
        self._live: dict[Any, None] = {}  # open connections' handlers, oldest first
        self._closing: set[Any] = set()  # handlers closed to make room, until their socket is released
        self._handling: set[object] = set()  # transports with a request being handled
        self._reading: set[object] = set()  # ... of which those still waiting for their body
        self._evicted: set[object] = set()  # transports closed to make room (not hang-ups)
        self._handler_class = type("JsonErrors", (_JsonErrors,), {"__slots__": (), "stats": stats})
        self._doomed: set[Any] = set()  # handlers closed to make room before their connection started
        aiohttp_made, aiohttp_lost = server.connection_made, server.connection_lost

        def connection_made(handler: Any, transport: asyncio.Transport) -> None:
            aiohttp_made(handler, transport)
            if handler in self._doomed:  # closed once aiohttp has started it (it was force-closed)
                self._doomed.discard(handler)
                asyncio.get_running_loop().call_soon(transport.close)

        def connection_lost(handler: Any, exc: BaseException | None) -> None:  # each handler calls it once
            self._live.pop(handler, None)
            self._closing.discard(handler)
            aiohttp_lost(handler, exc)

        server.connection_lost = connection_lost  # type: ignore[method-assign,assignment]
        server.connection_made = connection_made  # type: ignore[method-assign]

    def accept(self) -> asyncio.BaseProtocol:
        """The protocol of an accepted connection: aiohttp's, or a 503 past ``max_connections``."""
        if len(self._live) + len(self._closing) >= self.max_connections:
            victim = self._room()
            if victim is None:
                self._stats.refused_connections += 1
                return _Refusal(_refusal_answer(self.max_connections))
            del self._live[victim]
            self._closing.add(victim)
            self._stats.closed_idle_connections += 1
            if victim.transport is None:
                self._doomed.add(victim)
            victim.force_close()
        handler = self._server()
        if type(handler) is RequestHandler:
            handler.__class__ = self._handler_class  # same slots: only handle_error differs
        self._live[handler] = None
        return handler

    @contextmanager
    def handling(self, transport: object) -> Iterator[None]:
        """Marks ``transport`` as having a request in hand, so it is not closed to make room."""
        self._handling.add(transport)
        try:
            yield
        finally:
            self._handling.discard(transport)

    @contextmanager
    def reading_body(self, transport: object) -> Iterator[None]:
        """Marks ``transport`` as waiting for its request body: it may be closed to make room."""
        self._reading.add(transport)
        try:
            yield
        finally:
            self._reading.discard(transport)

    def was_evicted(self, transport: object) -> bool:
        """Whether ``transport`` was closed to make room (then its lost request is no hang-up)."""
        if transport in self._evicted:
            self._evicted.discard(transport)
            return True
        return False

    def _room(self) -> Any:
        """The connection to close for a new one: the oldest idle, else the oldest waiting for its body."""
        waiting = None
        for handler in self._live:
            transport = handler.transport
            if transport is None or transport not in self._handling:  # idle (or not started yet)
                return handler
            if waiting is None and transport in self._reading:
                waiting = handler
        if waiting is not None:
            self._evicted.add(waiting.transport)
        return waiting
