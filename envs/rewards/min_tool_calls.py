"""LightSearcher's per-question minimum of searches: :class:`MinToolCallStore`.

The fewest searches that led to a good answer outlives one episode and is shared by every
env worker, so it lives in a store: in this process by default, or in a JSON-lines log
(:class:`~searchgym.envs.storage.jsonl_log.JsonlLog`, the same log as the experience
memory's, with the same guarantees and the same ``searchgym memory repair``) that many
processes share. On a cluster, a Ray actor owns it (:mod:`searchgym.trainers.ray_store`)
and agents call it through an object with the same methods (:class:`MinToolCalls`).

A log line is ``{"id": question id, "n": searches}`` (no ``schema`` field: version 0). A
reader takes the minimum per id. A torn last line (a writer died mid-write) is never read
and is cut off by the next writer before it appends; a corrupt complete line is skipped,
copied to ``<file>.rejected`` and reported (:attr:`MinToolCallStore.skipped_lines`).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable
from typing import Any, Protocol, runtime_checkable

from ..errors import DataFileError, InvalidArgumentError
from ..storage.jsonl_log import JsonlLog
from ..storage.snapshots import LogSnapshots

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
        path: The log file, created (with its folders) on the first write; ``None`` keeps
            the store in this process.
        follow: With ``path``, read what other processes appended before every lookup,
            so workers see each other's records. ``False`` reads the file only at start-up
            and on :meth:`refresh`.
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
        self._log: JsonlLog | None = None
        self._offset = 0  # bytes of the log already read
        self._fid: tuple[int, int] | None = None
        if self.path is not None:
            if os.path.isdir(self.path):
                raise DataFileError(f"MinToolCallStore path {self.path!r} is a folder; give a file path.")
            self._log = JsonlLog(self.path, fsync=fsync, schema=None, validate=check_min_record)
            self.refresh()

    @property
    def skipped_lines(self) -> int:
        """Corrupt complete lines skipped (and copied to ``<file>.rejected``) by this process."""
        return 0 if self._log is None else len(self._log.corrupt)

    # -- reading ---------------------------------------------------------------------------

    def _sync(self) -> None:
        """Merge records appended since the last read; call with the lock held."""
        if self._log is None:
            return
        fid = self._log.file_id()
        if fid != self._fid:  # new, replaced (repaired, restored) or removed: read from 0
            self._mins, self._offset, self._fid = {}, 0, fid
        records, self._offset = self._log.read(self._offset)
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
        with self._lock:
            if self.follow:
                self._sync()
            self._lower(qid, m)

    def lookup_and_lower(self, qid: str, m: int | None) -> int | None:
        """The minimum for ``qid`` before this call, then lower it to ``m`` (``None``: only look).

        LightSearcher's reward reads ``n`` and updates it in one call, so a remote store
        answers it in one round trip.
        """
        return self.lookup_and_lower_many([(qid, m)])[0]

    def lookup_and_lower_many(self, items: Iterable[tuple[str, int | None]]) -> list[int | None]:
        """:meth:`lookup_and_lower` for many questions in order (one read of the log)."""
        items = list(items)
        for qid, m in items:
            _check_update(qid, 0 if m is None else m)
        with self._lock:
            if self.follow:
                self._sync()
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

    def _snapshots(self) -> LogSnapshots:
        if self._log is None:
            raise InvalidArgumentError("An in-memory MinToolCallStore has no snapshots: give it a path.")
        stem = self._log.path[: -len(".jsonl")] if self._log.path.endswith(".jsonl") else self._log.path
        return LogSnapshots(f"{stem}.snapshots.jsonl", {"min_tool_calls": self._log})

    def snapshot(self, step: int) -> None:
        """Remember the log as it is at training step ``step`` (see :mod:`~searchgym.envs.storage.snapshots`)."""
        with self._lock:
            self._snapshots().snapshot(step)

    def restore(self, step: int) -> None:
        """Bring the log back to its snapshot of ``step``; later records are moved aside, not lost."""
        with self._lock:
            self._snapshots().restore(step)
            self._fid = None
            self._sync()

    def close(self) -> None:
        """Close the log's descriptor (a later update reopens it)."""
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
