"""Tests for the retrieval server: Search-R1's wire format, caps, errors, dynamic batching, CLI."""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

pytest.importorskip("aiohttp", reason="the server needs aiohttp: pip install 'searchgym[serve]'")

from searchgym.error import DataFileError, InvalidArgumentError
from searchgym.retrieval import BM25Retriever, Retriever
from searchgym.retrieval.batching import DynamicBatcher
from searchgym.retrieval.records import Doc
from searchgym.retrieval.server import RetrievalServer
from searchgym.retrieval.server_protocol import (
    RequestLimits,
    doc_contents,
    doc_from_item,
    format_response,
    parse_response,
)
from searchgym.retrieval.service import ServerConfig, load_index

# After stop-word removal: d1 "paris capital france", d2 "berlin capital germany",
# d3 "rome ancient city italy". "paris" occurs only in d1, so a query "paris" ranks d1 alone
# (every other passage scores 0 and is left out).
DOCS = [
    Doc("d1", "Paris", "capital of France"),
    Doc("d2", "Berlin", "capital of Germany"),
    Doc("d3", "Rome", "ancient city in Italy"),
]


class Conn:
    """A tiny HTTP helper on one keep-alive connection (independent of the client under test)."""

    def __init__(self, port: int) -> None:
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)

    def post(self, body: bytes | str | dict, path: str = "/retrieve") -> tuple[int, dict]:
        if isinstance(body, dict):
            body = json.dumps(body)
        if isinstance(body, str):
            body = body.encode()
        self.conn.request("POST", path, body=body, headers={"Content-Type": "application/json"})
        response = self.conn.getresponse()
        return response.status, json.loads(response.read())

    def get(self, path: str) -> tuple[int, dict]:
        self.conn.request("GET", path)
        response = self.conn.getresponse()
        return response.status, json.loads(response.read())

    def close(self) -> None:
        self.conn.close()


@pytest.fixture(scope="module")
def small() -> BM25Retriever:
    return BM25Retriever(DOCS)


@pytest.fixture()
def server(small):
    with RetrievalServer(small, ServerConfig(port=0)) as srv:
        yield srv


@pytest.fixture()
def conn(server):
    c = Conn(server.port)
    yield c
    c.close()


# -- wire format -------------------------------------------------------------------------------


def test_answer_has_search_r1_shape_with_scores(conn, small):
    status, body = conn.post({"queries": ["paris", "capital"], "topk": 2, "return_scores": True})
    assert status == 200
    assert list(body) == ["result"]
    first, second = body["result"]
    # "paris" is in d1 only; FlashRAG's contents put the quoted title on the first line.
    assert len(first) == 1
    assert first[0]["document"] == {"id": "d1", "contents": '"Paris"\ncapital of France'}
    assert first[0]["score"] == small.search(["paris"], 2)[0][0].score
    # "capital" is in d1 and d2, equally long, so both score alike; d3 scores 0.
    assert sorted(item["document"]["id"] for item in second) == ["d1", "d2"]
    assert set(second[0]) == {"document", "score"}


def test_without_return_scores_items_are_bare_documents(conn):
    # Search-R1's server appends the corpus rows themselves when return_scores is false.
    status, body = conn.post({"queries": ["berlin"], "topk": 3})
    assert status == 200
    assert body == {"result": [[{"id": "d2", "contents": '"Berlin"\ncapital of Germany'}]]}


def test_missing_or_null_topk_uses_the_default_and_unknown_keys_are_ignored(small):
    with RetrievalServer(small, ServerConfig(port=0, default_topk=1)) as srv:
        c = Conn(srv.port)
        for payload in ({"queries": ["capital"]}, {"queries": ["capital"], "topk": None, "extra": 1}):
            status, body = c.post(payload)
            assert status == 200
            assert len(body["result"][0]) == 1  # two passages match, the default keeps one
        c.close()


def test_empty_queries_and_empty_query_strings(conn):
    assert conn.post({"queries": []}) == (200, {"result": []})
    assert conn.post({"queries": ["", "   "], "topk": 2}) == (200, {"result": [[], []]})


def test_round_trip_through_the_wire_format_gives_back_the_same_docs(small):
    docs = small.search(["paris", "capital", "rome italy"], 3)
    body = json.dumps(format_response(docs, return_scores=True)).encode()
    assert parse_response(body, 3) == docs


