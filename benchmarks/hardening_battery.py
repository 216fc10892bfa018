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
``repair_crash``       ``repair`` killed after a random file-system step: the old file or the
                       repaired one at the live path, finished by the next repair, nothing left over
``read_only``          the store on a read-only mount: ``memory repair`` says so in one line,
                       ``memory show`` reads it
``checkpoint_damage``  a built-in GRPO checkpoint's files cut, deleted, garbled or symlinked: the
                       resume refuses in one line naming the file; no checkpoint is removed
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

    OMP_NUM_THREADS=1 python -m benchmarks.hardening_battery --out benchmarks/results/hardening_battery.json
    python -m benchmarks.render_docs          # the table in docs/hardening.md
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

from benchmarks._common import write_report

COMMAND = (
    "OMP_NUM_THREADS=1 python -m benchmarks.hardening_battery --out benchmarks/results/hardening_battery.json"
)

_WRITER = """
import sys
from searchgym.storage import SqliteLog
log = SqliteLog(sys.argv[1], schema=None)
acks = open(sys.argv[2], "a", buffering=1)
for i in range(int(sys.argv[3]), 10**9):
    log.append({"id": f"r{i}", "n": i % 7}, key=f"k{i}")
    acks.write(f"r{i}\\n")  # only once append() returned: acknowledged
"""


def _ids(path: Path) -> list[str]:
    from searchgym.storage import SqliteLog

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
    from searchgym.storage import SqliteLog

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
from searchgym.error import DataFileError
from searchgym.storage import SqliteLog
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


_CRASHING_REPAIR = """
import os, sys
limit, calls = int(sys.argv[2]), [0]
def counted(name):
    real = getattr(os, name)
    def call(*args, **kwargs):
        result = real(*args, **kwargs)
        calls[0] += 1
        if calls[0] == limit:
            os._exit(70)  # killed right after this change to the file system
        return result
    return call
for name in ("rename", "replace", "link", "unlink", "remove", "fsync"):
    setattr(os, name, counted(name))
from searchgym.storage import SqliteLog
SqliteLog(sys.argv[1], schema=None).repair()
"""


