"""Several server processes on one port: ``searchgym serve --workers N``.

One Python process serves HTTP and runs the retriever on one core at a time (the GIL), so
on a machine with spare cores a cheap retriever (BM25) is held back by the per-request HTTP
cost. With ``--workers N`` the parent starts N server processes, each loading the index
and running a :class:`~.server.RetrievalServer` bound with ``SO_REUSEPORT`` to the same
port; the kernel spreads client connections over them, and each batches what it gets.
``/health`` and ``/stats`` answer for the worker that took the request (``pid`` says which).

The parent holds the port from the start (bound, not listening, so it takes no
connections), restarts a worker that dies, and stops them all on SIGINT or SIGTERM. A port
that another server already listens on is refused, even one shared with ``SO_REUSEPORT``,
and a worker whose parent dies (``kill -9``) stops too, so no stale worker keeps answering.
Linux spreads connections over the workers; other systems may not (macOS hands them to one
worker), and Windows has no ``SO_REUSEPORT``.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import os
import queue
import signal
import socket
import sys
import threading
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from ..errors import InvalidArgumentError, SearchGymError
from .service import ServerConfig

__all__ = ["serve_workers"]

_START_TIMEOUT_S = 600.0  # loading a large dense index can take minutes


def _worker(
    slot: int, index: str, backend: str | None, load_options: dict[str, Any], config: ServerConfig, ready: Any
) -> None:
    """One worker process: load the index, serve until SIGTERM, report readiness or failure."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when workers stop
    _follow_parent()
    try:
        from .server import RetrievalServer
        from .service import load_index

        server = RetrievalServer(load_index(index, backend, **load_options), config, reuse_port=True)
        server.serve_forever(
            on_ready=lambda srv: ready.put(("ready", slot, srv.backend, srv.service.num_docs()))
        )
    except BaseException as exc:  # reported to the parent, which gives the user the message
        ready.put(("error", slot, f"{type(exc).__name__}: {exc}"))
        raise SystemExit(1) from None


def _follow_parent() -> None:
    """Stop this worker (SIGTERM to itself, a clean stop) as soon as its parent process dies."""
    parent = multiprocessing.parent_process()
    if parent is None or parent.sentinel is None:
        return

    def watch() -> None:
        multiprocessing.connection.wait([parent.sentinel])  # ready when the parent is gone
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="searchgym-parent-watch", daemon=True).start()


def _cannot_listen(host: str, port: int, exc: OSError) -> InvalidArgumentError:
    return InvalidArgumentError(
        f"Cannot listen on {host}:{port} ({exc.strerror or exc}). Choose another --port "
        "(0 picks a free one) or stop the process that holds it."
    )


def _reserve_port(host: str, port: int) -> socket.socket:
    """A socket bound (not listening) to ``host:port`` with SO_REUSEPORT: it keeps the port ours.

    A port that another server holds is refused, even when that server bound it with
    SO_REUSEPORT as well (it would otherwise share the port and take part of the traffic).
    """
    if not hasattr(socket, "SO_REUSEPORT"):
        raise InvalidArgumentError("--workers needs SO_REUSEPORT, which this system lacks; use --workers 1.")
    try:
        family, _, _, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        sock = socket.socket(family, socket.SOCK_STREAM)
    except OSError as exc:
        raise InvalidArgumentError(f"Cannot resolve --host {host!r} ({exc}).") from exc
    try:
        # First without SO_REUSEPORT: this bind fails on a port that anyone else holds.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        address = sock.getsockname()  # the port picked for --port 0
        sock.close()
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind(address)
    except OSError as exc:
        sock.close()
        raise _cannot_listen(host, port, exc) from exc
    return sock


def serve_workers(
    index: str,
    config: ServerConfig,
    workers: int,
    *,
    backend: str | None = None,
    load_options: dict[str, Any] | None = None,
    on_ready: Callable[[str, str, int | None], None] | None = None,
) -> None:
    """Serve ``index`` from ``workers`` processes on one port, until SIGINT or SIGTERM.

    Args:
        index: What each worker loads (see :func:`~.service.load_index`).
        config: Host, port (0 picks a free one), batching and caps of every worker.
        workers: Number of server processes (>= 1).
        backend: Index kind, or None to detect it.
        load_options: Keyword arguments of ``load_index`` (``corpus_path``, ``model``).
        on_ready: Called once every worker answers, with the URL, the backend and the
            number of passages.

    Raises:
        InvalidArgumentError: The port cannot be bound or the system lacks SO_REUSEPORT.
        SearchGymError: A worker failed to start (its error is in the message).
    """
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise InvalidArgumentError(f"workers must be an int >= 1, got {workers!r}.")
    reserved = _reserve_port(config.host, config.port)
    port = int(reserved.getsockname()[1])
    config = replace(config, port=port)
    context = multiprocessing.get_context("spawn")  # no fork of a process that may hold threads
    ready = context.Queue()
    options = dict(load_options or {})

    def start(slot: int) -> Any:
        process = context.Process(
            target=_worker,
            args=(slot, str(index), backend, options, config, ready),
            name=f"searchgym-serve-{slot}",
        )
        process.start()
        return process

    stopping = False

    def stop(signum: int, frame: Any) -> None:
        nonlocal stopping
        stopping = True

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    processes = [start(slot) for slot in range(workers)]
    try:
        backend_name, num_docs = _await_workers(processes, ready, lambda: stopping)
        if stopping:
            return
        if on_ready is not None:
            on_ready(config.url_at(port), backend_name, num_docs)
        while not stopping:
            multiprocessing.connection.wait([p.sentinel for p in processes], timeout=0.5)
            for slot, process in enumerate(processes):
                if not stopping and process.exitcode is not None:
                    print(
                        f"searchgym serve: worker {slot} (pid {process.pid}) exited with code "
                        f"{process.exitcode}; starting a new one.",
                        file=sys.stderr,
                        flush=True,
                    )
                    processes[slot] = start(slot)
    finally:
        reserved.close()
        for process in processes:
            if process.is_alive():
                process.terminate()  # SIGTERM: the worker closes its connections and exits
        for process in processes:
            process.join(timeout=15)
            if process.is_alive():
                process.kill()
                process.join()
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _await_workers(processes: list[Any], ready: Any, stopping: Callable[[], bool]) -> tuple[str, int | None]:
    """Wait until every worker reports ready; raise with the first worker's error."""
    waiting, backend, num_docs = set(range(len(processes))), "", None
    deadline = _START_TIMEOUT_S
    while waiting and not stopping():
        try:
            message = ready.get(timeout=0.5)
        except queue.Empty:
            deadline -= 0.5
            dead = [s for s in waiting if processes[s].exitcode is not None]
            if dead or deadline <= 0:
                reason = (
                    f"exited with code {processes[dead[0]].exitcode}" if dead else "did not start in time"
                )
                raise SearchGymError(f"searchgym serve: a worker {reason}.") from None
            continue
        if message[0] == "error":
            raise SearchGymError(message[2])
        waiting.discard(message[1])
        backend, num_docs = message[2], message[3]
    return backend, num_docs
