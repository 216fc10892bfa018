"""Several server processes on one port: ``searchgym serve --workers N``, run by gunicorn.

One Python process serves HTTP and runs the retriever on one core at a time (the GIL), so
on a machine with spare cores a cheap retriever (BM25) is held back by the per-request HTTP
cost. With ``--workers N`` gunicorn's arbiter (run in-process through its ``BaseApplication``
API) forks N workers of the class :class:`RetrievalWorker`; each loads the index and runs a
:class:`~.server.RetrievalServer` on the listening socket they share, so every worker keeps
the single server's routes, batching, caps, timeouts and connection cap
(:class:`~.connections.ConnectionGuard`, ``max_connections`` per worker). ``/health`` and
``/stats`` answer for the worker that took the request (``pid`` says which).

From gunicorn come: a dead worker is replaced; a worker whose event loop stops answering
for ``_HEARTBEAT_TIMEOUT_S`` is killed and replaced; SIGINT or SIGTERM stops all workers;
a worker whose parent dies (``kill -9``) exits within about a second. This module binds the
port before gunicorn starts (without ``SO_REUSEPORT``), so a port that another server holds
is refused at once, and reports the workers' readiness and load errors to the command line.
"""

from __future__ import annotations

import asyncio
import json
import os
import select
import signal
import socket
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

from aiohttp import GunicornWebWorker
from gunicorn.app.base import BaseApplication
from gunicorn.arbiter import Arbiter
from gunicorn.errors import HaltServer
from gunicorn.sock import TCP6Socket, TCPSocket

from ..error import InvalidArgumentError, SearchGymError
from .connections import BACKLOG
from .server import RetrievalServer
from .service import ServerConfig, load_index

__all__ = ["RetrievalWorker", "serve_workers"]

_HEARTBEAT_TIMEOUT_S = 30
"""A worker whose event loop sends no heartbeat for this long is killed and replaced (searches
run on a thread, so only a stuck loop misses it; loading the index beats too)."""

_GRACEFUL_S = 10
"""How long stopping workers get to finish their requests before they are killed."""


@dataclass(frozen=True)
class _WorkerSpec:
    """What each worker serves, and the pipe it reports to the parent on."""

    index: str
    backend: str | None
    load_options: dict[str, Any]
    config: ServerConfig
    report_fd: int


def _report(fd: int, **message: Any) -> None:
    """Write one JSON line to the parent (a write under 4 KiB to a pipe is never interleaved)."""
    os.write(fd, (json.dumps(message) + "\n").encode())


class RetrievalWorker(GunicornWebWorker):  # type: ignore[misc]
    """A gunicorn worker that loads the index and serves it through :class:`RetrievalServer`.

    aiohttp's worker hands accepted connections to aiohttp directly; this one opens the
    server on the shared sockets, so accepts go through the connection cap. It reports
    ``ready`` (or the load error) to the parent and leaves when gunicorn or a dead parent
    says so.
    """

    async def _run(self) -> None:
        spec: _WorkerSpec = self.app.spec
        loop = asyncio.get_running_loop()
        beating = loop.create_task(self._beat())  # loading a large index may take minutes
        try:
            options = dict(spec.load_options)
            retriever = await loop.run_in_executor(
                None, partial(load_index, spec.index, spec.backend, **options)
            )
            server = RetrievalServer(retriever, spec.config)
            await server.open([listener.sock for listener in self.sockets])
        except Exception as exc:  # reported to the parent, which gives the user the message
            _report(spec.report_fd, error=f"{type(exc).__name__}: {exc}"[:2000])
            self.exit_code = Arbiter.WORKER_BOOT_ERROR  # gunicorn stops instead of retrying
            return
        finally:
            beating.cancel()
        self.booted = True
        _report(spec.report_fd, ready=os.getpid(), backend=server.backend, num_docs=server.service.num_docs())
        while self.alive:
            self.notify()
            if self.ppid != os.getppid():  # the parent died: no stale worker keeps the port
                self.alive = False
                self.log.info("Parent changed, shutting down: %s", self)
            else:
                await self._wait_next_notify()
        await server.close()

    async def _beat(self) -> None:
        while True:
            self.notify()
            await asyncio.sleep(1.0)


class _Application(BaseApplication):  # type: ignore[misc]
    """gunicorn's settings for ``serve --workers``; ``spec`` is what every worker serves."""

    def __init__(self, spec: _WorkerSpec, workers: int) -> None:
        self.spec = spec
        self._workers = workers
        super().__init__()

    def load_config(self) -> None:
        config = self.spec.config
        settings = {
            "bind": [
                f"[{config.host}]:{config.port}" if ":" in config.host else f"{config.host}:{config.port}"
            ],
            "workers": self._workers,
            "worker_class": f"{__name__}.RetrievalWorker",
            "timeout": _HEARTBEAT_TIMEOUT_S,
            "graceful_timeout": _GRACEFUL_S,
            "loglevel": "warning",
            "control_socket_disable": True,  # a second server would share its socket file
            "proc_name": "searchgym-serve",
            "child_exit": _worker_exited,
        }
        for key, value in settings.items():
            self.cfg.set(key, value)

    def load(self) -> _WorkerSpec:
        return self.spec


