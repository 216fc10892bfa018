"""The stores and the retrieval server under faults: does each promise of the docs hold?

Each check injects one fault, on loopback and in a temporary folder, and checks the promise
that ``docs/stores.md`` or ``docs/hardening.md`` states for it; the result file records the
trials and how many held. The whole battery takes a couple of minutes.

=====================  ==========================================================================
``writer_kill``        a writer ``kill -9``-ed at a random instant of its appends: every
                       acknowledged record is stored, none twice
``file_cut_short``     the database cut to half its size: ``repair`` keeps readable records,
                       only records that were written, and the store opens again
``disk_full``          appends until the file size limit (``RLIMIT_FSIZE``) stops them: one line
                       naming the file, and every acknowledged record is there after
``actor_kill``         the Ray store actor killed (Ray restarts it) during appends and step
                       counts: every acknowledged record and the exact step count survive; a
                       client with a cached handle finds a recreated actor, and without one
                       says in one line that the actor was ended
``slow_readers``       clients that ask for 20 MB answers and never read: dropped after
                       ``send_timeout_s``, a normal query answered meanwhile
``idle_burst``         60 idle connections at once against ``max_connections=50``: no 503
``parser_errors``      requests aiohttp's parser refuses: a 4xx in the JSON error shape
=====================  ==========================================================================

Usage::

    OMP_NUM_THREADS=1 python benchmarks/hardening_battery.py --out benchmarks/results/hardening_battery.json
    python benchmarks/render_docs.py          # the table in docs/hardening.md
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import write_report  # noqa: E402

COMMAND = (
    "OMP_NUM_THREADS=1 python benchmarks/hardening_battery.py --out benchmarks/results/hardening_battery.json"
)

_WRITER = """
import sys
from searchgym.envs.storage import SqliteLog
log = SqliteLog(sys.argv[1], schema=None)
acks = open(sys.argv[2], "a", buffering=1)
for i in range(int(sys.argv[3]), 10**9):
    log.append({"id": f"r{i}", "n": i % 7}, key=f"k{i}")
    acks.write(f"r{i}\\n")  # only once append() returned: acknowledged
"""


def _ids(path: Path) -> list[str]:
    from searchgym.envs.storage import SqliteLog

    log = SqliteLog(str(path), schema=None)
    try:
        return [r["id"] for r in log.read()[0]]
    finally:
        log.close()


def writer_kill(folder: Path, trials: int, rng: random.Random) -> dict[str, Any]:
    path, acks = folder / "log.sqlite", folder / "acks.txt"
    held, acknowledged = 0, 0
    for trial in range(trials):
        start = len(acks.read_text().split()) if acks.exists() else 0
        proc = subprocess.Popen(
            [sys.executable, "-c", _WRITER, str(path), str(acks), str(start + trial * 10**6)]
        )
        deadline = time.monotonic() + 60
        while (not acks.exists() or len(acks.read_text().split()) <= start) and time.monotonic() < deadline:
            time.sleep(0.05)  # until it appends
        time.sleep(rng.uniform(0.0, 0.5))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        acked = acks.read_text().split()
        stored = _ids(path)
        held += set(acked) <= set(stored) and len(stored) == len(set(stored))
        acknowledged = len(acked)
    return {
        "trials": trials,
        "held": held,
        "detail": f"{acknowledged:,} acknowledged records, none lost or doubled",
    }


def file_cut_short(folder: Path, trials: int, rng: random.Random) -> dict[str, Any]:
    from searchgym.envs.storage import SqliteLog

    held, kept_total, written_total = 0, 0, 0
    for trial in range(trials):
        path = folder / f"cut{trial}.sqlite"
        log = SqliteLog(str(path), schema=None)
        written = [f"q{trial}-{i:05d}" for i in range(1500)]
        for name in written:
            log.append({"id": name, "n": 1})
        log.close()
        for suffix in ("-wal", "-shm"):
            Path(f"{path}{suffix}").unlink(missing_ok=True)
        size = path.stat().st_size
        with open(path, "r+b") as handle:
            handle.truncate(int(size * rng.uniform(0.4, 0.6)))
        report = SqliteLog(str(path), schema=None).repair()
        stored = _ids(path)
        held += (
            0 < report.kept == len(stored) and set(stored) <= set(written) and len(stored) == len(set(stored))
        )
        kept_total += len(stored)
        written_total += len(written)
    return {
        "trials": trials,
        "held": held,
        "detail": f"{kept_total:,} of {written_total:,} records kept from files cut to 40-60%",
    }


_FULL = """
import resource, sys
from searchgym.envs.errors import DataFileError
from searchgym.envs.storage import SqliteLog
resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv[3]), int(sys.argv[3])))
log = SqliteLog(sys.argv[1], schema=None)
acks = open(sys.argv[2], "a", buffering=1)
try:
    for i in range(10**6):
        log.append({"id": f"r{i}", "n": i % 7, "pad": "x" * 200})
        acks.write(f"r{i}\\n")