def test_doc_from_item_reads_search_r1_variants():
    # Search-R1's BM25 server gives title/text/contents and no id.
    assert doc_from_item({"title": "T", "text": "body", "contents": '"T"\nbody'}) == Doc("", "T", "body")
    assert doc_from_item({"document": {"id": 7, "contents": '"T"\nline1\nline2'}, "score": 1.5}) == Doc(
        "7", "T", "line1\nline2", 1.5
    )
    assert doc_contents(Doc("x", "A title", "text")) == '"A title"\ntext'
    for bad in ([], {"document": {"id": "x"}}, {"document": {"contents": "c"}, "score": "high"}):
        with pytest.raises(ValueError):
            doc_from_item(bad)


# -- bad requests ------------------------------------------------------------------------------

BAD = [
    (b"not json", 400, "not valid UTF-8 JSON"),
    (b"\xff\xfe", 400, "not valid UTF-8 JSON"),
    (b"[1, 2]", 400, "must be a JSON object"),
    (b"{}", 400, "'queries'"),
    (b'{"queries": "paris"}', 400, "must be a list of strings"),
    (b'{"queries": ["ok", 3]}', 400, "queries[1] must be a string"),
    (b'{"queries": ["a"], "topk": 0}', 400, "'topk' must be a positive integer"),
    (b'{"queries": ["a"], "topk": "3"}', 400, "'topk' must be a positive integer"),
    (b'{"queries": ["a"], "topk": true}', 400, "'topk' must be a positive integer"),
    (b'{"queries": ["a"], "return_scores": "yes"}', 400, "'return_scores' must be true or false"),
    (b"[" * 50_000 + b"]" * 50_000, 400, "not valid UTF-8 JSON"),
]


@pytest.mark.parametrize("body,status,message", BAD)
def test_bad_requests_get_a_4xx_json_message(conn, body, status, message):
    got_status, got = conn.post(body)
    assert got_status == status
    assert message in got["error"]


def test_caps_answer_which_cap_and_its_value(small):
    limits = RequestLimits(max_body_bytes=2000, max_queries=3, max_query_chars=50, max_topk=5)
    with RetrievalServer(small, ServerConfig(port=0, limits=limits)) as srv:
        c = Conn(srv.port)
        cases = [
            ({"queries": ["a", "b", "c", "d"]}, 413, "max_queries", 3, 4),
            ({"queries": ["x" * 51]}, 413, "max_query_chars", 50, 51),
            ({"queries": ["a"], "topk": 6}, 400, "max_topk", 5, 6),
        ]
        for payload, status, cap, limit, received in cases:
            got_status, got = c.post(payload)
            assert got_status == status
            assert (got["cap"], got["limit"], got["received"]) == (cap, limit, received)
            assert f"{cap}={limit}" in got["error"]
        big = json.dumps({"queries": ["y" * 40] * 3, "pad": "z" * 2000})
        got_status, got = c.post(big)
        assert got_status == 413
        assert got["cap"] == "max_body_bytes" and got["limit"] == 2000
        c.close()
        # A chunked body (no Content-Length) over the cap is refused too.
        raw = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
        chunk = b"x" * 3000
        raw.sendall(
            b"POST /retrieve HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
            + f"{len(chunk):x}\r\n".encode()
            + chunk
            + b"\r\n0\r\n\r\n"
        )
        answer = raw.recv(65536)
        raw.close()
        assert answer.startswith(b"HTTP/1.1 413")
        assert b"max_body_bytes" in answer
        assert Conn(srv.port).post({"queries": ["paris"]})[0] == 200


def test_burst_of_garbage_then_a_good_request(server):
    junk = [
        b"\x00\x01\x02garbage\r\n\r\n",
        b"GET / HTTP/9.9\r\n\r\n",
        b"POST /retrieve HTTP/1.1\r\nContent-Length: 99999999999999999999\r\n\r\n",
        b'POST /retrieve HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n{"qu',  # then hang up
        b"",  # connect and close at once
    ]
    for payload in junk * 3:
        raw = socket.create_connection(("127.0.0.1", server.port), timeout=10)
        if payload:
            raw.sendall(payload)
        raw.close()
    c = Conn(server.port)
    for body, _, _ in BAD:
        assert c.post(body)[0] == 400
    assert (
        c.post({"queries": ["paris"], "topk": 1, "return_scores": True})[1]["result"][0][0]["document"]["id"]
        == "d1"
    )
    c.close()


