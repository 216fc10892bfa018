"""The retrieval server under hostile clients and failing processes: slow and idle connections,
a full connection table, oversized work, clients that hang up, workers whose parent dies, and a
second server on a held port. Real servers on loopback, with short timeouts to stay fast."""

from __future__ import annotations

import http.client
import json
import logging
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

pytest.importorskip("aiohttp", reason="the server needs aiohttp: pip install 'searchgym[serve]'")

from searchgym.retrieval import BM25Retriever, Retriever
from searchgym.retrieval.records import Doc
from searchgym.retrieval.server import RetrievalServer
from searchgym.retrieval.server_protocol import RequestLimits
from searchgym.retrieval.service import ServerConfig

DOCS = [
    Doc("d1", "Paris", "capital of France"),
    Doc("d2", "Berlin", "capital of Germany"),
    Doc("d3", "Rome", "ancient city in Italy"),
]
HEAD = b"POST /retrieve HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"


@pytest.fixture(scope="module")
def small() -> BM25Retriever:
    return BM25Retriever(DOCS)


class Sleepy(Retriever):
    """``inner`` that takes 0.8 s per search call (a slow encoder)."""

    name = "sleepy"

    def __init__(self, inner: Retriever) -> None:
        self.inner = inner

    def search(self, queries: Sequence[str], k: int) -> list[list[Doc]]:
        time.sleep(0.8)
        return self.inner.search(queries, k)


