"""Rebuild a damaged store database from what can still be read: :func:`rebuild`, :func:`finish_interrupted`.

What is read: every row SQLite itself can still reach (the whole table, then id by id past
a damaged page), and every row :func:`~searchgym.storage.salvage.salvage` finds on
the pages of the file and in the intact frames of its WAL.

How the file is replaced, so that a crash at any instant leaves either the damaged file
(with its WAL) or the rebuilt one at the live path:

1. The rebuilt database is written to ``<file>.rebuilding-<pid>``, committed, checkpointed
   and synced.
2. A journal, ``<file>.repair``, names it and the name the original will keep
   (``<file>.damaged-<time>``); it is written atomically.
3. The original and its WAL get their kept names as hard links (a copy where the file
   system has none), the live WAL and shared-memory files are removed, the rebuilt file is
   moved over the live path (``os.replace``), and the journal is removed.

Every step of 3 can be done again, so :func:`finish_interrupted`, which every
:class:`~searchgym.storage.sqlite_log.SqliteLog` calls before it opens its file,
finishes a repair that has a journal and removes the half-written file of one that has
none (its live file was never touched).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import shutil
import sqlite3
import time
from typing import Any

from .atomic import write_atomically
from .salvage import salvage

__all__ = ["rebuild", "finish_interrupted", "readable_rows"]

logger = logging.getLogger("searchgym.memory")


def readable_rows(
    path: str, wal_paths: list[str] | None = None
) -> tuple[list[tuple[int, str, Any]], list[tuple[Any, ...]], int]:
    """The records and snapshots that can be read from ``path`` (and its WAL), and the highest id it gave.

    SQLite's own reading comes first; rows only the page scan finds are added to it.
    """
    records: dict[int, tuple[int, str, Any]] = {}
    snapshots: list[tuple[Any, ...]] = []
    highest = 0
    with contextlib.suppress(sqlite3.Error):
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            with contextlib.suppress(sqlite3.Error):
                for row in conn.execute("SELECT id, body, key FROM records ORDER BY id"):
                    records[row[0]] = row
            for query in (
                "SELECT MAX(id) FROM records",
                "SELECT seq FROM sqlite_sequence WHERE name = 'records'",
                "SELECT value FROM meta WHERE name = 'id_floor'",
            ):
                with contextlib.suppress(sqlite3.Error, TypeError, ValueError):
                    highest = max(highest, int(conn.execute(query).fetchone()[0]))
            for row_id in range(1, max(highest, max(records, default=0)) + 1):  # past a damaged page
                if row_id not in records:
                    with contextlib.suppress(sqlite3.Error):
                        row = conn.execute(
                            "SELECT id, body, key FROM records WHERE id = ?", (row_id,)
                        ).fetchone()
                        if row is not None:
                            records[row_id] = row
            with contextlib.suppress(sqlite3.Error):
                snapshots = conn.execute(
                    "SELECT step, last_id, time FROM snapshots ORDER BY rowid"
                ).fetchall()
        finally:
            conn.close()
    with contextlib.suppress(OSError):
        pages = salvage(path, wal_paths)
        for row_id, row in pages.records.items():
            records.setdefault(row_id, row)
        snapshots = snapshots or pages.snapshots
    rows = [records[i] for i in sorted(records) if isinstance(records[i][1], str)]
    return rows, snapshots, max(highest, max(records, default=0))


def _sync_folder(path: str) -> None:
    descriptor = os.open(os.path.dirname(path) or ".", os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def _keep(source: str, target: str) -> None:
    """``target`` becomes a name of ``source`` (a hard link; a copy moved into place elsewhere)."""
    try:
        os.link(source, target)
    except FileExistsError:
        pass  # made by an earlier, interrupted try: the name was free when the journal was written
    except OSError:
        partial = target + ".partial"
        shutil.copyfile(source, partial)
        os.replace(partial, target)


def _finish(path: str, journal: dict[str, str]) -> None:
    """Step 3 of the module docstring; every part of it can be done again."""
    fresh, original = journal["fresh"], journal["original"]
    if os.path.exists(fresh):
        for suffix in ("", "-wal"):
            if os.path.exists(path + suffix):
                _keep(path + suffix, original + suffix)
        _sync_folder(path)
        for suffix in ("-wal", "-shm"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path + suffix)
        os.replace(fresh, path)
        _sync_folder(path)
    os.unlink(path + ".repair")
    _sync_folder(path)


def finish_interrupted(path: str) -> str | None:
    """Finish (or undo) a repair of ``path`` that was interrupted; returns what was done, or ``None``."""
    folder, name = os.path.split(path)
    try:
        leftovers = [n for n in os.listdir(folder or ".") if n.startswith(name + ".rebuilding-")]
    except OSError:
        return None
    done = None
    if os.path.exists(path + ".repair"):
        try:
            handle = open(path + ".repair", "rb")
        except FileNotFoundError:
            handle = None
        if handle is not None:
            with handle:
                fcntl.flock(handle.fileno(), fcntl.LOCK_EX)  # one process finishes it
                if os.path.exists(path + ".repair"):
                    journal = json.loads(handle.read().decode("utf-8"))
                    _finish(path, journal)
                    done = f"finished an interrupted repair; the original is kept as {journal['original']}"
    for leftover in leftovers:
        fresh, pid = os.path.join(folder, leftover), leftover[len(name) + len(".rebuilding-") :]
        if not pid.isdigit() or _alive(int(pid)) or not os.path.exists(fresh):
            continue  # a repair running now (or the rebuilt file's own -wal/-shm)
        if not os.path.exists(path) and _is_store(fresh):  # an older searchgym moved the original first
            os.replace(fresh, path)
            _sync_folder(path)
            done = f"put back the rebuilt file {fresh} an interrupted repair had left"
            continue
        for suffix in ("", "-wal", "-shm"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(fresh + suffix)
        done = (
            done
            or f"removed {fresh}, the half-written file of an interrupted repair (the original was untouched)"
        )
    if done:
        logger.warning("%s: %s.", path, done)
    return done


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _is_store(path: str) -> bool:
    with contextlib.suppress(sqlite3.Error):
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            return conn.execute("PRAGMA quick_check").fetchone()[0] == "ok" and bool(
                conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'records'").fetchone()
            )
        finally:
            conn.close()
    return False


def _free_name(path: str) -> str:
    base = f"{path}.damaged-{time.strftime('%Y%m%dT%H%M%S')}"
    name, n = base, 1
    while any(os.path.exists(name + s) for s in ("", "-wal")):
        name, n = f"{base}-{n}", n + 1
    return name


def rebuild(path: str, tables: tuple[str, ...], meta: dict[str, str]) -> tuple[str, int, int]:
    """Replace the damaged database at ``path`` by one holding every readable record.

    Args:
        path: The live database file.
        tables: The statements that create the tables of a new database.
        meta: Rows of the ``meta`` table of the new database (its generation, instance, ...);
            an ``id_floor`` there (the ids acknowledged) is kept when the original gave fewer.

    Returns:
        Where the original was kept, the records kept, and the highest id the original gave.
    """
    records, snapshots, highest = readable_rows(path)
    fresh = f"{path}.rebuilding-{os.getpid()}"
    for suffix in ("", "-wal", "-shm"):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(fresh + suffix)
    conn = sqlite3.connect(fresh, isolation_level=None)
    try:
        conn.execute("PRAGMA page_size=1024")
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("BEGIN")
        for statement in tables:
            conn.execute(statement)
        conn.executemany("INSERT OR IGNORE INTO records (id, body, key) VALUES (?, ?, ?)", records)
        conn.executemany("INSERT INTO snapshots (step, last_id, time) VALUES (?, ?, ?)", snapshots)
        rows = {**meta, "id_floor": str(max(highest, int(meta.get("id_floor", "0"))))}
        conn.executemany("INSERT INTO meta (name, value) VALUES (?, ?)", sorted(rows.items()))
        conn.execute("COMMIT")
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        conn.close()
    with open(fresh, "rb+") as handle:
        os.fsync(handle.fileno())
    original = _free_name(path)
    write_atomically(path + ".repair", json.dumps({"fresh": fresh, "original": original}).encode("utf-8"))
    _finish(path, {"fresh": fresh, "original": original})
    return original, len(records), highest
