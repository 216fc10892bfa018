"""Cost per episode of the two store backends: the file store and the Ray store actor.

An agent under OpenRLHF touches the stores four times per episode: it reads the bank at
reset (``memory.experience``), draws the few-shot example (``sample_few_shot``), scores
the episode through LightSearcher's minimum of searches (``lookup_and_lower``, one call)
and adds the finished trajectory (``add``). This script times those four calls, one agent,
against a store that already holds ``--prefill`` trajectories and a bank, for:

- ``file``: :class:`~searchgym.memory.ExperienceMemory` and
  :class:`~searchgym.envs.rewards.MinToolCallStore` on a local folder (this process);
- ``actor``: :class:`~searchgym.trainers.ray_store.RemoteMemory` and
  :class:`~searchgym.trainers.ray_store.RemoteMinToolCalls` against the store actor of a
  local Ray cluster (``ray.init(num_cpus=2)``): the same work plus one Ray round trip per call.

It also times the log itself against SQLite in WAL mode (``sqlite3``, ``synchronous=NORMAL``,
which like the log without ``fsync`` survives a killed process but not a power cut): one
trajectory record appended and the new records read back, per episode.

Trajectories are SyntheticFacts episodes of the oracle policy under LightSearcher's reward
(seed 0). Medians over ``--rounds`` rounds of ``--episodes`` episodes.

    OMP_NUM_THREADS=1 python benchmarks/store_backends.py --out benchmarks/results/store_backends.json
    python benchmarks/store_backends.py --table benchmarks/results/store_backends.json --doc docs/stores.md
"""

from __future__ import annotations

import argparse
import json
import random
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import gymnasium as gym

import searchgym  # noqa: F401  (registers the env ids)
from searchgym.envs.records import Trajectory
from searchgym.envs.rewards import MinToolCallStore
from searchgym.envs.storage import JsonlLog
from searchgym.memory import ExperienceMemory, trajectory_to_dict
from searchgym.policies import make_policy

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import write_report  # noqa: E402

BEGIN, END = "<!-- store_backends:begin -->", "<!-- store_backends:end -->"


def episodes(n: int) -> list[Trajectory]:
    """``n`` finished SyntheticFacts episodes (oracle policy, LightSearcher's reward)."""
    env = gym.make("searchgym/SyntheticFacts-v0", protocol="tool_call", reward="lightsearcher")
    agent = make_policy("oracle_synthetic", protocol="tool_call", world=env.unwrapped.world)
    out = []
    for seed in range(n):
        context, _ = env.reset(seed=seed)
        done = False
        while not done:
            action = agent.act([context])[0]
            obs, _, terminated, truncated, _ = env.step(action)
            context += action + obs
            done = terminated or truncated
        out.append(env.unwrapped.trajectory)
    return out


def one_episode(memory: Any, mins: Any, trajectory: Trajectory, rng: random.Random, times: dict) -> None:
    """The four store calls of one agent episode, each timed into ``times`` (seconds)."""
    t0 = time.perf_counter()
    _ = memory.experience
    t1 = time.perf_counter()
    memory.sample_few_shot(rng)
    t2 = time.perf_counter()
    mins.lookup_and_lower(trajectory.question.id, trajectory.num_searches)
    t3 = time.perf_counter()
    memory.add(trajectory)
    t4 = time.perf_counter()
    for key, seconds in (("bank", t1 - t0), ("example", t2 - t1), ("minimum", t3 - t2), ("add", t4 - t3)):
        times[key].append(seconds)
    times["episode"].append(t4 - t0)