def _damaged_log(path: Path, count: int) -> None:
    from searchgym.storage import SqliteLog

    log = SqliteLog(str(path), schema=None)
    for i in range(count):
        log.append({"id": f"r{i:05d}", "n": i % 7})
    log.close()
    with open(path, "r+b") as handle:
        handle.truncate(path.stat().st_size // 2)


def repair_crash(folder: Path, trials: int, rng: random.Random) -> dict[str, Any]:
    import shutil

    from searchgym.error import DataFileError

    pristine = folder / "pristine"
    pristine.mkdir()
    _damaged_log(pristine / "log.sqlite", 1500)
    reference = folder / "reference"
    shutil.copytree(pristine, reference)
    from searchgym.storage import SqliteLog

    SqliteLog(str(reference / "log.sqlite"), schema=None).repair()
    repaired = _ids(reference / "log.sqlite")
    held, points, broken = 0, [], []
    for trial in range(trials):
        limit = rng.randrange(1, 14)
        points.append(limit)
        copy = folder / f"crash{trial}"
        shutil.copytree(pristine, copy)
        path = copy / "log.sqlite"
        subprocess.run([sys.executable, "-c", _CRASHING_REPAIR, str(path), str(limit)], timeout=120)
        try:
            after = _ids(path)  # the next open finishes or rolls back the interrupted repair
            state_ok = after == repaired
        except DataFileError as exc:  # the old, damaged file is back at the live path
            state_ok = "is damaged" in str(exc)
        SqliteLog(str(path), schema=None).repair()
        leftovers = [p.name for p in copy.iterdir() if ".rebuilding-" in p.name or p.name.endswith(".repair")]
        ok = state_ok and _ids(path) == repaired and not leftovers
        held += ok
        if not ok:
            broken.append(f"killed after step {limit}: state {state_ok}, leftovers {leftovers}")
    return {
        "trials": trials,
        "held": held,
        "detail": f"repair killed after file-system steps {sorted(points)}: the old file or the repaired one "
        f"at the live path each time, {len(repaired):,} records after the repair finished"
        + "".join(f"; FAILED {b}" for b in broken),
    }


def read_only(folder: Path, trials: int, rng: random.Random) -> dict[str, Any]:
    import shlex
    import shutil

    from searchgym.memory import MemoryStore

    store = MemoryStore(folder / "store")
    for i in range(30):
        store.log("min_tool_calls").append({"id": f"q{i}", "n": i % 5}, None)
    store.close()

    def on_read_only(*command: str) -> subprocess.CompletedProcess[str]:
        line = " ".join(shlex.quote(part) for part in (sys.executable, "-m", "searchgym.cli", *command))
        target = shlex.quote(str(folder / "store"))
        if os.geteuid() != 0:
            (folder / "store").chmod(0o555)
            try:
                return subprocess.run(line, shell=True, capture_output=True, text=True, timeout=120)
            finally:
                (folder / "store").chmod(0o755)
        mount = f"mount --bind -o ro {target} {target}"
        return subprocess.run(
            ["unshare", "-m", "sh", "-c", f"{mount} && exec {line}"],
            capture_output=True,
            text=True,
            timeout=120,
        )

    if os.geteuid() == 0 and shutil.which("unshare") is None:
        return {
            "trials": 0,
            "held": 0,
            "detail": "not run: needs unshare(1) to mount a folder read-only as root",
        }
    repair = on_read_only("memory", "repair", str(folder / "store"))
    show = on_read_only("memory", "show", str(folder / "store"))
    if "mount:" in repair.stderr:
        return {"trials": 0, "held": 0, "detail": f"not run: {repair.stderr.strip()[:120]}"}
    said = repair.stderr.strip()
    repair_ok = repair.returncode == 2 and "\n" not in said and "Traceback" not in said
    show_ok = show.returncode == 0 and show.stdout.startswith(f"Store {folder / 'store'}")
    return {
        "trials": 2,
        "held": int(repair_ok) + int(show_ok),
        "detail": f"`memory repair` said: {said[:160]}; `memory show` read the store",
    }


def checkpoint_damage(folder: Path, trials: int, rng: random.Random) -> dict[str, Any]:
    import shutil

    from searchgym.error import DataFileError
    from searchgym.policies.tiny import build_tiny_lm
    from searchgym.trainers.config import TrainConfig
    from searchgym.trainers.grpo import GRPOTrainer

    tiny = folder / "tiny"
    build_tiny_lm(tiny, hidden_size=32, num_layers=1)

    def config(out: Path, steps: int) -> TrainConfig:
        return TrainConfig.from_dict(
            {
                "output_dir": str(out),
                "steps": steps,
                "env": {"id": "searchgym/SyntheticFacts-v1", "kwargs": {"reward": "f1", "max_turns": 2}},
                "model": {"tiny": {"dir": str(tiny), "hidden_size": 32, "num_layers": 1}},
                "rollout": {"group_size": 2, "questions_per_step": 1, "max_new_tokens": 4},
                "algo": {"kl_coef": 0.0, "micro_batch_size": 4},
                "checkpoint": {"every": 1, "keep_last": 5},
                "wandb": {"enabled": False},
            }
        )

    run = folder / "run"
    trainer = GRPOTrainer(config(run, 2), progress=False)
    trainer.train()
    trainer.close()

    def truncate(path: Path) -> None:
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])

    def garbage(path: Path) -> None:
        path.write_bytes(bytes(rng.randrange(256) for _ in range(path.stat().st_size)))

    def symlink(path: Path) -> None:
        outside = folder / f"outside-{path.name}"
        shutil.copyfile(path, outside)
        path.unlink()
        path.symlink_to(outside)

    damages = {
        "optimizer.pt cut in half": ("optimizer.pt", truncate),
        "trainer_state.json deleted": ("trainer_state.json", Path.unlink),
        "rng.pt overwritten with random bytes": ("rng.pt", garbage),
        "model weights cut in half": ("model/model.safetensors", truncate),
        "tokenizer.json deleted": ("model/tokenizer.json", Path.unlink),
        "scheduler.pt replaced by a symlink": ("scheduler.pt", symlink),
    }
    held, broken = 0, []
    for what, (name, damage) in damages.items():
        copy = shutil.copytree(run, folder / f"copy-{len(broken)}-{held}")
        target = copy / "checkpoints" / "step_000002" / name
        if not target.exists():
            broken.append(f"{what}: no {name} in the checkpoint")
            continue
        damage(target)
        try:
            resumed = GRPOTrainer(config(copy, 4), progress=False)
            resumed.setup()
            resumed.close()
            message = ""
        except DataFileError as exc:
            message = str(exc)
        steps_kept = sorted(p.name for p in (copy / "checkpoints").iterdir()) == [
            "step_000001",
            "step_000002",
        ]
        ok = bool(message) and "\n" not in message and "step_000002" in message and steps_kept
        held += ok
        if not ok:
            broken.append(f"{what}: {message[:120]!r}")
    return {
        "trials": len(damages),
        "held": held,
        "detail": f"{', '.join(damages)}: each refused in one line naming the file, both checkpoints kept"
        + "".join(f"; FAILED {b}" for b in broken),
    }


def actor_kill(folder: Path, trials: int, rng: random.Random) -> dict[str, Any]:
    import ray

    from searchgym.envs.records import Action, Question, Trajectory, Turn
    from searchgym.error import SearchGymError
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
    from searchgym.retrieval import Retriever
    from searchgym.retrieval.records import Doc
    from searchgym.retrieval.server import RetrievalServer
    from searchgym.retrieval.service import ServerConfig

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
    from searchgym.retrieval import BM25Retriever
    from searchgym.retrieval.records import Doc

    return BM25Retriever([Doc("d1", "Paris", "capital of France"), Doc("d2", "Rome", "city in Italy")])


def idle_burst(folder: Path, trials: int, rng: random.Random) -> dict[str, Any]:
    from searchgym.retrieval.server import RetrievalServer
    from searchgym.retrieval.service import ServerConfig

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
    from searchgym.retrieval.server import RetrievalServer
    from searchgym.retrieval.service import ServerConfig

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
    "repair_crash": ("`repair` killed after a random step", repair_crash, 4),
    "read_only": ("the store on a read-only disk: `repair` and `show`", read_only, 2),
    "checkpoint_damage": (
        "a GRPO checkpoint's files cut, deleted, garbled or symlinked",
        checkpoint_damage,
        6,
    ),
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
