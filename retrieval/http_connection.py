"""A lean keep-alive HTTP/1.1 client connection on the standard library's sockets.

:class:`HTTPConnection` is what :class:`~.http_client.HTTPRetriever` sends its requests
through, one per thread. It exists instead of urllib3 or :mod:`http.client` because every
request has a deadline for the whole answer: each socket read waits only for the time left,
so a server that trickles its answer a byte at a time cannot hold a request past it
(urllib3's and httpx's timeouts bound each read, not the answer). It is as fast as urllib3
on small JSON requests (``benchmarks/http_clients.py``, see ``docs/hardening.md``).
"""

from __future__ import annotations

import os
import socket
import ssl
import time

from .server_protocol import host_port

__all__ = ["HTTPConnection", "ProtocolError", "ServerClosed"]

_MAX_LINE = 65_536
_MAX_HEADERS = 100
_MAX_BODY = 1 << 30
_RECV = 65_536


class ProtocolError(Exception):
    """The peer answered something that is not HTTP/1.x."""


class ServerClosed(ConnectionError):
    """The server closed the connection before a whole answer arrived."""


def _time_left(deadline: float) -> float:
    """Seconds until ``deadline`` (a :func:`time.monotonic` time); TimeoutError once it passed."""
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("the deadline passed")
    return left


class HTTPConnection:
    """One keep-alive HTTP/1.1 connection, kept lean for small JSON requests.

    Each request is written in one send and its answer read with a small buffered reader
    whose every ``recv`` waits no longer than the request's deadline allows. It handles
    ``Content-Length``, chunked and close-delimited bodies, 1xx interim answers,
    ``Connection: close`` and HTTP/1.0, and refuses oversized header lines and bodies.

    Args:
        scheme: ``"http"`` or ``"https"``.
        host: Server host.
        port: Server port.
        deadline: :func:`time.monotonic` time by which the connection must be open.

    Raises:
        TimeoutError: The connection was not open by ``deadline``.
        OSError: The connection was refused or failed.
    """

    def __init__(self, scheme: str, host: str, port: int, deadline: float) -> None:
        sock = socket.create_connection((host, port), timeout=_time_left(deadline))
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if scheme == "https":
                sock = ssl.create_default_context().wrap_socket(sock, server_hostname=host)
        except BaseException:
            sock.close()
            raise
        self.sock = sock
        self.host_header = host_port(host, port)
        self.pid = os.getpid()
        self.used = False
        """Whether a request has completed on this connection (then a close is a stale socket)."""
        self.open = True
        self._buffer = bytearray()
        self._deadline = deadline

    def close(self) -> None:
        self.open = False
        try:
            self.sock.close()
        except OSError:
            pass

    def request(self, method: str, path: str, body: bytes | None, deadline: float) -> tuple[int, bytes]:
        """Send one request and read the whole answer by ``deadline``: ``(status, body)``.

        Raises:
            TimeoutError: The whole answer did not arrive by ``deadline`` (the connection is closed).
        """
        self._deadline = deadline
        head = f"{method} {path} HTTP/1.1\r\nHost: {self.host_header}\r\nAccept: application/json\r\n"
        if body is not None:
            head += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        self.sock.settimeout(_time_left(deadline))
        self.sock.sendall(head.encode("ascii") + b"\r\n" + (body or b""))
        status, version, headers = self._read_head()
        while 100 <= status < 200:  # interim answers carry no body
            status, version, headers = self._read_head()
        data, delimited = self._read_body(headers, status, method)
        connection = headers.get(b"connection", b"").lower()
        if (
            not delimited
            or b"close" in connection
            or (version == b"HTTP/1.0" and b"keep-alive" not in connection)
        ):
            self.close()
        self.used = True
        return status, data

    # -- reading with a deadline -------------------------------------------------------------

    def _fill(self) -> bool:
        """Read what the server sent next into the buffer; False at the end of the stream."""
        self.sock.settimeout(_time_left(self._deadline))
        chunk = self.sock.recv(_RECV)
        self._buffer += chunk
        return bool(chunk)

    def _readline(self) -> bytes:
        start = 0
        while True:
            end = self._buffer.find(b"\n", start)
            if end >= 0:
                break
            if len(self._buffer) > _MAX_LINE:
                raise ProtocolError(f"a header line longer than {_MAX_LINE} bytes")
            start = len(self._buffer)
            if not self._fill():
                line = bytes(self._buffer)
                self._buffer.clear()
                return line
        if end >= _MAX_LINE:
            raise ProtocolError(f"a header line longer than {_MAX_LINE} bytes")
        line = bytes(self._buffer[: end + 1])
        del self._buffer[: end + 1]
        return line

    def _read(self, size: int) -> bytes:
        """Up to ``size`` bytes: fewer only when the server closed the connection."""
        while len(self._buffer) < size and self._fill():
            pass
        data = bytes(self._buffer[:size])
        del self._buffer[:size]
        return data

    def _read_exactly(self, size: int) -> bytes:
        data = self._read(size)
        if len(data) < size:
            raise ServerClosed(f"the answer was cut short ({len(data)} of {size} bytes)")
        return data

    def _read_head(self) -> tuple[int, bytes, dict[bytes, bytes]]:
        line = self._readline()
        if not line:
            raise ServerClosed("the server closed the connection without answering")
        parts = line.split(None, 2)
        if (
            len(parts) < 2
            or not parts[0].startswith(b"HTTP/1.")
            or len(parts[1]) != 3
            or not parts[1].isdigit()
        ):
            raise ProtocolError(f"not an HTTP status line: {line[:80]!r}")
        headers: dict[bytes, bytes] = {}
        for _ in range(_MAX_HEADERS):
            line = self._readline()
            if line in (b"\r\n", b"\n"):
                return int(parts[1]), parts[0], headers
            name, colon, value = line.partition(b":")
            if not line.endswith(b"\n") or not colon:
                raise ProtocolError(f"a malformed header line: {line[:80]!r}")
            headers[name.strip().lower()] = value.strip()
        raise ProtocolError(f"more than {_MAX_HEADERS} header lines")

    def _read_body(self, headers: dict[bytes, bytes], status: int, method: str) -> tuple[bytes, bool]:
        """The body, and whether its end was marked (False: it ran to the connection's close)."""
        if method == "HEAD" or status in (204, 304):
            return b"", True
        if b"chunked" in headers.get(b"transfer-encoding", b"").lower():
            chunks: list[bytes] = []
            total = 0
            while True:
                size_text = self._readline().split(b";")[0].strip()
                try:
                    size = int(size_text, 16)
                except ValueError:
                    raise ProtocolError(f"a bad chunk size {size_text[:20]!r}") from None
                total += size
                if size < 0 or total > _MAX_BODY:
                    raise ProtocolError(f"a chunked body over {_MAX_BODY} bytes")
                if size == 0:
                    while self._readline() not in (b"\r\n", b"\n", b""):  # trailers
                        pass
                    return b"".join(chunks), True
                chunks.append(self._read_exactly(size))
                self._readline()  # the CRLF after each chunk
        length = headers.get(b"content-length")
        if length is not None:
            if not length.isdigit() or int(length) > _MAX_BODY:
                raise ProtocolError(f"a bad Content-Length {length[:20]!r}")
            return self._read_exactly(int(length)), True
        data = self._read(_MAX_BODY + 1)
        if len(data) > _MAX_BODY:
            raise ProtocolError(f"a body over {_MAX_BODY} bytes")
        return data, False
