"""The finished trajectories an :class:`~searchgym.memory.ExperienceMemory` has seen.

:class:`TrajectoryFeed` counts them, keeps the few-shot pool (reward ≥ θ_r) and hands out
the window of trajectories each update contrasts. With a store it reads the store's
``trajectories.jsonl`` incrementally, so that it sees what every process sharing the store
appended; without one it keeps them in this process.
"""

from __future__ import annotations

import logging
import os
from collections import deque
from typing import Any

from ...envs.errors import DataFileError, InvalidArgumentError
from ...envs.records import Trajectory
from ...envs.storage.jsonl_log import JsonlLog
from ..serialize import trajectory_from_dict, trajectory_to_dict
from ..store import MemoryStore

__all__ = ["TrajectoryFeed"]

logger = logging.getLogger("searchgym.memory")


class TrajectoryFeed:
    """Trajectories in store order: their count, the few-shot pool and the update windows.

    Not thread-safe: the memory that owns it holds its lock around every call but
    :meth:`add` with a store (appending is safe on its own).

    Args:
        store: The store shared with other processes, or ``None`` for this process only.
        theta_r: The pool keeps trajectories with reward ≥ ``theta_r``.
        max_pool: The pool keeps the latest ``max_pool`` (``None``: all).
        cursor: Number of the first trajectory of the next window (0-based, in store order).
    """

    count: int
    """Trajectories seen (as of the last :meth:`sync`)."""
    pool: deque[Trajectory]
    """The few-shot pool (as of the last :meth:`sync`)."""

    def __init__(self, store: MemoryStore | None, theta_r: float, max_pool: int | None, cursor: int = 0):
        self._store = store
        self.theta_r = theta_r
        self.max_pool = max_pool
        self._cursor = cursor
        self._pending: list[Trajectory] = []  # without a store: the next window itself
        self._reset()
        self.sync()

    def _reset(self) -> None:
        self.count = 0
        self.pool = deque(maxlen=self.max_pool)
        self._offset = 0  # bytes of the log read so far
        self._fid: tuple[int, int] | None = None
        self._cursor_offset = 0  # byte offset of the cursor's trajectory

    @property
    def _log(self) -> JsonlLog:
        assert self._store is not None
        return self._store.log("trajectories")

    def _ingest(self, trajectory: Trajectory) -> None:
        self.count += 1
        if trajectory.reward is not None and trajectory.reward >= self.theta_r:
            self.pool.append(trajectory)

    def _decode(self, record: dict[str, Any], number: int) -> Trajectory:
        try:
            return trajectory_from_dict(record["trajectory"])
        except (KeyError, InvalidArgumentError) as exc:
            assert self._store is not None
            detail = "no 'trajectory' field" if isinstance(exc, KeyError) else str(exc)
            raise DataFileError(
                f"{self._log.path}, line {number}: not a trajectory record ({detail}). Run "
                f"`searchgym memory repair {self._store.root}` to rewrite the file keeping every readable record."
            ) from None

    def sync(self) -> None:
        """Read the trajectories other processes (or this one) appended since the last read."""
        if self._store is None:
            return
        log = self._log
        fid = log.file_id()
        if fid != self._fid:
            if self._fid is not None:
                logger.info("%s was replaced (repaired?); reading it again from the start.", log.path)
            self._reset()
            self._fid = fid
        entries, end = log.read_entries(self._offset)  # skips (and reports) corrupt lines
        for offset, record in entries:
            if self.count == self._cursor:
                self._cursor_offset = offset
            self._ingest(self._decode(record, self.count + 1))
        self._offset = end
        if self._cursor >= self.count:
            self._cursor = self.count
            self._cursor_offset = end

    def add(self, trajectory: Trajectory, key: str | None = None) -> None:
        """Append a finished trajectory to the store, or keep it in this process.

        ``key``, when given, is stored with it (the Ray store uses it to drop a retried append).
        """
        if self._store is None:
            self._ingest(trajectory)
            self._pending.append(trajectory)
        else:
            record: dict[str, Any] = {"trajectory": trajectory_to_dict(trajectory), "pid": os.getpid()}
            if key is not None:
                record["key"] = key
            self._log.append(record)

    def take_window(self) -> tuple[list[Trajectory], tuple[int, int]]:
        """The trajectories added since the last window, and their numbers ``(start, end)``."""
        start = self._cursor
        if self._store is None:
            window, self._pending = self._pending, []
        else:
            self.sync()
            entries, _ = self._log.read_entries(self._cursor_offset)
            window = [
                self._decode(record, start + i + 1)
                for i, (offset, record) in enumerate(entries)
                if offset < self._offset
            ]
            self._cursor_offset = self._offset
        self._cursor = start + len(window)
        return window, (start, self._cursor)
