"""``searchgym serve --workers 2`` against the same app under gunicorn's aiohttp worker.

Both serve the same BM25 index of the shared corpus (``benchmarks/.cache/server/bm25``,
built by ``benchmarks/server.py`` or here), with the same batching, caps and an idle timeout
of 2 s. For each load shape (1, 8 and 64 client threads sending one query per request, and
one client sending 64 queries per request) the two servers are started and measured in
turn, ``--repeats`` times (5), interleaved; the median of requests/s, p50 and p99 is kept and
the ratio gunicorn / pool reported. Then it checks the behaviours of each with
``max_connections`` 8 per worker (the pool; gunicorn has no such setting): 40 silent
connections, a silent connection,
a second server on the held port, ``kill -9`` of a worker and of the parent.

Usage::

    OMP_NUM_THREADS=1 python benchmarks/server_pool_vs_gunicorn.py \\
        --out benchmarks/results/server_pool_vs_gunicorn.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from _common import REPO, SHARED_DATA
from server import load, load_queries, percentile

from searchgym.envs.retrieval import make_retriever
from searchgym.envs.retrieval.http_client import HTTPRetriever

IDLE_TIMEOUT_S = 2.0
CAP, CROWD = 8, 40  # max_connections per worker in the checks, silent connections opened 10 ms apart
SHAPES = ((1, 1), (8, 1), (64, 1), (1, 64))  # (client threads, queries per request)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start(kind: str, index: Path, port: int, workers: int, max_connections: int = 1000) -> subprocess.Popen:
    """Start one server and wait until it answers (gunicorn has no ``max_connections``)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    if kind == "pool":
        command = [sys.executable, "-m", "searchgym", "serve", "--index", str(index), "--backend", "bm25"]
        command += ["--port", str(port), "--workers", str(workers), "--idle-timeout", str(IDLE_TIMEOUT_S)]
        command += ["--max-connections", str(max_connections)]
    else:
        app = f"searchgym.envs.retrieval.server:gunicorn_app({str(index)!r}, 'bm25', idle_timeout_s={IDLE_TIMEOUT_S})"
        command = [sys.executable, "-m", "gunicorn", "--worker-class", "aiohttp.GunicornWebWorker"]
        command += [
            "--workers",
            str(workers),
            "--bind",
            f"127.0.0.1:{port}",
            "--log-level",
            "warning",
            "--no-control-socket",
            app,
        ]
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit(f"{kind} exited with code {proc.returncode}: {command}")
        if len(worker_pids(f"http://127.0.0.1:{port}", workers, tries=4 * workers)) >= workers:
            return proc
        time.sleep(0.2)
    proc.kill()
    sys.exit(f"{kind} did not start")


