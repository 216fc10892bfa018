"""Rebuild a damaged store database from what can still be read: :func:`rebuild`.

SQLite's own ``.recover`` lives in its command-line shell, not in Python's ``sqlite3``, so
this reads the ``records`` table row by row (skipping what the damaged pages hide), writes
what it read to a new database beside the old one, keeps the old one (and its WAL) as
``<file>.damaged-<time>`` and moves the new one into place.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import time
from typing import Any

__all__ = ["rebuild"]


def _readable(path: str) -> tuple[list[tuple[int, str, Any]], list[tuple[Any, ...]]]:
    """The records and snapshots of ``path`` that can be read (none when it is not a database)."""
    records: dict[int, tuple[int, str, Any]] = {}
    snapshots: list[tuple[Any, ...]] = []
    try:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    except sqlite3.Error:
        return [], []
    try:
        with contextlib.suppress(sqlite3.Error):
            for row in conn.execute("SELECT id, body, key FROM records ORDER BY id"):
                records[row[0]] = row
        highest = max(records, default=0)
        for query in (
            "SELECT MAX(id) FROM records",
            "SELECT seq FROM sqlite_sequence WHERE name = 'records'",
        ):
            with contextlib.suppress(sqlite3.Error, TypeError):
                highest = max(highest, int(conn.execute(query).fetchone()[0]))
        for row_id in range(1, highest + 1):  # ids past a damaged page, one by one
            if row_id not in records:
                with contextlib.suppress(sqlite3.Error):
                    row = conn.execute("SELECT id, body, key FROM records WHERE id = ?", (row_id,)).fetchone()
                    if row is not None:
                        records[row_id] = row
        with contextlib.suppress(sqlite3.Error):
            snapshots = conn.execute("SELECT step, last_id, time FROM snapshots ORDER BY rowid").fetchall()
    finally:
        conn.close()
    return [records[i] for i in sorted(records) if isinstance(records[i][1], str)], snapshots


def rebuild(path: str) -> tuple[str, int]:
    """Replace the damaged database at ``path`` by one holding every readable record.

    Returns:
        Where the original was kept, and the records kept.
    """
    from .sqlite_log import _TABLES

    records, snapshots = _readable(path)
    fresh = f"{path}.rebuilding-{os.getpid()}"
    with contextlib.suppress(FileNotFoundError):
        os.unlink(fresh)
    conn = sqlite3.connect(fresh, isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("BEGIN")
        for statement in _TABLES:
            conn.execute(statement)
        conn.executemany("INSERT INTO records (id, body, key) VALUES (?, ?, ?)", records)
        conn.executemany("INSERT INTO snapshots (step, last_id, time) VALUES (?, ?, ?)", snapshots)
        conn.execute("INSERT INTO meta (name, value) VALUES ('generation', ?)", (str(time.time_ns()),))
        conn.execute("COMMIT")
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        conn.close()
    original = f"{path}.damaged-{time.strftime('%Y%m%dT%H%M%S')}"
    for suffix in ("-wal", "-shm", ""):
        with contextlib.suppress(FileNotFoundError):
            os.rename(path + suffix, original + suffix)
    os.rename(fresh, path)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(fresh + "-wal")
        os.unlink(fresh + "-shm")
    return original, len(records)
