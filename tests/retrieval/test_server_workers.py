"""``searchgym serve --workers 2`` on gunicorn keeps every hardened behaviour of the single
server: the connection cap per worker, idle and body timeouts, request caps, hang-ups counted
apart, ``/stats`` per worker. One real server (two gunicorn workers, a BM25 index of real
passages) on loopback, started once for the module with small caps and short timeouts."""

from __future__ import annotations

import http.client
import itertools
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("aiohttp", reason="the server needs aiohttp: pip install 'searchgym[serve]'")
pytest.importorskip("gunicorn", reason="--workers needs gunicorn: pip install 'searchgym[serve]'")

from searchgym.retrieval import BM25Retriever, make_retriever

MAX_CONNECTIONS = 4  # per worker
HEAD = b"POST /retrieve HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"


@pytest.fixture(scope="module")
def served(
    shared_data: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[int, BM25Retriever]]:
    """``(port, retriever)`` of a ``serve --workers 2`` process serving 500 shared passages."""
    folder = tmp_path_factory.mktemp("workers")
    corpus = folder / "corpus.jsonl"
    with (shared_data / "corpus.jsonl").open(encoding="utf-8") as src:
        corpus.write_text("".join(itertools.islice(src, 500)), encoding="utf-8")
    retriever = make_retriever("bm25", corpus_path=corpus, index_dir=folder / "idx")
    command = [sys.executable, "-m", "searchgym", "serve", "--index", str(folder / "idx"), "--port", "0"]
    command += ["--workers", "2", "--max-connections", str(MAX_CONNECTIONS), "--idle-timeout", "1.5"]
    command += ["--body-timeout", "0.5", "--max-results", "10"]
    proc = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    line = proc.stdout.readline()  # type: ignore[union-attr]
    match = re.search(r"listening on http://127\.0\.0\.1:(\d+) \(bm25, 500 passages.*, 2 workers\)", line)
    if not match:
        proc.kill()
        pytest.fail(f"no listening line: {line!r} {proc.stderr.read()!r}")  # type: ignore[union-attr]
    try:
        yield int(match.group(1)), retriever
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0


def _post(port: int, payload: dict) -> tuple[int, dict, float]:
    start = time.monotonic()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("POST", "/retrieve", body=json.dumps(payload).encode())
        response = conn.getresponse()
        return response.status, json.loads(response.read()), time.monotonic() - start
    finally:
        conn.close()


def _raw(port: int, data: bytes = b"") -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    if data:
        sock.sendall(data)
    return sock


def _closed_by_server(sock: socket.socket, within: float) -> bytes | None:
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


def _worker_stats(port: int) -> dict[int, dict]:
    """The latest ``/stats`` of each worker, by pid (each new connection reaches either)."""
    seen: dict[int, dict] = {}
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        conn.request("GET", "/stats")
        answer = json.loads(conn.getresponse().read())
        conn.close()
        seen[answer["pid"]] = answer
        if len(seen) == 2:
            break
        time.sleep(0.01)  # on a busy machine the worker that just answered may win every accept
    return seen


def test_each_worker_answers_from_the_index_and_applies_the_request_caps(served):
    port, retriever = served
    assert len(_worker_stats(port)) == 2
    queries = ["who wrote hamlet", "capital of france"]
    status, body, _ = _post(port, {"queries": queries, "topk": 3})
    assert status == 200
    assert [[item["id"] for item in docs] for docs in body["result"]] == [
        [doc.id for doc in docs] for docs in retriever.search(queries, 3)
    ]
    status, body, _ = _post(port, {"queries": queries, "topk": 6})  # 12 documents > max_results=10
    assert status == 413 and (body["cap"], body["limit"], body["received"]) == ("max_results", 10, 12)


def test_idle_partial_head_and_slow_body_connections_are_closed(served):
    port, _ = served
    idle = _raw(port)
    partial = _raw(port, b"POST /retrieve HTTP/1.1\r\nHost: t\r\n")
    assert _closed_by_server(idle, within=5.0) == b""  # idle timeout 1.5 s
    assert _closed_by_server(partial, within=5.0) == b""
    slow = _raw(port, HEAD % 100 + b'{"queries"')
    answer = _closed_by_server(slow, within=5.0)  # body timeout 0.5 s
    assert answer is not None and answer.startswith(b"HTTP/1.1 408") and b"body_timeout_s=0.5" in answer


def test_past_max_connections_idle_ones_make_room_and_a_normal_query_is_answered(served):
    port, _ = served
    before = _worker_stats(port)
    idle = [_raw(port) for _ in range(30)]
    time.sleep(0.3)
    status, body, seconds = _post(port, {"queries": ["capital of france"], "topk": 1})
    assert status == 200 and len(body["result"][0]) == 1 and seconds < 2.0  # not queued behind the idle ones
    time.sleep(1.2)  # a 503 answer closes its connection within 1 s (idle ones close at 1.5 s anyway)
    # At most MAX_CONNECTIONS per worker stay open; aiohttp's own worker closed none of 40 here.
    still_open = sum(_closed_by_server(sock, within=0.05) is None for sock in idle)
    assert still_open <= 2 * MAX_CONNECTIONS
    after = _worker_stats(port)
    made_room = sum(
        after[pid]["closed_idle_connections"]
        + after[pid]["refused_connections"]
        - before[pid]["closed_idle_connections"]
        - before[pid]["refused_connections"]
        for pid in after
    )
    assert made_room >= 30 - 2 * MAX_CONNECTIONS
    for sock in idle:
        sock.close()


def test_a_client_that_hangs_up_is_counted_apart_not_as_an_error(served):
    port, _ = served
    before = _worker_stats(port)
    for _ in range(4):
        sock = _raw(port, HEAD % 100 + b'{"queries": ["par')
        time.sleep(0.05)
        sock.close()
    time.sleep(0.3)
    after = _worker_stats(port)
    assert sum(after[pid]["client_disconnects"] - before[pid]["client_disconnects"] for pid in after) == 4
    assert all(after[pid]["errors"].get("500", 0) == 0 for pid in after)
