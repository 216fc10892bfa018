"""One append-only JSON-lines file shared by many processes: :class:`JsonlLog`.

Lines are as :mod:`~searchgym.envs.storage.jsonl_format` describes them. The experience
memory's store (:mod:`searchgym.memory.store`) and LightSearcher's minimum tool-call store
(:class:`~searchgym.envs.rewards.min_tool_calls.MinToolCallStore`) both keep their records
in such logs.

## Concurrency and crashes

:meth:`JsonlLog.append` writes one complete line with one ``os.write`` on an ``O_APPEND``
descriptor while holding ``fcntl.flock`` on the file, so any number of processes (rollout
workers, Ray actors) append at once without interleaving. Readers take no lock: they read
up to the last ``\\n`` and return the offset reached, so a later :meth:`JsonlLog.read`
continues from there. A writer killed mid-write leaves a *torn* tail (bytes after the last
newline); readers ignore it, and the next writer, which holds the lock and therefore
knows no one else is writing, moves the torn bytes to ``<file>.rejected`` and truncates
them before it appends, so its line starts fresh. A complete line that does not parse, or
is not a record of the file's kind, is corruption, not a crash: a reader skips it, copies
it to the ``.rejected`` file (once, however many readers meet it), logs a warning with the
file and line, and lists it in :attr:`JsonlLog.corrupt`; training goes on.
:meth:`JsonlLog.repair` (``searchgym memory repair PATH``) rewrites the file atomically
keeping every readable record, so that readers stop meeting the line. The lock is
``flock``: use a local file system (not NFS); on a cluster, let one Ray actor own the store
(:mod:`searchgym.trainers.ray_store`).
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from ..errors import DataFileError, InvalidArgumentError
from .jsonl_format import (
    SCHEMA_VERSION,
    Validator,
    decode_line,
    decode_lines,
    encode_record,
    line_number,
    sift_lines,
    write_atomically,
)

__all__ = ["JsonlLog", "RepairReport"]

logger = logging.getLogger("searchgym.memory")

_CHUNK = 1 << 16


@dataclass
class RepairReport:
    """What :meth:`JsonlLog.repair` did to one file."""

    path: str
    kept: int = 0
    """Readable records kept, in their order."""
    dropped: list[tuple[int, str]] = field(default_factory=list)
    """``(line, reason)`` of each complete line that could not be read."""
    torn_bytes: int = 0
    """Bytes of an unfinished last line that were dropped."""
    rejected_path: str | None = None
    """Where the dropped bytes were copied (``None`` when nothing was dropped)."""

    @property
    def changed(self) -> bool:
        return bool(self.dropped or self.torn_bytes)


class JsonlLog:
    """One append-only JSON-lines file shared by many processes (see the module docstring).

    The descriptor is opened on the first append and reopened after a fork, after a
    :meth:`repair` by another process, and after unpickling, so a log can be handed to
    worker processes.

    Args:
        path: The file; its folder is created on the first append.
        fsync: Call ``os.fsync`` after every append (durable across power loss, slower).
        schema: The newest record version this reader understands; ``None`` reads
            schemaless records and adds no ``schema`` field on append.
        validate: Checks one decoded record, raising ``ValueError`` (or a subclass such as
            :class:`InvalidArgumentError`) when it is not a record of this kind. Reading
            reports such a line as corrupt, and :meth:`repair` drops it.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        fsync: bool = False,
        schema: int | None = SCHEMA_VERSION,
        validate: Validator | None = None,
    ):
        if not isinstance(path, (str, os.PathLike)):
            raise InvalidArgumentError(f"path must be a file path, got {path!r}.")
        self.path = os.fspath(path)
        if os.path.isdir(self.path):
            raise DataFileError(f"{self.path!r} is a folder; a log needs a file path.")
        self.fsync = bool(fsync)
        self.schema = schema
        self.validate = validate
        self._fd: int | None = None
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self.corrupt: list[tuple[int, str]] = []
        """``(line, reason)`` of each corrupt line this process skipped while reading."""
        self._seen_corrupt: set[tuple[tuple[int, int] | None, int]] = set()

    # -- writing -------------------------------------------------------------------------------

    def _open(self) -> int:
        folder = os.path.dirname(self.path)
        if folder:
            os.makedirs(folder, exist_ok=True)
        return os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)

    def _close_fd(self) -> None:
        if self._fd is not None and self._pid == os.getpid():
            try:
                os.close(self._fd)
            except OSError:
                pass
        self._fd = None

    @contextmanager
    def _locked(self) -> Iterator[int]:
        """Hold the thread lock and ``flock`` on the current file; yield its descriptor."""
        with self._lock:
            if self._pid != os.getpid():  # a forked child must not share the parent's lock
                self._fd, self._pid = None, os.getpid()
            while True:
                if self._fd is None:
                    self._fd = self._open()
                fd = self._fd
                fcntl.flock(fd, fcntl.LOCK_EX)
                try:
                    same = os.fstat(fd).st_ino == os.stat(self.path).st_ino
                except FileNotFoundError:
                    same = False
                if same:
                    break
                fcntl.flock(fd, fcntl.LOCK_UN)  # the file was replaced (repair) or removed
                self._close_fd()
            try:
                yield fd
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)

    def _drop_torn_tail(self, fd: int) -> None:
        """With the lock held: move an unfinished last line aside and cut it off."""
        size = os.fstat(fd).st_size
        if size == 0 or os.pread(fd, 1, size - 1) == b"\n":
            return
        start = size
        while start > 0:
            lo = max(0, start - _CHUNK)
            chunk = os.pread(fd, start - lo, lo)
            cut = chunk.rfind(b"\n")
            if cut >= 0:
                start = lo + cut + 1
                break
            start = lo
        torn = os.pread(fd, size - start, start)
        rejected = self._reject([torn])
        os.ftruncate(fd, start)
        logger.warning(
            "%s: dropped an unfinished last line of %d bytes (a writer died mid-write); copied to %s.",
            self.path,
            len(torn),
            rejected,
        )

    def _write_all(self, fd: int, data: bytes) -> None:
        self._write_fd(fd, data)  # one write in practice; a short write continues under the lock
        if self.fsync:
            os.fsync(fd)

    def append(self, record: Mapping[str, Any]) -> None:
        """Append one record as one line (adds ``schema`` when the log has one).

        Raises:
            InvalidArgumentError: ``record`` is not a JSON-serialisable dict.
            DataFileError: the file cannot be written.
        """
        data = encode_record(record, self.schema)
        try:
            with self._locked() as fd:
                self._drop_torn_tail(fd)
                self._write_all(fd, data)
        except OSError as exc:
            raise DataFileError(f"Cannot append to {self.path!r}: {exc}.") from exc

    def append_after(
        self, build: Callable[[list[dict[str, Any]]], Mapping[str, Any] | None]
    ) -> dict[str, Any] | None:
        """Read every record and append ``build(records)``, all under the lock.

        For records that depend on the ones before them (a bank version number), so that
        two processes can never write the same one. ``build`` returning ``None`` writes
        nothing. Meant for small files: it reads the whole file.

        Returns:
            The record written (with ``schema``), or ``None``.
        """
        try:
            with self._locked() as fd:
                self._drop_torn_tail(fd)
                records, _ = self.read()
                record = build(records)
                if record is None:
                    return None
                data = encode_record(record, self.schema)
                self._write_all(fd, data)
                return json.loads(data)
        except OSError as exc:
            raise DataFileError(f"Cannot append to {self.path!r}: {exc}.") from exc

    # -- reading -------------------------------------------------------------------------------

    def file_id(self) -> tuple[int, int] | None:
        """``(device, inode)`` of the file now at ``path``, or ``None`` when it does not exist.

        A reader that keeps an offset compares it between reads: a change means the file
        was replaced (repaired) and must be read again from 0.
        """
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return None
        return st.st_dev, st.st_ino

    def read(self, since: int = 0, *, check: bool = True) -> tuple[list[dict[str, Any]], int]:
        """The complete records after byte ``since``, and the offset to read from next time.

        An unfinished last line is left unread (the offset stops before it). A missing file
        reads as empty.

        A complete line that is not a valid record is skipped, quarantined and reported
        (see the module docstring).

        Raises:
            DataFileError: a record of a newer schema (upgrade searchgym), or the file
                cannot be read.
        """
        entries, end = self.read_entries(since, check=check)
        return [record for _, record in entries], end

    def read_entries(
        self, since: int = 0, *, check: bool = True
    ) -> tuple[list[tuple[int, dict[str, Any]]], int]:
        """As :meth:`read`, with the byte offset at which each record's line starts.

        ``check=False`` skips the log's ``validate`` function (for a caller that decodes
        and checks each record itself).
        """
        validate = self.validate if check else None
        if isinstance(since, bool) or not isinstance(since, int) or since < 0:
            raise InvalidArgumentError(f"since must be a byte offset >= 0, got {since!r}.")
        try:
            with open(self.path, "rb") as handle:
                handle.seek(since)
                data = handle.read()
                file_id = (os.fstat(handle.fileno()).st_dev, os.fstat(handle.fileno()).st_ino)
        except FileNotFoundError:
            return [], since
        except OSError as exc:
            raise DataFileError(f"Cannot read {self.path!r}: {exc}.") from exc
        entries, end, corrupt = decode_lines(
            data, since, path=self.path, schema=self.schema, validate=validate
        )
        for offset, line, reason in corrupt:
            self._quarantine(file_id, offset, line, reason)
        return entries, end

    def _quarantine(self, file_id: tuple[int, int], offset: int, line: bytes, reason: str) -> None:
        """Copy a corrupt line to the ``.rejected`` file and report it, once per process."""
        if (file_id, offset) in self._seen_corrupt:
            return
        self._seen_corrupt.add((file_id, offset))
        number = line_number(self.path, offset)
        self.corrupt.append((number, reason))
        try:
            rejected = self._reject([line])
        except OSError as exc:
            rejected = f"nowhere ({exc})"
        logger.warning(
            "%s, line %d: %s; skipped (copied to %s). Run `searchgym memory repair %s` to remove it.",
            self.path,
            number,
            reason,
            rejected,
            os.path.dirname(self.path) or ".",
        )

    # -- repair --------------------------------------------------------------------------------

    def _reject(self, chunks: list[bytes]) -> str:
        """Append ``chunks`` (as lines) to ``<file>.rejected``, skipping any it already holds."""
        rejected = self.path + ".rejected"
        fd = os.open(rejected, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            held = os.pread(fd, os.fstat(fd).st_size, 0).split(b"\n")
            new = [c.rstrip(b"\n") for c in chunks]
            data = b"".join(c + b"\n" for c in new if c not in held)
            if data:
                self._write_fd(fd, data)
        finally:
            os.close(fd)
        return rejected

    @staticmethod
    def _write_fd(fd: int, data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]

    def repair(self) -> RepairReport:
        """Rewrite the file keeping every readable record, in order.

        Lines that do not parse (and an unfinished last line) are copied to
        ``<file>.rejected`` first; the new file is written beside the old one, synced, and
        moved over it with ``os.replace``, so a crash during repair leaves the old file
        whole. Writers in other processes notice the new file before their next append.
        Records from a newer schema are kept as they are.
        """
        report = RepairReport(path=self.path)
        if not os.path.exists(self.path):
            return report
        with self._locked() as fd:
            keep, bad, torn = sift_lines(os.pread(fd, os.fstat(fd).st_size, 0), self.schema, self.validate)
            report.kept, report.torn_bytes = len(keep), len(torn)
            report.dropped = [(number, reason) for number, _, reason in bad]
            if not report.changed:
                return report
            report.rejected_path = self._reject([line for _, line, _ in bad] + ([torn] if torn else []))
            write_atomically(self.path, b"".join(keep))
        self._close_fd()
        logger.info(
            "%s: repaired; kept %d records, dropped %d corrupt lines and %d torn bytes (copied to %s).",
            self.path,
            report.kept,
            len(report.dropped),
            report.torn_bytes,
            report.rejected_path,
        )
        return report

    def keep_first(self, count: int, aside: str) -> int:
        """Keep the first ``count`` records and move every later line (and an unreadable
        one among them) to the file ``aside``, atomically. Returns the lines moved."""
        seen = [0]

        def keep(record: dict[str, Any]) -> bool:
            seen[0] += 1
            return seen[0] <= count

        return self.keep_where(keep, aside)

    def keep_where(self, keep: Callable[[dict[str, Any]], bool], aside: str) -> int:
        """Keep the records for which ``keep`` is true, in order; move the other lines to the
        file ``aside`` (appended), and rewrite the file atomically. Returns the lines moved."""
        if not os.path.exists(self.path):
            return 0
        with self._locked() as fd:
            data = os.pread(fd, os.fstat(fd).st_size, 0)
            end = data.rfind(b"\n") + 1
            kept: list[bytes] = []
            moved: list[bytes] = []
            for line in data[:end].split(b"\n")[:-1]:
                if not line.strip():
                    continue
                try:
                    good = keep(decode_line(line, self.schema, self.validate))
                except ValueError:
                    good = False
                (kept if good else moved).append(line + b"\n")
            if data[end:]:
                moved.append(data[end:] + b"\n")
            if not moved:
                return 0
            with open(aside, "ab") as handle:
                handle.write(b"".join(moved))
                handle.flush()
                os.fsync(handle.fileno())
            write_atomically(self.path, b"".join(kept))
        self._close_fd()
        return len(moved)

    # -- protocol ------------------------------------------------------------------------------

    def close(self) -> None:
        """Close the descriptor; the next append reopens it."""
        with self._lock:
            self._close_fd()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        del state["_lock"]
        state["_fd"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self.__dict__.setdefault("corrupt", [])
        self.__dict__.setdefault("_seen_corrupt", set())

    def __del__(self) -> None:
        try:
            self._close_fd()
        except Exception:  # noqa: BLE001 - never raise from a finaliser
            pass

    def __repr__(self) -> str:
        return f"JsonlLog({self.path!r})"
