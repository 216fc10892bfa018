"""Cost per episode of the two store backends: SQLite files and the Ray store actor.

An agent under OpenRLHF touches the stores four times per episode: it reads the bank at
reset (``memory.experience``), draws the few-shot example (``sample_few_shot``), scores
the episode through LightSearcher's minimum of searches (``lookup_and_lower``, one call)
and adds the finished trajectory (``add``). This script times those four calls, one agent,
against a store that already holds ``--prefill`` trajectories and a bank, for:

- ``sqlite``: :class:`~searchgym.memory.ExperienceMemory` and
  :class:`~searchgym.envs.rewards.MinToolCallStore` on a local folder of SQLite logs (WAL,
  ``synchronous=NORMAL``), called from this process;
- ``actor``: :class:`~searchgym.trainers.ray_store.RemoteMemory` and
  :class:`~searchgym.trainers.ray_store.RemoteMinToolCalls` against the store actor of a
  local Ray cluster (``ray.init(num_cpus=2)``): the same work plus one Ray round trip per call.

It also times many writers: ``--writers`` processes each append ``--appends`` trajectory
records to one SQLite log at once (appends per second over all writers, and the median
time of one append, waits for the other writers' transactions included).

Trajectories are SyntheticFacts episodes of the oracle policy under LightSearcher's reward
(seed 0). Medians over ``--rounds`` rounds of ``--episodes`` episodes.

    OMP_NUM_THREADS=1 python -m benchmarks.store_backends --out benchmarks/results/store_backends.json
    python -m benchmarks.store_backends --table benchmarks/results/store_backends.json --doc docs/stores.md
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import random
import sqlite3
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import gymnasium as gym

import searchgym  # noqa: F401  (registers the env ids)
from benchmarks._common import add_table_arguments, show_table, shown_command, write_report
from searchgym.envs.records import Trajectory
from searchgym.envs.rewards import MinToolCallStore
from searchgym.memory import ExperienceMemory, trajectory_to_dict
from searchgym.policies import make_policy
from searchgym.storage import SqliteLog

BEGIN, END = "<!-- store_backends:begin -->", "<!-- store_backends:end -->"


def episodes(n: int) -> list[Trajectory]:
    """``n`` finished SyntheticFacts episodes (oracle policy, LightSearcher's reward)."""
    env = gym.make("searchgym/SyntheticFacts-v1", protocol="tool_call", reward="lightsearcher")
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
    mins = MinToolCallStore(root / "min_tool_calls.sqlite")
    for i in range(count):
        t = trajectories[i % len(trajectories)]
        memory.add(t)
        mins.update(t.question.id, t.num_searches)
        if i in (count // 2, count - 1):
            memory.step()


def time_backend(backend: str, root: Path, trajectories: list[Trajectory], args: argparse.Namespace) -> dict:
    if backend == "sqlite":
        memory: Any = ExperienceMemory(root / "memory", update_every=1, summarizer="rule")
        mins: Any = MinToolCallStore(root / "min_tool_calls.sqlite")
    else:
        from searchgym.trainers import ray_store

        spec = ray_store.StoreSpec(
            str(root / "memory"),
            {"update_every": 1, "summarizer": "rule"},
            str(root / "min_tool_calls.sqlite"),
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


def _writer(path: str, record: dict, count: int, start: Any, out: Any) -> None:
    log = SqliteLog(path)
    log.append({"warm": True})
    start.wait()
    times = []
    for _ in range(count):
        t0 = time.perf_counter()
        log.append(record)
        times.append(time.perf_counter() - t0)
    out.put(times)


def time_writers(root: Path, trajectories: list[Trajectory], args: argparse.Namespace) -> dict[str, float]:
    """``--writers`` processes appending to one SQLite log at once: throughput and median append."""
    record = {"trajectory": trajectory_to_dict(trajectories[0]), "pid": 0}
    ctx = mp.get_context("spawn")
    start, out = ctx.Barrier(args.writers + 1), ctx.Queue()
    path = str(root / "shared.sqlite")
    procs = [
        ctx.Process(target=_writer, args=(path, record, args.appends, start, out))
        for _ in range(args.writers)
    ]
    for p in procs:
        p.start()
    start.wait()
    t0 = time.perf_counter()
    times = [t for _ in procs for t in out.get(timeout=600)]
    wall = time.perf_counter() - t0
    for p in procs:
        p.join()
    assert SqliteLog(path).count() == args.writers * (args.appends + 1)  # nothing lost or doubled
    return {
        "writers": args.writers,
        "appends_per_writer": args.appends,
        "appends_per_second": len(times) / wall,
        "median_append_us": statistics.median(times) * 1e6,
    }


def measure(args: argparse.Namespace) -> dict[str, Any]:
    trajectories = episodes(50)
    report: dict[str, Any] = {
        "command": "OMP_NUM_THREADS=1 python -m benchmarks.store_backends "
        f"--prefill {args.prefill} --episodes {args.episodes} --rounds {args.rounds} "
        f"--writers {args.writers} --appends {args.appends}",
        "prefill": args.prefill,
        "episodes": args.episodes,
        "rounds": args.rounds,
        "unit": "microseconds per call (median)",
        "backends": {},
    }
    import ray

    load_before = os.getloadavg()[0]
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        for backend in ("sqlite", "actor"):
            with tempfile.TemporaryDirectory() as tmp:
                prefill(Path(tmp), trajectories, args.prefill)
                report["backends"][backend] = time_backend(backend, Path(tmp), trajectories, args)
    finally:
        ray.shutdown()
    with tempfile.TemporaryDirectory() as tmp:
        report["many_writers"] = time_writers(Path(tmp), trajectories, args)
    report["ray"] = ray.__version__
    report["sqlite"] = sqlite3.sqlite_version
    report["load_1m"] = [round(load_before, 2), round(os.getloadavg()[0], 2)]
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
    many = report["many_writers"]
    local, actor = report["backends"]["sqlite"]["episode"], report["backends"]["actor"]["episode"]
    rows += [
        "",
        f"The four store calls of an episode cost {local:,.0f} µs on the SQLite backend and {actor:,.0f} µs "
        f"through the actor ({actor / local:.0f}×); {many['writers']} processes writing at once append "
        f"{many['appends_per_second']:,.0f} trajectories per second to one SQLite log.",
        "",
        "| writers on one SQLite log | appends per writer | appends per second (all writers) | median append |",
        "|---:|---:|---:|---:|",
        f"| {many['writers']} processes | {many['appends_per_writer']:,} | {many['appends_per_second']:,.0f} | "
        f"{many['median_append_us']:,.0f} µs |",
        "",
        f"Store prefilled with {report['prefill']:,} trajectories; {report['episodes']} episodes × "
        f"{report['rounds']} rounds; {report['cpus']} CPUs (load {report['load_1m'][0]}–{report['load_1m'][1]}), Python {report['python']}, SQLite {report['sqlite']}, "
        f"Ray {report['ray']}. "
        f"Reproduce: `{shown_command(report['command'])}`.",
    ]
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prefill", type=int, default=2000, help="trajectories in the store before timing")
    parser.add_argument("--episodes", type=int, default=300, help="episodes per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--writers", type=int, default=4, help="processes appending at once")
    parser.add_argument("--appends", type=int, default=2000, help="appends per writer")
    add_table_arguments(parser)
    args = parser.parse_args()
    if show_table(args, table, BEGIN, END):
        return
    report = measure(args)
    write_report(args.out, report)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
