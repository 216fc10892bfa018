"""The on-disk format of the memory stores: a folder of append-only JSON-lines logs.

## Format

A store is a folder. Each kind of record has its own file, ``<kind>.jsonl``:

================================  ===================================================================
``trajectories.jsonl``            finished episodes: ``{"schema": 1, "trajectory": {...}}`` (the
                                  trajectory as :func:`~searchgym.memory.serialize.trajectory_to_dict`
                                  writes it)
``bank.jsonl``                    every version of LightSearcher's experience bank, oldest first:
                                  ``{"schema": 1, "version", "step", "good", "bad", "summarizer",
                                  "window": [start, end], "time", "bank": {three groups}}``
``updates.jsonl``                 every update attempt, written or skipped, with its reason
``hiexp_levels.jsonl``            HiExp's records, ``{"schema": 1, "level", "type", "title", "tags",
                                  "description", "thinking"}`` (written by ``memory.hierarchical``)
``min_tool_calls.jsonl``          LightSearcher's per-question minimum of searches, written by
                                  :class:`~searchgym.envs.rewards.lightsearcher.MinToolCallStore`
================================  ===================================================================

Every line is one UTF-8 JSON object ending in ``\\n``. Records written through
:class:`JsonlLog` carry ``"schema"``, the format version (:data:`SCHEMA_VERSION`); a reader
refuses a newer version with an error that says to upgrade. ``min_tool_calls.jsonl`` is
the one exception: :class:`MinToolCallStore` predates this module and writes
``{"id": ..., "n": ...}`` lines without ``schema`` (read it as version 0) through the same
single-``os.write``-on-``O_APPEND`` discipline, and it skips unreadable lines itself. Point
``LightSearcherReward(store=MemoryStore(PATH).path_of("min_tool_calls"))`` at it to keep
it beside the bank.

## Concurrency and crashes

:meth:`JsonlLog.append` writes one complete line with one ``os.write`` on an ``O_APPEND``
descriptor while holding ``fcntl.flock`` on the file, so any number of processes (rollout
workers, Ray actors) append at once without interleaving. Readers take no lock: they read
up to the last ``\\n`` and return the offset reached, so a later :meth:`JsonlLog.read`
continues from there. A writer killed mid-write leaves a *torn* tail (bytes after the last
newline); readers ignore it, and the next writer, which holds the lock and therefore
knows no one else is writing, moves the torn bytes to ``<kind>.jsonl.rejected`` and
truncates them before it appends, so its line starts fresh. A complete line that does not
parse, or is not a record of the file's kind, is corruption, not a crash: reading raises :class:`DataFileError` with the file and
line, and :meth:`JsonlLog.repair` (``searchgym memory repair PATH``) rewrites the file
(temp file + ``os.replace``) keeping every readable record and copying the rest to the
``.rejected`` file. The lock is ``flock``: use a local file system (not NFS).
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..envs.errors import DataFileError, InvalidArgumentError, did_you_mean
from .serialize import trajectory_from_dict
from .summarizers import ExperienceBank

__all__ = [
    "SCHEMA_VERSION",
    "KINDS",
    "JsonlLog",
    "MemoryStore",
    "RepairReport",
]

logger = logging.getLogger("searchgym.memory")

SCHEMA_VERSION = 1
"""Version of the record layout written by this searchgym."""

KINDS = ("trajectories", "bank", "updates", "hiexp_levels", "min_tool_calls")
"""The files a store may hold, ``<kind>.jsonl`` each."""

_SCHEMALESS = ("min_tool_calls",)
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


def _decode(
    line: bytes, schema: int | None, validate: Callable[[dict[str, Any]], object] | None = None
) -> dict[str, Any]:
    """One record, or ``ValueError`` with a plain reason."""
    try:
        record = json.loads(line)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ValueError(f"not valid JSON ({exc})") from None
    if not isinstance(record, dict):
        raise ValueError(f"not a JSON object (got {type(record).__name__})")
    if schema is not None:
        version = record.get("schema")
        if isinstance(version, bool) or not isinstance(version, int):
            raise ValueError(f"no integer 'schema' field (got {version!r})")
        if version > schema:
            raise _NewerSchema(version)
    if validate is not None:
        try:
            validate(record)
        except (KeyError, TypeError) as exc:
            raise ValueError(f"not a record of this file's kind ({type(exc).__name__}: {exc})") from None
    return record


class _NewerSchema(ValueError):
    def __init__(self, version: int):
        super().__init__(version)
        self.version = version


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
        validate: Callable[[dict[str, Any]], object] | None = None,
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

    # -- writing -------------------------------------------------------------------------------

    def _encode(self, record: Mapping[str, Any]) -> bytes:
        if not isinstance(record, Mapping):
            raise InvalidArgumentError(f"A record must be a dict, got {type(record).__name__}.")
        body = dict(record)
        if self.schema is not None:
            body.setdefault("schema", self.schema)
        try:
            text = json.dumps(body, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
        except (TypeError, ValueError) as exc:
            raise InvalidArgumentError(f"A record must be JSON-serialisable without NaN: {exc}.") from exc
        return (text + "\n").encode("utf-8")

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
        view = memoryview(data)
        while view:  # one write in practice; a short write continues under the same lock
            view = view[os.write(fd, view) :]
        if self.fsync:
            os.fsync(fd)

    def append(self, record: Mapping[str, Any]) -> None:
        """Append one record as one line (adds ``schema`` when the log has one).

        Raises:
            InvalidArgumentError: ``record`` is not a JSON-serialisable dict.
            DataFileError: the file cannot be written.
        """
        data = self._encode(record)
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
                data = self._encode(record)
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

    def _line_number(self, offset: int) -> int:
        with open(self.path, "rb") as handle:
            return handle.read(offset).count(b"\n") + 1

    def read(self, since: int = 0, *, check: bool = True) -> tuple[list[dict[str, Any]], int]:
        """The complete records after byte ``since``, and the offset to read from next time.

        An unfinished last line is left unread (the offset stops before it). A missing file
        reads as empty.

        Raises:
            DataFileError: a complete line is not a valid record (names the file and line),
                or the file cannot be read.
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
        except FileNotFoundError:
            return [], since
        except OSError as exc:
            raise DataFileError(f"Cannot read {self.path!r}: {exc}.") from exc
        end = data.rfind(b"\n") + 1
        records: list[tuple[int, dict[str, Any]]] = []
        pos = 0
        while pos < end:
            nl = data.index(b"\n", pos)
            line = data[pos:nl]
            if line.strip():
                try:
                    records.append((since + pos, _decode(line, self.schema, validate)))
                except _NewerSchema as exc:
                    raise DataFileError(
                        f"{self.path}, line {self._line_number(since + pos)}: written by a newer searchgym "
                        f"(record schema {exc.version}; this version reads up to {self.schema}). "
                        "Upgrade searchgym to read this store."
                    ) from None
                except ValueError as exc:
                    raise DataFileError(
                        f"{self.path}, line {self._line_number(since + pos)}: {exc}. Run "
                        f"`searchgym memory repair {os.path.dirname(self.path) or '.'}` to rewrite the file "
                        "keeping every readable record."
                    ) from None
            pos = nl + 1
        return records, since + end

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return iter(self.read()[0])

    def __len__(self) -> int:
        return len(self.read()[0])

    # -- repair --------------------------------------------------------------------------------

    def _reject(self, chunks: list[bytes]) -> str:
        rejected = self.path + ".rejected"
        with open(rejected, "ab") as handle:
            for chunk in chunks:
                handle.write(chunk if chunk.endswith(b"\n") else chunk + b"\n")
        return rejected

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
            size = os.fstat(fd).st_size
            data = os.pread(fd, size, 0)
            end = data.rfind(b"\n") + 1
            keep: list[bytes] = []
            bad: list[bytes] = []
            for number, line in enumerate(data[:end].split(b"\n")[:-1], start=1):
                if not line.strip():
                    continue
                try:
                    _decode(line, self.schema, self.validate)
                except _NewerSchema:
                    pass
                except ValueError as exc:
                    report.dropped.append((number, str(exc)))
                    bad.append(line)
                    continue
                keep.append(line + b"\n")
            report.kept = len(keep)
            if end < len(data):
                report.torn_bytes = len(data) - end
                bad.append(data[end:])
            if not report.changed:
                return report
            report.rejected_path = self._reject(bad)
            tmp = f"{self.path}.tmp-{os.getpid()}-{time.monotonic_ns()}"
            with open(tmp, "wb") as handle:
                handle.write(b"".join(keep))
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, self.path)
            folder = os.open(os.path.dirname(self.path) or ".", os.O_RDONLY)
            try:
                os.fsync(folder)
            finally:
                os.close(folder)
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

    def __del__(self) -> None:
        try:
            self._close_fd()
        except Exception:  # noqa: BLE001 - never raise from a finaliser
            pass

    def __repr__(self) -> str:
        return f"JsonlLog({self.path!r})"


