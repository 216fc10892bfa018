"""The highest acknowledged record id of a log, kept outside its database: :class:`AckFile`.

SQLite drops the frames of a write-ahead log after the first one whose checksum is wrong,
and a deleted ``-wal`` file takes every commit not yet copied into the database with it.
Neither leaves a trace in the database. So after every commit that appended records, the
writer puts the highest record id it committed into ``<file>.acked``, a line of text:
``<database instance> <id>``. A database that holds fewer ids than its ``.acked`` file
says has lost acknowledged records.

The line is written with one ``pwrite`` under an exclusive ``flock``, and only raised, never
lowered, so writers in many processes keep it at the true highest id. It is written after
the commit, so a writer killed in between leaves it lower than the database (nothing is
claimed that was not committed); it is not synced, so it survives a process crash, as the
commits it follows do under ``synchronous=NORMAL``. The instance is a random id kept in the
database's ``meta`` table and changed in every copy (:meth:`SqliteLog.backup
<searchgym.storage.sqlite_log.SqliteLog.backup>`), so a file put back from a
checkpoint is not compared with the ids of the file it replaced.
"""

from __future__ import annotations

import contextlib
import fcntl
import os

__all__ = ["AckFile"]

_WIDTH = 64


class AckFile:
    """``<database>.acked``: the instance and highest acknowledged id of one log."""

    def __init__(self, database: str):
        self.path = database + ".acked"
        self._fd: int | None = None
        self._pid = os.getpid()

    def read(self) -> tuple[str, int] | None:
        """``(instance, id)``, or ``None`` when there is no (readable) file."""
        try:
            with open(self.path, "rb") as handle:
                text = handle.read(_WIDTH).decode("ascii", "replace").split()
        except OSError:
            return None
        if len(text) != 2 or not text[1].isdigit():
            return None
        return text[0], int(text[1])

    def _handle(self) -> int:
        if self._pid != os.getpid():
            self._fd, self._pid = None, os.getpid()  # a forked child opens its own
        if self._fd is None:
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        return self._fd

    def advance(self, instance: str, last: int) -> None:
        """Raise the id to ``last`` (or set both when the file names another instance)."""
        fd = self._handle()
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            text = os.pread(fd, _WIDTH, 0).decode("ascii", "replace").split()
            if len(text) == 2 and text[0] == instance and text[1].isdigit() and int(text[1]) >= last:
                return
            os.pwrite(fd, f"{instance} {last}".ljust(_WIDTH - 1).encode("ascii") + b"\n", 0)
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)

    def set(self, instance: str, last: int) -> None:
        """Set the id to ``last`` even when lower (after a repair has reported the loss)."""
        fd = self._handle()
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            os.pwrite(fd, f"{instance} {last}".ljust(_WIDTH - 1).encode("ascii") + b"\n", 0)
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)

    def close(self) -> None:
        if self._fd is not None and self._pid == os.getpid():
            with contextlib.suppress(OSError):
                os.close(self._fd)
        self._fd = None
