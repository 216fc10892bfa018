"""Per-request cost of the HTTP client: searchgym's own connection against urllib3 and httpx.

Starts ``searchgym serve`` on a BM25 index of the shared corpus (cached as in
``benchmarks/server.py``) and sends the same one-query ``/retrieve`` requests, one at a time
from one thread (what one env does), through each client: searchgym's
:class:`~searchgym.retrieval.http_connection.HTTPConnection`, a ``urllib3``
``HTTPConnectionPool`` and an ``httpx.Client``. Each keeps one keep-alive connection. It
reports requests per second and p50 / p99 latency, the median of ``--repeats`` runs.

Usage::

    OMP_NUM_THREADS=1 python -m benchmarks.http_clients --out benchmarks/results/http_clients.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path

from benchmarks._common import REPO, SHARED_DATA
from benchmarks.server import build_index, load_queries, start_server
from searchgym.retrieval.http_connection import HTTPConnection


def searchgym_client(host: str, port: int) -> Callable[[bytes], bytes]:
    conn = HTTPConnection("http", host, port, deadline=time.monotonic() + 30.0)
    return lambda body: conn.request("POST", "/retrieve", body, deadline=time.monotonic() + 30.0)[1]


def urllib3_client(host: str, port: int) -> Callable[[bytes], bytes]:
    import urllib3

    pool = urllib3.HTTPConnectionPool(host, port, maxsize=1, timeout=30.0, retries=False)
    headers = {"Content-Type": "application/json"}
    return lambda body: pool.urlopen("POST", "/retrieve", body=body, headers=headers).data


def httpx_client(host: str, port: int) -> Callable[[bytes], bytes]:
    import httpx

    client = httpx.Client(base_url=f"http://{host}:{port}", timeout=30.0)
    headers = {"Content-Type": "application/json"}
    return lambda body: client.post("/retrieve", content=body, headers=headers).content


CLIENTS = {"searchgym": searchgym_client, "urllib3": urllib3_client, "httpx": httpx_client}


def run(send: Callable[[bytes], bytes], bodies: list[bytes]) -> tuple[float, float, float]:
    """Requests per second, p50 and p99 latency in ms of sending ``bodies`` one after another."""
    for body in bodies[:50]:  # warm up
        send(body)
    latencies = []
    start = time.perf_counter()
    for body in bodies:
        t0 = time.perf_counter()
        json.loads(send(body))
        latencies.append(time.perf_counter() - t0)
    rps = len(bodies) / (time.perf_counter() - start)
    latencies.sort()
    return rps, 1000 * latencies[len(latencies) // 2], 1000 * latencies[int(0.99 * (len(latencies) - 1))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", default=str(SHARED_DATA / "corpus.jsonl"))
    parser.add_argument("--cache-dir", default=str(REPO / "benchmarks" / ".cache" / "server"))
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--k", type=int, default=3)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    args.backend, args.corpus_limit, args.workers, args.max_batch_size, args.max_wait_ms = (
        "bm25",
        0,
        1,
        64,
        5.0,
    )

    _, index_dir = build_index(args)
    queries = load_queries(args.requests)
    bodies = [json.dumps({"queries": [q], "topk": args.k, "return_scores": True}).encode() for q in queries]
    proc, url = start_server(index_dir, args, batching=True)
    host, port = url.removeprefix("http://").rsplit(":", 1)
    results = {}
    try:
        for name, make in CLIENTS.items():
            runs = [run(make(host, int(port)), bodies) for _ in range(args.repeats)]
            rps, p50, p99 = (statistics.median(r[i] for r in runs) for i in range(3))
            results[name] = {"requests_per_s": rps, "p50_ms": p50, "p99_ms": p99}
            print(f"{name:10s} {rps:7.0f} req/s  p50 {p50:.3f} ms  p99 {p99:.3f} ms", flush=True)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    if args.out:
        report = {
            "command": "OMP_NUM_THREADS=1 python -m benchmarks.http_clients --out " + str(args.out),
            "requests": len(bodies),
            "repeats": args.repeats,
            "clients": results,
            "machine": {
                "python": platform.python_version(),
                "cores": os.cpu_count(),
                "load_average_at_start": os.getloadavg(),
            },
        }
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