class _Arbiter(Arbiter):  # type: ignore[misc]
    """gunicorn's arbiter, which knows when it is stopping (its workers' exits are then expected)."""

    stopping = False

    def stop(self, graceful: bool = True) -> None:
        self.stopping = True
        super().stop(graceful)

    def reap_workers(self) -> None:
        try:
            super().reap_workers()
        except HaltServer:  # a second worker that failed to boot: already stopping
            if not self.stopping:
                raise


def _worker_exited(arbiter: _Arbiter, worker: Any) -> None:
    """gunicorn's ``child_exit`` hook: say that a worker died and is replaced."""
    if not arbiter.stopping:
        print(
            f"searchgym serve: worker pid {worker.pid} exited; starting a new one.",
            file=sys.stderr,
            flush=True,
        )


def _listen(host: str, port: int) -> socket.socket:
    """A socket listening on ``host:port``; a port that another process holds is refused.

    It is bound without ``SO_REUSEPORT``, so the bind fails even when the other server shares
    its port that way; gunicorn's workers inherit it.
    """
    try:
        family, _, _, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        sock = socket.socket(family, socket.SOCK_STREAM)
    except OSError as exc:
        raise InvalidArgumentError(f"Cannot resolve --host {host!r} ({exc}).") from exc
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(BACKLOG)
    except OSError as exc:
        sock.close()
        raise InvalidArgumentError(
            f"Cannot listen on {host}:{port} ({exc.strerror or exc}). Choose another --port "
            "(0 picks a free one) or stop the process that holds it."
        ) from exc
    return sock


class _Reports:
    """Reads the workers' reports in a thread: announces once all are ready, keeps the first error."""

    def __init__(self, fd: int, workers: int, on_ready: Callable[[str, int | None], None]) -> None:
        self.error: str | None = None
        self._fd = fd
        self._waiting = workers
        self._on_ready = on_ready
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._read, name="searchgym-serve-reports", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Read what is left, then stop."""
        self._done.set()
        self._thread.join()

    def _read(self) -> None:
        pending = b""
        while True:
            done = self._done.is_set()  # read once more after stop(): nothing written is missed
            readable, _, _ = select.select([self._fd], [], [], 0.2)
            chunk = os.read(self._fd, 65536) if readable else b""
            *lines, pending = (pending + chunk).split(b"\n")
            for line in lines:
                self._handle(json.loads(line))
            if done and not chunk:
                return

    def _handle(self, message: dict[str, Any]) -> None:
        if "error" in message:
            self.error = self.error or message["error"]
        elif self._waiting > 0:
            self._waiting -= 1
            if self._waiting == 0:
                self._on_ready(message["backend"], message["num_docs"])


def _run(arbiter: Arbiter) -> object:
    """Run gunicorn's arbiter until it stops; its exit code (0 after SIGINT or SIGTERM)."""
    parent = os.getpid()
    try:
        arbiter.run()
    except SystemExit as exc:
        if os.getpid() != parent:  # a forked worker leaving: end it here, not in the caller's code
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(exc.code if isinstance(exc.code, int) else 1)
        return exc.code
    return 0


def serve_workers(
    index: str,
    config: ServerConfig,
    workers: int,
    *,
    backend: str | None = None,
    load_options: dict[str, Any] | None = None,
    on_ready: Callable[[str, str, int | None], None] | None = None,
) -> None:
    """Serve ``index`` from ``workers`` gunicorn workers on one port, until SIGINT or SIGTERM.

    Args:
        index: What each worker loads (see :func:`~.service.load_index`).
        config: Host, port (0 picks a free one), batching and caps of every worker.
        workers: Number of server processes (>= 1).
        backend: Index kind, or None to detect it.
        load_options: Keyword arguments of ``load_index`` (``corpus_path``, ``model``).
        on_ready: Called once every worker answers, with the URL, the backend and the
            number of passages.

    Raises:
        InvalidArgumentError: The port cannot be bound.
        SearchGymError: A worker failed to start (its error is in the message).
    """
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise InvalidArgumentError(f"workers must be an int >= 1, got {workers!r}.")
    listener = _listen(config.host, config.port)
    config = replace(config, port=int(listener.getsockname()[1]))
    url = config.url_at(config.port)
    read_fd, write_fd = os.pipe()
    spec = _WorkerSpec(str(index), backend, dict(load_options or {}), config, write_fd)
    application = _Application(spec, workers)
    arbiter = _Arbiter(application)
    socket_class = TCP6Socket if listener.family == socket.AF_INET6 else TCPSocket
    arbiter.LISTENERS = [
        socket_class(listener.getsockname(), application.cfg, arbiter.log, fd=listener.detach())
    ]
    reports = _Reports(read_fd, workers, lambda name, num_docs: on_ready and on_ready(url, name, num_docs))
    previous = {sig: signal.getsignal(sig) for sig in Arbiter.SIGNALS + [signal.SIGCHLD]}
    try:
        code = _run(arbiter)
    finally:
        reports.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        for listening in arbiter.LISTENERS:
            listening.close()
        os.close(read_fd)
        os.close(write_fd)
    if code not in (0, None):
        raise SearchGymError(reports.error or f"searchgym serve: gunicorn stopped with exit code {code}.")