# -- what a record of each kind must hold -----------------------------------------------------


def _need(record: Mapping[str, Any], key: str, types: type | tuple[type, ...]) -> Any:
    if key not in record:
        raise ValueError(f"missing field {key!r}")
    value = record[key]
    wanted = types if isinstance(types, tuple) else (types,)
    if (isinstance(value, bool) and bool not in wanted) or not isinstance(value, wanted):
        raise ValueError(
            f"field {key!r} must be {' or '.join(t.__name__ for t in wanted)}, got {value!r:.80}"
        )
    return value


def _window(record: Mapping[str, Any]) -> None:
    window = _need(record, "window", list)
    if len(window) != 2 or not all(isinstance(w, int) and not isinstance(w, bool) for w in window):
        raise ValueError(f"field 'window' must be [start, end], got {window!r}")


def _check_trajectory(record: dict[str, Any]) -> None:
    trajectory_from_dict(_need(record, "trajectory", dict))


def _check_bank(record: dict[str, Any]) -> None:
    for key in ("version", "step", "good", "bad"):
        _need(record, key, int)
    _need(record, "summarizer", str)
    _need(record, "time", (int, float))
    _window(record)
    ExperienceBank.from_dict(_need(record, "bank", dict))


def _check_update(record: dict[str, Any]) -> None:
    for key in ("step", "good", "bad"):
        _need(record, key, int)
    if _need(record, "outcome", str) not in ("written", "skipped", "failed"):
        raise ValueError(f"field 'outcome' must be written, skipped or failed, got {record['outcome']!r}")
    _window(record)


