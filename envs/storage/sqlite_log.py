"""One append-only log of records that many processes share: :class:`SqliteLog`, a SQLite database.

The experience memory's store (:mod:`searchgym.memory.store`) and LightSearcher's minimum
tool-call store (:class:`~searchgym.envs.rewards.min_tool_calls.MinToolCallStore`) keep
their records in such logs, one database file each.

## The database

================  ===========================================================================
``records``       ``id`` (increasing, never reused), ``body`` (the record as JSON text),
                  ``key`` (unique when given: a retried append with the same key is dropped)
``snapshots``     ``step``, ``last_id``: the last record of each checkpointed training step
``rejected``      records moved out by :meth:`SqliteLog.repair` or an import, with the reason
``meta``          ``generation`` (changes when records are cut or repaired, so readers that
                  remember an id read again from the start) and ``imported`` (an old
                  JSON-lines file already imported)
================  ===========================================================================

## Concurrency and crashes

The database is in WAL mode with a busy timeout: readers never wait for writers, writers
wait for each other. Every append is one transaction (``BEGIN IMMEDIATE`` ... ``COMMIT``);
once :meth:`SqliteLog.append` returns, the record survives the process being killed
(``synchronous=NORMAL``), and with ``fsync=True`` a power cut too (``synchronous=FULL``).
:meth:`SqliteLog.writing` holds one write transaction over several reads and appends, so a
read-then-write (a bank version number, a minimum lowered) is atomic across processes.

A record that does not decode, or is not a record of the log's kind, is skipped by readers,
logged once with its file and id and listed in :attr:`SqliteLog.corrupt`; training goes on.
A file that is not a database, or a damaged one, is a one-line :class:`DataFileError`
naming the file. :meth:`SqliteLog.repair` (``searchgym memory repair``) runs SQLite's
integrity check, moves corrupt records to ``rejected``, and rebuilds a damaged file from
what can be read, keeping the original beside it.

WAL needs shared memory between the processes, so keep the file on a local disk of one
machine (not NFS). On a cluster, one Ray actor owns the store (:mod:`searchgym.trainers.ray_store`).
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from ..errors import DataFileError, InvalidArgumentError
from . import legacy
from .records import SCHEMA_VERSION, NewerSchemaError, Validator, decode_record, encode_record

__all__ = ["SqliteLog", "RepairReport", "BUSY_TIMEOUT_S"]

logger = logging.getLogger("searchgym.memory")

_OPENED: set[tuple[int, str]] = set()
"""``(pid, real path)`` of every database this process has opened a connection to."""
_OPENING = threading.Lock()
_INHERITED: list[sqlite3.Connection] = []
"""Connections a forked child inherited: kept, never closed (closing one here could act on
the parent's database state)."""

BUSY_TIMEOUT_S = 60.0
"""Seconds a writer waits for another process's write transaction before failing."""


class _Busy(Exception):
    """Another process held the new database's lock while this one set it up."""


_TABLES = (
    "CREATE TABLE IF NOT EXISTS records (id INTEGER PRIMARY KEY AUTOINCREMENT, body TEXT NOT NULL, key TEXT UNIQUE)",
    "CREATE TABLE IF NOT EXISTS snapshots (step INTEGER NOT NULL, last_id INTEGER NOT NULL, time REAL NOT NULL)",
    "CREATE TABLE IF NOT EXISTS rejected (id INTEGER, body TEXT, reason TEXT NOT NULL, time REAL NOT NULL)",
    "CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value TEXT NOT NULL)",
)


@dataclass
class RepairReport:
    """What :meth:`SqliteLog.repair` did to one file."""

    path: str
    kept: int = 0
    """Readable records kept, in their order."""
    dropped: list[tuple[int, str]] = field(default_factory=list)
    """``(id or line, reason)`` of each record moved out (to the ``rejected`` table)."""
    problems: list[str] = field(default_factory=list)
    """What SQLite's integrity check found (empty: the file is sound)."""
    original: str | None = None
    """Where a damaged file was kept when it was rebuilt (``None``: not rebuilt)."""

    @property
    def changed(self) -> bool:
        return bool(self.dropped or self.problems)


def describe_error(path: str, exc: sqlite3.Error, action: str) -> DataFileError:
    """A one-line error naming ``path`` for a SQLite failure while doing ``action``."""
    text = str(exc).replace("\n", " ")
    if isinstance(exc, sqlite3.DatabaseError) and (
        "not a database" in text or "malformed" in text or "corrupt" in text
    ):
        store = os.path.dirname(path) or "."
        error = DataFileError(
            f"{path} is damaged or not a searchgym store ({text}) while {action}; run `searchgym memory "
            f"repair {store}` (it keeps the original), or move the file away."
        )
        error.reason = text  # type: ignore[attr-defined]
        return error
    return DataFileError(f"{path}: cannot finish {action} ({text}).")


class SqliteLog:
    """One append-only log in a SQLite database (see the module docstring).

    The connection is opened on first use and again after a fork or unpickling, so a log
    can be handed to worker processes. Thread-safe.

    Args:
        path: The database file; its folder is created on first use.
        fsync: Sync every commit to disk (durable across power loss, slower).
        schema: The newest record version this reader understands; ``None`` reads
            schemaless records and adds no ``schema`` field.
        validate: Checks one decoded record, raising ``ValueError`` (or a subclass) when it
            is not a record of this kind.
        legacy: An old JSON-lines file to import once (default: ``path`` itself, when it
            holds one); it is kept as ``<legacy>.imported``.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        fsync: bool = False,
        schema: int | None = SCHEMA_VERSION,
        validate: Validator | None = None,
        legacy: str | os.PathLike[str] | None = None,
    ):
        if not isinstance(path, (str, os.PathLike)):
            raise InvalidArgumentError(f"path must be a file path, got {path!r}.")
        self.path = os.fspath(path)
        if os.path.isdir(self.path):
            raise DataFileError(f"{self.path!r} is a folder; a store log needs a file path.")
        self.fsync = bool(fsync)
        self.schema = schema
        self.validate = validate
        self.legacy = os.fspath(legacy) if legacy is not None else None
        self.corrupt: list[tuple[int, str]] = []
        """``(id, reason)`` of each corrupt record this process skipped while reading."""
        self._seen: set[tuple[int, int]] = set()
        self._conn: sqlite3.Connection | None = None
        self._pid = os.getpid()
        self._lock = threading.RLock()
        self._writing = False

    # -- the connection ------------------------------------------------------------------------

    def _db(self) -> sqlite3.Connection:
        """The connection of this process, opened (and the file set up) on first use."""
        if self._pid != os.getpid():  # never use (or close) a connection across fork
            if self._conn is not None:
                _INHERITED.append(self._conn)
            self._conn, self._pid, self._writing = None, os.getpid(), False
        if self._conn is None:
            self._conn = self._open()
        return self._conn

    def _open(self) -> sqlite3.Connection:
        folder = os.path.dirname(self.path)
        if folder:
            os.makedirs(folder, exist_ok=True)
        with _OPENING:
            # Looking for an old JSON-lines file at our own path opens and closes the file, and
            # closing any descriptor drops this process's SQLite locks on it: only before the
            # first connection of this process to it.
            opened = (os.getpid(), os.path.realpath(self.path))
            source = legacy.adopt(self.legacy or self.path) if self.legacy or opened not in _OPENED else None
            try:
                conn = self._connect()
            except sqlite3.Error as exc:
                raise describe_error(self.path, exc, "opening it") from None
            _OPENED.add(opened)
        deadline = time.monotonic() + BUSY_TIMEOUT_S
        while True:
            try:
                return self._set_up(conn, source)
            except _Busy:
                # Switching a new file to WAL while another process does the same can answer
                # "database is locked" at once, without SQLite's busy wait: wait and try again.
                if time.monotonic() > deadline:
                    raise describe_error(
                        self.path, sqlite3.OperationalError("database is locked"), "opening it"
                    ) from None
                time.sleep(0.05)
                conn = self._connect()

    def _connect(self) -> sqlite3.Connection:
        return sqlite3.connect(
            self.path, timeout=BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False
        )

    def _set_up(self, conn: sqlite3.Connection, source: str | None) -> sqlite3.Connection:
        """WAL mode, the sync level and the tables on a new connection; closes it on failure."""
        try:
            mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise DataFileError(
                    f"{self.path}: SQLite cannot use WAL mode here (journal mode {mode!r}); keep stores on a "
                    "local disk, not a network file system."
                )
            conn.execute(f"PRAGMA synchronous={'FULL' if self.fsync else 'NORMAL'}")
            if self._needs_setup(conn, source):  # a write only when there is something to set up
                conn.execute("BEGIN IMMEDIATE")
                try:
                    for statement in _TABLES:
                        conn.execute(statement)
                    if source is not None and self._meta(conn, "imported") is None:
                        self._import(conn, source)
                    conn.execute("COMMIT")
                except BaseException:
                    conn.execute("ROLLBACK")
                    raise
        except (sqlite3.Error, DataFileError) as exc:
            conn.close()
            if isinstance(exc, DataFileError):
                raise
            if isinstance(exc, sqlite3.OperationalError) and "locked" in str(exc):
                raise _Busy() from None
            raise describe_error(self.path, exc, "opening it") from None
        return conn

    def _needs_setup(self, conn: sqlite3.Connection, source: str | None) -> bool:
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if not {"records", "snapshots", "rejected", "meta"} <= tables:
            return True
        return source is not None and self._meta(conn, "imported") is None

    @staticmethod
    def _meta(conn: sqlite3.Connection, name: str) -> str | None:
        row = conn.execute("SELECT value FROM meta WHERE name = ?", (name,)).fetchone()
        return None if row is None else str(row[0])

    def _import(self, conn: sqlite3.Connection, source: str) -> None:
        """With the write transaction open: the records of an old JSON-lines file, once."""
        records, bad = legacy.read_lines(source, self.schema, self.validate)
        for record in records:
            key = record.pop("key", None)
            conn.execute(
                "INSERT OR IGNORE INTO records (body, key) VALUES (?, ?)",
                (encode_record(record, None), key if isinstance(key, str) else None),
            )
        now = time.time()
        conn.executemany(
            "INSERT INTO rejected (id, body, reason, time) VALUES (NULL, ?, ?, ?)",
            [(text, f"{source}, {reason}", now) for text, reason in bad],
        )
        conn.execute("INSERT INTO meta (name, value) VALUES ('imported', ?)", (source,))
        logger.warning(
            "%s: imported %d records of the old JSON-lines store %s (kept there)%s.",
            self.path,
            len(records),
            source,
            f"; {len(bad)} unreadable lines went to its 'rejected' table" if bad else "",
        )

    @contextmanager
    def _errors(self, action: str) -> Iterator[None]:
        try:
            yield
        except sqlite3.Error as exc:
            raise describe_error(self.path, exc, action) from None

    # -- writing -------------------------------------------------------------------------------

    @contextmanager
    def writing(self) -> Iterator[SqliteLog]:
        """One write transaction: reads and appends inside it are atomic across processes.

        Nested use joins the open transaction. An exception rolls everything back.
        """
        with self._lock:
            if self._writing and self._pid == os.getpid():
                yield self
                return
            with self._errors("starting a write"):
                conn = self._db()
                conn.execute("BEGIN IMMEDIATE")
            self._writing = True
            try:
                yield self
                with self._errors("committing a write"):
                    conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
            finally:
                self._writing = False

    def append(self, record: Mapping[str, Any], key: str | None = None) -> bool:
        """Append one record in one transaction (adds ``schema`` when the log has one).

        Args:
            record: A JSON-serialisable dict.
            key: An id of this append: a record with the same key already stored makes this
                one a no-op (a retried call is stored once).

        Returns:
            Whether the record was stored (``False``: its key was there already).

        Raises:
            InvalidArgumentError: ``record`` is not a JSON-serialisable dict.
            DataFileError: the file cannot be written.
        """
        text = encode_record(record, self.schema)
        if key is not None and not isinstance(key, str):
            raise InvalidArgumentError(f"key must be a str or None, got {key!r}.")
        with self.writing(), self._errors("appending"):
            cursor = self._db().execute(
                "INSERT OR IGNORE INTO records (body, key) VALUES (?, ?)", (text, key)
            )
            return cursor.rowcount == 1

    def append_after(
        self, build: Callable[[list[dict[str, Any]]], Mapping[str, Any] | None]
    ) -> dict[str, Any] | None:
        """Read every record and append ``build(records)`` in one transaction (``None``: nothing).

        For records that depend on the ones before them (a bank version number). Returns the
        record written, with ``schema``.
        """
        with self.writing():
            records, _ = self.read()
            record = build(records)
            if record is None:
                return None
            self.append(record)
            return decode_record(encode_record(record, self.schema), None)

    # -- reading -------------------------------------------------------------------------------

    def generation(self) -> int:
        """Changes when records are cut (restore) or moved out (repair): a reader that keeps
        an id reads again from the start when it changes."""
        with self._lock, self._errors("reading"):
            value = self._meta(self._db(), "generation")
            return 0 if value is None else int(value)

    def _bump_generation(self, conn: sqlite3.Connection) -> None:
        conn.execute(
            "INSERT INTO meta (name, value) VALUES ('generation', '1') ON CONFLICT(name) "
            "DO UPDATE SET value = CAST(value AS INTEGER) + 1"
        )

    def read(self, since: int = 0, *, check: bool = True) -> tuple[list[dict[str, Any]], int]:
        """The records after id ``since``, and the id to read from next time.

        Corrupt records are skipped and reported (see the module docstring).

        Raises:
            DataFileError: a record of a newer schema (upgrade searchgym), or the file is
                damaged or cannot be read.
        """
        entries, end = self.read_entries(since, check=check)
        return [record for _, record in entries], end

    def read_entries(
        self, since: int = 0, *, check: bool = True
    ) -> tuple[list[tuple[int, dict[str, Any]]], int]:
        """As :meth:`read`, with each record's id. ``check=False`` skips ``validate``."""
        if isinstance(since, bool) or not isinstance(since, int) or since < 0:
            raise InvalidArgumentError(f"since must be a record id >= 0, got {since!r}.")
        validate = self.validate if check else None
        with self._lock, self._errors("reading"):
            rows = (
                self._db()
                .execute("SELECT id, body FROM records WHERE id > ? ORDER BY id", (since,))
                .fetchall()
            )
        entries: list[tuple[int, dict[str, Any]]] = []
        for row_id, body in rows:
            try:
                entries.append((row_id, decode_record(body, self.schema, validate)))
            except NewerSchemaError as exc:
                raise DataFileError(
                    f"{self.path}, record {row_id}: written by a newer searchgym (record schema {exc.version}; "
                    f"this version reads up to {self.schema}). Upgrade searchgym to read this store."
                ) from None
            except ValueError as exc:
                self._report(row_id, str(exc))
        return entries, rows[-1][0] if rows else since

    def _report(self, row_id: int, reason: str) -> None:
        """Log a corrupt record once per process (per generation)."""
        seen = (self.generation(), row_id)
        if seen in self._seen:
            return
        self._seen.add(seen)
        self.corrupt.append((row_id, reason))
        logger.warning(
            "%s, record %d: %s; skipped. Run `searchgym memory repair %s` to move it out.",
            self.path,
            row_id,
            reason,
            os.path.dirname(self.path) or ".",
        )

    def count(self) -> int:
        """Records stored (corrupt ones included)."""
        with self._lock, self._errors("reading"):
            return int(self._db().execute("SELECT COUNT(*) FROM records").fetchone()[0])

    # -- snapshots -----------------------------------------------------------------------------

    def steps(self) -> list[int]:
        """The training steps that have a snapshot, in the order they were taken."""
        with self._lock, self._errors("reading snapshots"):
            return [int(r[0]) for r in self._db().execute("SELECT step FROM snapshots ORDER BY rowid")]

    def snapshot(self, step: int) -> int:
        """Remember the last record as the state after training step ``step``; returns the records held."""
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise InvalidArgumentError(f"step must be an int >= 0, got {step!r}.")
        with self.writing(), self._errors("taking a snapshot"):
            conn = self._db()
            conn.execute(
                "INSERT INTO snapshots (step, last_id, time) SELECT ?, COALESCE(MAX(id), 0), ? FROM records",
                (step, time.time()),
            )
            return int(conn.execute("SELECT COUNT(*) FROM records").fetchone()[0])

    def has_snapshot(self, step: int) -> bool:
        """Whether ``restore(step)`` has a state to go back to (step 0 always has: empty)."""
        return step == 0 or step in self.steps()

    def restore(self, step: int, aside: str | None = None) -> int:
        """Cut the records written after the snapshot of ``step``; returns how many were cut.

        The cut records are appended to ``aside`` (default ``<file>.cut-<step>.jsonl``, one
        record per line) and synced before they leave the database, so nothing is lost.
        Snapshots of later steps are dropped. Step 0 without a snapshot means empty.

        Raises:
            DataFileError: no snapshot of ``step`` (the message lists the steps there are).
        """
        aside = aside or f"{self.path}.cut-{step}.jsonl"
        with self.writing(), self._errors("restoring a snapshot"):
            conn = self._db()
            row = conn.execute(
                "SELECT last_id FROM snapshots WHERE step = ? ORDER BY rowid DESC LIMIT 1", (step,)
            ).fetchone()
            if row is None and step != 0:
                raise DataFileError(
                    f"No snapshot of step {step} in {self.path} (snapshots: {self.steps() or 'none'}). Resume "
                    "from a checkpoint whose step has one, or start a fresh run with a new store path."
                )
            last = 0 if row is None else int(row[0])
            cut = conn.execute("SELECT body FROM records WHERE id > ? ORDER BY id", (last,)).fetchall()
            if cut:
                with open(aside, "a", encoding="utf-8") as handle:
                    handle.write("".join(body + "\n" for (body,) in cut))
                    handle.flush()
                    os.fsync(handle.fileno())
                conn.execute("DELETE FROM records WHERE id > ?", (last,))
                self._bump_generation(conn)
            conn.execute("DELETE FROM snapshots WHERE step > ?", (step,))
            return len(cut)

    def backup(self, target: str | os.PathLike[str]) -> None:
        """Copy the database, as one consistent state, to the new file ``target`` (SQLite's backup)."""
        with self._lock, self._errors("copying it"):
            copy = sqlite3.connect(os.fspath(target))
            try:
                self._db().backup(copy)
            finally:
                copy.close()

    # -- repair --------------------------------------------------------------------------------

    def repair(self) -> RepairReport:
        """Check the file and keep every readable record (``searchgym memory repair``).

        Runs ``PRAGMA integrity_check``. A sound file has its corrupt records moved to the
        ``rejected`` table. A damaged file (or one that is not a database) is rebuilt from
        every record that can still be read, and the original is kept as
        ``<file>.damaged-<time>``. Stop the processes that write the store first.
        """
        from .recovery import rebuild

        report = RepairReport(path=self.path)
        if not os.path.exists(self.path) and not (self.legacy and os.path.exists(self.legacy)):
            return report
        self.close()
        try:
            conn = self._db()
            rows = conn.execute("PRAGMA integrity_check").fetchall()
            problems = [x for (r,) in rows for x in str(r).splitlines() if x and not x.startswith("***")]
        except (sqlite3.DatabaseError, DataFileError) as exc:
            problems = [getattr(exc, "reason", str(exc))]
        self.close()
        if problems != ["ok"]:
            report.problems = problems
            report.original, report.kept = rebuild(self.path)
            self._seen.clear()
            logger.warning(
                "%s: rebuilt (%s); the original is kept as %s.", self.path, problems[0], report.original
            )
        with self.writing(), self._errors("repairing"):
            conn = self._db()
            rows = conn.execute("SELECT id, body FROM records ORDER BY id").fetchall()
            now = time.time()
            for row_id, body in rows:
                try:
                    decode_record(body, self.schema, self.validate)
                except NewerSchemaError:
                    pass
                except ValueError as exc:
                    report.dropped.append((row_id, str(exc)))
                    conn.execute(
                        "INSERT INTO rejected (id, body, reason, time) VALUES (?, ?, ?, ?)",
                        (row_id, body, str(exc), now),
                    )
                    conn.execute("DELETE FROM records WHERE id = ?", (row_id,))
            if report.dropped:
                self._bump_generation(conn)
            report.kept = len(rows) - len(report.dropped)
        return report

    # -- protocol ------------------------------------------------------------------------------

    def close(self) -> None:
        """Close the connection; the next use reopens it."""
        with self._lock:
            if self._conn is not None and self._pid == os.getpid():
                self._conn.close()
            self._conn, self._writing = None, False

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        del state["_lock"]
        state["_conn"], state["_writing"] = None, False
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.RLock()
        self._pid = os.getpid()

    def __repr__(self) -> str:
        return f"SqliteLog({self.path!r})"