def test_unknown_routes_and_methods_answer_json(conn):
    status, body = conn.get("/nope")
    assert status == 404 and "POST /retrieve" in body["error"]
    status, body = conn.get("/retrieve")
    assert status == 405


def test_health_and_stats(conn):
    assert conn.get("/health") == (200, {"status": "ok", "backend": "bm25", "num_docs": 3})
    conn.post({"queries": ["paris", "rome"]})
    conn.post(b"junk")
    status, stats = conn.get("/stats")
    assert status == 200
    assert stats["requests"] == 2 and stats["queries"] == 2 and stats["batches"] == 1
    assert stats["batch_queries"] == {"2": 1} and stats["batch_requests"] == {"1": 1}
    assert stats["errors"] == {"400": 1}
    assert stats["batching"] is True and stats["max_batch_size"] == 64


class Exploding(Retriever):
    """Raises on the query "boom", returns a wrong number of lists on "short"."""

    name = "exploding"

    def search(self, queries: Sequence[str], k: int) -> list[list[Doc]]:
        if "boom" in queries:
            raise RuntimeError("index file vanished")
        if "short" in queries:
            return []
        return [[Doc("x", "T", q)] for q in queries]


def test_a_failing_retriever_gets_500_and_the_server_stays_up():
    with RetrievalServer(Exploding(), ServerConfig(port=0)) as srv:
        c = Conn(srv.port)
        status, body = c.post({"queries": ["boom"]})
        assert status == 500 and "index file vanished" in body["error"]
        status, body = c.post({"queries": ["short"]})
        assert status == 500 and "0 result lists for 1 queries" in body["error"]
        assert c.post({"queries": ["fine"]}) == (200, {"result": [[{"id": "x", "contents": '"T"\nfine'}]]})
        assert c.get("/stats")[1]["errors"] == {"500": 2}
        c.close()


# -- dynamic batching --------------------------------------------------------------------------


class Slow(Retriever):
    """BM25 over DOCS that takes 30 ms per call, like an encoder would, and logs call sizes."""

    name = "slow"

    def __init__(self) -> None:
        self.inner = BM25Retriever(DOCS)
        self.calls: list[tuple[int, int]] = []

    def search(self, queries: Sequence[str], k: int) -> list[list[Doc]]:
        self.calls.append((len(queries), k))
        time.sleep(0.03)
        return self.inner.search(queries, k)

    def __len__(self) -> int:
        return len(DOCS)