def query(port: int, payload: dict | None = None, timeout: float = 5.0) -> tuple[int, dict, float]:
    """POST ``payload`` on a new connection: ``(status, answer, seconds taken)``."""
    start = time.monotonic()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        body = json.dumps(payload or {"queries": ["paris"], "topk": 1}).encode()
        conn.request("POST", "/retrieve", body=body, headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        return response.status, json.loads(response.read()), time.monotonic() - start
    finally:
        conn.close()


def raw(port: int, data: bytes = b"") -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    if data:
        sock.sendall(data)
    return sock


def closed_by_server(sock: socket.socket, within: float) -> bytes | None:
    """What the server sent before closing ``sock`` within ``within`` seconds (None: still open)."""
    sock.settimeout(within)
    received = b""
    try:
        while chunk := sock.recv(65536):
            received += chunk
    except TimeoutError:
        return None
    except ConnectionResetError:
        pass
    return received


def stats(port: int) -> dict:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    conn.request("GET", "/stats")
    answer = json.loads(conn.getresponse().read())
    conn.close()
    return answer


# -- 1. slow, idle and too many connections -------------------------------------------------------


def test_idle_and_partial_header_connections_are_closed_after_idle_timeout(small):
    with RetrievalServer(small, ServerConfig(port=0, idle_timeout_s=0.3)) as srv:
        idle = raw(srv.port)
        partial = raw(srv.port, b"POST /retrieve HTTP/1.1\r\nHost: t\r\n")
        assert closed_by_server(idle, within=3.0) == b""
        assert closed_by_server(partial, within=3.0) == b""
        assert query(srv.port)[0] == 200


def test_a_body_that_does_not_arrive_gets_408_and_the_connection_closes(small):
    with RetrievalServer(small, ServerConfig(port=0, body_timeout_s=0.3)) as srv:
        sock = raw(srv.port, HEAD % 100 + b'{"queries"')
        answer = closed_by_server(sock, within=3.0)
        assert answer is not None and answer.startswith(b"HTTP/1.1 408")
        assert b"body_timeout_s=0.3" in answer
        assert query(srv.port)[0] == 200 and stats(srv.port)["errors"] == {"408": 1}


def test_past_max_connections_idle_ones_make_room_and_a_normal_query_is_answered(small):
    with RetrievalServer(small, ServerConfig(port=0, max_connections=8)) as srv:
        idle = [raw(srv.port) for _ in range(30)]
        time.sleep(0.2)  # accepted (in one burst, several are answered 503 before any is idle)
        status, answer, seconds = query(srv.port)
        assert status == 200 and answer["result"][0][0]["id"] == "d1"
        assert seconds < 1.0
        # All but 8 were closed: idle ones to make room, or answered 503 while all 8 were new.
        time.sleep(1.2)  # a 503 answer closes its connection within 1 s
        assert sum(closed_by_server(s, within=0.05) is not None for s in idle) >= 30 - 8
        counters = stats(srv.port)
        assert counters["closed_idle_connections"] >= 1
        assert counters["closed_idle_connections"] + counters["refused_connections"] >= 30 + 1 - 8
        for s in idle:
            s.close()


def test_stalled_bodies_make_room_too_and_a_503_comes_only_when_all_are_being_answered(small):
    with RetrievalServer(Sleepy(small), ServerConfig(port=0, max_connections=4, body_timeout_s=30)) as srv:
        stalled = [raw(srv.port, HEAD % 100 + b'{"que') for _ in range(4)]
        time.sleep(0.3)  # four requests wait for their bodies
        status, answer, seconds = query(srv.port)
        assert status == 200 and seconds < 2.0  # the oldest stalled body made room
        assert closed_by_server(stalled[0], within=1.0) is not None
        counters = stats(srv.port)
        assert counters["closed_idle_connections"] >= 1 and counters["client_disconnects"] == 0
        assert counters["errors"] == {}
        for s in stalled:
            s.close()
        time.sleep(0.2)
        body = json.dumps({"queries": ["paris"]}).encode()
        searching = [raw(srv.port, HEAD % len(body) + body) for _ in range(4)]
        time.sleep(0.3)  # four requests being searched (0.8 s each, one at a time)
        sock = raw(srv.port, HEAD % 2 + b"{}")
        answer = closed_by_server(sock, within=3.0)
        assert answer is not None and answer.startswith(b"HTTP/1.1 503")
        payload = json.loads(answer.split(b"\r\n\r\n", 1)[1])
        assert payload["cap"] == "max_connections" and "max_connections=4" in payload["error"]
        for s in searching:
            s.close()
        assert stats(srv.port)["refused_connections"] >= 1


# -- 2. work and answer size of one request ---------------------------------------------------------


def test_queries_times_topk_over_max_results_is_a_413_naming_the_cap(small):
    with RetrievalServer(small, ServerConfig(port=0, limits=RequestLimits(max_results=50))) as srv:
        status, answer, _ = query(srv.port, {"queries": ["paris"] * 6, "topk": 10})
        assert status == 413 and (answer["cap"], answer["limit"], answer["received"]) == (
            "max_results",
            50,
            60,
        )
        assert "max_results=50" in answer["error"] and "--max-results" in answer["error"]
        assert query(srv.port, {"queries": ["paris"] * 5, "topk": 10})[0] == 200


def test_an_answer_over_max_response_bytes_is_a_413_naming_the_cap(small):
    # "capital" finds d1 and d2: ids, titles and texts of 2 + 5 + 17 and 2 + 6 + 18 characters,
    # plus 100 bytes of JSON each = 250; one "paris" finds d1 alone: 124.
    limits = RequestLimits(max_response_bytes=200)
    with RetrievalServer(small, ServerConfig(port=0, limits=limits)) as srv:
        status, answer, _ = query(srv.port, {"queries": ["capital"], "topk": 3})
        assert status == 413 and (answer["cap"], answer["received"]) == ("max_response_bytes", 250)
        assert query(srv.port, {"queries": ["paris"], "topk": 3})[0] == 200


# -- 4. clients that hang up ----------------------------------------------------------------------------


def test_a_client_that_hangs_up_is_counted_apart_and_logged_in_one_line(small, caplog):
    caplog.set_level(logging.INFO)
    with RetrievalServer(small, ServerConfig(port=0)) as srv:
        for _ in range(3):
            sock = raw(srv.port, HEAD % 100 + b'{"queries": ["par')
            time.sleep(0.05)
            sock.close()
        time.sleep(0.3)
        counters = stats(srv.port)
    assert counters["client_disconnects"] == 3 and counters["errors"] == {}
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING or r.exc_info]  # aiohttp's too
    records = [r for r in caplog.records if r.name == "searchgym.server"]
    assert len(records) == 3 and all(r.levelno == logging.INFO for r in records)
    assert "client hung up before the answer to POST /retrieve" in records[0].getMessage()


# -- 3. workers and their parent; a held port -----------------------------------------------------------


