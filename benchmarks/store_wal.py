"""Bytes an append writes to a store's SQLite files: the WAL, and everything with checkpoints.

Each append is one transaction, and SQLite's WAL holds whole pages: an append writes the
table's last page again, and every other page the insert touches. This script appends
``--appends`` records of each kind to a new :class:`~searchgym.storage.SqliteLog` in
two layouts:

- ``older``: a database as an older searchgym made it (4 KiB pages, ``AUTOINCREMENT``,
  whose ``sqlite_sequence`` row is written by every insert, and a unique index on ``key``
  that every insert writes, ``NULL`` or not);
- ``current``: a database this searchgym makes (1 KiB pages, ids from the highest one given,
  a unique index on ``key`` only where it is not ``NULL``).

Per layout and kind it reports the WAL bytes per append (automatic checkpoints off, so the
WAL holds every frame), the bytes the process handed to ``write()`` per append with the
default checkpoints and the one on closing (``/proc/self/io`` ``wchar``: WAL frames,
checkpoint copies, the ``.acked`` line), the largest the WAL grew, the database size after
closing, and the median time of one append. Records: LightSearcher's minimum (``{"id", "n"}``) and SyntheticFacts trajectories
(oracle policy, seed 0 onwards).

    OMP_NUM_THREADS=1 python -m benchmarks.store_wal --appends 2000 --out benchmarks/results/store_wal.json
    python -m benchmarks.store_wal --table benchmarks/results/store_wal.json --doc docs/stores.md
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks._common import add_table_arguments, show_table, shown_command, write_report

BEGIN, END = "<!-- store_wal:begin -->", "<!-- store_wal:end -->"

_OLDER = (
    "CREATE TABLE records (id INTEGER PRIMARY KEY AUTOINCREMENT, body TEXT NOT NULL, key TEXT UNIQUE)",
    "CREATE TABLE snapshots (step INTEGER NOT NULL, last_id INTEGER NOT NULL, time REAL NOT NULL)",
    "CREATE TABLE rejected (id INTEGER, body TEXT, reason TEXT NOT NULL, time REAL NOT NULL)",
    "CREATE TABLE meta (name TEXT PRIMARY KEY, value TEXT NOT NULL)",
)


def records(kind: str, n: int) -> list[dict[str, Any]]:
    """``n`` records of ``kind`` (``minimum`` or ``trajectory``)."""
    if kind == "minimum":
        return [{"id": f"question-{i:06d}", "n": i % 5} for i in range(n)]
    import gymnasium as gym

    import searchgym  # noqa: F401  (registers the env ids)
    from searchgym.memory import trajectory_to_dict
    from searchgym.policies import make_policy

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
        out.append({"trajectory": trajectory_to_dict(env.unwrapped.trajectory)})
    return out


def _wchar() -> int:
    with open("/proc/self/io", encoding="ascii") as handle:
        return next(int(line.split()[1]) for line in handle if line.startswith("wchar:"))


def _new_log(path: Path, layout: str) -> Any:
    from searchgym.storage import SqliteLog

    if layout == "older":
        conn = sqlite3.connect(path, isolation_level=None)
        conn.execute("PRAGMA page_size=4096")
        conn.execute("PRAGMA journal_mode=WAL")
        for statement in _OLDER:
            conn.execute(statement)
        conn.close()
    return SqliteLog(path, schema=None)


def one(layout: str, kind: str, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Append ``rows`` twice to new logs: automatic checkpoints off (WAL bytes), then on (all bytes)."""
    with tempfile.TemporaryDirectory() as folder:
        log = _new_log(Path(folder) / "wal.sqlite", layout)
        log.append(rows[0])
        log._db().execute("PRAGMA wal_autocheckpoint=0")
        wal = Path(f"{log.path}-wal")
        start = wal.stat().st_size
        for row in rows:
            log.append(row)
        wal_per_append = (wal.stat().st_size - start) / len(rows)
        log.close()

        log = _new_log(Path(folder) / "all.sqlite", layout)
        log.append(rows[0])
        wal = Path(f"{log.path}-wal")
        times, peak, before = [], 0, _wchar()
        for row in rows:
            t0 = time.perf_counter()
            log.append(row)
            times.append(time.perf_counter() - t0)
            peak = max(peak, wal.stat().st_size)
        log.close()  # the last connection checkpoints the WAL into the file: counted too
        written = (_wchar() - before) / len(rows)
        size = Path(log.path).stat().st_size
    body = sum(len(json.dumps(r, separators=(",", ":"))) for r in rows) / len(rows)
    return {
        "layout": layout,
        "kind": kind,
        "appends": len(rows),
        "record_bytes": round(body),
        "wal_bytes_per_append": round(wal_per_append),
        "written_bytes_per_append": round(written),
        "peak_wal_bytes": peak,
        "database_bytes": size,
        "median_append_us": round(statistics.median(times) * 1e6, 1),
    }


def measure(args: argparse.Namespace) -> dict[str, Any]:
    runs = []
    for kind in ("minimum", "trajectory"):
        rows = records(kind, args.appends if kind == "minimum" else args.trajectories)
        for layout in ("older", "current"):
            runs.append(one(layout, kind, rows))
            print(json.dumps(runs[-1]), flush=True)
    return {"runs": runs, "sqlite": sqlite3.sqlite_version}


def table(report: dict[str, Any]) -> str:
    """The Markdown table of ``report`` (what ``--doc`` writes between the markers)."""
    rows = [
        "| records | layout | record | WAL per append | written per append (checkpoints on) | largest WAL | "
        "database | median append |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    names = {"older": "made by an older searchgym", "current": "made by this searchgym"}
    runs = report["runs"]
    for run in runs:
        rows.append(
            f"| {run['appends']:,} {run['kind']} records | {names[run['layout']]} | {run['record_bytes']:,} B | "
            f"{run['wal_bytes_per_append']:,} B | {run['written_bytes_per_append']:,} B | "
            f"{run['peak_wal_bytes'] / 1024:,.0f} KiB | {run['database_bytes'] / 1024:,.0f} KiB | "
            f"{run['median_append_us']:,.0f} µs |"
        )
    ratio = {
        kind: next(r for r in runs if r["kind"] == kind and r["layout"] == "older")["wal_bytes_per_append"]
        / next(r for r in runs if r["kind"] == kind and r["layout"] == "current")["wal_bytes_per_append"]
        for kind in ("minimum", "trajectory")
    }
    rows += [
        "",
        f"A new store writes {ratio['minimum']:.1f}× fewer WAL bytes per minimum and {ratio['trajectory']:.1f}× "
        f"fewer per trajectory than one made by an older searchgym, which keeps its layout. "
        f"{report['cpus']} CPUs shared with other jobs (load {report['load_average'][0]:g}), "
        f"Python {report['python']}, SQLite {report['sqlite']}. Reproduce: `{shown_command(report['command'])}`.",
    ]
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--appends", type=int, default=2000, help="minimum records appended per layout")
    parser.add_argument(
        "--trajectories", type=int, default=300, help="trajectory records appended per layout"
    )
    add_table_arguments(parser)
    args = parser.parse_args()
    if show_table(args, table, BEGIN, END):
        return
    report = measure(args)
    write_report(args.out, report)


if __name__ == "__main__":
    main()
