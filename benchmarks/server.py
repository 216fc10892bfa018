"""Throughput and latency of the retrieval server against the same retriever in-process.

Builds (or reuses) an index of the shared corpus in a cache directory, starts
``searchgym serve`` on it in a subprocess on a free loopback port, and sends one-query
requests from 1, 8 and 64 client threads through :class:`HTTPRetriever` (what an env uses),
first with dynamic batching on and then with it off (``--no-batching``), plus one client
that sends ``--max-batch-size`` queries per request (as a vector env does). For each run it
reports queries per second, p50 and p99 latency, and the mean number of queries per search
call on the server (from ``GET /stats``). The baseline is the same retriever in-process:
batched calls of ``--max-batch-size`` queries (the limit a server can approach) and calls
of one query.

Usage::

    python -m benchmarks.server --out server_bm25.json
    python -m benchmarks.server --workers 2            # two server processes on the port (serve --workers)
    python -m benchmarks.server --backend dense --corpus-limit 3000   # when dense is installed
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from benchmarks._common import REPO, SHARED_DATA, versions
from searchgym.retrieval import RETRIEVERS, Retriever, make_retriever
from searchgym.retrieval.corpus import read_jsonl
from searchgym.retrieval.http_client import HTTPRetriever

QA_SETS = ("nq", "triviaqa", "popqa", "hotpotqa", "2wikimultihopqa", "musique", "bamboogle")


@dataclass
class Run:
    """One load level against one server."""

    batching: bool
    clients: int
    queries_per_request: int
    requests: int
    qps: float
    p50_ms: float
    p99_ms: float
    mean_batch: float
    errors: int


def load_queries(limit: int) -> list[str]:
    """Questions of the shared open-domain QA sets, interleaved, up to ``limit``."""
    per_file = [
        [
            rec["question"]
            for _, rec in read_jsonl(SHARED_DATA / "questions" / f"{name}.jsonl", "question file")
        ]
        for name in QA_SETS
        if (SHARED_DATA / "questions" / f"{name}.jsonl").is_file()
    ]
    queries: list[str] = []
    for row in itertools.zip_longest(*per_file):
        queries.extend(q for q in row if isinstance(q, str) and q.strip())
    return queries[:limit]


def build_index(args: argparse.Namespace) -> tuple[Retriever, Path]:
    """The retriever, built from the corpus or reloaded from the cache directory."""
    index_dir = Path(args.cache_dir) / args.backend
    corpus = Path(args.corpus)
    if args.corpus_limit:
        subset = Path(args.cache_dir) / f"corpus_{args.corpus_limit}.jsonl"
        if not subset.is_file():
            subset.parent.mkdir(parents=True, exist_ok=True)
            with corpus.open(encoding="utf-8") as src, subset.open("w", encoding="utf-8") as dst:
                for i, line in enumerate(src):
                    if i >= args.corpus_limit:
                        break
                    dst.write(line)
        corpus = subset
    if args.backend not in RETRIEVERS:
        sys.exit(f"backend {args.backend!r} is not available in this install (known: {sorted(RETRIEVERS)})")
    start = time.perf_counter()
    retriever = make_retriever(args.backend, corpus_path=corpus, index_dir=index_dir)
    print(f"index ready in {time.perf_counter() - start:.1f} s: {index_dir}", flush=True)
    return retriever, index_dir


def in_process(retriever: Retriever, queries: list[str], batch: int, k: int) -> float:
    """Queries per second of ``retriever.search`` in calls of ``batch`` queries."""
    retriever.search(queries[:batch], k)  # warm up
    start = time.perf_counter()
    for i in range(0, len(queries), batch):
        retriever.search(queries[i : i + batch], k)
    return len(queries) / (time.perf_counter() - start)


def start_server(index_dir: Path, args: argparse.Namespace, batching: bool) -> tuple[subprocess.Popen, str]:
    command = [
        sys.executable,
        "-m",
        "searchgym",
        "serve",
        "--index",
        str(index_dir),
        "--backend",
        args.backend,
        "--port",
        "0",
        "--max-batch-size",
        str(args.max_batch_size),
        "--max-wait-ms",
        str(args.max_wait_ms),
    ]
    if not batching:
        command.append("--no-batching")
    if args.workers > 1:
        command += ["--workers", str(args.workers)]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    match = re.search(r"listening on (http://\S+)", line)
    if not match:
        proc.kill()
        sys.exit(f"the server did not start: {line!r}")
    return proc, match.group(1)


def load(
    url: str, queries: list[str], clients: int, total: int, k: int, per_request: int = 1
) -> tuple[float, list[float], int]:
    """Send ``total`` requests of ``per_request`` queries from ``clients`` threads.

    Returns:
        Queries per second, the latency of every request in seconds, and the errors.
    """
    client = HTTPRetriever(url, timeout=60.0, retries=0, max_queries_per_request=max(per_request, 1))
    latencies: list[list[float]] = [[] for _ in range(clients)]
    counter = iter(range(total))
    lock = threading.Lock()
    barrier = threading.Barrier(clients + 1)

    def worker(slot: int) -> None:
        barrier.wait()
        mine = latencies[slot]
        while True:
            with lock:
                i = next(counter, None)
            if i is None:
                return
            batch = [queries[(i * per_request + j) % len(queries)] for j in range(per_request)]
            start = time.perf_counter()
            try:
                client.search(batch, k)
            except Exception:  # counted by client.error_count
                pass
            mine.append(time.perf_counter() - start)

    elapsed = run_together(worker, [(s,) for s in range(clients)], barrier)
    client.close()
    return total * per_request / elapsed, [x for xs in latencies for x in xs], client.error_count


def run_together(target: Any, arguments: list[tuple], barrier: threading.Barrier) -> float:
    """Run ``target`` on each argument tuple in its own thread; the threads start together at
    ``barrier`` (which ``target`` waits on). Returns the seconds until the last one ends."""
    threads = [threading.Thread(target=target, args=args) for args in arguments]
    for thread in threads:
        thread.start()
    barrier.wait()
    start = time.perf_counter()
    for thread in threads:
        thread.join()
    return time.perf_counter() - start


def server_totals(url: str, workers: int) -> dict[str, int]:
    """Query and batch counts summed over the server's workers (each new connection may reach
    another worker, so ask until every worker has answered)."""
    probe, seen = HTTPRetriever(url), {}
    for _ in range(200):
        stats = probe.server_stats()
        probe.close()  # an idle connection would count as a batch-mate still to come
        seen[stats.get("pid")] = stats
        if len(seen) >= workers:
            break
    return {key: sum(s[key] for s in seen.values()) for key in ("queries", "batches")}


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def measure(
    url: str, queries: list[str], args: argparse.Namespace, batching: bool, clients: int, per_request: int
) -> Run:
    """One load level, repeated ``args.repeats`` times; the repeat with the median throughput is kept."""
    total = max(1, args.requests // per_request)
    load(url, queries, clients, min(200, total), args.k, per_request)  # warm up connections and caches
    trials: list[Run] = []
    for _ in range(args.repeats):
        before = server_totals(url, args.workers)
        qps, latencies, errors = load(url, queries, clients, total, args.k, per_request)
        after = server_totals(url, args.workers)
        trials.append(
            Run(
                batching=batching,
                clients=clients,
                queries_per_request=per_request,
                requests=total,
                qps=qps,
                p50_ms=1000 * percentile(latencies, 0.50),
                p99_ms=1000 * percentile(latencies, 0.99),
                mean_batch=(after["queries"] - before["queries"])
                / max(after["batches"] - before["batches"], 1),
                errors=errors,
            )
        )
    return sorted(trials, key=lambda run: run.qps)[len(trials) // 2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", default="bm25", help="bm25 or dense (default: %(default)s)")
    parser.add_argument("--corpus", default=str(SHARED_DATA / "corpus.jsonl"))
    parser.add_argument("--corpus-limit", type=int, default=0, help="index only the first N passages")
    parser.add_argument("--cache-dir", default=str(REPO / "benchmarks" / ".cache" / "server"))
    parser.add_argument("--clients", default="1,8,64", help="client thread counts (default: %(default)s)")
    parser.add_argument("--requests", type=int, default=3000, help="requests per run (default: %(default)s)")
    parser.add_argument("--queries", type=int, default=4000, help="distinct queries (default: %(default)s)")
    parser.add_argument("--k", type=int, default=3)
    parser.add_argument("--max-batch-size", type=int, default=64)
    parser.add_argument("--max-wait-ms", type=float, default=5.0)
    parser.add_argument("--workers", type=int, default=1, help="server processes (serve --workers)")
    parser.add_argument("--repeats", type=int, default=3, help="repeats of every measurement, median kept")
    parser.add_argument("--out", type=Path, help="write the figures as JSON")
    args = parser.parse_args()

    load_at_start = os.getloadavg()
    retriever, index_dir = build_index(args)
    queries = load_queries(args.queries)
    levels = [int(c) for c in args.clients.split(",")]
    batched = statistics.median(
        in_process(retriever, queries, args.max_batch_size, args.k) for _ in range(args.repeats)
    )
    single = statistics.median(
        in_process(retriever, queries[: min(len(queries), 1000)], 1, args.k) for _ in range(args.repeats)
    )
    print(f"in-process: {batched:.0f} q/s in calls of {args.max_batch_size}, {single:.0f} q/s one at a time")

    runs: list[Run] = []
    for batching in (True, False):
        proc, url = start_server(index_dir, args, batching)
        try:
            shapes = [(level, 1) for level in levels]
            if batching:
                shapes.append((1, args.max_batch_size))  # one client batching its own queries (a vector env)
            for clients, per_request in shapes:
                run = measure(url, queries, args, batching, clients, per_request)
                runs.append(run)
                print(
                    f"batching={'on ' if batching else 'off'} clients={clients:3d} x {per_request:2d} q/request: "
                    f"{run.qps:7.0f} q/s  p50 {run.p50_ms:8.2f} ms  p99 {run.p99_ms:8.2f} ms  "
                    f"mean batch {run.mean_batch:5.1f}  ({run.qps / batched:.0%} of in-process batched)",
                    flush=True,
                )
        finally:
            proc.terminate()
            proc.wait(timeout=30)

    print()
    print(
        "| batching | clients | queries/request | q/s | p50 ms | p99 ms | mean batch | "
        f"vs in-process batched ({batched:.0f} q/s) |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for r in runs:
        print(
            f"| {'on' if r.batching else 'off'} | {r.clients} | {r.queries_per_request} | {r.qps:.0f} | "
            f"{r.p50_ms:.2f} | {r.p99_ms:.2f} | {r.mean_batch:.1f} | {r.qps / batched:.0%} |"
        )
    if args.out:
        report = {
            "backend": args.backend,
            "corpus": args.corpus,
            "corpus_limit": args.corpus_limit,
            "passages": len(retriever),
            "k": args.k,
            "max_batch_size": args.max_batch_size,
            "max_wait_ms": args.max_wait_ms,
            "workers": args.workers,
            "in_process_batched_qps": batched,
            "in_process_single_qps": single,
            "runs": [asdict(r) for r in runs],
            "machine": {
                "python": platform.python_version(),
                "cpu": platform.processor() or platform.machine(),
                "cores": os.cpu_count(),
                "omp_num_threads": os.environ.get("OMP_NUM_THREADS", "unset"),
                "load_average_at_start": load_at_start,
                "load_average_at_end": os.getloadavg(),
                "versions": versions(),
            },
            "command": "python " + " ".join(sys.argv),
        }
        args.out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
