"""One-line errors that name a store file and the true cause of a failure: :func:`describe_error`.

SQLite answers "unable to open database file" for a read-only disk, a folder without write
permission and a missing folder alike, and "database disk image is malformed" both for a
damaged file and for processes that see its write-ahead log differently (its ``-shm`` file
was deleted while they had it open). This module looks at the file system and at the file
to say which it is, and what to do.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3

from ..error import DataFileError

__all__ = ["describe_error", "write_problem", "stale_shm_users", "shm_deleted_error"]

_DAMAGE = ("not a database", "malformed", "corrupt")
_OPENING = ("unable to open", "readonly", "read-only", "disk i/o error", "disk is full", "permission")


def _existing(path: str) -> str:
    """``path``, or its nearest folder that exists."""
    path = os.path.abspath(path)
    while not os.path.exists(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    return path


def write_problem(path: str) -> str | None:
    """Why the database ``path`` (and the files SQLite keeps beside it) cannot be written, or ``None``."""
    folder = _existing(os.path.dirname(os.path.abspath(path)))
    with contextlib.suppress(OSError):
        stats = os.statvfs(folder)
        if stats.f_flag & os.ST_RDONLY:
            return f"the file system holding {folder} is read-only"
        if stats.f_bavail == 0:
            return f"the disk holding {folder} is full"
    if not os.access(folder, os.W_OK | os.X_OK):
        return f"this user (uid {os.geteuid()}) may not write in {folder}"
    if os.path.exists(path) and not os.access(path, os.R_OK | os.W_OK):
        return f"this user (uid {os.geteuid()}) may not read and write {path}"
    return None


def stale_shm_users(path: str) -> list[int]:
    """Processes that map a deleted ``<path>-shm``: they had the store open when it was removed."""
    target = os.path.realpath(path) + "-shm (deleted)"
    found = []
    with contextlib.suppress(OSError):
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            with (
                contextlib.suppress(OSError),
                open(f"/proc/{entry}/maps", encoding="utf-8", errors="replace") as maps,
            ):
                if any(line.rstrip("\n").endswith(target) for line in maps):
                    found.append(int(entry))
    return sorted(found)


def shm_deleted_error(path: str) -> DataFileError | None:
    """The error to raise instead of opening ``path`` while processes write it through a deleted
    ``-shm`` file, or ``None``.

    A process that opened it now would make a new ``-shm`` file: it would not see their
    locks, and its writes and checkpoints could damage the file under them (a connection of a
    process that maps the deleted file shares it). Only a store with a ``-wal`` file can have
    such writers, so ``/proc`` is searched only then.
    """
    users = stale_shm_users(path) if os.path.exists(path + "-wal") else []
    users = [pid for pid in users if pid != os.getpid()]  # this process's connections share its -shm
    return _shm_deleted(path, users, "so this process does not open it") if users else None


def _shm_deleted(path: str, users: list[int], what_now: str) -> DataFileError:
    return DataFileError(
        f"{path}: its shared-memory index {path}-shm was deleted while processes "
        f"{', '.join(map(str, users))} had the store open, and a process that opens it now sees its "
        f"write-ahead log differently from them, {what_now}. Stop every process that uses the store, "
        "then start them again; never delete the -shm or -wal file of a store in use."
    )


def _sound(path: str) -> bool:
    """Whether SQLite's quick check of ``path`` passes on a new read-only connection."""
    with contextlib.suppress(sqlite3.Error):
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            return conn.execute("PRAGMA quick_check").fetchone()[0] == "ok"
        finally:
            conn.close()
    return False


def describe_error(path: str, exc: sqlite3.Error | OSError, action: str) -> DataFileError:
    """A one-line error naming ``path`` and the cause of ``exc``, raised while doing ``action``."""
    store = os.path.dirname(path) or "."
    if isinstance(exc, OSError):
        text = f"{exc.strerror or exc}" + (f": {exc.filename}" if exc.filename else "")
    else:
        text = str(exc).replace("\n", " ")
    lowered = text.lower()
    if isinstance(exc, OSError) or any(word in lowered for word in _OPENING):
        cause = write_problem(path)
        if cause is not None:
            return DataFileError(
                f"{path}: cannot finish {action}: {cause} ({text}). Give the store a writable local disk, or "
                "copy it to one."
            )
    users = stale_shm_users(path) if isinstance(exc, sqlite3.Error) else []
    if users:  # SQLite reports this as damage or as an I/O error, depending on timing
        return _shm_deleted(path, users, f"as this process did ({text} while {action})")
    if isinstance(exc, sqlite3.DatabaseError) and any(word in lowered for word in _DAMAGE):
        if os.path.exists(path) and _sound(path):
            return DataFileError(
                f"{path} is not damaged (SQLite's check of it passes), but this process read it inconsistently "
                f"({text} while {action}): its -shm or -wal file was deleted or replaced while processes had it "
                "open. Stop every process that uses the store, then start them again."
            )
        error = DataFileError(
            f"{path} is damaged or not a searchgym store ({text}) while {action}; run `searchgym memory "
            f"repair {store}` (it keeps the original), or move the file away."
        )
        error.reason = text  # type: ignore[attr-defined]
        return error
    return DataFileError(f"{path}: cannot finish {action} ({text}).")
