"""One append-only log of records that many processes share: :class:`SqliteLog`, a SQLite database.

The experience memory's store (:mod:`searchgym.memory.store`) and LightSearcher's minimum
tool-call store (:class:`~searchgym.envs.rewards.min_tool_calls.MinToolCallStore`) keep
their records in such logs, one database file each.

## The database

================  ===========================================================================
``records``       ``id`` (increasing, never reused), ``body`` (the record as JSON text),
                  ``key`` (unique when given: a retried append with the same key is dropped;
                  indexed only where given)
``snapshots``     ``step``, ``last_id``: the last record of each checkpointed training step
``rejected``      records moved out by :meth:`SqliteLog.repair` or an import, with the reason
``meta``          ``generation`` (changes when records are cut or repaired, so readers that
                  remember an id read again from the start), ``imported`` (an old
                  JSON-lines file already imported), ``instance`` (a random id of this
                  database; a copy gets its own) and ``id_floor`` (the highest id given
                  before records were deleted: ids are never given twice)
================  ===========================================================================

## Concurrency and crashes

The database is in WAL mode with a busy timeout and 1 KiB pages (an append writes the last
page of the table again): readers never wait for writers, writers wait for each other.
Every append is one transaction (``BEGIN IMMEDIATE`` ... ``COMMIT``); once
:meth:`SqliteLog.append` returns, the record survives the process being killed
(``synchronous=NORMAL``), and with ``fsync=True`` a power cut too (``synchronous=FULL``).
After the commit its id goes to ``<file>.acked`` (:mod:`~searchgym.storage.acked`):
a file that holds fewer ids than that (its WAL was deleted or damaged) is refused on open
with the count of missing records, until a repair has read back what it can.
:meth:`SqliteLog.writing` holds one write transaction over several reads and appends, so a
read-then-write (a bank version number, a minimum lowered) is atomic across processes.

A record that does not decode, or is not a record of the log's kind, is skipped by readers,
logged once with its file and id and listed in :attr:`SqliteLog.corrupt`; training goes on.
A file that is not a database, or a damaged one, is a one-line :class:`DataFileError`
naming the file, as is a file that cannot be written (with the cause: a read-only disk, no
permission) and one whose ``-shm`` was deleted under running processes
(:mod:`~searchgym.storage.diagnose`). :meth:`SqliteLog.repair` (``searchgym memory
repair``) runs SQLite's integrity check, moves corrupt records to ``rejected``, rebuilds a
damaged file from every row that can be read, keeping the original beside it, so that a
crash at any instant leaves the old file or the new one (:mod:`~searchgym.storage.recovery`),
and reads back the records of a lost WAL that its intact frames hold.

WAL needs shared memory between the processes, so keep the file on a local disk of one
machine (not NFS). On a cluster, one Ray actor owns the store (:mod:`searchgym.trainers.ray_store`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from ..error import DataFileError, InvalidArgumentError
from . import legacy, recovery
from .acked import AckFile
from .diagnose import describe_error, shm_deleted_error, stale_shm_users, write_problem
from .records import SCHEMA_VERSION, NewerSchemaError, Validator, decode_record, encode_record
from .salvage import salvage

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


PAGE_SIZE = 1024
"""Page size of a new database: an append rewrites the last page of the table in the WAL."""

_PRAGMAS = (
    "PRAGMA journal_size_limit=1048576",  # the WAL is cut back to 1 MiB after a checkpoint
    "PRAGMA secure_delete=ON",  # deleted rows are overwritten, so a salvage never brings them back
)

_HIGHEST = (
    "SELECT MAX(COALESCE((SELECT MAX(id) FROM records), 0), "
    "COALESCE((SELECT CAST(value AS INTEGER) FROM meta WHERE name = 'id_floor'), 0){sequence})"
)
"""The highest id the log has given: ids cut or moved out stay given (``id_floor``)."""

_TABLES = (
    "CREATE TABLE IF NOT EXISTS records (id INTEGER PRIMARY KEY, body TEXT NOT NULL, key TEXT)",
    "CREATE UNIQUE INDEX IF NOT EXISTS records_key ON records (key) WHERE key IS NOT NULL",
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
    acknowledged: int = 0
    """The highest record id acknowledged to a writer, as ``<file>.acked`` holds it (0: unknown)."""
    missing: list[int] = field(default_factory=list)
    """Acknowledged ids after the highest one the file held: ``[first, last]``, or empty."""
    salvaged: int = 0
    """Records of ``missing`` read back from the frames of a damaged or kept WAL."""
    wal_copies: list[str] = field(default_factory=list)
    """Copies of the WAL kept beside the file when records were missing."""

    @property
    def lost(self) -> int:
        """Acknowledged records that could not be read back."""
        return 0 if not self.missing else self.missing[1] - self.missing[0] + 1 - self.salvaged

    @property
    def changed(self) -> bool:
        return bool(self.dropped or self.problems or self.missing)


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
        readonly: Only read (``searchgym memory show``): nothing is created, set up or
            finished, and a store on a read-only disk is read when no WAL is beside it.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        fsync: bool = False,
        schema: int | None = SCHEMA_VERSION,
        validate: Validator | None = None,
        legacy: str | os.PathLike[str] | None = None,
        readonly: bool = False,
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
        self.readonly = bool(readonly)
        self.corrupt: list[tuple[int, str]] = []
        """``(id, reason)`` of each corrupt record this process skipped while reading."""
        self._seen: set[tuple[int, int]] = set()
        self._conn: sqlite3.Connection | None = None
        self._pid = os.getpid()
        self._lock = threading.RLock()
        self._writing = False
        self._ack = AckFile(self.path)
        self._instance: str | None = None
        self._appended = 0  # the highest id appended in the open write transaction
        self._next_id = ""  # how an append picks its id (set when the connection opens)
        self._highest_sql = _HIGHEST.format(sequence="")
        self._repairing = False

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
        refused = shm_deleted_error(self.path)
        if refused is not None:
            raise refused
        if self.readonly:
            return self._open_readonly()
        folder = os.path.dirname(self.path)
        try:
            if folder:
                os.makedirs(folder, exist_ok=True)
            recovery.finish_interrupted(self.path)
        except OSError as exc:
            raise describe_error(self.path, exc, "opening it") from None
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
                conn = self._set_up(conn, source)
                break
            except _Busy:
                # Switching a new file to WAL while another process does the same can answer
                # "database is locked" at once, without SQLite's busy wait: wait and try again.
                if time.monotonic() > deadline:
                    raise describe_error(
                        self.path, sqlite3.OperationalError("database is locked"), "opening it"
                    ) from None
                time.sleep(0.05)
                conn = self._connect()
        try:
            self._learn(conn)
            if not self._repairing:
                self._check_acknowledged(conn)
        except sqlite3.Error as exc:
            conn.close()
            raise describe_error(self.path, exc, "opening it") from None
        except BaseException:
            conn.close()
            raise
        return conn

    def _open_readonly(self) -> sqlite3.Connection:
        if not os.path.exists(self.path):
            raise DataFileError(f"{self.path}: no such store file.")
        uris = [f"file:{self.path}?mode=ro"]
        if write_problem(self.path) and not os.path.exists(self.path + "-wal"):
            uris.append(
                f"file:{self.path}?immutable=1"
            )  # nothing but the file to read, and none may write it
        error: sqlite3.Error | None = None
        for uri in uris:
            try:
                conn = sqlite3.connect(
                    uri, uri=True, timeout=BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False
                )
                conn.execute("SELECT COUNT(*) FROM sqlite_master").fetchone()
                self._learn(conn)
                return conn
            except sqlite3.Error as exc:
                error = exc
        assert error is not None
        raise describe_error(self.path, error, "opening it") from None

    def _learn(self, conn: sqlite3.Connection) -> None:
        """What this connection needs to know of the file: its instance and how ids are given."""
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        self._instance = self._meta(conn, "instance") if "meta" in tables else None
        sequence = ", COALESCE((SELECT seq FROM sqlite_sequence WHERE name = 'records'), 0)"
        self._highest_sql = _HIGHEST.format(sequence=sequence if "sqlite_sequence" in tables else "")
        # A database made with AUTOINCREMENT keeps giving ids that way; a new one takes the
        # highest id given + 1 (no sqlite_sequence page written per append).
        self._next_id = "" if "sqlite_sequence" in tables else f"({self._highest_sql} + 1)"

    def highest_id(self) -> int:
        """The highest record id this log has given (ids of records cut or moved out included)."""
        with self._lock, self._errors("reading"):
            return int(self._db().execute(self._highest_sql).fetchone()[0])

    def _check_acknowledged(self, conn: sqlite3.Connection) -> None:
        """Refuse a file that holds fewer ids than it acknowledged (a lost or damaged WAL)."""
        acked = self._ack.read()  # before the database: a commit after this only raises the database's
        if acked is None or self._instance is None or acked[0] != self._instance:
            return
        highest = int(conn.execute(self._highest_sql).fetchone()[0])
        if acked[1] <= highest:
            return
        if stale_shm_users(self.path):  # not lost: other processes write through a deleted index
            raise describe_error(
                self.path, sqlite3.DatabaseError("database disk image is malformed"), "opening it"
            )
        kept = self._keep_wal()
        missing = acked[1] - highest
        raise DataFileError(
            f"{self.path}: {missing} acknowledged record{'s' if missing != 1 else ''} (ids {highest + 1}-"
            f"{acked[1]}) are missing: its write-ahead log {self.path}-wal was deleted or damaged, or the file "
            f"was replaced by an older copy{f'; the WAL is kept as {kept}' if kept else ''}. Run `searchgym "
            f"memory repair {os.path.dirname(self.path) or '.'}` to read back what the WAL still holds and go on "
            "without the rest."
        )

    def _keep_wal(self) -> str | None:
        """Copy the live WAL aside before closing the connection lets SQLite checkpoint it away."""
        wal = self.path + "-wal"
        if not os.path.exists(wal) or os.path.getsize(wal) == 0:
            return None
        kept = f"{self.path}.wal-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}-{time.monotonic_ns()}"
        try:
            shutil.copyfile(wal, kept)
        except OSError:
            return None
        return kept

    def _connect(self) -> sqlite3.Connection:
        return sqlite3.connect(
            self.path, timeout=BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False
        )

    def _set_up(self, conn: sqlite3.Connection, source: str | None) -> sqlite3.Connection:
        """WAL mode, the sync level and the tables on a new connection; closes it on failure."""
        try:
            conn.execute(f"PRAGMA page_size={PAGE_SIZE}")  # takes effect on a new, empty file only
            mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise DataFileError(
                    f"{self.path}: SQLite cannot use WAL mode here (journal mode {mode!r}); keep stores on a "
                    "local disk, not a network file system."
                )
            conn.execute(f"PRAGMA synchronous={'FULL' if self.fsync else 'NORMAL'}")
            for pragma in _PRAGMAS:
                conn.execute(pragma)
            if self._needs_setup(conn, source):  # a write only when there is something to set up
                conn.execute("BEGIN IMMEDIATE")
                try:
                    for statement in _TABLES:
                        conn.execute(statement)
                    conn.execute(
                        "INSERT OR IGNORE INTO meta (name, value) VALUES ('instance', ?)",
                        (os.urandom(8).hex(),),
                    )
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
        except (sqlite3.Error, OSError) as exc:
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
            if self.readonly:
                raise InvalidArgumentError(
                    f"{self.path} was opened read-only; open it without readonly=True to write."
                )
            with self._errors("starting a write"):
                conn = self._db()
                conn.execute("BEGIN IMMEDIATE")
            self._writing, self._appended = True, 0
            try:
                yield self
                with self._errors("committing a write"):
                    if self._appended and self._instance is None:
                        self._instance = os.urandom(8).hex()
                        conn.execute(
                            "INSERT OR IGNORE INTO meta (name, value) VALUES ('instance', ?)",
                            (self._instance,),
                        )
                        self._instance = self._meta(conn, "instance")
                    conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
            finally:
                self._writing = False
            if self._appended and self._instance is not None:
                with self._errors("recording the acknowledged id"):
                    self._ack.advance(self._instance, self._appended)

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
            conn = self._db()
            if self._next_id:
                cursor = conn.execute(
                    f"INSERT OR IGNORE INTO records (id, body, key) VALUES ({self._next_id}, ?, ?)",
                    (text, key),
                )
            else:
                cursor = conn.execute("INSERT OR IGNORE INTO records (body, key) VALUES (?, ?)", (text, key))
            if cursor.rowcount == 1:
                self._appended = max(self._appended, int(cursor.lastrowid or 0))
                return True
            return False

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

    def _hold_ids(self, conn: sqlite3.Connection) -> None:
        """Before records are deleted: the ids given so far are never given again."""
        conn.execute(
            "INSERT INTO meta (name, value) VALUES ('id_floor', CAST((" + self._highest_sql + ") AS TEXT)) "
            "ON CONFLICT(name) DO UPDATE SET value = excluded.value"
        )

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

    def last(self) -> dict[str, Any] | None:
        """The newest readable record, or ``None`` when the log holds none (a counter's value).

        Corrupt records after it are skipped and reported, as :meth:`read` does.

        Raises:
            DataFileError: as :meth:`read`.
        """
        with self._lock, self._errors("reading"):
            rows = self._db().execute("SELECT id, body FROM records ORDER BY id DESC")
            for row_id, body in rows:
                try:
                    return decode_record(body, self.schema, self.validate)
                except NewerSchemaError as exc:
                    raise DataFileError(
                        f"{self.path}, record {row_id}: written by a newer searchgym (record schema "
                        f"{exc.version}; this version reads up to {self.schema}). Upgrade searchgym to read "
                        "this store."
                    ) from None
                except ValueError as exc:
                    self._report(row_id, str(exc))
        return None

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
                self._hold_ids(conn)
                conn.execute("DELETE FROM records WHERE id > ?", (last,))
                self._bump_generation(conn)
            conn.execute("DELETE FROM snapshots WHERE step > ?", (step,))
            return len(cut)

    def backup(self, target: str | os.PathLike[str]) -> None:
        """Copy the database, as one consistent state, to the new file ``target`` (SQLite's backup).

        The copy is a database of its own: it gets a new instance id, so its ids are not
        compared with this file's acknowledged ones (see :mod:`~searchgym.storage.acked`).
        """
        with self._lock, self._errors("copying it"):
            copy = sqlite3.connect(os.fspath(target), isolation_level=None)
            try:
                self._db().backup(copy)
                copy.execute(
                    "INSERT INTO meta (name, value) VALUES ('instance', ?) ON CONFLICT(name) DO UPDATE SET "
                    "value = excluded.value",
                    (os.urandom(8).hex(),),
                )
            finally:
                copy.close()

    # -- repair --------------------------------------------------------------------------------

    def repair(self) -> RepairReport:
        """Check the file and keep every readable record (``searchgym memory repair``).

        Runs ``PRAGMA integrity_check``. A damaged file (or one that is not a database) is
        rebuilt from every record that can still be read (:mod:`~searchgym.storage.recovery`),
        and the original is kept as ``<file>.damaged-<time>``. A file that holds fewer ids
        than it acknowledged (its WAL was lost or damaged) gets back what the WAL's intact
        frames still hold, and the report says how many records are lost. Corrupt records
        are moved to the ``rejected`` table. Stop the processes that write the store first.

        Raises:
            DataFileError: the file cannot be written (a read-only disk, no permission).
        """
        report = RepairReport(path=self.path)
        if not os.path.exists(self.path) and not (self.legacy and os.path.exists(self.legacy)):
            return report
        problem = write_problem(self.path)
        if problem is not None:
            raise DataFileError(
                f"{self.path}: cannot repair it: {problem}. A repair writes beside the file; copy the store "
                "to a writable local disk and repair the copy."
            )
        self.close()
        self._repairing = True
        try:
            recovery.finish_interrupted(self.path)  # an earlier repair's journal first
            self._repair(report)
        except OSError as exc:
            raise describe_error(self.path, exc, "repairing it") from None
        finally:
            self._repairing = False
        self.close()
        return report

    def _check(self) -> tuple[list[str], str | None]:
        """SQLite's integrity check and the instance id, read without writing (no checkpoint)."""
        if self._legacy_pending():
            self._db()  # the import first: a JSON-lines file is not damage
            self.close()
        try:
            conn = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True, timeout=BUSY_TIMEOUT_S)
        except sqlite3.Error as exc:
            return [str(exc)], None
        try:
            rows = conn.execute("PRAGMA integrity_check").fetchall()
            problems = [x for (r,) in rows for x in str(r).splitlines() if x and not x.startswith("***")]
            instance = None
            with contextlib.suppress(sqlite3.Error):
                instance = self._meta(conn, "instance")
            return problems, instance
        except sqlite3.Error as exc:
            return [str(exc)], None
        finally:
            conn.close()

    def _legacy_pending(self) -> bool:
        if self.legacy and os.path.exists(self.legacy):
            return True
        try:
            with open(self.path, "rb") as handle:
                return handle.read(4096).lstrip().startswith(b"{")
        except OSError:
            return False

    def _repair(self, report: RepairReport) -> None:
        rebuilt = 0
        acked = self._ack.read()
        copy = self._keep_wal()  # before anything can checkpoint it away
        problems, instance = self._check()
        acknowledged = acked[1] if acked is not None and (instance is None or acked[0] == instance) else 0
        instance = instance or (acked[0] if acked is not None else None) or os.urandom(8).hex()
        report.acknowledged = acknowledged
        if problems != ["ok"]:
            report.problems = problems
            # The acknowledged ids stay given in the rebuilt file from the moment it goes live:
            # a crash before this repair ends leaves no store that seems to have lost them anew.
            meta = {"generation": str(time.time_ns()), "instance": instance, "id_floor": str(acknowledged)}
            report.original, report.kept, rebuilt = recovery.rebuild(self.path, _TABLES, meta)
            self._seen.clear()
            logger.warning(
                "%s: rebuilt (%s); the original is kept as %s.", self.path, problems[0], report.original
            )
        with self.writing(), self._errors("repairing"):
            conn = self._db()
            highest = (
                rebuilt if report.original is not None else int(conn.execute(self._highest_sql).fetchone()[0])
            )
            if acknowledged > highest:
                report.missing = [highest + 1, acknowledged]
                if report.original is None:  # a rebuild has read the WAL's frames already
                    report.salvaged, report.wal_copies = self._salvage_wal(conn, highest, acknowledged)
                    highest = int(conn.execute(self._highest_sql).fetchone()[0])
                self._bump_generation(conn)
            if copy is not None and not report.wal_copies:
                os.unlink(copy)  # not needed: nothing was missing, or the original WAL is kept with the file
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
                    self._hold_ids(conn)
                    conn.execute("DELETE FROM records WHERE id = ?", (row_id,))
            if report.dropped:
                self._bump_generation(conn)
            report.kept = len(rows) - len(report.dropped)
            conn.execute(
                "INSERT INTO meta (name, value) VALUES ('id_floor', ?) ON CONFLICT(name) DO UPDATE SET "
                "value = MAX(CAST(value AS INTEGER), excluded.value)",
                (max(acknowledged, highest),),
            )
            self._instance = self._meta(conn, "instance") or instance
            if self._meta(conn, "instance") is None:
                conn.execute("INSERT INTO meta (name, value) VALUES ('instance', ?)", (self._instance,))
        self._ack.set(self._instance, max(acknowledged, highest))  # the loss is reported: start from here

    def _salvage_wal(
        self, conn: sqlite3.Connection, highest: int, acknowledged: int
    ) -> tuple[int, list[str]]:
        """Put back the records with ids in ``(highest, acknowledged]`` found in intact WAL frames;
        returns how many, and the WAL copies read."""
        folder, name = os.path.split(self.path)
        kept = sorted(
            os.path.join(folder, n) for n in os.listdir(folder or ".") if n.startswith(name + ".wal-")
        )
        found: dict[int, tuple[int, str, str | None]] = {}
        for wal in [*kept, self.path + "-wal"]:
            if os.path.exists(wal):
                found.update(salvage(self.path, [wal]).records)
        rows = [found[i] for i in sorted(found) if highest < i <= acknowledged]
        before = conn.total_changes
        conn.executemany("INSERT OR IGNORE INTO records (id, body, key) VALUES (?, ?, ?)", rows)
        return conn.total_changes - before, kept

    # -- protocol ------------------------------------------------------------------------------

    def close(self) -> None:
        """Close the connection; the next use reopens it."""
        with self._lock:
            if self._conn is not None and self._pid == os.getpid():
                self._conn.close()
            self._conn, self._writing = None, False
            self._ack.close()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        del state["_lock"]
        state["_conn"], state["_writing"], state["_ack"] = None, False, AckFile(self.path)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.RLock()
        self._pid = os.getpid()

    def __repr__(self) -> str:
        return f"SqliteLog({self.path!r})"
