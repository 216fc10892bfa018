"""Tests for the HTTP retriever backend: round trips, batching, and every way a server can fail."""

from __future__ import annotations

import json
import os
import pickle
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import gymnasium as gym
import pytest

import searchgym  # noqa: F401  (registers the env ids)
from searchgym.envs.synthetic import generate_world
from searchgym.error import InvalidArgumentError, RetrievalError
from searchgym.retrieval import BM25Retriever, clear_retriever_cache, make_retriever
from searchgym.retrieval.http_client import HTTPRetriever
from searchgym.retrieval.records import Doc

try:
    from searchgym.retrieval.server import RetrievalServer
    from searchgym.retrieval.service import ServerConfig
except ImportError:  # no aiohttp: only the tests against tiny stdlib servers run
    RetrievalServer = ServerConfig = None  # type: ignore[assignment,misc]

needs_server = pytest.mark.skipif(
    RetrievalServer is None, reason="searchgym's server needs aiohttp: pip install 'searchgym[serve]'"
)

DOCS = [
    Doc("d1", "Paris", "capital of France"),
    Doc("d2", "Berlin", "capital of Germany"),
    Doc("d3", "Rome", "ancient city in Italy"),
]


@pytest.fixture(autouse=True)
def _fresh_cache():
    clear_retriever_cache()
    yield
    clear_retriever_cache()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def small() -> BM25Retriever:
    return BM25Retriever(DOCS)


@pytest.fixture()
def server(small):
    with RetrievalServer(small, ServerConfig(port=0)) as srv:
        yield srv


# -- tiny misbehaving servers (the world outside the unit) ------------------------------------

Answer = Callable[[bytes], tuple[int, bytes, dict[str, str]]]


@contextmanager
def canned_server(answer: Answer, *, http10: bool = False, delay: float = 0.0) -> Iterator[str]:
    """A stdlib HTTP server whose POST answer is ``answer(body) -> (status, body, headers)``."""
    stop = threading.Event()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.0" if http10 else "HTTP/1.1"

        def do_POST(self) -> None:
            request = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            if delay:
                stop.wait(delay)
            status, body, headers = answer(request)
            self.send_response(status)
            for name, value in headers.items():
                self.send_header(name, value)
            if "Transfer-Encoding" not in headers and not http10:
                self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        stop.set()
        httpd.shutdown()
        httpd.server_close()


def json_answer(payload: object, status: int = 200) -> Answer:
    return lambda _body: (status, json.dumps(payload).encode(), {"Content-Type": "application/json"})


