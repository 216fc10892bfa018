"""A retriever backed by a remote server speaking Search-R1's ``/retrieve`` API.

``make_retriever("http://host:port")`` (or ``retriever="http://host:port"`` in any env)
builds an :class:`HTTPRetriever`. It works against ``searchgym serve`` and against
Search-R1's own retrieval server, and anything else that answers the same format.

The HTTP is a small keep-alive HTTP/1.1 client on the standard library's sockets (see
:class:`~.http_connection.HTTPConnection` for why not urllib3): one connection per thread, so a
shared client is thread-safe and needs no new dependency, reopened when the server closed
it, after a fork, or after an error. ``timeout`` bounds a whole :meth:`HTTPRetriever.search`
call, retries included. Every failure, whatever the server sends, ends in
:class:`~searchgym.error.RetrievalError`, which :class:`~searchgym.envs.SearchQAEnv` turns
into an error observation, so a dead, frozen or confused server never crashes a training run.
"""

from __future__ import annotations

import json
import os
import random
import threading
import time
import urllib.parse
import weakref
from collections.abc import Sequence
from typing import Any

from ..checks import check_int, check_number
from ..error import InvalidArgumentError, RetrievalError
from .base import Retriever
from .http_connection import HTTPConnection, ProtocolError, ServerClosed
from .records import Doc
from .server_protocol import host_port, parse_response

__all__ = ["RETRYABLE_STATUSES", "HTTPRetriever", "make_http_retriever"]

RETRYABLE_STATUSES = frozenset({429, 502, 503, 504})
"""HTTP statuses worth another try (overload, gateway trouble). Other 4xx/5xx are final."""


class _Transient(Exception):
    """An attempt failed in a way that another attempt may not (connection, timeout, 503)."""


class _Final(Exception):
    """An attempt failed in a way that another attempt would repeat (4xx, 500, garbage)."""


def _parse_url(url: object) -> tuple[str, str, int, str]:
    """``(scheme, host, port, retrieve_path)`` of a server URL, with or without ``/retrieve``."""
    if not isinstance(url, str):
        raise InvalidArgumentError(f"url must be a string such as 'http://127.0.0.1:8000', got {url!r}.")
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise InvalidArgumentError(
            f"url must look like 'http://host:port' (optionally ending in /retrieve), got {url!r}."
        )
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError as exc:
        raise InvalidArgumentError(f"url {url!r} has a bad port: {exc}.") from None
    path = urllib.parse.quote(parts.path.rstrip("/"), safe="/%:@!$&'()*+,;=-._~")
    if not path.endswith("/retrieve"):
        path += "/retrieve"
    return parts.scheme, parts.hostname, port, path