def _hammer(port: int, payloads: list[dict], threads: int) -> list[tuple[int, dict]]:
    """Send ``payloads`` from ``threads`` threads started together; answers in payload order."""
    answers: list[tuple[int, dict] | None] = [None] * len(payloads)
    barrier = threading.Barrier(threads)

    def worker(slot: int) -> None:
        c = Conn(port)
        barrier.wait()
        for i in range(slot, len(payloads), threads):
            answers[i] = c.post(payloads[i])
        c.close()

    pool = [threading.Thread(target=worker, args=(s,)) for s in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    return [a for a in answers if a is not None]


WORDS = ["paris", "berlin", "rome", "capital", "italy", "germany", "france", "ancient"]
# The batching tests below repeat these words, so they turn the result cache off (cache_size=0):
# with it on, repeats are answered from it and never reach a batch (tests/retrieval/test_server_cache.py).


def test_concurrent_requests_are_merged_and_split_back_correctly():
    retriever = Slow()
    payloads = [{"queries": [WORDS[i % 8]], "topk": 2, "return_scores": True} for i in range(96)]
    with RetrievalServer(
        retriever, ServerConfig(port=0, max_batch_size=64, max_wait_ms=50, cache_size=0)
    ) as srv:
        answers = _hammer(srv.port, payloads, threads=32)
        stats = Conn(srv.port).get("/stats")[1]
    assert len(answers) == 96
    expected = retriever.inner.search(WORDS, 2)
    for i, (status, body) in enumerate(answers):
        assert status == 200
        want = [
            {"document": {"id": d.id, "contents": doc_contents(d)}, "score": d.score} for d in expected[i % 8]
        ]
        assert body["result"] == [want]
    # Every request was searched exactly once...
    assert sum(int(n) * c for n, c in stats["batch_requests"].items()) == 96
    assert stats["queries"] == 96
    # ...in fewer calls than requests: 32 clients, 30 ms per call, so requests pile up and merge.
    assert stats["batches"] < 96
    assert max(int(n) for n in stats["batch_requests"]) > 1
    assert stats["batches"] == len(retriever.calls)


def test_batches_never_exceed_max_batch_size_and_k_groups_stay_apart():
    retriever = Slow()
    payloads = [{"queries": [WORDS[i % 8]], "topk": 1 + i % 2} for i in range(40)]
    with RetrievalServer(retriever, ServerConfig(port=0, max_batch_size=4, max_wait_ms=50)) as srv:
        answers = _hammer(srv.port, payloads, threads=16)
        stats = Conn(srv.port).get("/stats")[1]
    assert all(int(n) <= 4 for n in stats["batch_queries"])
    assert all(size <= 4 for size, _ in retriever.calls)
    for i, (status, body) in enumerate(answers):
        # "capital" matches two passages; every other word one, so topk=1 and 2 differ only there.
        want = retriever.inner.search([WORDS[i % 8]], 1 + i % 2)[0]
        assert status == 200 and [item["id"] for item in body["result"][0]] == [d.id for d in want]


def test_a_request_larger_than_max_batch_size_is_searched_in_slices_with_small_ones_between():
    retriever = Slow()  # 30 ms per search call
    with RetrievalServer(retriever, ServerConfig(port=0, max_batch_size=2, cache_size=0)) as srv:
        big: list[tuple[int, dict]] = []
        thread = threading.Thread(
            target=lambda: big.append(Conn(srv.port).post({"queries": WORDS, "topk": 1}))
        )
        thread.start()
        time.sleep(0.04)  # the big request's first slice is being searched
        small_status, small = Conn(srv.port).post({"queries": ["rome"], "topk": 1})
        small_done = len(retriever.calls)
        thread.join()
    status, body = big[0]
    assert status == 200 and [r[0]["id"] for r in body["result"]] == [
        docs[0].id for docs in retriever.inner.search(WORDS, 1)
    ]
    assert small_status == 200 and small["result"][0][0]["id"] == "d3"
    assert sorted(retriever.calls) == [(1, 1)] + [(2, 1)] * 4
    assert small_done < len(retriever.calls)  # answered before the big request's last slice ran


def test_no_batching_searches_each_request_alone():
    retriever = Slow()
    payloads = [{"queries": [WORDS[i % 8]]} for i in range(32)]
    with RetrievalServer(retriever, ServerConfig(port=0, batching=False, cache_size=0)) as srv:
        answers = _hammer(srv.port, payloads, threads=16)
        stats = Conn(srv.port).get("/stats")[1]
    assert all(status == 200 for status, _ in answers)
    assert stats["batch_requests"] == {"1": 32} and stats["batches"] == 32 and stats["batching"] is False


def test_a_lone_client_does_not_wait_out_max_wait():
    # One open connection and one pending request: no batch-mate can come, so the batch
    # leaves at once. With a 10 s max wait, five sequential requests would otherwise take 50 s.
    with RetrievalServer(BM25Retriever(DOCS), ServerConfig(port=0, max_wait_ms=10_000)) as srv:
        c = Conn(srv.port)
        c.conn.timeout = 5
        for _ in range(5):
            assert c.post({"queries": ["paris"]})[0] == 200
        c.close()


def test_batcher_defaults_to_open_calls_as_peers():
    import asyncio

    calls: list[int] = []

    def search(queries: Sequence[str], k: int) -> list[list[Doc]]:
        calls.append(len(queries))
        return [[Doc(q, "", q)] for q in queries]

    async def main() -> list[list[list[Doc]]]:
        batcher = DynamicBatcher(search, max_batch_size=8, max_wait_s=10.0)
        results = await asyncio.gather(*(batcher.submit([f"q{i}"], 1) for i in range(5)))
        await batcher.close()
        return results

    results = asyncio.run(main())
    assert [r[0][0].id for r in results] == ["q0", "q1", "q2", "q3", "q4"]
    # The first call leaves alone (it was the only open call when submitted); the other four
    # queue meanwhile and leave together once every open call is in the batch.
    assert calls == [1, 4]


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_max_wait_closes_a_batch_whose_peers_never_come(loop):
    import asyncio

    if loop == "uvloop":
        uvloop = pytest.importorskip("uvloop")  # Ray Serve replicas may run on uvloop
    calls: list[int] = []

    def search(queries: Sequence[str], k: int) -> list[list[Doc]]:
        calls.append(len(queries))
        return [[] for _ in queries]

    async def main() -> None:
        # 100 possible peers, 3 requests: only the 20 ms deadline can close the batch.
        batcher = DynamicBatcher(search, max_batch_size=8, max_wait_s=0.02, peers=lambda: 100)
        await asyncio.gather(*(batcher.submit([f"q{i}"], 1) for i in range(3)))
        await asyncio.gather(*(batcher.submit([f"r{i}"], 1) for i in range(9)))  # 8 fill one batch
        await batcher.close()

    if loop == "uvloop":
        uvloop.run(main())
    else:
        asyncio.run(main())
    assert calls == [3, 8, 1]


# -- configuration and start-up ----------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"port": 70000}, r"port must be an int in \[0, 65535\]"),
        ({"max_batch_size": 0}, "max_batch_size must be an int >= 1"),
        ({"max_wait_ms": -1}, "max_wait_ms must be a finite number"),
        ({"host": ""}, "host must be a non-empty string"),
        ({"batching": "yes"}, "batching must be True or False"),
    ],
)
def test_server_config_rejects_bad_values(kwargs, message):
    with pytest.raises(InvalidArgumentError, match=message):
        ServerConfig(**kwargs)