except DataFileError as exc:
    print(exc)
"""


def disk_full(folder: Path, trials: int, rng: random.Random) -> dict[str, Any]:
    held, lines = 0, []
    for trial in range(trials):
        path, acks = folder / f"full{trial}.sqlite", folder / f"full{trial}.acks"
        limit = rng.randrange(200_000, 600_000)
        run = subprocess.run(
            [sys.executable, "-c", _FULL, str(path), str(acks), str(limit)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        out = run.stdout.strip()
        acked = acks.read_text().split() if acks.exists() else []
        stored = _ids(path)
        one_line = run.returncode == 0 and out.count("\n") == 0 and str(path) in out
        held += one_line and set(acked) <= set(stored)
        lines.append(out)
    return {"trials": trials, "held": held, "detail": f"the line: {lines[-1][:160]}"}


def actor_kill(folder: Path, trials: int, rng: random.Random) -> dict[str, Any]:
    import ray

    from searchgym.envs.errors import SearchGymError
    from searchgym.envs.records import Action, Question, Trajectory, Turn
    from searchgym.trainers import ray_store

    def trajectory(qid: str) -> Trajectory:
        turn = Turn("a:x", Action(kind="answer", answer="x"))
        return Trajectory(Question(qid, f"{qid}?", ("x",)), "search_r1", [turn], reward=1.0)

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        name = f"battery-{os.getpid()}"
        owner = ray_store.StoreClient(name, ray_store.StoreSpec(str(folder / "memory"), {"update_every": 5}))
        memory = ray_store.RemoteMemory(ray_store.StoreClient(name))
        owner.call("status")
        acked, held, step, broken = [], 0, 0, []
        for trial in range(trials):
            for _ in range(rng.randrange(20, 60)):
                qid = f"t{trial}-{len(acked)}"
                memory.add(trajectory(qid))
                acked.append(qid)
            step += rng.randrange(1, 9)
            memory.steps = step
            ray.kill(memory.client.actor, no_restart=False)  # Ray restarts it from its files
            seen = (len(memory), memory.steps)
            held += seen == (len(acked), step)
            if seen != (len(acked), step):
                broken.append(f"restart {trial}: {seen} for {(len(acked), step)}")
        ray.kill(memory.client.actor, no_restart=True)
        try:
            memory.client.call("status")
            ended = ""
        except SearchGymError as exc:
            ended = str(exc)
        owner.call("status")  # its cached handle died: it starts the actor again from its spec
        found = memory.steps == step and len(memory) == len(acked)
        held += "was ended" in ended and "\n" not in ended and found
        if not ("was ended" in ended and "\n" not in ended and found):
            broken.append(f"ended: {ended[:200]!r}, found {found}")
        ray.kill(owner.actor, no_restart=True)
    finally:
        ray.shutdown()
    return {
        "trials": trials + 1,
        "held": held,
        "detail": f"{len(acked):,} acknowledged records through {trials} restarts; step count {step} kept; "
        "an ended actor named in one line, a recreated one found" + "".join(f"; FAILED {b}" for b in broken),
    }


def _rss_mb() -> float:
    with open("/proc/self/status") as handle:
        line = next(x for x in handle if x.startswith("VmRSS:"))
    return int(line.split()[1]) / 1024


def slow_readers(folder: Path, trials: int, rng: random.Random) -> dict[str, Any]:
    from searchgym.envs.records import Doc
    from searchgym.envs.retrieval import Retriever
    from searchgym.envs.retrieval.server import RetrievalServer
    from searchgym.envs.retrieval.service import ServerConfig

    class Bulky(Retriever):
        name = "bulky"
        docs = [Doc(f"b{i}", f"T{i}", "x" * 50_000) for i in range(100)]

        def search(self, queries: Any, k: int) -> list[list[Doc]]:
            return [self.docs[:k] for _ in queries]

    body = json.dumps({"queries": ["a", "b", "c", "d"], "topk": 100}).encode()
    head = (
        b"POST /retrieve HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
    )
    before = _rss_mb()
    with RetrievalServer(Bulky(), ServerConfig(port=0, send_timeout_s=2.0)) as srv:
        readers = []
        for _ in range(trials):
            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.connect(("127.0.0.1", srv.port))
            sock.sendall(head % len(body) + body)
            readers.append(sock)
        status, seconds = _query(srv.port)
        peak = _rss_mb()
        deadline = time.monotonic() + 60
        while _stats(srv.port)["slow_readers"] < trials and time.monotonic() < deadline:
            time.sleep(0.2)
        dropped = _stats(srv.port)["slow_readers"]
        for sock in readers:
            sock.close()
        time.sleep(1.0)
        after = _rss_mb()
    return {
        "trials": trials,
        "held": min(dropped, trials) if status == 200 else 0,
        "detail": f"{dropped} of {trials} 20 MB answers dropped after send_timeout_s=2; a normal query "
        f"answered 200 in {seconds:.2f} s meanwhile; RSS {before:.0f} MB before, {peak:.0f} MB while held, {after:.0f} MB after",
    }


def _query(port: int) -> tuple[int, float]:
    import http.client

    start = time.monotonic()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        conn.request("POST", "/retrieve", body=b'{"queries": ["a"], "topk": 1}')
        response = conn.getresponse()
        response.read()
        return response.status, time.monotonic() - start
    finally:
        conn.close()


def _stats(port: int) -> dict[str, Any]:
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("GET", "/stats")
        return json.loads(conn.getresponse().read())
    finally:
        conn.close()


def _small_server() -> Any:
    from searchgym.envs.records import Doc
    from searchgym.envs.retrieval import BM25Retriever

    return BM25Retriever([Doc("d1", "Paris", "capital of France"), Doc("d2", "Rome", "city in Italy")])


def idle_burst(folder: Path, trials: int, rng: random.Random) -> dict[str, Any]:
    from searchgym.envs.retrieval.server import RetrievalServer
    from searchgym.envs.retrieval.service import ServerConfig

    held, refused = 0, 0
    for _ in range(trials):
        with RetrievalServer(_small_server(), ServerConfig(port=0, max_connections=50)) as srv:
            idle = [socket.create_connection(("127.0.0.1", srv.port), timeout=5) for _ in range(60)]
            time.sleep(0.5)
            status, _ = _query(srv.port)
            counters = _stats(srv.port)
            refused += counters["refused_connections"]
            held += status == 200 and counters["refused_connections"] == 0
            for sock in idle:
                sock.close()
    return {"trials": trials, "held": held, "detail": f"{refused} answered 503 over {trials} bursts of 60"}


_HOSTILE = [
    b"POST /retrieve HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    b"POST /retrieve HTTP/1.1\r\nHost: t\r\nX-Big: " + b"a" * 20_000 + b"\r\n\r\n",
    b"POST /retrieve HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nab\r\n0\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost t\r\n\r\n",
    b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + bytes(64),  # a TLS hello
]


def parser_errors(folder: Path, trials: int, rng: random.Random) -> dict[str, Any]:
    from searchgym.envs.retrieval.server import RetrievalServer
    from searchgym.envs.retrieval.service import ServerConfig

    held = 0
    with RetrievalServer(_small_server(), ServerConfig(port=0)) as srv:
        for data in _HOSTILE:
            sock = socket.create_connection(("127.0.0.1", srv.port), timeout=5)
            sock.sendall(data)
            answer = b""
            try:
                while chunk := sock.recv(65536):
                    answer += chunk
            except OSError:
                pass
            sock.close()
            head, _, body = answer.partition(b"\r\n\r\n")
            try:
                error = json.loads(body)["error"]
            except (ValueError, KeyError, TypeError):
                error = None
            held += head[9:10] == b"4" and b"application/json" in head and isinstance(error, str)
        normal = _query(srv.port)[0] == 200
    return {
        "trials": len(_HOSTILE),
        "held": held if normal else 0,
        "detail": "both Content-Length and Transfer-Encoding, a 20 KB header, a bad chunk size, a header "
        "without a colon, a TLS hello",
    }


CHECKS: dict[str, tuple[str, Callable[[Path, int, random.Random], dict[str, Any]], int]] = {
    "writer_kill": ("a writer `kill -9`-ed during appends", writer_kill, 8),
    "file_cut_short": ("the database file cut short, then `repair`", file_cut_short, 3),
    "disk_full": ("the file size limit reached during appends", disk_full, 3),
    "actor_kill": ("the Ray store actor killed, restarted and ended", actor_kill, 3),
    "slow_readers": ("clients that never read their 20 MB answers", slow_readers, 8),
    "idle_burst": ("60 idle connections at once, `max_connections=50`", idle_burst, 2),
    "parser_errors": ("requests the HTTP parser refuses", parser_errors, 1),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--only", nargs="*", default=None, help="run only these checks")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    resource.setrlimit(resource.RLIMIT_NOFILE, (4096, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    results = []
    for name, (fault, check, trials) in CHECKS.items():
        if args.only and name not in args.only:
            continue
        start = time.monotonic()
        with tempfile.TemporaryDirectory(prefix=f"battery-{name}-") as folder:
            result = check(Path(folder), trials, random.Random(args.seed))
        result = {"check": name, "fault": fault, **result, "seconds": round(time.monotonic() - start, 1)}
        print(json.dumps(result), flush=True)
        results.append(result)
    write_report(args.out, {"checks": results, "seed": args.seed})


if __name__ == "__main__":
    main()
