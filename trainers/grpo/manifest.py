"""What belongs to one checkpoint: its ``manifest.json``.

The manifest names the run that wrote the checkpoint and lists every file of it with its
size and SHA-256::

    {"format": 1, "run_id": "3f2c…", "step": 200,
     "files": {"model/model.safetensors": {"size": 1048576, "sha256": "9a0b…"}, ...}}

It is written last, atomically, once every other file is written and synced. Resuming
checks the folder against it before anything is read for use: a file it does not list, a
listed file that is missing, or one whose size or digest differs (another run's file, or a
damaged one) is an error that names the file. Sizes are compared before any byte is read,
so no file is read beyond the size the checkpoint wrote.

A checkpoint never holds a symbolic link or anything but folders and regular files; one
that does is refused before its manifest is read.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from ...error import DataFileError
from ...storage.atomic import fsync_folder, write_atomically

__all__ = [
    "MANIFEST",
    "DAMAGED_ADVICE",
    "FileRecord",
    "Manifest",
    "new_run_id",
    "checkpoint_files",
    "open_regular",
    "read_bounded",
    "write_manifest",
    "read_manifest",
    "verify_files",
    "file_mismatch",
]

MANIFEST = "manifest.json"
_FORMAT = 1
_MANIFEST_LIMIT = 16 * 2**20
"""Bytes a manifest may have (about 100,000 files)."""
_CHUNK = 2**20

DAMAGED_ADVICE = (
    "Move the damaged folder aside to resume from the checkpoint before it (the run then redoes "
    "the steps since), or set checkpoint.resume to another checkpoint folder."
)


@dataclass(frozen=True)
class FileRecord:
    """One file of a checkpoint as it was written.

    Attributes:
        size: Its size in bytes.
        sha256: The SHA-256 of its bytes, in hex.
    """

    size: int
    sha256: str


@dataclass(frozen=True)
class Manifest:
    """A checkpoint's ``manifest.json``.

    Attributes:
        run_id: The run that wrote the checkpoint (kept across resumes).
        step: The step of the checkpoint.
        files: Every file but the manifest, by its ``/``-separated path in the folder.
    """

    run_id: str
    step: int
    files: dict[str, FileRecord]


def new_run_id() -> str:
    """A fresh run id (a random UUID in hex)."""
    return uuid.uuid4().hex


def _refuse(path: Path, what: str) -> DataFileError:
    return DataFileError(f"{str(path)!r} {what}. {DAMAGED_ADVICE}")


def _transient_sqlite_file(name: str, size: int) -> bool:
    """SQLite's ``-shm`` index, or a ``-wal`` with no frames: what any process that opens a
    store copy creates beside it while it reads. They hold no data; they are neither listed,
    checked nor restored."""
    return name.endswith(".sqlite-shm") or (name.endswith(".sqlite-wal") and size == 0)


def checkpoint_files(folder: Path) -> list[str]:
    """Every regular file under ``folder`` but the manifest (and SQLite's transient files beside
    an opened store copy), as sorted ``/``-separated paths.

    Raises:
        DataFileError: a symbolic link or anything else that is neither a folder nor a
            regular file (named).
    """
    found: list[str] = []

    def walk(directory: Path, prefix: str) -> None:
        with os.scandir(directory) as entries:
            for entry in entries:
                mode = entry.stat(follow_symlinks=False).st_mode
                path = Path(entry.path)
                if stat.S_ISLNK(mode):
                    raise _refuse(
                        path,
                        "is a symbolic link; a checkpoint holds only its own files, so resuming follows none",
                    )
                if stat.S_ISDIR(mode):
                    walk(path, f"{prefix}{entry.name}/")
                elif stat.S_ISREG(mode):
                    if not _transient_sqlite_file(entry.name, entry.stat(follow_symlinks=False).st_size):
                        found.append(f"{prefix}{entry.name}")
                else:
                    raise _refuse(path, "is not a regular file (a device, pipe or socket)")

    walk(folder, "")
    return sorted(name for name in found if name != MANIFEST)


def open_regular(path: Path) -> int:
    """Open ``path`` for reading without following a link; the descriptor of a regular file.

    Raises:
        DataFileError: it is missing, a link, or not a regular file.
    """
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError as exc:
        raise _refuse(path, "is missing") from exc
    except OSError as exc:
        if os.path.islink(path):
            raise _refuse(path, "is a symbolic link; resuming follows none") from exc
        raise _refuse(path, f"cannot be opened ({exc.strerror})") from exc
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise _refuse(path, "is not a regular file")
    return fd


def read_bounded(path: Path, limit: int, what: str) -> bytes:
    """The bytes of ``path``, refused without reading them when it holds more than ``limit``.

    Args:
        path: The file.
        limit: The most bytes a valid file can have.
        what: What a valid file is, for the message (``"the size manifest.json records"``).

    Raises:
        DataFileError: the file is missing, a link, or larger than ``limit``.
    """
    fd = open_regular(path)
    with os.fdopen(fd, "rb") as handle:
        size = os.fstat(handle.fileno()).st_size
        if size > limit:
            raise _refuse(path, f"holds {size:,} bytes, more than {what} ({limit:,})")
        data = bytearray()
        while len(data) <= limit:  # in chunks: never a buffer of the bound's size
            chunk = handle.read(min(_CHUNK, limit + 1 - len(data)))
            if not chunk:
                break
            data += chunk
    if len(data) > limit:
        raise _refuse(path, f"grew beyond {what} ({limit:,} bytes) while it was read")
    return bytes(data)


def _digest(fd: int, limit: int) -> str:
    """SHA-256 of at most ``limit`` bytes read from ``fd``."""
    sha = hashlib.sha256()
    left = limit
    while left > 0:
        chunk = os.read(fd, min(_CHUNK, left))
        if not chunk:
            break
        sha.update(chunk)
        left -= len(chunk)
    return sha.hexdigest()


def write_manifest(folder: Path, run_id: str, step: int) -> Manifest:
    """Sync every file of ``folder`` to disk, then write its manifest (atomically, last).

    Returns:
        The manifest written.
    """
    files: dict[str, FileRecord] = {}
    folders = {folder}
    for name in checkpoint_files(folder):
        path = folder / name
        folders.add(path.parent)
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            size = os.fstat(fd).st_size
            files[name] = FileRecord(size, _digest(fd, size))
        finally:
            os.close(fd)
    for directory in folders:
        fsync_folder(directory)
    body = {
        "format": _FORMAT,
        "run_id": run_id,
        "step": step,
        "files": {name: {"size": r.size, "sha256": r.sha256} for name, r in files.items()},
    }
    write_atomically(folder / MANIFEST, (json.dumps(body, indent=1) + "\n").encode("utf-8"))
    return Manifest(run_id, step, files)


def read_manifest(folder: Path) -> Manifest | None:
    """The manifest of ``folder``, or None when it has none.

    Raises:
        DataFileError: the manifest is a link, too large, or not a manifest.
    """
    path = folder / MANIFEST
    if not os.path.lexists(path):
        return None
    data = read_bounded(path, _MANIFEST_LIMIT, "a manifest can have")
    try:
        body = json.loads(data.decode("utf-8"))
        if not isinstance(body, dict) or body.get("format") != _FORMAT:
            raise ValueError(f"not a format-{_FORMAT} manifest")
        run_id, step, listed = body["run_id"], body["step"], body["files"]
        if not isinstance(run_id, str) or not run_id:
            raise ValueError("run_id must be a non-empty string")
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise ValueError("step must be a non-negative int")
        if not isinstance(listed, dict):
            raise ValueError("files must be an object")
        files = {}
        for name, entry in listed.items():
            size, sha = entry["size"], entry["sha256"]
            bad_name = name.startswith("/") or ".." in name.split("/") or name == MANIFEST
            if bad_name or isinstance(size, bool) or not isinstance(size, int) or size < 0:
                raise ValueError(f"bad entry {name!r}")
            if not isinstance(sha, str) or len(sha) != 64:
                raise ValueError(f"bad digest of {name!r}")
            files[name] = FileRecord(size, sha)
    except (UnicodeDecodeError, ValueError, KeyError, TypeError) as exc:
        raise _refuse(path, f"is unreadable ({exc})") from exc
    return Manifest(run_id, step, files)


def file_mismatch(path: Path, what: str) -> DataFileError:
    """The error for a file that is not the one the manifest records."""
    return _refuse(
        path, f"{what}: it is another run's file or a damaged one, not the one this checkpoint wrote"
    )


def verify_files(folder: Path, manifest: Manifest, *, skip_digest: Iterable[str] = ()) -> None:
    """Check that ``folder`` holds exactly the files of ``manifest``, each as it was written.

    Every listed file must exist with its recorded size (checked for all files before any
    is read) and digest; no other file may be present.

    Args:
        folder: The checkpoint folder.
        manifest: Its manifest.
        skip_digest: Path prefixes whose digests are left to the caller (checked while they
            are copied); their sizes are still checked.

    Raises:
        DataFileError: a link, a file not listed, a listed file missing, or one whose size
            or digest differs; the message names the file.
    """
    present = checkpoint_files(folder)
    extra = sorted(set(present) - set(manifest.files))
    if extra:
        raise _refuse(
            folder / extra[0],
            f"is not part of this checkpoint ({MANIFEST} does not list it); a file from elsewhere was "
            "added, so resuming would mix it in",
        )
    missing = sorted(set(manifest.files) - set(present))
    if missing:
        raise DataFileError(
            f"Checkpoint {str(folder)!r} has no {missing[0]} (listed in {MANIFEST}). {DAMAGED_ADVICE}"
        )
    for name, record in manifest.files.items():
        size = (folder / name).lstat().st_size
        if size != record.size:
            raise file_mismatch(
                folder / name, f"holds {size:,} bytes where {MANIFEST} records {record.size:,}"
            )
    skipped = tuple(skip_digest)
    for name, record in manifest.files.items():
        if name.startswith(skipped):
            continue
        fd = open_regular(folder / name)
        try:
            digest = _digest(fd, record.size)
        finally:
            os.close(fd)
        if digest != record.sha256:
            raise file_mismatch(folder / name, f"has another SHA-256 than {MANIFEST} records")