class HTTPRetriever(Retriever):
    """Search through a retrieval server (``searchgym serve``, Search-R1's server, ...).

        Each :meth:`search` call sends its queries in as few requests as the chunking allows
        (``max_queries_per_request`` queries per request), with ``return_scores`` set so that
        documents keep their scores. Queries longer than ``max_query_chars`` are cut, as BM25
        does in-process, so no query string is refused for its length.

    Failures: connection errors, timeouts and the statuses in :data:`RETRYABLE_STATUSES`
        are retried ``retries`` times, waiting ``backoff · 2^attempt`` seconds (capped at
        ``max_backoff``, with jitter) in between, as long as the ``timeout`` of the call lasts.
        Other error statuses, and answers that are not the ``/retrieve`` format (including
        numbers no float can hold), fail at once. Either way :meth:`search` raises
        :class:`RetrievalError` with a message that names the server and what went wrong, and
        :attr:`error_count` goes up by one. Connections are reopened as needed, so a restarted
        server is picked up by the next call.

        Args:
            url: ``http://host:port``, optionally with a path prefix or ending in ``/retrieve``.
            timeout: Seconds one :meth:`search` call may take in all: connecting, sending, reading
                the whole answer, every retry and the waits between them. A server that trickles
                its answer or freezes costs at most this much per search.
            retries: Extra attempts after a transient failure, while ``timeout`` lasts.
            backoff: First wait between attempts, in seconds.
            max_backoff: Longest wait between attempts, in seconds.
            max_queries_per_request: Queries per request; a larger batch is sent in chunks.
            max_query_chars: Queries are cut to this many characters before sending.

        Raises:
            InvalidArgumentError: A malformed URL or option.
    """

    name = "http"

    def __init__(
        self,
        url: str,
        *,
        timeout: float = 30.0,
        retries: int = 3,
        backoff: float = 0.1,
        max_backoff: float = 2.0,
        max_queries_per_request: int = 256,
        max_query_chars: int = 10_000,
    ) -> None:
        self.scheme, self.host, self.port, self.path = _parse_url(url)
        self.url = url
        self.timeout = check_number("timeout", timeout, 1e-3)
        self.retries = check_int("retries", retries, 0)
        self.backoff = check_number("backoff", backoff, 0)
        self.max_backoff = check_number("max_backoff", max_backoff, 0)
        self.max_queries_per_request = check_int("max_queries_per_request", max_queries_per_request, 1)
        self.max_query_chars = check_int("max_query_chars", max_query_chars, 1)
        self.error_count = 0
        """Number of :meth:`search` calls that raised :class:`RetrievalError`."""
        self.retry_count = 0
        """Number of attempts repeated after a transient failure."""
        self.request_count = 0
        """Number of HTTP requests sent (attempts included)."""
        self._init_runtime()

    def _init_runtime(self) -> None:
        self._lock = threading.Lock()
        self._local = threading.local()
        self._connections: weakref.WeakSet[HTTPConnection] = weakref.WeakSet()

    def __getstate__(self) -> dict[str, Any]:  # picklable for Ray / multiprocessing: drop sockets
        state = self.__dict__.copy()
        for key in ("_lock", "_local", "_connections"):
            state.pop(key, None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._init_runtime()

    def __repr__(self) -> str:
        return f"HTTPRetriever({self.url!r}, timeout={self.timeout}, retries={self.retries})"

    @property
    def base_url(self) -> str:
        """``scheme://host:port`` of the server."""
        return f"{self.scheme}://{host_port(self.host, self.port)}"

    # -- connections ---------------------------------------------------------------------

    def _connection(self, deadline: float) -> HTTPConnection:
        """This thread's open connection, or a new one (also after a fork)."""
        conn: HTTPConnection | None = getattr(self._local, "conn", None)
        if conn is not None and conn.open and conn.pid == os.getpid():
            return conn
        conn = HTTPConnection(self.scheme, self.host, self.port, deadline)
        self._local.conn = conn
        with self._lock:
            self._connections.add(conn)
        return conn

    def _drop_connection(self) -> None:
        conn: HTTPConnection | None = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None

    def close(self) -> None:
        """Close every pooled connection (they reopen on the next request)."""
        with self._lock:
            connections = list(self._connections)
        for conn in connections:
            if conn.pid == os.getpid():
                conn.close()
        self._local = threading.local()

    def _exchange(self, method: str, path: str, body: bytes | None, deadline: float) -> tuple[int, bytes]:
        """One request on this thread's connection; a stale keep-alive socket is replaced once."""
        for fresh_try in (False, True):
            conn = self._connection(deadline)
            try:
                with self._lock:
                    self.request_count += 1
                return conn.request(method, path, body, deadline)
            except (ServerClosed, BrokenPipeError, ConnectionResetError):
                self._drop_connection()
                if conn.used and not fresh_try:  # the server closed an idle connection: try a new one
                    continue
                raise
            except BaseException:
                self._drop_connection()
                raise
        raise AssertionError("unreachable")

    # -- one attempt, with retries -----------------------------------------------------------

    def _attempt(self, method: str, path: str, body: bytes | None, deadline: float) -> bytes:
        try:
            status, data = self._exchange(method, path, body, deadline)
        except TimeoutError as exc:
            raise _Transient(f"no whole answer within timeout={self.timeout:g} s") from exc
        except OSError as exc:  # refused, reset, closed early, TLS trouble
            raise _Transient(f"{type(exc).__name__}: {exc}") from exc
        except ProtocolError as exc:
            raise _Final(f"the answer is not HTTP ({exc})") from exc
        if status == 200:
            return data
        message = f"HTTP {status}"
        try:
            detail = json.loads(data)
            if isinstance(detail, dict) and ("error" in detail or "detail" in detail):
                message += f": {detail.get('error', detail.get('detail'))}"
            else:
                message += f": {data[:200]!r}"
        except (ValueError, RecursionError):
            message += f": {data[:200]!r}"
        if status in RETRYABLE_STATUSES:
            raise _Transient(message)
        raise _Final(message)

    def _call(self, method: str, path: str, body: bytes | None, what: str, deadline: float) -> bytes:
        """Run one request with retries until ``deadline``; raise RetrievalError (and count it) when all fail."""
        attempts = self.retries + 1
        for attempt in range(attempts):
            try:
                return self._attempt(method, path, body, deadline)
            except _Final as exc:
                problem, tries = str(exc), attempt + 1
                break
            except _Transient as exc:
                problem, tries = str(exc), attempt + 1
                delay = min(self.max_backoff, self.backoff * 2**attempt) * random.uniform(0.5, 1.0)
                if attempt + 1 == attempts or time.monotonic() + delay >= deadline:
                    break
                with self._lock:
                    self.retry_count += 1
                time.sleep(delay)
        self._count_error()
        raise RetrievalError(
            f"The retrieval server at {self.base_url} failed {what} after {tries} attempt(s): {problem}. "
            f"Check that it runs (`searchgym serve --index DIR --port {self.port}`) and answers "
            f"GET {self.base_url}/health."
        )

    def _count_error(self) -> None:
        with self._lock:
            self.error_count += 1

    # -- Retriever API -------------------------------------------------------------------------

    def search(self, queries: Sequence[str], k: int) -> list[list[Doc]]:
        """Top-``k`` documents for each query, from the server.

        Raises:
            InvalidArgumentError: ``k`` is not a positive int, or ``queries`` is not a list
                or tuple of strings.
            RetrievalError: The server is unreachable, too slow, refused the request, or
                answered something other than the ``/retrieve`` format.
        """
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise InvalidArgumentError(f"k must be a positive integer (documents per query), got {k!r}.")
        if isinstance(queries, str) or not isinstance(queries, (list, tuple)):
            raise InvalidArgumentError(
                f"queries must be a list or tuple of strings, got {type(queries).__name__}: {queries!r:.60}."
            )
        for i, query in enumerate(queries):
            if not isinstance(query, str):
                raise InvalidArgumentError(
                    f"queries[{i}] must be a string, got {type(query).__name__}: {query!r:.60}."
                )
        deadline = time.monotonic() + self.timeout
        results: list[list[Doc]] = []
        step = self.max_queries_per_request
        for start in range(0, len(queries), step):
            chunk = [q[: self.max_query_chars] for q in queries[start : start + step]]
            body = json.dumps({"queries": chunk, "topk": k, "return_scores": True}).encode()
            what = f"to answer {len(chunk)} quer{'y' if len(chunk) == 1 else 'ies'}"
            data = self._call("POST", self.path, body, what, deadline)
            try:
                results.extend(parse_response(data, len(chunk)))
            except Exception as exc:  # whatever the server sent, the caller gets a RetrievalError
                self._count_error()
                raise RetrievalError(
                    f"The retrieval server at {self.base_url} answered POST {self.path} with something that is "
                    f"not Search-R1's /retrieve format ({exc}). Is {self.url!r} a retrieval server?"
                ) from None
        return results

    def health(self) -> dict[str, Any]:
        """The server's ``GET /health`` answer (searchgym servers; Search-R1's has none).

        Raises:
            RetrievalError: The server cannot be reached or answered something else than JSON.
        """
        return self._get_json("/health")

    def server_stats(self) -> dict[str, Any]:
        """The server's ``GET /stats`` counters (searchgym servers only)."""
        return self._get_json("/stats")

    def _get_json(self, route: str) -> dict[str, Any]:
        path = self.path[: -len("/retrieve")] + route
        data = self._call("GET", path, None, f"on GET {route}", time.monotonic() + self.timeout)
        try:
            value = json.loads(data)
        except (ValueError, RecursionError):
            value = None
        if not isinstance(value, dict):
            self._count_error()
            raise RetrievalError(
                f"The server at {self.base_url} answered GET {route} with {data[:120]!r}, not a JSON object."
            )
        return value

    def __len__(self) -> int:
        """Number of passages on the server, from ``GET /health``.

        Raises:
            RetrievalError: The server is unreachable or does not report ``num_docs``.
        """
        num_docs = self.health().get("num_docs")
        if isinstance(num_docs, bool) or not isinstance(num_docs, int):
            raise RetrievalError(f"The server at {self.base_url} does not report num_docs on GET /health.")
        return num_docs


def make_http_retriever(
    *,
    url: str,
    corpus_path: object = None,
    docs: object = None,
    index_dir: object = None,
    **options: Any,
) -> HTTPRetriever:
    """The ``"http"`` factory: ``make_retriever("http://host:port", timeout=..., ...)``.

    The corpus and index arguments that envs pass to every backend are ignored: the server
    holds the index.
    """
    return HTTPRetriever(url, **options)
