"""The finished trajectories an :class:`~searchgym.memory.ExperienceMemory` has seen.

:class:`TrajectoryFeed` counts them, keeps the few-shot pool (reward ≥ θ_r) and hands out
the window of trajectories each update contrasts. With a store it reads the store's
``trajectories.sqlite`` incrementally, so that it sees what every process sharing the store
appended; without one it keeps them in this process.
"""

from __future__ import annotations

import logging
import os
from collections import deque
from typing import Any

from ...envs.records import Trajectory
from ...error import DataFileError, InvalidArgumentError
from ...storage.sqlite_log import SqliteLog
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
        self._last = 0  # id of the last record read
        self._generation: int | None = None
        self._cursor_after = 0  # id of the record before the cursor's trajectory

    @property
    def _log(self) -> SqliteLog:
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
                f"{self._log.path}, trajectory {number}: not a trajectory record ({detail}). Run "
                f"`searchgym memory repair {self._store.root}` to rewrite the file keeping every readable record."
            ) from None

    def sync(self) -> None:
        """Read the trajectories other processes (or this one) appended since the last read."""
        if self._store is None:
            return
        log = self._log
        generation = log.generation()
        if generation != self._generation:
            if self._generation is not None:
                logger.info("%s was cut or repaired; reading it again from the start.", log.path)
            self._reset()
            self._generation = generation
        entries, end = log.read_entries(self._last)  # skips (and reports) corrupt records
        for row_id, record in entries:
            if self.count == self._cursor:
                self._cursor_after = self._last
            self._ingest(self._decode(record, self.count + 1))
            self._last = row_id
        self._last = end
        if self._cursor >= self.count:
            self._cursor = self.count
            self._cursor_after = end

    def add(self, trajectory: Trajectory, key: str | None = None) -> bool:
        """Append a finished trajectory to the store, or keep it in this process.

        ``key``, when given, is stored with it: a later append with the same key is dropped
        (the Ray store's retried calls). Returns whether the trajectory was stored.
        """
        if self._store is None:
            self._ingest(trajectory)
            self._pending.append(trajectory)
            return True
        record: dict[str, Any] = {"trajectory": trajectory_to_dict(trajectory), "pid": os.getpid()}
        return self._log.append(record, key=key)

    def take_window(self) -> tuple[list[Trajectory], tuple[int, int]]:
        """The trajectories added since the last window, and their numbers ``(start, end)``."""
        start = self._cursor
        if self._store is None:
            window, self._pending = self._pending, []
        else:
            self.sync()
            entries, _ = self._log.read_entries(self._cursor_after)
            window = [
                self._decode(record, start + i + 1)
                for i, (row_id, record) in enumerate(entries)
                if row_id <= self._last
            ]
            self._cursor_after = self._last
        self._cursor = start + len(window)
        return window, (start, self._cursor)
