"""LightSearcher's per-question minimum of searches: :class:`MinToolCallStore`.

The fewest searches that led to a good answer outlives one episode and is shared by every
env worker, so it lives in a store: in this process by default, or in a SQLite log
(:class:`~searchgym.storage.sqlite_log.SqliteLog`, the same log as the experience
memory's, with the same guarantees and the same ``searchgym memory repair``) that many
processes share. On a cluster, a Ray actor owns it (:mod:`searchgym.trainers.ray_store`)
and agents call it through an object with the same methods (:class:`MinToolCalls`).

A record is ``{"id": question id, "n": searches}`` (no ``schema`` field: version 0). A
reader takes the minimum per id. :meth:`MinToolCallStore.lookup_and_lower_many` reads and
lowers in one write transaction, so it is atomic across processes. A corrupt record is
skipped and reported (:attr:`MinToolCallStore.skipped_lines`). A path that holds an old
JSON-lines file is imported once (the file is kept as ``<path>.imported``).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable
from typing import Any, Protocol, runtime_checkable

from ...error import DataFileError, InvalidArgumentError
from ...storage.sqlite_log import SqliteLog

__all__ = ["MinToolCalls", "MinToolCallStore", "check_min_record"]


@runtime_checkable
class MinToolCalls(Protocol):
    """What LightSearcher's reward needs of a minimum tool-call store (local or remote)."""

    def get(self, qid: str) -> int | None: ...

    def update(self, qid: str, m: int) -> None: ...

    def lookup_and_lower(self, qid: str, m: int | None) -> int | None: ...

    def minima(self) -> dict[str, int]: ...


def check_min_record(record: dict[str, Any]) -> None:
    """Raise ``ValueError`` unless ``record`` is ``{"id": str, "n": int >= 0}``."""
    qid, n = record.get("id"), record.get("n")
    if not isinstance(qid, str):
        raise ValueError(f"field 'id' must be a question id (str), got {qid!r:.80}")
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"field 'n' must be a search count (int >= 0), got {n!r:.80}")


def _check_update(qid: object, m: object) -> None:
    if not isinstance(qid, str):
        raise InvalidArgumentError(f"qid must be a str (a question id), got {qid!r}.")
    if isinstance(m, bool) or not isinstance(m, int) or m < 0:
        raise InvalidArgumentError(f"m must be a non-negative int (a search count), got {m!r}.")


