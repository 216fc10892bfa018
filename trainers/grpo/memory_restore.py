"""Putting a checkpoint's copy of the experience-memory store back in place of the live store.

Two stages, so that the live store is untouched until the copy is known to be sound:

1. :func:`stage_memory` copies the checkpoint's ``memory/`` into a hidden folder beside
   the live store. Each file is checked against the checkpoint's manifest while it is
   copied (size before reading, SHA-256 of the very bytes written), and each SQLite file
   must pass SQLite's integrity check on the copy. For a checkpoint without a manifest, a
   SQLite file's size must be the one its header states. Everything is synced to disk.
2. :func:`commit_memory` swaps the staged folder and the live store in one step
   (``renameat2(RENAME_EXCHANGE)`` on Linux), then deletes the old store. Where the
   system cannot swap folders, the live store is renamed aside and the staged one into
   its place; a crash between the two leaves the checkpoint as it was, and resuming again
   restores the store from it.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import hashlib
import logging
import os
import shutil
import sqlite3
import tempfile
from pathlib import Path

from ...error import DataFileError
from ...storage.atomic import fsync_folder
from .manifest import DAMAGED_ADVICE, Manifest, checkpoint_files, file_mismatch, open_regular

__all__ = ["stage_memory", "commit_memory", "discard_staged"]

logger = logging.getLogger(__name__)

_CHUNK = 2**20
_SQLITE_MAGIC = b"SQLite format 3\x00"


def _refuse(path: Path, what: str) -> DataFileError:
    return DataFileError(f"{str(path)!r} {what}; the live memory store is unchanged. {DAMAGED_ADVICE}")


def _sqlite_size(path: Path, fd: int) -> int | None:
    """The size the header of a SQLite file states (page size × pages), or None when it states none.

    Raises:
        DataFileError: the file is not a SQLite database.
    """
    header = os.pread(fd, 100, 0)
    if len(header) < 100 or not header.startswith(_SQLITE_MAGIC):
        raise _refuse(path, "is not a SQLite database (its header is wrong)")
    page = int.from_bytes(header[16:18], "big")
    page = 65536 if page == 1 else page
    pages = int.from_bytes(header[28:32], "big")
    counter_valid = header[24:28] == header[92:96]
    return page * pages if pages and counter_valid else None


def _copy(source: Path, target: Path, expected_size: int | None, expected_sha: str | None) -> None:
    """Copy ``source`` to the new file ``target``, reading at most the size the file may have."""
    fd = open_regular(source)
    try:
        size = os.fstat(fd).st_size
        if expected_size is None and source.suffix == ".sqlite":
            expected_size = _sqlite_size(source, fd)
            if expected_size is not None and size != expected_size:
                raise _refuse(
                    source,
                    f"holds {size:,} bytes where its SQLite header states {expected_size:,} (truncated or damaged)",
                )
        if expected_size is not None and size != expected_size:
            raise file_mismatch(source, f"holds {size:,} bytes where the manifest records {expected_size:,}")
        limit = size if expected_size is None else expected_size
        sha = hashlib.sha256()
        with open(target, "xb") as out:
            left = limit
            while left > 0:
                chunk = os.read(fd, min(_CHUNK, left))
                if not chunk:
                    break
                sha.update(chunk)
                out.write(chunk)
                left -= len(chunk)
            out.flush()
            os.fsync(out.fileno())
        if left:
            raise _refuse(source, "shrank while it was copied")
    finally:
        os.close(fd)
    if expected_sha is not None and sha.hexdigest() != expected_sha:
        raise file_mismatch(source, "has another SHA-256 than the manifest records")


def _integrity(copy: Path, source: Path) -> None:
    """SQLite's integrity check of ``copy`` (a staged file); errors name the checkpoint's ``source``."""
    try:
        conn = sqlite3.connect(f"file:{copy}?immutable=1", uri=True)
        try:
            rows = conn.execute("PRAGMA integrity_check").fetchall()
        finally:
            conn.close()
        problems = [str(r[0]) for r in rows if str(r[0]) != "ok"]
    except sqlite3.DatabaseError as exc:
        problems = [str(exc)]
    if problems:
        raise _refuse(source, f"fails SQLite's integrity check ({problems[0].splitlines()[0]})")


def stage_memory(checkpoint: Path, manifest: Manifest | None, live: Path) -> Path | None:
    """Copy and check the checkpoint's ``memory/`` into a hidden folder beside ``live``.

    Args:
        checkpoint: The checkpoint folder.
        manifest: Its manifest, or None for a checkpoint written without one.
        live: The live store folder (not touched).

    Returns:
        The staged folder, or None when the checkpoint holds no memory copy.

    Raises:
        DataFileError: a file of the copy is a link, not the manifest's, truncated, or
            fails SQLite's integrity check; the message names the checkpoint's file.
    """
    source = checkpoint / "memory"
    if not os.path.lexists(source):
        return None
    names = checkpoint_files(source) if source.is_dir() and not source.is_symlink() else None
    if names is None:
        raise _refuse(source, "is not a folder")
    live.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{live.name}.restore-", dir=live.parent))
    try:
        for name in names:
            record = manifest.files.get(f"memory/{name}") if manifest is not None else None
            if manifest is not None and record is None:
                raise file_mismatch(source / name, "is not listed in the manifest")
            target = staging / name
            target.parent.mkdir(parents=True, exist_ok=True)
            _copy(
                source / name,
                target,
                record.size if record else None,
                record.sha256 if record else None,
            )
            if name.endswith(".sqlite"):
                _integrity(target, source / name)
        for folder in {(staging / n).parent for n in names} | {staging}:
            fsync_folder(folder)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return staging


def discard_staged(staging: Path | None) -> None:
    """Delete a staged copy that will not be committed."""
    if staging is not None:
        shutil.rmtree(staging, ignore_errors=True)


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths in one step (Linux ``renameat2``); False where the system cannot."""
    libc = ctypes.CDLL(None, use_errno=True)
    renameat2 = getattr(libc, "renameat2", None)
    if renameat2 is None:
        return False
    at_fdcwd, rename_exchange = -100, 2
    if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP):
        return False
    raise OSError(code, os.strerror(code), str(b))


def commit_memory(staging: Path, live: Path) -> None:
    """Put the staged copy in place of ``live`` in one step and delete the old store."""
    if not os.path.lexists(live):
        os.replace(staging, live)
    elif _exchange(staging, live):
        shutil.rmtree(staging)  # it now holds the old store
    else:
        aside = Path(tempfile.mkdtemp(prefix=f".{live.name}.old-", dir=live.parent))
        os.replace(live, aside / live.name)
        os.replace(staging, live)
        with contextlib.suppress(OSError):
            shutil.rmtree(aside)
    fsync_folder(live.parent)