def worker_pids(url: str, workers: int, tries: int = 200) -> set[int]:
    """The pids of the workers that answer ``/stats`` (each new connection may reach another)."""
    seen: set[int] = set()
    for _ in range(tries):
        probe = HTTPRetriever(url, timeout=2.0, retries=0)
        try:
            seen.add(int(probe.server_stats()["pid"]))
        except Exception:
            pass
        finally:
            probe.close()
        if len(seen) >= workers:
            break
    return seen


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def measure_shape(
    url: str, queries: list[str], clients: int, per_request: int, requests: int
) -> dict[str, float]:
    total = max(1, requests // per_request)
    load(url, queries, clients, min(200, total), 3, per_request)  # warm up
    qps, latencies, errors = load(url, queries, clients, total, 3, per_request)
    return {
        "requests_per_s": qps / per_request,
        "p50_ms": 1000 * percentile(latencies, 0.50),
        "p99_ms": 1000 * percentile(latencies, 0.99),
        "errors": errors,
    }


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is dead
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def checks(kind: str, index: Path, workers: int) -> dict[str, Any]:
    """The life-cycle behaviours of one server kind."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = start(kind, index, port, workers, max_connections=CAP)
    result: dict[str, Any] = {}
    try:
        # More silent connections than the workers' max_connections together: are old ones closed?
        crowd = []
        for _ in range(CROWD):
            crowd.append(socket.create_connection(("127.0.0.1", port)))
            time.sleep(0.01)  # one at a time, as clients arrive (not one accept burst)
        time.sleep(0.5 * IDLE_TIMEOUT_S)
        closed = refused = 0
        for sock in crowd:
            sock.settimeout(0.01)
            try:
                data = sock.recv(64)
                closed += data == b""
                refused += data.startswith(b"HTTP/1.1 503")
            except ConnectionError:
                closed += 1
            except TimeoutError:
                pass
            sock.close()
        result["over_max_connections"] = f"{closed} closed, {refused} answered 503"
        time.sleep(0.2)
        # A silent connection: closed after the idle timeout?
        with socket.create_connection(("127.0.0.1", port)) as sock:
            sock.settimeout(4 * IDLE_TIMEOUT_S)
            began = time.monotonic()
            try:
                closed = sock.recv(1) == b""
            except (TimeoutError, ConnectionError):
                closed = False
            result["silent_connection_closed_after_s"] = (
                round(time.monotonic() - began, 2) if closed else None
            )
        # A second server on the held port: refused, and how fast?
        began = time.monotonic()
        second = start_quiet(kind, index, port, workers)
        try:
            code = second.wait(timeout=30)
        except subprocess.TimeoutExpired:
            code = None
        result["second_server_on_port"] = (
            f"refused in {time.monotonic() - began:.1f} s" if code not in (None, 0) else "NOT refused"
        )
        if second.poll() is None:
            stop(second)
        # kill -9 of a worker: replaced?
        pids = worker_pids(url, workers)
        victim = min(pids)
        os.kill(victim, signal.SIGKILL)
        began, replaced = time.monotonic(), None
        while time.monotonic() - began < 30:
            now = worker_pids(url, workers, tries=4 * workers)
            if victim not in now and len(now) >= workers:
                replaced = round(time.monotonic() - began, 2)
                break
            time.sleep(0.1)
        result["worker_killed_replaced_after_s"] = replaced
        # kill -9 of the parent: do the workers stop?
        pids = worker_pids(url, workers)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        began, gone = time.monotonic(), None
        while time.monotonic() - began < 30:
            if not any(alive(pid) for pid in pids):
                gone = round(time.monotonic() - began, 2)
                break
            time.sleep(0.05)
        result["parent_killed_workers_exit_after_s"] = gone
    finally:
        if proc.poll() is None:
            stop(proc)
    return result


def start_quiet(kind: str, index: Path, port: int, workers: int) -> subprocess.Popen:
    """A second server on ``port``, not waited for."""
    if kind == "pool":
        command = [sys.executable, "-m", "searchgym", "serve", "--index", str(index), "--backend", "bm25"]
        command += ["--port", str(port), "--workers", str(workers)]
    else:
        app = f"searchgym.envs.retrieval.server:gunicorn_app({str(index)!r}, 'bm25')"
        command = [sys.executable, "-m", "gunicorn", "--worker-class", "aiohttp.GunicornWebWorker"]
        command += [
            "--workers",
            str(workers),
            "--bind",
            f"127.0.0.1:{port}",
            "--log-level",
            "critical",
            "--no-control-socket",
            app,
        ]
    return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--index", type=Path, default=REPO / "benchmarks" / ".cache" / "server" / "bm25")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--requests", type=int, default=2000, help="requests per single-query run")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()

    if not (args.index / "searchgym_bm25.json").is_file():
        make_retriever("bm25", corpus_path=SHARED_DATA / "corpus.jsonl", index_dir=args.index)
    queries = load_queries(4000)
    load_before = os.getloadavg()
    trials: dict[str, dict[str, list[dict[str, float]]]] = {"pool": {}, "gunicorn": {}}
    for repeat in range(args.repeats):
        for kind in ("pool", "gunicorn") if repeat % 2 == 0 else ("gunicorn", "pool"):
            port = free_port()
            proc = start(kind, args.index, port, args.workers)
            try:
                for clients, per_request in SHAPES:
                    requests = args.requests if per_request == 1 else max(1, args.requests // 10)
                    run = measure_shape(f"http://127.0.0.1:{port}", queries, clients, per_request, requests)
                    trials[kind].setdefault(f"{clients}x{per_request}", []).append(run)
                    print(
                        f"run {repeat + 1} {kind:8s} {clients:2d} clients x {per_request:2d} q: "
                        f"{run['requests_per_s']:7.0f} req/s  p50 {run['p50_ms']:6.2f}  p99 {run['p99_ms']:6.2f} ms",
                        flush=True,
                    )
            finally:
                stop(proc)
    load_after = os.getloadavg()

    shapes = []
    for clients, per_request in SHAPES:
        key = f"{clients}x{per_request}"
        medians = {
            kind: {
                m: statistics.median(t[m] for t in trials[kind][key])
                for m in ("requests_per_s", "p50_ms", "p99_ms")
            }
            for kind in trials
        }
        shapes.append(
            {
                "clients": clients,
                "queries_per_request": per_request,
                **{kind: medians[kind] for kind in medians},
                "gunicorn_over_pool_requests_per_s": medians["gunicorn"]["requests_per_s"]
                / medians["pool"]["requests_per_s"],
                "errors": {kind: sum(t["errors"] for t in trials[kind][key]) for kind in trials},
                "trials": {kind: trials[kind][key] for kind in trials},
            }
        )
    behaviours = {kind: checks(kind, args.index, args.workers) for kind in ("pool", "gunicorn")}
    for kind, result in behaviours.items():
        print(kind, result)
    report = {
        "command": "OMP_NUM_THREADS=1 python benchmarks/server_pool_vs_gunicorn.py --out "
        "benchmarks/results/server_pool_vs_gunicorn.json",
        "workers": args.workers,
        "index": "BM25 over shared/data/corpus.jsonl",
        "requests_per_run": args.requests,
        "repeats": args.repeats,
        "shapes": shapes,
        "behaviours": behaviours,
        "machine": {
            "python": platform.python_version(),
            "cores": os.cpu_count(),
            "load_average_before": load_before,
            "load_average_after": load_after,
            "gunicorn": version("gunicorn"),
            "aiohttp": version("aiohttp"),
        },
    }
    if args.out:
        args.out.write_text(json.dumps(report, indent=2), encoding="utf-8")
        print(f"wrote {args.out}")


def version(package: str) -> str:
    from importlib.metadata import version as dist_version

    return dist_version(package)


if __name__ == "__main__":
    main()
