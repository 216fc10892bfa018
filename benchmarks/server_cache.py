"""The retrieval server's result cache under a GRPO-shaped load: on against off, same index, one run.

A GRPO step sends every question to a group of rollouts (12 in the LightSearcher config), and
their first searches are often the question itself. Here each step runs ``--groups`` groups of
``--group-size`` rollouts at once, one client thread per rollout, on real questions of the
shared sets: a rollout's first search is its group's question (the same string across the
group), and its ``--turns - 1`` follow-up searches are other real questions, distinct across
every rollout. Two ``searchgym serve`` processes load the same dense index (all-MiniLM-L6-v2,
flat) of a subsample of the shared corpus, one with the default cache and one with
``--cache-size 0``; the steps alternate between them, each step with new questions, so both
see the same queries in the same machine load. Reported per server: queries per second over
all steps (median of the steps), p50 and p99 latency per request, and the cache's hit rate from
``GET /stats``.

Usage::

    OMP_NUM_THREADS=1 python -m benchmarks.server_cache --out benchmarks/results/server_cache.json
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

from benchmarks._common import REPO, SHARED_DATA, write_report
from benchmarks.server import load_queries, percentile, run_together
from searchgym.retrieval.http_client import HTTPRetriever


def build(corpus: Path, cache: Path, limit: int) -> Path:
    """A dense index of the first ``limit`` passages in ``cache`` (built once, then reused)."""
    from searchgym.retrieval.dense_build import build_dense_index

    subset = cache / f"corpus_{limit}.jsonl"
    if not subset.is_file():
        cache.mkdir(parents=True, exist_ok=True)
        with corpus.open(encoding="utf-8") as src:
            subset.write_text(
                "".join(line for _, line in zip(range(limit), src, strict=False)), encoding="utf-8"
            )
    index_dir = cache / f"dense_{limit}"
    build_dense_index(subset, index_dir, progress=False)
    return index_dir


def start(index_dir: Path, flags: list[str]) -> tuple[subprocess.Popen, str]:
    command = [sys.executable, "-m", "searchgym", "serve", "--index", str(index_dir), "--port", "0", *flags]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    match = re.search(r"listening on (http://\S+)", line)
    if not match:
        proc.kill()
        sys.exit(f"the server did not start: {line!r}")
    return proc, match.group(1)


def step(url: str, plans: list[list[str]], k: int) -> tuple[float, list[float], int]:
    """One GRPO step: every rollout's searches, rollouts in parallel, each rollout's in turn.

    Returns:
        Seconds from the first search to the last answer, every request's latency, errors.
    """
    client = HTTPRetriever(url, timeout=120.0, retries=0)
    latencies: list[float] = []
    lock = threading.Lock()
    barrier = threading.Barrier(len(plans) + 1)

    def rollout(queries: list[str]) -> None:
        barrier.wait()
        for query in queries:
            t0 = time.perf_counter()
            try:
                client.search([query], k)
            except Exception:  # counted by client.error_count
                pass
            with lock:
                latencies.append(time.perf_counter() - t0)

    elapsed = run_together(rollout, [(plan,) for plan in plans], barrier)
    client.close()
    return elapsed, latencies, client.error_count


def after_queries(before: dict, after: dict) -> int:
    """Queries the server searched between two ``/stats`` answers (cache off: every query)."""
    return int(after["queries"] - before["queries"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", type=Path, default=SHARED_DATA / "corpus.jsonl")
    parser.add_argument(
        "--corpus-limit", type=int, default=500, help="passages indexed (default: %(default)s)"
    )
    parser.add_argument("--cache-dir", type=Path, default=REPO / "benchmarks" / ".cache" / "server_cache")
    parser.add_argument("--groups", type=int, default=4, help="groups per step (default: %(default)s)")
    parser.add_argument(
        "--group-size", type=int, default=12, help="rollouts per group (default: %(default)s)"
    )
    parser.add_argument("--turns", type=int, default=3, help="searches per rollout (default: %(default)s)")
    parser.add_argument("--steps", type=int, default=6, help="steps per server (default: %(default)s)")
    parser.add_argument("--k", type=int, default=3)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()

    index_dir = build(args.corpus, args.cache_dir, args.corpus_limit)
    per_step = args.groups * (1 + args.group_size * (args.turns - 1))
    pool = load_queries(args.steps * per_step)
    if len(pool) < args.steps * per_step:
        sys.exit(f"only {len(pool)} distinct questions for {args.steps * per_step} needed")
    steps = []
    for s in range(args.steps):
        mine = iter(pool[s * per_step : (s + 1) * per_step])
        plans = []
        for _ in range(args.groups):
            question = next(mine)
            plans += [
                [question] + [next(mine) for _ in range(args.turns - 1)] for _ in range(args.group_size)
            ]
        steps.append(plans)

    servers = {"cache on": start(index_dir, []), "cache off": start(index_dir, ["--cache-size", "0"])}
    results: dict[str, dict] = {name: {"seconds": [], "latencies": [], "errors": 0} for name in servers}
    try:
        for _, url in servers.values():  # warm up: load the model's first batch, open connections
            step(url, [[f"warm up {i}"] for i in range(32)], args.k)
        stats_before = {name: HTTPRetriever(url).server_stats() for name, (_, url) in servers.items()}
        for s, plans in enumerate(steps):
            order = list(servers) if s % 2 == 0 else list(reversed(servers))
            for name in order:
                seconds, latencies, errors = step(servers[name][1], plans, args.k)
                results[name]["seconds"].append(seconds)
                results[name]["latencies"] += latencies
                results[name]["errors"] += errors
                print(f"step {s} {name}: {len(latencies) / seconds:6.1f} q/s", flush=True)
        stats_after = {name: HTTPRetriever(url).server_stats() for name, (_, url) in servers.items()}
    finally:
        for proc, _ in servers.values():
            proc.terminate()
            proc.wait(timeout=30)

    queries_per_step = args.groups * args.group_size * args.turns
    rows = []
    for name, r in results.items():
        before, after = stats_before[name].get("cache"), stats_after[name].get("cache")
        hits = misses = 0
        if after is not None:
            hits, misses = after["hits"] - before["hits"], after["misses"] - before["misses"]
        rows.append(
            {
                "server": name,
                "qps": statistics.median(queries_per_step / s for s in r["seconds"]),
                "step_s": statistics.median(r["seconds"]),
                "step_qps": [round(queries_per_step / s, 2) for s in r["seconds"]],
                "p50_ms": 1000 * percentile(r["latencies"], 0.50),
                "p99_ms": 1000 * percentile(r["latencies"], 0.99),
                "searched": misses
                if after is not None
                else after_queries(stats_before[name], stats_after[name]),
                "hits": hits,
                "misses": misses,
                "hit_rate": hits / (hits + misses) if hits + misses else None,
                "errors": r["errors"],
            }
        )
    print("| server | q/s | step s | p50 ms | p99 ms | queries searched | hit rate |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        rate = "–" if r["hit_rate"] is None else f"{r['hit_rate']:.1%}"
        print(
            f"| {r['server']} | {r['qps']:.1f} | {r['step_s']:.2f} | {r['p50_ms']:.1f} | {r['p99_ms']:.1f} "
            f"| {r['searched']} | {rate} |"
        )
    write_report(
        args.out,
        {
            "index": "dense all-MiniLM-L6-v2 flat",
            "passages": args.corpus_limit,
            "groups": args.groups,
            "group_size": args.group_size,
            "turns": args.turns,
            "steps": args.steps,
            "k": args.k,
            "queries_per_step": queries_per_step,
            "rows": rows,
            "serve_omp_num_threads": os.environ.get("OMP_NUM_THREADS", "unset"),
        },
    )


if __name__ == "__main__":
    main()