def _check_hiexp(record: dict[str, Any]) -> None:
    if _need(record, "level", int) < 1:
        raise ValueError(f"field 'level' must be >= 1, got {record['level']!r}")
    for key in ("type", "title", "description", "thinking"):
        _need(record, key, str)
    tags = _need(record, "tags", list)
    if not all(isinstance(t, str) for t in tags):
        raise ValueError(f"field 'tags' must be a list of strings, got {tags!r:.80}")


_VALIDATORS: dict[str, Callable[[dict[str, Any]], object]] = {
    "trajectories": _check_trajectory,
    "bank": _check_bank,
    "updates": _check_update,
    "hiexp_levels": _check_hiexp,
}


class MemoryStore:
    """A store folder: one :class:`JsonlLog` per kind (see the module docstring).

    Args:
        root: The folder, created when ``create`` is true (the default).
        fsync: Passed to every log.
        create: Make the folder now. ``False`` requires it to exist (for inspection).

    Raises:
        DataFileError: ``root`` is a file, or is missing and ``create`` is false.
    """

    def __init__(self, root: str | os.PathLike[str], *, fsync: bool = False, create: bool = True):
        if not isinstance(root, (str, os.PathLike)):
            raise InvalidArgumentError(f"A store path must be a folder path, got {root!r}.")
        self.root = Path(root)
        if self.root.exists() and not self.root.is_dir():
            raise DataFileError(
                f"Store path {str(self.root)!r} is a file; a memory store is a folder of .jsonl files."
            )
        if not self.root.exists():
            if not create:
                raise DataFileError(
                    f"No memory store at {str(self.root)!r}: the folder does not exist. Give the folder "
                    "passed to ExperienceMemory(path=...)."
                )
            self.root.mkdir(parents=True, exist_ok=True)
        self.fsync = fsync
        self._logs: dict[str, JsonlLog] = {}

    def path_of(self, kind: str) -> str:
        """The file of ``kind`` (one of :data:`KINDS`)."""
        if kind not in KINDS:
            raise did_you_mean("store kind", kind, KINDS)
        return str(self.root / f"{kind}.jsonl")

    def log(self, kind: str) -> JsonlLog:
        """The log of ``kind``; ``min_tool_calls`` is read without a schema check."""
        if kind not in self._logs:
            schema = None if kind in _SCHEMALESS else SCHEMA_VERSION
            self._logs[kind] = JsonlLog(
                self.path_of(kind), fsync=self.fsync, schema=schema, validate=_VALIDATORS.get(kind)
            )
        return self._logs[kind]

    def kinds_present(self) -> list[str]:
        """The kinds whose file exists, in :data:`KINDS` order."""
        return [k for k in KINDS if os.path.exists(self.path_of(k))]

    def repair(self) -> list[RepairReport]:
        """Repair every file of the store that :class:`JsonlLog` writes (see :meth:`JsonlLog.repair`).

        ``min_tool_calls.jsonl`` is left alone: its reader already skips unreadable lines.
        """
        return [self.log(k).repair() for k in self.kinds_present() if k not in _SCHEMALESS]

    def close(self) -> None:
        for log in self._logs.values():
            log.close()

    def __repr__(self) -> str:
        return f"MemoryStore({str(self.root)!r})"
