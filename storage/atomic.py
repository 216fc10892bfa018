"""Replace a whole file so that a crash leaves the old file or the new one: :func:`write_atomically`;
:func:`fsync_folder` makes a rename in a folder durable."""

from __future__ import annotations

import contextlib
import os
import time

__all__ = ["fsync_folder", "write_atomically"]


def write_atomically(path: str | os.PathLike[str], data: bytes) -> None:
    """Replace the file at ``path`` by ``data``, so that a crash leaves the old file or the new one.

    ``data`` goes to a temporary file beside ``path`` (removed if writing fails), which is
    synced, moved over ``path`` with ``os.replace``, and the folder synced.
    """
    path = os.fspath(path)
    folder = os.path.dirname(path) or "."
    tmp = os.path.join(folder, f".{os.path.basename(path)}.{os.getpid()}-{time.monotonic_ns()}.tmp")
    handle = open(tmp, "xb")
    try:
        with handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    fsync_folder(folder)


def fsync_folder(folder: str | os.PathLike[str]) -> None:
    """Sync ``folder`` itself, so that the files created, renamed or removed in it stay so after a crash."""
    descriptor = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