class MinToolCallStore:
    """Per question id, the fewest searches among trajectories that answered well.

    Thread-safe and picklable (a Ray or multiprocessing worker can receive it with its
    reward scheme; a pickled in-memory store is a copy, a file-backed one is shared).

    Args:
        path: The database file (``min_tool_calls.sqlite`` by convention), created with its
            folders on first use; ``None`` keeps the store in this process.
        follow: With ``path``, read what other processes appended before every lookup,
            so workers see each other's records. ``False`` reads the file only at start-up,
            on :meth:`refresh` and when lowering (which is atomic across processes either way).
        fsync: Sync every append to disk (durable across power loss, slower).

    Raises:
        DataFileError: ``path`` names a folder or cannot be read.
    """

    def __init__(
        self, path: str | os.PathLike[str] | None = None, follow: bool = True, *, fsync: bool = False
    ) -> None:
        if path is not None and not isinstance(path, (str, os.PathLike)):
            raise InvalidArgumentError(f"path must be a file path or None, got {path!r}.")
        if not isinstance(follow, bool):
            raise InvalidArgumentError(f"follow must be a bool, got {follow!r}.")
        self.path = os.fspath(path) if path is not None else None
        self.follow = follow
        self._mins: dict[str, int] = {}
        self._lock = threading.Lock()
        self._log: SqliteLog | None = None
        self._last = 0  # id of the last record read
        self._generation: int | None = None
        if self.path is not None:
            if os.path.isdir(self.path):
                raise DataFileError(f"MinToolCallStore path {self.path!r} is a folder; give a file path.")
            self._log = SqliteLog(self.path, fsync=fsync, schema=None, validate=check_min_record)
            self.refresh()

    @property
    def skipped_lines(self) -> int:
        """Corrupt records skipped by this process (``searchgym memory repair`` moves them out)."""
        return 0 if self._log is None else len(self._log.corrupt)

    # -- reading ---------------------------------------------------------------------------

    def _sync(self) -> None:
        """Merge records appended since the last read; call with the lock held."""
        if self._log is None:
            return
        generation = self._log.generation()
        if generation != self._generation:  # records were cut (restore) or moved out (repair)
            self._mins, self._last, self._generation = {}, 0, generation
        records, self._last = self._log.read(self._last)
        for record in records:
            qid, n = record["id"], record["n"]
            if qid not in self._mins or n < self._mins[qid]:
                self._mins[qid] = n

    def refresh(self) -> None:
        """Merge the records other processes appended to the log since the last read."""
        with self._lock:
            self._sync()

    def get(self, qid: str) -> int | None:
        """The fewest searches recorded for ``qid``, or ``None`` when there is none yet."""
        with self._lock:
            if self.follow:
                self._sync()
            return self._mins.get(qid)

    # -- writing ---------------------------------------------------------------------------

    def _lower(self, qid: str, m: int) -> None:
        current = self._mins.get(qid)
        if current is not None and current <= m:
            return
        self._mins[qid] = m
        if self._log is not None:
            self._log.append({"id": qid, "n": m})

    def update(self, qid: str, m: int) -> None:
        """Record that ``qid`` was answered well with ``m`` searches (keeps the minimum)."""
        _check_update(qid, m)
        self.lookup_and_lower_many([(qid, m)])

    def lookup_and_lower(self, qid: str, m: int | None) -> int | None:
        """The minimum for ``qid`` before this call, then lower it to ``m`` (``None``: only look).

        LightSearcher's reward reads ``n`` and updates it in one call, so a remote store
        answers it in one round trip.
        """
        return self.lookup_and_lower_many([(qid, m)])[0]

    def lookup_and_lower_many(self, items: Iterable[tuple[str, int | None]]) -> list[int | None]:
        """:meth:`lookup_and_lower` for many questions in order, in one transaction: no other
        process lowers a minimum between this call's read and its write."""
        items = list(items)
        for qid, m in items:
            _check_update(qid, 0 if m is None else m)
        lowers = any(m is not None for _, m in items)
        with self._lock:
            if self._log is None or not lowers:
                if self.follow:
                    self._sync()
                return self._lookup_and_lower(items)
            with self._log.writing():
                self._sync()
                return self._lookup_and_lower(items)

    def _lookup_and_lower(self, items: list[tuple[str, int | None]]) -> list[int | None]:
        before = []
        for qid, m in items:
            before.append(self._mins.get(qid))
            if m is not None:
                self._lower(qid, m)
        return before

    def minima(self) -> dict[str, int]:
        """A copy of the fewest searches per question id known so far."""
        with self._lock:
            if self.follow:
                self._sync()
            return dict(self._mins)

    # -- checkpoints -----------------------------------------------------------------------

    def _stored(self) -> SqliteLog:
        if self._log is None:
            raise InvalidArgumentError("An in-memory MinToolCallStore has no snapshots: give it a path.")
        return self._log

    def snapshot(self, step: int) -> None:
        """Remember the store as it is after training step ``step`` (:meth:`SqliteLog.snapshot`)."""
        with self._lock:
            self._stored().snapshot(step)

    def steps(self) -> list[int]:
        """The training steps that have a snapshot, in the order they were taken."""
        return self._stored().steps()

    def has_snapshot(self, step: int) -> bool:
        """Whether :meth:`restore` can go back to ``step``."""
        return self._stored().has_snapshot(step)

    def restore(self, step: int) -> int:
        """Bring the store back to its snapshot of ``step``; later records go to
        ``<path>.cut-<step>.jsonl``, not lost. Returns how many were cut."""
        with self._lock:
            cut = self._stored().restore(step)
            self._generation = None
            self._sync()
            return cut

    def holds_data(self) -> bool:
        """Whether the store holds any record."""
        return self._stored().count() > 0

    def close(self) -> None:
        """Close the log's connection (a later call reopens it)."""
        if self._log is not None:
            self._log.close()

    # -- protocol --------------------------------------------------------------------------

    def __len__(self) -> int:
        with self._lock:
            return len(self._mins)

    def __getstate__(self) -> dict[str, Any]:
        with self._lock:
            state = self.__dict__.copy()
        del state["_lock"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"MinToolCallStore(path={self.path!r}, questions={len(self._mins)})"
