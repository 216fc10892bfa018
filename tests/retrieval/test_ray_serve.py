"""Tests for the Ray Serve deployment of the retrieval server."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from pathlib import Path

import pytest

pytest.importorskip("aiohttp", reason="the server needs aiohttp: pip install 'searchgym[serve]'")

from searchgym.error import InvalidArgumentError, RetrievalError
from searchgym.retrieval import BM25Retriever
from searchgym.retrieval.http_client import HTTPRetriever
from searchgym.retrieval.records import Doc
from searchgym.retrieval.server_protocol import RequestLimits
from searchgym.trainers.ray_serve import RayServeConfig, RetrievalReplica, serve_with_ray

DOCS = [
    Doc("d1", "Paris", "capital of France"),
    Doc("d2", "Berlin", "capital of Germany"),
    Doc("d3", "Rome", "ancient city in Italy"),
]


@pytest.fixture(scope="module")
def index_dir(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("ray") / "idx"
    BM25Retriever(DOCS).save(path)
    return path


class FakeRequest:
    """What a replica reads from Starlette's Request: method, url.path, headers, body()."""

    def __init__(self, method: str, path: str, body: bytes = b"") -> None:
        self.method = method
        self.url = type("URL", (), {"path": path})()
        self.headers = {"content-length": str(len(body))}
        self._body = body

    async def body(self) -> bytes:
        return self._body


def call(replica: RetrievalReplica, method: str, path: str, body: bytes = b"") -> tuple[int, dict]:
    response = asyncio.run(replica(FakeRequest(method, path, body)))
    return response.status_code, json.loads(response.body)


def test_replica_answers_like_the_plain_server(index_dir):
    pytest.importorskip("starlette")
    replica = RetrievalReplica(RayServeConfig(index=str(index_dir), limits=RequestLimits(max_queries=2)))
    status, body = call(
        replica, "POST", "/retrieve", b'{"queries": ["berlin"], "topk": 2, "return_scores": true}'
    )
    assert status == 200
    score = BM25Retriever(DOCS).search(["berlin"], 2)[0][0].score
    assert body == {
        "result": [[{"document": {"id": "d2", "contents": '"Berlin"\ncapital of Germany'}, "score": score}]]
    }
    status, body = call(replica, "POST", "/retrieve", b'{"queries": ["a", "b", "c"]}')
    assert status == 413 and body["cap"] == "max_queries" and body["limit"] == 2
    assert call(replica, "POST", "/retrieve", b"junk")[0] == 400
    assert call(replica, "GET", "/retrieve")[0] == 405
    assert call(replica, "GET", "/nope")[0] == 404
    status, body = call(replica, "GET", "/health")
    assert status == 200 and body["num_docs"] == 3 and body["backend"] == "bm25"
    status, body = call(replica, "GET", "/stats")
    assert (
        body["requests"] == 3
        and body["queries"] == 1
        and body["errors"] == {"400": 1, "404": 1, "405": 1, "413": 1}
    )


def test_config_is_validated_before_ray_starts(index_dir):
    with pytest.raises(InvalidArgumentError, match="replicas must be an int >= 1"):
        RayServeConfig(index=str(index_dir), replicas=0)
    with pytest.raises(InvalidArgumentError, match="max_batch_size must be an int >= 1"):
        RayServeConfig(index=str(index_dir), max_batch_size=0)


def test_two_replicas_on_ray_serve(index_dir, monkeypatch):
    ray = pytest.importorskip("ray")
    pytest.importorskip("ray.serve")
    # a busy 2-core machine answers Serve's proxy health checks late: give them time
    for name in ("HEALTH_CHECK_TIMEOUT_S", "READY_CHECK_TIMEOUT_S"):
        monkeypatch.setenv(f"RAY_SERVE_PROXY_{name}", "60")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    ray.init(num_cpus=2, include_dashboard=False, object_store_memory=100 * 1024**2, log_to_driver=False)
    try:
        config = RayServeConfig(
            index=str(index_dir), replicas=2, num_cpus_per_replica=0.5, port=port, idle_timeout_s=1.5
        )
        handle = serve_with_ray(config)
        try:
            client = HTTPRetriever(handle.url, timeout=60)
            queries = ["paris", "rome italy", "capital", ""]
            for _ in range(3):
                assert client.search(queries, 2) == BM25Retriever(DOCS).search(queries, 2)
            health = client.health()
            assert health["num_docs"] == 3 and health["backend"] == "bm25" and health["replica"]
            bad = HTTPRetriever(handle.url, retries=0)
            with pytest.raises(
                RetrievalError, match="HTTP 400: 'topk' is over the server's cap max_topk=100"
            ):
                bad.search(["paris"], 101)
            assert client.error_count == 0
            # The proxy closes a keep-alive connection idle for idle_timeout_s (rounded up: 2 s),
            # not after uvicorn's default 90 s.
            with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
                sock.sendall(b"GET /health HTTP/1.1\r\nHost: t\r\n\r\n")
                answer, start = sock.recv(65536), time.monotonic()
                assert answer.startswith(b"HTTP/1.1 200")
                sock.settimeout(20)
                while sock.recv(65536):
                    pass
                assert time.monotonic() - start < 10
        finally:
            handle.shutdown()
    finally:
        ray.shutdown()