@contextmanager
def junk_server(reply: bytes) -> Iterator[str]:
    """A TCP server that answers any request with ``reply`` (not HTTP) and hangs up."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.2)
    done = threading.Event()

    def loop() -> None:
        while not done.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                continue
            with conn:
                conn.recv(65536)
                conn.sendall(reply)

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        done.set()
        thread.join()
        listener.close()


# -- round trips -------------------------------------------------------------------------------


@needs_server
def test_make_retriever_with_a_url_builds_one_shared_client(server, small):
    client = make_retriever(server.url)
    assert isinstance(client, HTTPRetriever)
    assert make_retriever(server.url) is client  # one client per URL and options in a process
    assert make_retriever(server.url, timeout=5.0) is not client
    queries = ["paris", "capital", "rome italy", "", "zzz unknown"]
    assert client.search(queries, 2) == small.search(queries, 2)
    assert client.search([], 3) == []
    assert len(client) == 3
    assert client.health()["backend"] == "bm25"
    assert client.error_count == 0


@needs_server
def test_url_forms_and_bad_urls(server, small):
    for url in (server.url + "/", server.url + "/retrieve"):
        assert HTTPRetriever(url).search(["berlin"], 1) == small.search(["berlin"], 1)
    for bad in ("ftp://x:1", "http://", "localhost:8000", "http://h:99999", 8000):
        with pytest.raises(InvalidArgumentError, match="url"):
            HTTPRetriever(bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="timeout must be a finite number"):
        HTTPRetriever(server.url, timeout=0)
    with pytest.raises(InvalidArgumentError, match="retries must be an int"):
        HTTPRetriever(server.url, retries=-1)


@needs_server
def test_search_rejects_bad_arguments_without_a_request(server):
    client = HTTPRetriever(server.url)
    with pytest.raises(InvalidArgumentError, match="k must be a positive integer"):
        client.search(["a"], 0)
    with pytest.raises(InvalidArgumentError, match="list or tuple of strings"):
        client.search("paris", 1)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match=r"queries\[1\] must be a string"):
        client.search(["a", None], 1)  # type: ignore[list-item]
    assert client.request_count == 0


@needs_server
def test_large_batches_go_in_chunks_and_long_queries_are_cut(server, small):
    client = HTTPRetriever(server.url, max_queries_per_request=2, max_query_chars=20)
    queries = ["paris", "berlin", "rome", "capital", "italy"]
    assert client.search(queries, 1) == small.search(queries, 1)
    assert client.request_count == 3  # 2 + 2 + 1 queries
    # Cut to 20 characters, "paris" + padding still finds Paris; the server's cap is never hit.
    assert client.search(["paris" + " x" * 5000], 1) == small.search(["paris"], 1)


@needs_server
def test_shared_corpus_round_trip_equals_in_process(shared_data: Path, tmp_path_factory):
    retriever = make_retriever(
        "bm25", corpus_path=shared_data / "corpus.jsonl", index_dir=tmp_path_factory.mktemp("bm25")
    )
    questions = [
        json.loads(line)["question"]
        for name in ("hotpotqa", "nq")
        for line in (shared_data / "questions" / f"{name}.jsonl")
        .read_text(encoding="utf-8")
        .splitlines()[:60]
    ]
    with RetrievalServer(retriever, ServerConfig(port=0)) as srv:
        client = make_retriever(srv.url)
        for k in (3, 5):
            assert client.search(questions, k) == retriever.search(questions, k)


@needs_server
def test_threads_share_one_client(server, small):
    client = HTTPRetriever(server.url)
    words = ["paris", "berlin", "rome", "capital"]
    failures: list[str] = []

    def worker(i: int) -> None:
        for j in range(10):
            query = words[(i + j) % 4]
            if client.search([query], 2) != small.search([query], 2):
                failures.append(query)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == [] and client.error_count == 0 and client.request_count == 160
    client.close()
    assert client.search(["rome"], 1) == small.search(["rome"], 1)  # reopens after close()


@needs_server
def test_pickled_client_works_in_the_copy(server, small):
    client = HTTPRetriever(server.url, timeout=7.0)
    client.search(["paris"], 1)
    copy = pickle.loads(pickle.dumps(client))
    assert copy.timeout == 7.0 and copy.search(["rome"], 1) == small.search(["rome"], 1)


# -- failures ------------------------------------------------------------------------------------


def test_server_down_raises_retrieval_error_after_retries():
    client = HTTPRetriever(f"http://127.0.0.1:{free_port()}", retries=2, backoff=0.01)
    with pytest.raises(
        RetrievalError, match=r"failed to answer 1 query after 3 attempt\(s\): ConnectionRefusedError"
    ):
        client.search(["paris"], 3)
    assert client.error_count == 1 and client.retry_count == 2
    with pytest.raises(RetrievalError, match="searchgym serve --index DIR"):
        client.search(["paris"], 3)
    assert client.error_count == 2


def test_slow_server_beyond_the_timeout():
    with canned_server(json_answer({"result": [[]]}), delay=5.0) as url:
        client = HTTPRetriever(url, timeout=0.2, retries=1, backoff=0.01)
        start = time.monotonic()
        with pytest.raises(
            RetrievalError, match=r"after 1 attempt\(s\): no whole answer within timeout=0.2 s"
        ):
            client.search(["paris"], 3)
    assert time.monotonic() - start < 1.0  # the timeout covers the retries too
    assert client.error_count == 1 and client.retry_count == 0 and client.request_count == 1


@contextmanager
def trickle_server(reply: bytes, every_s: float) -> Iterator[str]:
    """A TCP server that reads a request, then sends ``reply`` one byte every ``every_s`` seconds."""
    listener = socket.create_server(("127.0.0.1", 0))
    done = threading.Event()

    def serve(conn: socket.socket) -> None:
        with conn:
            conn.recv(65536)
            for i in range(len(reply)):
                if done.wait(every_s):
                    return
                try:
                    conn.sendall(reply[i : i + 1])
                except OSError:
                    return

    def loop() -> None:
        while not done.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    threading.Thread(target=loop, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        done.set()
        listener.close()


def test_a_server_trickling_a_valid_answer_is_cut_at_the_timeout():
    body = json.dumps({"result": [[{"document": {"id": "d1", "contents": '"P"\nx'}, "score": 1.0}]]}).encode()
    reply = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
    with trickle_server(reply, every_s=0.05) as url:  # the whole answer would take 5 s
        client = HTTPRetriever(url, timeout=0.4, retries=3, backoff=0.01)
        start = time.monotonic()
        with pytest.raises(RetrievalError, match=r"no whole answer within timeout=0.4 s"):
            client.search(["paris"], 3)
        assert time.monotonic() - start < 1.2


def test_an_integer_score_too_large_for_a_float_is_a_retrieval_error():
    body = (
        b'{"result": [[{"document": {"id": "d1", "contents": "\\"P\\"\\nx"}, "score": 1'
        + b"0" * 400
        + b"}]]}"
    )
    with canned_server(lambda _b: (200, body, {"Content-Type": "application/json"})) as url:
        client = HTTPRetriever(url)
        with pytest.raises(RetrievalError, match="score must be a finite number"):
            client.search(["paris"], 3)
        env = gym.make("searchgym/SyntheticFacts-v1", retriever=client)
        env.reset(seed=0)
        obs, reward, terminated, truncated, info = env.step("<search>anything</search>")
        assert "score must be a finite number" in info["retrieval_error"] and not terminated


@pytest.mark.parametrize(
    "payload,message",
    [
        ({"result": []}, "expected 1 result lists"),
        ({"results": [[]]}, 'expected {"result": [...]}'),
        ({"result": [[{"document": {"id": "x"}, "score": 1}]]}, "needs 'contents' or 'text'"),
        ({"result": [["just a string"]]}, "must be a JSON object"),
        ({"result": [[{"document": {"contents": "c"}, "score": "NaN"}]]}, "score must be a finite number"),
    ],
)
def test_answers_in_the_wrong_shape(payload, message):
    with canned_server(json_answer(payload)) as url:
        client = HTTPRetriever(url, retries=3)
        with pytest.raises(RetrievalError, match="not Search-R1's /retrieve format") as info:
            client.search(["paris"], 3)
    assert message in str(info.value)
    assert client.error_count == 1 and client.request_count == 1  # garbage is not retried


def test_non_json_answer():
    with canned_server(lambda _b: (200, b"<html>gateway</html>", {"Content-Type": "text/html"})) as url:
        client = HTTPRetriever(url)
        with pytest.raises(RetrievalError, match=r"the body is not JSON .*<html>gateway"):
            client.search(["paris"], 3)
    assert client.error_count == 1


def test_non_http_junk():
    with junk_server(b"\x00\x01\x02 definitely not http\r\n\r\n") as url:
        client = HTTPRetriever(url, retries=3, backoff=0.01)
        with pytest.raises(
            RetrievalError, match=r"after 1 attempt\(s\): the answer is not HTTP \(not an HTTP status line"
        ):
            client.search(["paris"], 3)
    assert client.error_count == 1


def test_a_server_that_hangs_up_without_answering():
    with junk_server(b"") as url:
        client = HTTPRetriever(url, retries=1, backoff=0.01)
        with pytest.raises(RetrievalError, match="closed the connection without answering"):
            client.search(["paris"], 3)
    assert client.request_count == 2


def test_error_statuses_show_the_servers_message_and_only_overload_is_retried():
    with canned_server(json_answer({"error": "index not loaded"}, status=500)) as url:
        client = HTTPRetriever(url, retries=3, backoff=0.01)
        with pytest.raises(RetrievalError, match="HTTP 500: index not loaded"):
            client.search(["paris"], 3)
        assert client.request_count == 1
    with canned_server(json_answer({"detail": "busy"}, status=503)) as url:
        client = HTTPRetriever(url, retries=2, backoff=0.01)
        with pytest.raises(RetrievalError, match=r"after 3 attempt\(s\): HTTP 503: busy"):
            client.search(["paris"], 3)
        assert client.request_count == 3 and client.retry_count == 2


@needs_server
def test_a_4xx_from_our_server_names_the_cap(small):
    from searchgym.retrieval.server_protocol import RequestLimits

    with RetrievalServer(small, ServerConfig(port=0, limits=RequestLimits(max_topk=2))) as srv:
        client = HTTPRetriever(srv.url)
        with pytest.raises(RetrievalError, match="HTTP 400: 'topk' is over the server's cap max_topk=2"):
            client.search(["paris"], 3)


def test_search_r1_answer_variants_chunked_and_http10():
    # Search-R1's BM25 server: title/text/contents and no id; its dense server: id/contents.
    items = [
        {
            "document": {
                "title": "Paris",
                "text": "capital of France",
                "contents": '"Paris"\ncapital of France',
            },
            "score": 2.5,
        },
        {"document": {"id": "7", "contents": '"Rome"\nancient city'}, "score": 1.0},
    ]
    want = [[Doc("", "Paris", "capital of France", 2.5), Doc("7", "Rome", "ancient city", 1.0)]]
    body = json.dumps({"result": [items]}).encode()

    def chunked(_b: bytes) -> tuple[int, bytes, dict[str, str]]:
        parts = [body[:10], body[10:]]
        data = b"".join(f"{len(p):x}\r\n".encode() + p + b"\r\n" for p in parts) + b"0\r\n\r\n"
        return 200, data, {"Transfer-Encoding": "chunked"}

    with canned_server(json_answer({"result": [items]})) as url:
        assert HTTPRetriever(url).search(["q"], 2) == want
    with canned_server(chunked) as url:
        client = HTTPRetriever(url)
        assert client.search(["q"], 2) == want
        assert client.search(["q"], 2) == want  # the connection stayed usable after a chunked body
    with canned_server(lambda _b: (200, body, {}), http10=True) as url:  # close-delimited body
        client = HTTPRetriever(url)
        assert client.search(["q"], 2) == want and client.search(["q"], 2) == want


@needs_server
def test_a_restarted_in_thread_server_is_picked_up_without_an_error(small):
    # The pooled keep-alive connection goes stale when the server restarts; the client
    # notices the closed socket and reconnects without counting an error or a retry.
    first = RetrievalServer(small, ServerConfig(port=0)).start()
    port = first.port
    client = HTTPRetriever(first.url)
    assert client.search(["paris"], 1) == small.search(["paris"], 1)
    first.stop()
    with RetrievalServer(small, ServerConfig(port=port)):
        assert client.search(["rome"], 1) == small.search(["rome"], 1)
    assert client.error_count == 0 and client.retry_count == 0


# -- a real server process, killed and restarted mid-episode ---------------------------------


def start_cli_server(index_dir: Path, port: int) -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, "-m", "searchgym", "serve", "--index", str(index_dir), "--port", str(port)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    line = proc.stdout.readline()
    if not re.search(rf"listening on http://127\.0\.0\.1:{port} ", line):
        proc.kill()
        raise AssertionError(f"the server did not start: {line!r}")
    return proc


def stop(proc: subprocess.Popen, sig: int = signal.SIGKILL) -> None:
    if proc.poll() is None:
        proc.send_signal(sig)
    proc.wait(timeout=30)


@needs_server
def test_env_survives_a_server_killed_mid_episode_and_recovers(tmp_path):
    world = generate_world(0)
    BM25Retriever(list(world.docs)).save(tmp_path / "idx")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = start_cli_server(tmp_path / "idx", port)
    try:
        env = gym.make("searchgym/SyntheticFacts-v1", retriever=url, max_turns=6)
        local = gym.make("searchgym/SyntheticFacts-v1", max_turns=6)  # in-process BM25, same world
        client = env.unwrapped.retriever
        assert isinstance(client, HTTPRetriever)
        question = world.questions[0].question
        env.reset(seed=0, options={"index": 0})
        local.reset(seed=0, options={"index": 0})
        action = f"<search>{question}</search>"

        obs, reward, terminated, truncated, info = env.step(action)
        assert obs == local.step(action)[0]
        assert "retrieval_error" not in info and info["retrieved_ids"][0]

        stop(proc)  # SIGKILL: no goodbye on the sockets
        obs, reward, terminated, truncated, info = env.step(action)
        assert "The search failed" in obs and "ConnectionRefusedError" in info["retrieval_error"]
        assert (reward, terminated, truncated) == (0.0, False, False)
        assert client.error_count == 1

        proc = start_cli_server(tmp_path / "idx", port)  # same port: the client recovers by itself
        obs, reward, terminated, truncated, info = env.step(action)
        assert "retrieval_error" not in info
        assert obs == local.step(action)[0]
        assert info["num_searches"] == 3 and client.error_count == 1

        obs, reward, terminated, truncated, info = env.step("<answer>whatever</answer>")
        assert terminated and info["answer"] == "whatever"
    finally:
        stop(proc)


@pytest.mark.parametrize("fault", ["slow", "garbage"])
def test_env_turns_a_slow_or_garbled_server_into_an_error_observation(fault):
    answer = json_answer({"result": [[]]}) if fault == "slow" else json_answer({"oops": True})
    with canned_server(answer, delay=5.0 if fault == "slow" else 0.0) as url:
        client = HTTPRetriever(url, timeout=0.2, retries=0)
        env = gym.make("searchgym/SyntheticFacts-v1", retriever=client)
        env.reset(seed=0)
        obs, reward, terminated, truncated, info = env.step("<search>anything</search>")
        expected = (
            "no whole answer within timeout=0.2 s" if fault == "slow" else "not Search-R1's /retrieve format"
        )
        assert expected in info["retrieval_error"] and "The search failed" in obs
        assert not terminated and client.error_count == 1
        obs, reward, terminated, truncated, info = env.step("<answer>x</answer>")
        assert terminated and info["answer"] == "x"
