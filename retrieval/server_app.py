"""The retrieval server's aiohttp app: its routes, error answers and timeouts.

The answers themselves come from :class:`~.service.RetrievalService`; this module carries
them over aiohttp. Every HTTP error becomes a JSON answer ``{"error": ...}``, an unexpected
exception a 500, and a client that hangs up before its answer is counted apart
(``client_disconnects``) and logged in one line. The middleware tells the
:class:`~.connections.ConnectionGuard` which connections have a request in hand.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import struct
from contextlib import nullcontext
from typing import Any

from aiohttp import web

from .connections import ConnectionGuard
from .server_protocol import body_too_large
from .service import RetrievalService

__all__ = ["RetrievalApp"]

_LINGER_S = 1.0
"""How long the unread rest of a refused body is read and dropped before the connection closes."""

_ENCODE_OFF_LOOP_DOCS = 1000
"""Answers with more documents are encoded on a thread, so the event loop keeps answering."""

_SHUTDOWN_S = 5.0
"""How long in-flight requests may take to finish when the server stops."""


_TRIM_AFTER_S = 0.5
"""How long after a dropped answer the freed memory is handed back (once the request is gone)."""


def _give_memory_back() -> None:
    """Hand the heap's free memory back to the system (glibc's ``malloc_trim``; elsewhere nothing).

    A dropped answer's buffers are freed, but glibc keeps large freed blocks of its thread
    arenas (answers are encoded on threads) in the process; without this the server stays
    at its peak size.
    """
    global _LIBC
    if _LIBC is None:
        try:
            import ctypes

            _LIBC = ctypes.CDLL("libc.so.6")
            _LIBC.malloc_trim  # noqa: B018 - glibc has it; musl and macOS do not
        except (OSError, AttributeError):
            _LIBC = False
    if _LIBC:
        _LIBC.malloc_trim(0)


_LIBC: Any = None


def _json(payload: dict[str, Any], status: int = 200) -> web.Response:
    return web.Response(body=json.dumps(payload).encode(), status=status, content_type="application/json")


class RetrievalApp:
    """The routes of one :class:`~.service.RetrievalService` as an aiohttp app.

    Args:
        service: What answers the routes.
    """

    def __init__(self, service: RetrievalService) -> None:
        self.service = service
        self.guard: ConnectionGuard | None = None
        """The connection table, once the server listens (None: requests are not tracked)."""

    def runner(self) -> web.AppRunner:
        """An aiohttp runner of the app with the service's timeouts (not yet set up)."""
        app = web.Application(
            client_max_size=self.service.config.limits.max_body_bytes, middlewares=[self._errors]
        )
        app.router.add_post("/retrieve", self._retrieve)
        app.router.add_get("/health", self._health)
        app.router.add_get("/stats", self._stats)
        # keepalive_timeout closes a connection that sends no whole request head for that long;
        # lingering_time bounds how long the rest of a refused body is read (10 s by default).
        return web.AppRunner(
            app,
            access_log=None,
            handle_signals=False,
            shutdown_timeout=_SHUTDOWN_S,
            keepalive_timeout=self.service.config.idle_timeout_s,
            lingering_time=_LINGER_S,
        )

    @web.middleware
    async def _errors(self, request: web.Request, handler: Any) -> web.StreamResponse:
        transport = request.transport
        guard = self.guard
        try:
            with guard.handling(transport) if guard is not None else nullcontext():
                response = await handler(request)
                await self._send(request, response)
                return response
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            return _json(
                self.service.refuse(exc.status, exc.reason, request.method, request.path), exc.status
            )
        except Exception as exc:  # a server never dies on a request
            # aiohttp reports a lost connection as ConnectionResetError or RuntimeError("Connection closed.")
            if isinstance(exc, ConnectionError) or request.protocol.transport is None:
                if guard is None or not guard.was_evicted(transport):  # the client hung up
                    self.service.client_gone(request.method, request.path)
                return web.Response(status=400)  # never sent; raising would make aiohttp log a traceback
            return _json(self.service.internal_error(exc, request.method, request.path), 500)

    async def _send(self, request: web.Request, response: web.StreamResponse) -> None:
        """Write ``response`` whole within ``send_timeout_s``, or drop it and close the connection.

        aiohttp would wait as long as the client takes to read; a client that never reads
        would hold the answer's memory and its connection forever. The connection is reset,
        which drops what is still buffered here and in the kernel.
        """
        limit = self.service.config.send_timeout_s
        try:
            await asyncio.wait_for(self._write(request, response), limit)
        except TimeoutError:
            transport = request.transport
            if transport is not None:
                sock = transport.get_extra_info("socket")
                if sock is not None:  # a reset, so the kernel drops what it still holds too
                    with contextlib.suppress(OSError):
                        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                transport.abort()
            self.service.too_slow_reader(request.method, request.path, limit)
            asyncio.get_running_loop().call_later(_TRIM_AFTER_S, _give_memory_back)

    @staticmethod
    async def _write(request: web.Request, response: web.StreamResponse) -> None:
        await response.prepare(request)
        await response.write_eof()

    async def _retrieve(self, request: web.Request) -> web.Response:
        async def read_body() -> bytes:
            guard = self.guard
            try:
                with guard.reading_body(request.transport) if guard is not None else nullcontext():
                    return await request.read()
            except web.HTTPRequestEntityTooLarge:  # a body without Content-Length, over the cap
                raise body_too_large(self.service.config.limits) from None

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
