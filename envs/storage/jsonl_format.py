"""The line format of the append-only stores: records to lines and back, and atomic rewrites.

Every line is one UTF-8 JSON object ending in ``\\n``. A log with a schema adds
``"schema"``, the format version (:data:`SCHEMA_VERSION`), to every record it writes; a
reader refuses a newer version with an error that says to upgrade. Bytes after the last
``\\n`` are an unfinished (torn) line, never a record. :class:`~searchgym.envs.storage.jsonl_log.JsonlLog`
does the file handling; this module holds the pure parts.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable, Mapping
from typing import Any

from ..errors import DataFileError, InvalidArgumentError

__all__ = [
    "SCHEMA_VERSION",
    "Validator",
    "encode_record",
    "decode_line",
    "decode_lines",
    "line_number",
    "Corrupt",
    "sift_lines",
    "write_atomically",
]

SCHEMA_VERSION = 1
"""Version of the record layout written by this searchgym."""

Validator = Callable[[dict[str, Any]], object]
"""Checks one decoded record, raising ``ValueError`` when it is not a record of its file's kind."""


class NewerSchemaError(ValueError):
    """A record written by a newer searchgym (its ``schema`` is above the reader's)."""

    def __init__(self, version: int):
        super().__init__(version)
        self.version = version


def encode_record(record: Mapping[str, Any], schema: int | None) -> bytes:
    """One record as one line, with ``schema`` added when given and absent.

    Raises:
        InvalidArgumentError: ``record`` is not a JSON-serialisable dict without NaN.
    """
    if not isinstance(record, Mapping):
        raise InvalidArgumentError(f"A record must be a dict, got {type(record).__name__}.")
    body = dict(record)
    if schema is not None:
        body.setdefault("schema", schema)
    try:
        text = json.dumps(body, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        raise InvalidArgumentError(f"A record must be JSON-serialisable without NaN: {exc}.") from exc
    return (text + "\n").encode("utf-8")


def decode_line(line: bytes, schema: int | None, validate: Validator | None = None) -> dict[str, Any]:
    """One record, or ``ValueError`` with a plain reason (:class:`NewerSchemaError` for a newer schema)."""
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
            raise NewerSchemaError(version)
    if validate is not None:
        try:
            validate(record)
        except (KeyError, TypeError) as exc:
            raise ValueError(f"not a record of this file's kind ({type(exc).__name__}: {exc})") from None
    return record


def line_number(path: str, offset: int) -> int:
    """The 1-based number of the line that starts at byte ``offset`` of ``path``."""
    with open(path, "rb") as handle:
        return handle.read(offset).count(b"\n") + 1


Corrupt = tuple[int, bytes, str]
"""A complete line that is not a valid record: ``(offset, line, reason)``."""


def decode_lines(
    data: bytes, since: int, *, path: str, schema: int | None, validate: Validator | None
) -> tuple[list[tuple[int, dict[str, Any]]], int, list[Corrupt]]:
    """The records of the complete lines of ``data`` (the bytes of ``path`` from offset
    ``since``), each with the offset its line starts at, the offset after the last line,
    and the lines that are not valid records (corrupt: the caller skips them).

    Raises:
        DataFileError: a record was written by a newer searchgym (upgrade to read it).
    """
    end = data.rfind(b"\n") + 1
    records: list[tuple[int, dict[str, Any]]] = []
    corrupt: list[Corrupt] = []
    pos = 0
    while pos < end:
        nl = data.index(b"\n", pos)
        line = data[pos:nl]
        if line.strip():
            try:
                records.append((since + pos, decode_line(line, schema, validate)))
            except NewerSchemaError as exc:
                raise DataFileError(
                    f"{path}, line {line_number(path, since + pos)}: written by a newer searchgym "
                    f"(record schema {exc.version}; this version reads up to {schema}). "
                    "Upgrade searchgym to read this store."
                ) from None
            except ValueError as exc:
                corrupt.append((since + pos, line, str(exc)))
        pos = nl + 1
    return records, since + end, corrupt


def sift_lines(
    data: bytes, schema: int | None, validate: Validator | None
) -> tuple[list[bytes], list[tuple[int, bytes, str]], bytes]:
    """Sort a whole file's bytes for repair.

    Returns:
        The readable lines (each ending in ``\\n``; records of a newer schema count as
        readable), ``(line number, line, reason)`` of each unreadable one, and the torn
        tail (``b""`` when the file ends in ``\\n``).
    """
    end = data.rfind(b"\n") + 1
    keep: list[bytes] = []
    bad: list[tuple[int, bytes, str]] = []
    for number, line in enumerate(data[:end].split(b"\n")[:-1], start=1):
        if not line.strip():
            continue
        try:
            decode_line(line, schema, validate)
        except NewerSchemaError:
            pass
        except ValueError as exc:
            bad.append((number, line, str(exc)))
            continue
        keep.append(line + b"\n")
    return keep, bad, data[end:]


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
    descriptor = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