def _serve(index: Path, port: int, *extra: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "searchgym", "serve", "--index", str(index), "--port", str(port), *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


def _children(pid: int) -> set[int]:
    """The pids of ``pid``'s child processes (Linux ``/proc``)."""
    children: set[int] = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        children.update(int(child) for child in (task / "children").read_text().split())
    return children


def _gone(pid: int, within: float) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    return False


@pytest.mark.slow
def test_workers_exit_when_their_parent_is_killed_and_a_held_port_is_refused(tmp_path, small):
    small.save(tmp_path / "idx")
    parent = _serve(tmp_path / "idx", 0, "--workers", "2")
    try:
        match = re.search(r"listening on http://127\.0\.0\.1:(\d+)", parent.stdout.readline())
        assert match, parent.stderr.read()
        port = int(match.group(1))
        pids = _children(parent.pid)  # gunicorn forks its workers from the serving process
        assert len(pids) == 2
        assert {stats(port)["pid"] for _ in range(4)} <= pids
        for extra in (("--workers", "2"), ()):  # a second server, with workers or without
            second = _serve(tmp_path / "idx", port, *extra)
            assert second.wait(timeout=60) == 2, second.stdout.read()
            assert f"Cannot listen on 127.0.0.1:{port}" in second.stderr.read()
        parent.kill()  # kill -9: no chance to stop its workers
        parent.wait()
        assert all(_gone(pid, within=10) for pid in pids)
        with pytest.raises(ConnectionRefusedError):
            query(port)
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()


# -- 5. a burst of idle connections, readers that never read, requests the parser refuses -------------


def test_a_burst_of_idle_connections_past_the_cap_gets_no_503(small):
    with RetrievalServer(small, ServerConfig(port=0, max_connections=8)) as srv:
        # 40 connections queued by the kernel before the server accepts: one accept burst,
        # whose connections have not started when the ninth arrives. None of them is busy.
        idle = [raw(srv.port) for _ in range(40)]
        time.sleep(0.5)
        status, _, seconds = query(srv.port)
        assert status == 200 and seconds < 1.0
        answers = [closed_by_server(s, within=0.05) for s in idle]
        open_now = sum(a is None for a in answers)
        assert not [a for a in answers if a], "an idle connection was answered (503) instead of closed"
        counters = stats(srv.port)
        assert counters["refused_connections"] == 0 and counters["closed_idle_connections"] >= 40 + 1 - 8
        assert open_now <= 8
        for s in idle:
            s.close()


class Bulky(Retriever):
    """Every search finds the same ``count`` documents of 50,000 characters each."""

    name = "bulky"

    def __init__(self, count: int = 100) -> None:
        self.docs = [Doc(f"b{i}", f"T{i}", "x" * 50_000) for i in range(count)]

    def search(self, queries: Sequence[str], k: int) -> list[list[Doc]]:
        return [self.docs[:k] for _ in queries]


def test_an_answer_the_client_never_reads_is_dropped_after_send_timeout(small):
    config = ServerConfig(port=0, send_timeout_s=0.5)
    with RetrievalServer(Bulky(), config) as srv:
        slow = socket.socket()
        slow.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # a reader that takes nothing
        slow.connect(("127.0.0.1", srv.port))
        body = json.dumps({"queries": ["a", "b", "c", "d"], "topk": 100}).encode()  # 20 MB of answer
        slow.sendall(HEAD % len(body) + body)
        time.sleep(0.2)
        assert query(srv.port, {"queries": ["a"], "topk": 1}, timeout=10)[0] == 200  # others are answered
        deadline = time.monotonic() + 5.0
        while stats(srv.port)["slow_readers"] == 0 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert stats(srv.port)["slow_readers"] == 1
        slow.settimeout(5.0)
        received = 0
        with pytest.raises(ConnectionResetError):  # aborted: what the socket had not taken is gone
            while chunk := slow.recv(1 << 20):
                received += len(chunk)
        assert received < 20_000_000
        slow.close()


@pytest.mark.parametrize(
    "request_bytes",
    [
        b"POST /retrieve HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        b"POST /retrieve HTTP/1.1\r\nHost: t\r\nX-Big: " + b"a" * 20_000 + b"\r\n\r\n",
        b"POST /retrieve HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nab\r\n0\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost t\r\n\r\n",
    ],
    ids=["length-and-chunked", "huge-header", "bad-chunk-size", "header-without-colon"],
)
def test_requests_the_parser_refuses_get_the_json_error_shape(small, request_bytes, caplog):
    caplog.set_level(logging.INFO)
    with RetrievalServer(small, ServerConfig(port=0)) as srv:
        answer = closed_by_server(raw(srv.port, request_bytes), within=3.0)
        assert answer is not None
        head, _, body = answer.partition(b"\r\n\r\n")
        assert re.match(rb"HTTP/1\.[01] 4\d\d ", head), head
        assert b"Content-Type: application/json" in head, head
        message = json.loads(body)["error"]
        assert message.startswith("Bad HTTP request: ") and "\n" not in message
        assert query(srv.port)[0] == 200
        assert sum(stats(srv.port)["errors"].values()) == 1
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING or r.exc_info]  # one INFO line
