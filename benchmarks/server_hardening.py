"""The retrieval server under a hostile battery, while a normal query is timed throughout.

Starts ``searchgym serve --workers 2`` with its default caps and timeouts on a BM25 index of
the shared corpus, the server's open-file limit lowered to 1024 (``ulimit -n 1024``), and
runs these phases one after another. Throughout, a prober sends one normal query (a real
question, topk 3) on a new connection every 0.1 s and records its status and latency.

1. ``baseline``: nothing else.
2. ``bad input``: 600 malformed requests (not JSON, wrong types, over each cap, non-HTTP
   bytes, unknown routes) from 4 threads; every answer must be a 4xx.
3. ``slow connections``: 6,000 connections held open: 2,000 idle, 2,000 stopping inside
   their request head, 2,000 inside their body.
4. ``max-size requests``: 3 requests at once, each 1,024 queries of 3,900 characters with
   topk 16 (the ``max_results`` cap, 16,384 documents), and one over the cap (a 413).
5. ``kill -9 worker``: one worker killed; the parent (gunicorn's arbiter) starts a new one.
6. ``second server``: ``searchgym serve --workers 2`` on the same port must be refused.
7. ``kill -9 parent``: the parent killed; its workers must exit and free the port.

Usage::

    OMP_NUM_THREADS=1 python -m benchmarks.server_hardening --out benchmarks/results/server_hardening.json
    python -m benchmarks.render_docs          # the table in docs/hardening.md
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import platform
import resource
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from importlib.metadata import version
from pathlib import Path
from typing import Any

from benchmarks._common import REPO, SHARED_DATA
from benchmarks.server import build_index, load_queries

COMMAND = (
    "OMP_NUM_THREADS=1 python -m benchmarks.server_hardening --out benchmarks/results/server_hardening.json"
)


def post(port: int, body: bytes, timeout: float = 30.0, path: str = "/retrieve") -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("POST", path, body=body, headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


class Prober:
    """Sends one normal query on a new connection every ``every_s`` seconds, from a thread."""

    def __init__(self, port: int, queries: list[str], every_s: float = 0.1) -> None:
        self.port, self.queries, self.every_s = port, queries, every_s
        self.samples: list[tuple[float, int, float]] = []  # (time, status or 0 for an error, seconds)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        i = 0
        while not self._stop.is_set():
            body = json.dumps({"queries": [self.queries[i % len(self.queries)]], "topk": 3}).encode()
            start = time.monotonic()
            try:
                status, _ = post(self.port, body, timeout=10.0)
            except OSError:
                status = 0
            self.samples.append((start, status, time.monotonic() - start))
            i += 1
            self._stop.wait(max(0.0, self.every_s - (time.monotonic() - start)))

    def summary(self, since: float, until: float) -> dict[str, Any]:
        window = [s for s in self.samples if since <= s[0] <= until]
        ok = [seconds for _, status, seconds in window if status == 200]
        return {
            "probes": len(window),
            "answered_200": len(ok),
            "failed": len(window) - len(ok),
            "p50_ms": round(1000 * statistics.median(ok), 1) if ok else None,
            "max_ms": round(1000 * max(ok), 1) if ok else None,
            "within_1s": sum(seconds <= 1.0 for seconds in ok),
        }

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def children(pid: int) -> list[int]:
    """The server worker processes of ``pid`` (gunicorn's forked workers)."""
    try:
        return [int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (exited, not yet reaped by its parent) is gone as far as serving goes
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def stats(port: int) -> dict[str, Any]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", "/stats")
        return json.loads(conn.getresponse().read())
    finally:
        conn.close()


def bad_requests() -> list[bytes]:
    """Raw HTTP requests that must each get a 4xx answer."""
    head = "POST {path} HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nContent-Length: {n}\r\n\r\n"

    def request(body: bytes, path: str = "/retrieve") -> bytes:
        return head.format(path=path, n=len(body)).encode() + body

    bodies = [
        b"{not json",
        b"[]",
        b'{"queries": "one string"}',
        b'{"queries": [1, 2]}',
        b'{"queries": ["a"], "topk": -1}',
        b'{"queries": ["a"], "topk": 101}',
        b'{"queries": ["a"], "return_scores": "yes"}',
        json.dumps({"queries": ["x" * 10_001]}).encode(),
        json.dumps({"queries": ["a"] * 1025}).encode(),
        json.dumps({"queries": ["a"] * 200, "topk": 100}).encode(),
        b"\xff\xfe garbage",
        b"[" * 100_000,
    ]
    raw = [request(b) for b in bodies]
    raw.append(request(b"{}", "/nowhere"))
    raw.append(b"GET /retrieve HTTP/1.1\r\nHost: t\r\n\r\n")
    raw.append(b"\x00\x01\x02 not http at all\r\n\r\n")
    raw.append(b"POST /retrieve HTTP/1.1\r\nHost: t\r\nContent-Length: 99999999999\r\n\r\n")
    return raw


def send_raw(port: int, data: bytes) -> int:
    """Send ``data`` on a new connection; the status answered (0: closed without an answer)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(data)
        answer = b""
        while b"\r\n" not in answer:
            chunk = sock.recv(65536)
            if not chunk:
                break
            answer += chunk
    parts = answer.split(b" ", 2)
    return int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0


def phase_bad_input(port: int) -> dict[str, Any]:
    requests = bad_requests() * 40  # 640
    statuses: dict[int, int] = {}
    lock = threading.Lock()

    def worker(slot: int) -> None:
        for data in requests[slot::4]:
            status = send_raw(port, data)
            with lock:
                statuses[status] = statuses.get(status, 0) + 1

    threads = [threading.Thread(target=worker, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return {"requests": len(requests), "statuses": {str(k): v for k, v in sorted(statuses.items())}}


def phase_slow_connections(port: int, count: int, hold_s: float) -> dict[str, Any]:
    kinds = [
        ("idle", b""),
        ("partial head", b"POST /retrieve HTTP/1.1\r\nHost: t\r\nContent-Le"),
        (
            "partial body",
            b'POST /retrieve HTTP/1.1\r\nHost: t\r\nContent-Length: 100\r\n\r\n{"queries": ["pa',
        ),
    ]
    sockets: list[tuple[str, socket.socket]] = []
    opened_at = time.monotonic()
    failed_to_open = 0
    for i in range(count):
        name, data = kinds[i % len(kinds)]
        try:
            sock = socket.create_connection(("127.0.0.1", port), timeout=5)
            if data:
                sock.sendall(data)
            sock.setblocking(False)
            sockets.append((name, sock))
        except OSError:
            failed_to_open += 1
    open_seconds = time.monotonic() - opened_at
    time.sleep(hold_s)
    closed: dict[str, int] = {name: 0 for name, _ in kinds}
    answered_503 = 0
    for name, sock in sockets:
        try:
            data = sock.recv(65536)
            closed[name] += 1  # answered (503) or closed by the server
            answered_503 += data.startswith(b"HTTP/1.1 503")
        except BlockingIOError:
            pass  # still open
        except OSError:
            closed[name] += 1
        sock.close()
    return {
        "connections": count,
        "failed_to_open": failed_to_open,
        "seconds_to_open": round(open_seconds, 2),
        "held_s": hold_s,
        "closed_by_server": closed,
        "answered_503": answered_503,
    }


def phase_max_size(port: int, parent: int, questions: list[str]) -> dict[str, Any]:
    text = " ".join(questions)
    long_queries = [(text[i * 97 :] + " " + text)[:3900] for i in range(1024)]
    body = json.dumps({"queries": long_queries, "topk": 16, "return_scores": True}).encode()
    over = json.dumps({"queries": long_queries, "topk": 17}).encode()
    results: list[tuple[int, int, float]] = []
    peak = {"rss_mb": 0.0}
    done = threading.Event()

    def big(payload: bytes) -> None:
        start = time.monotonic()
        status, answer = post(port, payload, timeout=120)
        results.append((status, len(answer), time.monotonic() - start))

    def watch() -> None:
        while not done.is_set():
            peak["rss_mb"] = max(peak["rss_mb"], sum(rss_mb(p) for p in children(parent)))
            done.wait(0.05)

    before = sum(rss_mb(p) for p in children(parent))
    watcher = threading.Thread(target=watch)
    watcher.start()
    threads = [threading.Thread(target=big, args=(p,)) for p in (body, body, body, over)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    done.set()
    watcher.join()
    return {
        "request_bytes": len(body),
        "answers": [
            {"status": status, "bytes": size, "seconds": round(seconds, 2)}
            for status, size, seconds in sorted(results)
        ],
        "workers_rss_mb_before": round(before, 1),
        "workers_rss_mb_peak": round(peak["rss_mb"], 1),
    }


def phase_kill_worker(port: int, parent: int) -> dict[str, Any]:
    workers = children(parent)
    victim = workers[0]
    os.kill(victim, signal.SIGKILL)
    start = time.monotonic()
    while time.monotonic() - start < 60:
        now = children(parent)
        if len(now) == len(workers) and victim not in now:
            fresh = [p for p in now if p not in workers]
            # The new worker answers once it has loaded the index.
            pids = {stats(port)["pid"] for _ in range(30)}
            if fresh and fresh[0] in pids:
                return {"workers": len(workers), "seconds_to_replace": round(time.monotonic() - start, 2)}
        time.sleep(0.1)
    return {"workers": len(workers), "seconds_to_replace": None}


def phase_second_server(index_dir: Path, port: int) -> dict[str, Any]:
    """Start a second ``serve --workers 2`` on the held port: it must be refused."""
    command = [sys.executable, "-m", "searchgym", "serve", "--index", str(index_dir), "--port", str(port)]
    start = time.monotonic()
    result = subprocess.run([*command, "--workers", "2"], capture_output=True, text=True, timeout=120)
    return {
        "exit_code": result.returncode,
        "refused": f"Cannot listen on 127.0.0.1:{port}" in result.stderr,
        "seconds_to_exit": round(time.monotonic() - start, 2),
    }


def phase_kill_parent(proc: subprocess.Popen, port: int) -> dict[str, Any]:
    workers = children(proc.pid)
    proc.kill()
    proc.wait()
    start = time.monotonic()
    while time.monotonic() - start < 30 and any(alive(p) for p in workers):
        time.sleep(0.05)
    gone = not any(alive(p) for p in workers)
    seconds = round(time.monotonic() - start, 2)
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2):
            port_free = False
    except ConnectionRefusedError:
        port_free = True
    return {
        "workers": len(workers),
        "workers_exited": gone,
        "seconds_to_exit": seconds,
        "port_free": port_free,
    }


def start_server(index_dir: Path, nofile: int) -> tuple[subprocess.Popen, int]:
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]

    def limit_files() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, hard))

    command = [sys.executable, "-m", "searchgym", "serve", "--index", str(index_dir), "--port", "0"]
    proc = subprocess.Popen(
        [*command, "--workers", "2"], stdout=subprocess.PIPE, text=True, preexec_fn=limit_files
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if "listening on http://127.0.0.1:" not in line:
        proc.kill()
        sys.exit(f"the server did not start: {line!r}")
    return proc, int(line.split("listening on http://127.0.0.1:")[1].split(" ")[0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", default=str(SHARED_DATA / "corpus.jsonl"))
    parser.add_argument("--cache-dir", default=str(REPO / "benchmarks" / ".cache" / "server"))
    parser.add_argument(
        "--connections", type=int, default=6000, help="slow connections (default: %(default)s)"
    )
    parser.add_argument("--hold", type=float, default=5.0, help="seconds to hold them (default: %(default)s)")
    parser.add_argument("--server-nofile", type=int, default=1024, help="the server's ulimit -n")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    args.backend, args.corpus_limit = "bm25", 0

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, args.connections + 1000), hard))
    _, index_dir = build_index(args)
    questions = load_queries(4000)
    proc, port = start_server(index_dir, args.server_nofile)
    parent = proc.pid
    prober = Prober(port, questions)
    phases: list[dict[str, Any]] = []

    def run(name: str, action: Any) -> None:
        start = time.monotonic()
        outcome = action()
        end = time.monotonic()
        time.sleep(0.3)  # probes just after the phase count too
        phases.append(
            {
                "phase": name,
                "seconds": round(end - start, 2),
                **outcome,
                "normal_query": prober.summary(start, end + 0.3),
            }
        )
        print(json.dumps(phases[-1]), flush=True)

    try:
        run("baseline", lambda: (time.sleep(3.0), {})[1])
        run("bad input", lambda: phase_bad_input(port))
        run("slow connections", lambda: phase_slow_connections(port, args.connections, args.hold))
        run("max-size requests", lambda: phase_max_size(port, parent, questions))
        run("kill -9 worker", lambda: phase_kill_worker(port, parent))
        run("second server", lambda: phase_second_server(index_dir, port))
        counters = [stats(port) for _ in range(20)]
        by_pid = {c["pid"]: c for c in counters}
        prober.stop()
        phases.append({"phase": "kill -9 parent", **phase_kill_parent(proc, port)})
        print(json.dumps(phases[-1]), flush=True)
    finally:
        prober.stop()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    report = {
        "command": COMMAND,
        "server": f"searchgym serve --workers 2 (gunicorn {version('gunicorn')}, aiohttp {version('aiohttp')}), default caps and timeouts, ulimit -n "
        f"{args.server_nofile} (raised by the server to fit --max-connections)",
        "corpus": "shared corpus.jsonl, BM25",
        "phases": phases,
        "server_stats_per_worker": list(by_pid.values()),
        "machine": {
            "python": platform.python_version(),
            "cores": os.cpu_count(),
            "load_average": os.getloadavg(),
        },
    }
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