def test_request_limits_reject_bad_values():
    with pytest.raises(InvalidArgumentError, match="max_topk must be an int >= 1"):
        RequestLimits(max_topk=0)


def test_a_busy_port_gives_a_clear_error(small):
    with RetrievalServer(small, ServerConfig(port=0)) as first:
        with pytest.raises(InvalidArgumentError, match=f"Cannot listen on 127.0.0.1:{first.port}"):
            RetrievalServer(small, ServerConfig(port=first.port)).start()


def test_load_index_reads_a_saved_bm25_index_and_refuses_a_missing_one(tmp_path, small):
    small.save(tmp_path / "idx")
    loaded = load_index(tmp_path / "idx")
    assert isinstance(loaded, BM25Retriever) and loaded.search(["rome"], 1) == small.search(["rome"], 1)
    with pytest.raises(DataFileError, match="is not a directory"):
        load_index(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataFileError, match="not a complete searchgym BM25 index"):
        load_index(tmp_path / "empty", "bm25")
    # A single file is read as a FAISS index (Search-R1's e5_Flat.index), which needs its corpus.
    (tmp_path / "e5_Flat.index").write_bytes(b"")
    with pytest.raises(InvalidArgumentError, match="also pass its corpus with --corpus"):
        load_index(tmp_path / "e5_Flat.index")
    with pytest.raises(InvalidArgumentError, match="only the dense backend reads"):
        load_index(tmp_path / "e5_Flat.index", "bm25", corpus_path=tmp_path / "c.jsonl")


