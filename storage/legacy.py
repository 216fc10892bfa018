"""Stores written by earlier searchgym versions as JSON-lines files, imported into SQLite once.

An old store kept one JSON object per line. When a :class:`~searchgym.storage.sqlite_log.SqliteLog`
opens and finds such a file (at its own path, or at the ``.jsonl`` path an old store folder
used), :func:`adopt` renames the file to ``<file>.imported``, where it stays, and the log
imports its records in one transaction, at most once. :func:`read_lines` sorts the lines.
"""

from __future__ import annotations

import fcntl
import os
from typing import Any

from ..error import DataFileError
from .records import NewerSchemaError, Validator, decode_record

__all__ = ["adopt", "read_lines"]


def _looks_like_json_lines(descriptor: int) -> bool:
    head = os.pread(descriptor, 4096, 0).lstrip()
    return head.startswith(b"{")


def adopt(legacy: str) -> str | None:
    """Move the JSON-lines file ``legacy`` to ``<legacy>.imported``; returns that path when it exists.

    The rename happens under ``flock`` on the old file and only while ``legacy`` still names
    it, so two processes that open the store at once never move a database that another one
    has just created at the same path.

    Raises:
        DataFileError: both ``legacy`` and ``<legacy>.imported`` hold a JSON-lines store.
    """
    moved = legacy + ".imported"
    try:
        descriptor = os.open(legacy, os.O_RDONLY)
    except FileNotFoundError:
        return moved if os.path.exists(moved) else None
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX)
        try:
            same = os.fstat(descriptor).st_ino == os.stat(legacy).st_ino
        except FileNotFoundError:
            same = False
        if same and _looks_like_json_lines(descriptor):
            if os.path.exists(moved):
                raise DataFileError(
                    f"{legacy} is an old JSON-lines store, but {moved} (imported earlier) is there too; "
                    "move one of them away."
                )
            os.rename(legacy, moved)
    finally:
        os.close(descriptor)
    return moved if os.path.exists(moved) else None


def read_lines(
    path: str, schema: int | None, validate: Validator | None
) -> tuple[list[dict[str, Any]], list[tuple[str, str]]]:
    """The records of an old JSON-lines file, and ``(line text, reason)`` of each line that is not one.

    A torn last line (no ``\\n``) counts as not a record. Records of a newer schema are kept.
    """
    with open(path, "rb") as handle:
        data = handle.read()
    records: list[dict[str, Any]] = []
    bad: list[tuple[str, str]] = []
    lines = data.split(b"\n")
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        text = line.decode("utf-8", errors="replace")
        if number == len(lines):
            bad.append((text, f"line {number}: an unfinished last line (a writer died mid-write)"))
            continue
        try:
            records.append(decode_record(line, schema, validate))
        except NewerSchemaError:
            records.append(decode_record(line, None))
        except ValueError as exc:
            bad.append((text, f"line {number}: {exc}"))
    return records, bad
