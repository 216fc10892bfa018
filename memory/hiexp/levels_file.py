"""HiExp's storage: ``hiexp_levels.jsonl`` in a store folder (docs/methods.md#hiexp).

One JSON object per line, each an :class:`~searchgym.memory.hiexp.record.ExperienceRecord`
with its ``level`` and ``"schema": 1``, lowest level first. :func:`save_records` writes
the whole file to a temporary file and renames it over the old one, so a crash leaves either
the old file or the new one. The file is one of the kinds of a
:class:`~searchgym.memory.store.MemoryStore`.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from ...error import DataFileError, InvalidArgumentError
from ...storage.atomic import write_atomically
from ...storage.records import SCHEMA_VERSION
from .record import ExperienceRecord

__all__ = [
    "HIEXP_FILE",
    "hiexp_file",
    "save_records",
    "load_records",
    "read_records",
    "repair_file",
    "parse_line",
    "record_from_json",
]

logger = logging.getLogger(__name__)

HIEXP_FILE = "hiexp_levels.jsonl"


def hiexp_file(path: str | os.PathLike[str]) -> Path:
    """The file of a store folder, or ``path`` itself when it is a ``.jsonl`` file."""
    path = Path(path)
    return path if path.suffix == ".jsonl" else path / HIEXP_FILE


def save_records(records: Iterable[ExperienceRecord], file: Path) -> None:
    """Write ``records`` to ``file`` atomically, creating its folder."""
    file.parent.mkdir(parents=True, exist_ok=True)
    lines = [
        json.dumps({"schema": SCHEMA_VERSION, **record.to_dict()}, ensure_ascii=False) + "\n"
        for record in records
    ]
    write_atomically(file, "".join(lines).encode("utf-8"))


def record_from_json(data: Mapping[str, Any]) -> ExperienceRecord:
    """The record of one decoded line; ``ValueError`` (or ``InvalidArgumentError``) with a
    plain reason when its ``schema`` is not :data:`SCHEMA_VERSION` or it is not a record."""
    data = dict(data)
    schema = data.pop("schema", None)
    if schema != SCHEMA_VERSION:
        raise ValueError(f"schema {schema!r} is not {SCHEMA_VERSION} (written by another searchgym version?)")
    return ExperienceRecord.from_dict(data)


def parse_line(line: str) -> ExperienceRecord:
    """One record of the file, or ``ValueError``/``InvalidArgumentError`` with a plain reason."""
    try:
        data = json.loads(line)
    except json.JSONDecodeError as error:
        raise ValueError(f"not valid JSON ({error.msg} at column {error.colno})") from None
    if not isinstance(data, Mapping):
        raise ValueError(f"expected a JSON object, got {line.strip()[:80]!r}")
    return record_from_json(data)


def read_records(file: Path) -> tuple[list[ExperienceRecord], list[tuple[int, str]]]:
    """The records of ``file``, and ``(line, reason)`` of each line that is not one.

    Raises:
        DataFileError: the file is missing.
    """
    if not file.is_file():
        raise DataFileError(
            f"No HiExp store at {file}: build one with HierarchicalExperience.build(..., path=DIR)."
        )
    records, bad = [], []
    with file.open(encoding="utf-8", errors="replace") as lines:
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                records.append(parse_line(line))
            except (ValueError, InvalidArgumentError) as error:
                bad.append((number, str(error)))
    return records, bad


def repair_file(file: Path) -> tuple[int, list[tuple[int, str]]]:
    """Rewrite ``file`` with its readable records (the original kept as ``<file>.corrupt``).

    Returns the records kept and ``(line, reason)`` of each line dropped; a sound file is
    left as it is.
    """
    records, bad = read_records(file)
    if bad:
        shutil.copyfile(file, file.with_name(file.name + ".corrupt"))
        save_records(
            sorted(records, key=lambda r: r.level), file
        )  # as HierarchicalExperience.save orders them
        logger.warning("HiExp store: repaired %s (%d bad lines; original kept as .corrupt)", file, len(bad))
    return len(records), bad


def load_records(file: Path, *, repair: bool = False) -> list[ExperienceRecord]:
    """The records of ``file``; a line that is not a record is skipped and logged with its line.

    With ``repair``, the readable records are also written back, and the original file is
    kept beside it as ``.corrupt`` (what ``searchgym memory repair`` does).

    Raises:
        DataFileError: the file is missing.
    """
    records, bad = read_records(file)
    for number, reason in bad:
        logger.warning(
            "HiExp store %s, line %d: %s; skipped. Run `searchgym memory repair %s` to remove it.",
            file,
            number,
            reason,
            file.parent,
        )
    if bad and repair:
        repair_file(file)
    return records
