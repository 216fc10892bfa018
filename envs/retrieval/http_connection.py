"""A lean keep-alive HTTP/1.1 client connection on the standard library's sockets.

:class:`HTTPConnection` is what :class:`~.http_client.HTTPRetriever` sends its requests
through, one per thread. It exists instead of :mod:`http.client` for speed on small JSON
requests (see the class), and has no dependency beyond the standard library.
"""

from __future__ import annotations

import os
import socket
import ssl

from .server_protocol import host_port

__all__ = ["HTTPConnection", "ProtocolError", "ServerClosed"]

_MAX_LINE = 65_536
_MAX_HEADERS = 100
_MAX_BODY = 1 << 30


class ProtocolError(Exception):
    """The peer answered something that is not HTTP/1.x."""


class ServerClosed(ConnectionError):
    """The server closed the connection before a whole answer arrived."""


class HTTPConnection:
    """One keep-alive HTTP/1.1 connection, kept lean for small JSON requests.

    :mod:`http.client` parses headers with the :mod:`email` package and writes the headers
    and the body in two sends (two server wake-ups per request); this writes each request in
    one send and reads the answer with a plain buffered reader. It handles ``Content-Length``,
    chunked and close-delimited bodies, 1xx interim answers, ``Connection: close`` and
    HTTP/1.0, and refuses oversized header lines and bodies.
    """

    def __init__(self, scheme: str, host: str, port: int, timeout: float) -> None:
        sock = socket.create_connection((host, port), timeout=timeout)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if scheme == "https":
                sock = ssl.create_default_context().wrap_socket(sock, server_hostname=host)
        except BaseException:
            sock.close()
            raise
        self.sock = sock
        self.reader = sock.makefile("rb")
        self.host_header = host_port(host, port)
        self.pid = os.getpid()
        self.used = False
        """Whether a request has completed on this connection (then a close is a stale socket)."""
        self.open = True

    def close(self) -> None:
        self.open = False
        for closable in (self.reader, self.sock):
            try:
                closable.close()
            except OSError:
                pass

    def request(self, method: str, path: str, body: bytes | None) -> tuple[int, bytes]:
        """Send one request and read the whole answer: ``(status, body)``."""
        head = f"{method} {path} HTTP/1.1\r\nHost: {self.host_header}\r\nAccept: application/json\r\n"
        if body is not None:
            head += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
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

    def _readline(self) -> bytes:
        line = self.reader.readline(_MAX_LINE + 1)
        if len(line) > _MAX_LINE:
            raise ProtocolError(f"a header line longer than {_MAX_LINE} bytes")
        return line

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

    def _read_exactly(self, size: int) -> bytes:
        data = self.reader.read(size)
        if len(data) < size:
            raise ServerClosed(f"the answer was cut short ({len(data)} of {size} bytes)")
        return data

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
        data = self.reader.read(_MAX_BODY + 1)
        if len(data) > _MAX_BODY:
            raise ProtocolError(f"a body over {_MAX_BODY} bytes")
        return data, False