def prefill(root: Path, trajectories: list[Trajectory], count: int) -> None:
    """``count`` trajectories and two bank versions in the store at ``root``."""
    memory = ExperienceMemory(root / "memory", update_every=1, summarizer="rule")
    mins = MinToolCallStore(root / "min_tool_calls.jsonl")
    for i in range(count):
        t = trajectories[i % len(trajectories)]
        memory.add(t)
        mins.update(t.question.id, t.num_searches)
        if i in (count // 2, count - 1):
            memory.step()


def time_backend(backend: str, root: Path, trajectories: list[Trajectory], args: argparse.Namespace) -> dict:
    if backend == "file":
        memory: Any = ExperienceMemory(root / "memory", update_every=1, summarizer="rule")
        mins: Any = MinToolCallStore(root / "min_tool_calls.jsonl")
    else:
        from searchgym.trainers import ray_store

        spec = ray_store.StoreSpec(
            str(root / "memory"),
            {"update_every": 1, "summarizer": "rule"},
            str(root / "min_tool_calls.jsonl"),
        )
        client = ray_store.StoreClient("bench-store", spec)
        memory, mins = ray_store.RemoteMemory(client), ray_store.RemoteMinToolCalls(client)
    rng = random.Random(0)
    rounds = []
    for _ in range(args.rounds):
        times: dict[str, list[float]] = {k: [] for k in ("bank", "example", "minimum", "add", "episode")}
        for i in range(args.episodes):
            one_episode(memory, mins, trajectories[i % len(trajectories)], rng, times)
        rounds.append({k: statistics.median(v) * 1e6 for k, v in times.items()})
    return {k: statistics.median(r[k] for r in rounds) for k in rounds[0]}


def time_logs(root: Path, trajectories: list[Trajectory], args: argparse.Namespace) -> dict[str, float]:
    """Median µs to append one trajectory record and read the new records back: JsonlLog vs SQLite WAL."""
    records = [{"trajectory": trajectory_to_dict(t), "pid": 0} for t in trajectories]
    log = JsonlLog(root / "log.jsonl")
    offset = 0
    db = sqlite3.connect(root / "log.sqlite", isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=NORMAL")
    db.execute("CREATE TABLE records (id INTEGER PRIMARY KEY, body TEXT NOT NULL)")
    last = 0
    jsonl, sqlite = [], []
    for i in range(args.rounds * args.episodes):
        record = records[i % len(records)]
        t0 = time.perf_counter()
        log.append(record)
        _, offset = log.read(offset)
        t1 = time.perf_counter()
        db.execute("INSERT INTO records (body) VALUES (?)", (json.dumps(record, separators=(",", ":")),))
        rows = db.execute("SELECT id, body FROM records WHERE id > ?", (last,)).fetchall()
        last = rows[-1][0]
        [json.loads(body) for _, body in rows]
        t2 = time.perf_counter()
        jsonl.append(t1 - t0)
        sqlite.append(t2 - t1)
    db.close()
    return {"jsonl": statistics.median(jsonl) * 1e6, "sqlite_wal": statistics.median(sqlite) * 1e6}


def measure(args: argparse.Namespace) -> dict[str, Any]:
    trajectories = episodes(50)
    report: dict[str, Any] = {
        "command": "OMP_NUM_THREADS=1 python benchmarks/store_backends.py "
        f"--prefill {args.prefill} --episodes {args.episodes} --rounds {args.rounds}",
        "prefill": args.prefill,
        "episodes": args.episodes,
        "rounds": args.rounds,
        "unit": "microseconds per call (median)",
        "backends": {},
    }
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        for backend in ("file", "actor"):
            with tempfile.TemporaryDirectory() as tmp:
                prefill(Path(tmp), trajectories, args.prefill)
                report["backends"][backend] = time_backend(backend, Path(tmp), trajectories, args)
    finally:
        ray.shutdown()
    with tempfile.TemporaryDirectory() as tmp:
        report["append_and_read"] = time_logs(Path(tmp), trajectories, args)
    report["ray"] = ray.__version__
    return report


def table(report: dict[str, Any]) -> str:
    """The Markdown tables of ``report`` (what ``--doc`` writes between the markers)."""
    rows = [
        "| backend | bank read | few-shot example | minimum read+lower | add trajectory | whole episode |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for backend, t in report["backends"].items():
        cells = " | ".join(f"{t[k]:,.0f} µs" for k in ("bank", "example", "minimum", "add", "episode"))
        rows.append(f"| {backend} | {cells} |")
    log = report["append_and_read"]
    rows += [
        "",
        "| one trajectory record appended and read back | median |",
        "|---|---:|",
        f"| JSON-lines log (`JsonlLog`, flock) | {log['jsonl']:,.0f} µs |",
        f"| SQLite, WAL, `synchronous=NORMAL` | {log['sqlite_wal']:,.0f} µs |",
        "",
        f"Store prefilled with {report['prefill']:,} trajectories; {report['episodes']} episodes × "
        f"{report['rounds']} rounds; {report['cpus']} CPUs, Python {report['python']}, Ray {report['ray']}. "
        f"Reproduce: `{report['command']}`.",
    ]
    return "\n".join(rows)


def write_table(results: Path, doc: Path) -> None:
    text = doc.read_text(encoding="utf-8")
    if BEGIN not in text or END not in text:
        raise SystemExit(f"{doc} has no {BEGIN} ... {END} block to fill")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    body = table(json.loads(results.read_text(encoding="utf-8")))
    doc.write_text(f"{head}{BEGIN}\n{body}\n{END}{tail}", encoding="utf-8")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prefill", type=int, default=2000, help="trajectories in the store before timing")
    parser.add_argument("--episodes", type=int, default=300, help="episodes per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, help="write the results here (JSON)")
    parser.add_argument("--table", type=Path, help="a results file: print its table instead of measuring")
    parser.add_argument(
        "--doc", type=Path, help="with --table: rewrite the table block of this Markdown file"
    )
    args = parser.parse_args()
    if args.table:
        if args.doc:
            write_table(args.table, args.doc)
        else:
            print(table(json.loads(args.table.read_text(encoding="utf-8"))))
        return
    report = measure(args)
    write_report(args.out, report)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