def test_cli_serves_a_saved_index_and_stops_on_sigterm(tmp_path, small):
    small.save(tmp_path / "idx")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "searchgym",
            "serve",
            "--index",
            str(tmp_path / "idx"),
            "--port",
            "0",
            "--topk",
            "1",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        line = proc.stdout.readline()
        match = re.search(r"listening on http://127\.0\.0\.1:(\d+) \(bm25, 3 passages", line)
        assert match, line
        c = Conn(int(match.group(1)))
        assert c.get("/health")[1]["num_docs"] == 3
        # --topk 1 is the default for a request without topk: one of the two "capital" passages.
        assert len(c.post({"queries": ["capital"]})[1]["result"][0]) == 1
        assert c.post({"queries": ["berlin"]})[1] == {
            "result": [[{"id": "d2", "contents": '"Berlin"\ncapital of Germany'}]]
        }
        c.close()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_cli_rejects_a_missing_index(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "searchgym", "serve", "--index", str(tmp_path / "nope"), "--port", "0"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    assert "is not a directory" in result.stderr and "searchgym index" in result.stderr


def test_shared_corpus_round_trip(shared_data: Path, tmp_path_factory):
    from searchgym.retrieval import make_retriever

    retriever = make_retriever(
        "bm25", corpus_path=shared_data / "corpus.jsonl", index_dir=tmp_path_factory.mktemp("bm25")
    )
    questions = [
        json.loads(line)["question"]
        for line in (shared_data / "questions" / "hotpotqa.jsonl")
        .read_text(encoding="utf-8")
        .splitlines()[:40]
    ]
    with RetrievalServer(retriever, ServerConfig(port=0)) as srv:
        status, body = Conn(srv.port).post({"queries": questions, "topk": 5, "return_scores": True})
    assert status == 200
    assert parse_response(json.dumps(body).encode(), len(questions)) == retriever.search(questions, 5)


def _serve_cli(index: Path, *extra: str) -> tuple[subprocess.Popen, int]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "searchgym", "serve", "--index", str(index), "--port", "0", *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    line = proc.stdout.readline()
    match = re.search(r"listening on http://127\.0\.0\.1:(\d+) \(bm25, 3 passages.*, 2 workers\)", line)
    if not match:
        proc.kill()
        pytest.fail(f"no listening line: {line!r} {proc.stderr.read()!r}")
    return proc, int(match.group(1))


def _worker_pids(port: int, want: int) -> set[int]:
    pids: set[int] = set()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # every new connection goes to one of the workers
        c = Conn(port)
        try:
            pids.add(c.get("/stats")[1]["pid"])
        except OSError:  # queued on a worker that was just killed: reset, as a client retry would see
            pass
        finally:
            c.close()
        if len(pids) >= want:
            break
        time.sleep(0.01)  # on a busy machine the worker that just answered may win every accept
    return pids


def test_cli_workers_share_one_port_restart_a_dead_worker_and_stop_together(tmp_path, small):
    small.save(tmp_path / "idx")
    proc, port = _serve_cli(tmp_path / "idx", "--workers", "2")
    try:
        pids = _worker_pids(port, 2)
        assert len(pids) == 2 and proc.pid not in pids
        for _ in range(6):  # whichever worker answers, the answer is the index's
            c = Conn(port)
            assert c.post({"queries": ["berlin"], "topk": 1})[1] == {
                "result": [[{"id": "d2", "contents": '"Berlin"\ncapital of Germany'}]]
            }
            c.close()
        dead = sorted(pids)[0]
        os.kill(dead, signal.SIGKILL)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            now = _worker_pids(port, 2)
            if len(now) == 2 and dead not in now:
                break
            time.sleep(0.5)
        assert len(now) == 2 and dead not in now, now
        log = _read_some(proc.stderr)
        assert f"Worker (pid:{dead}) was sent SIGKILL" in log  # gunicorn's line
        assert f"worker pid {dead} exited; starting a new one" in log
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        for pid in now:  # the workers went with the parent
            with pytest.raises(ProcessLookupError):
                for _ in range(100):
                    os.kill(pid, 0)
                    time.sleep(0.1)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _read_some(stream) -> str:
    os.set_blocking(stream.fileno(), False)
    return stream.read() or ""


def _run_serve(*args: str) -> subprocess.CompletedProcess:
    """``searchgym serve`` with ``args``, for runs expected to exit on their own."""
    return subprocess.run(
        [sys.executable, "-m", "searchgym", "serve", *args], capture_output=True, text=True, timeout=120
    )


def test_cli_workers_report_a_worker_that_cannot_load(tmp_path):
    (tmp_path / "idx").mkdir()  # a directory without an index
    result = _run_serve("--index", str(tmp_path / "idx"), "--workers", "2", "--port", "0")
    assert result.returncode == 2
    assert "DataFileError" in result.stderr and "listening" not in result.stdout


def test_cli_workers_and_replicas_do_not_mix(tmp_path, small):
    small.save(tmp_path / "idx")
    result = _run_serve("--index", str(tmp_path / "idx"), "--workers", "2", "--replicas", "2")
    assert result.returncode == 2 and "do not mix" in result.stderr
