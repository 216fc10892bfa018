"""The on-disk format of the memory stores: a folder of SQLite logs.

## Format

A store is a folder. Each kind of record has its own database, ``<kind>.sqlite`` (a
:class:`~searchgym.storage.sqlite_log.SqliteLog`, whose module describes the tables):

==========================  ===========================================================================
``trajectories.sqlite``     finished episodes: ``{"schema": 1, "trajectory": {...}}`` (the
                            trajectory as :func:`~searchgym.memory.serialize.trajectory_to_dict`
                            writes it)
``bank.sqlite``             every version of LightSearcher's experience bank, oldest first:
                            ``{"schema": 1, "version", "step", "good", "bad", "summarizer",
                            "window": [start, end], "time", "bank": {three groups}}``
``updates.sqlite``          every update attempt, written or skipped, with its reason
``steps.sqlite``            the memory's count of training steps, written whenever it changes:
                            ``{"schema": 1, "step", "updates" (records of updates.sqlite then),
                            "time"}``; the last record is the count
``min_tool_calls.sqlite``   LightSearcher's per-question minimum of searches, written by
                            :class:`~searchgym.envs.rewards.min_tool_calls.MinToolCallStore`:
                            ``{"id", "n"}`` (no ``schema``: version 0)
``hiexp_levels.jsonl``      HiExp's records, one JSON object per line, rewritten whole and
                            atomically by :meth:`HierarchicalExperience.save
                            <searchgym.memory.HierarchicalExperience.save>` (built offline, never
                            appended to)
==========================  ===========================================================================

Many processes append to a store at once; an acknowledged append survives the writer being
killed. Point ``LightSearcherReward(store=MemoryStore(PATH).path_of("min_tool_calls"))`` at
the minimum store to keep it beside the bank. A folder written by an older searchgym
(``<kind>.jsonl`` files) is imported on first open; the old files stay as ``<kind>.jsonl.imported``.

A corrupt record is skipped by readers and logged with its file and id; training goes on.
:meth:`MemoryStore.repair` (``searchgym memory repair PATH``) checks every file of the store
and keeps every readable record.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..envs.rewards.min_tool_calls import check_min_record
from ..error import DataFileError, InvalidArgumentError, did_you_mean
from ..storage.records import SCHEMA_VERSION, Validator
from ..storage.sqlite_log import RepairReport, SqliteLog
from .hiexp.levels_file import HIEXP_FILE, repair_file
from .lightsearcher.bank import ExperienceBank
from .serialize import trajectory_from_dict

__all__ = ["KINDS", "LOGS", "MemoryStore", "log_file"]

KINDS = ("trajectories", "bank", "updates", "steps", "hiexp_levels", "min_tool_calls")
"""The files a store may hold."""

LOGS = ("trajectories", "bank", "updates", "steps", "min_tool_calls")
"""The kinds kept in a :class:`SqliteLog` each (HiExp's levels are one JSON-lines file)."""

_SCHEMALESS = ("min_tool_calls",)

_ADDED_LATER = ("steps",)
"""Logs that snapshots taken by an older searchgym lack: restoring one of those empties them."""


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


def _check_steps(record: dict[str, Any]) -> None:
    for key in ("step", "updates"):
        if _need(record, key, int) < 0:
            raise ValueError(f"field {key!r} must be >= 0, got {record[key]}")


_VALIDATORS: dict[str, Validator] = {
    "trajectories": _check_trajectory,
    "bank": _check_bank,
    "updates": _check_update,
    "steps": _check_steps,
    "min_tool_calls": check_min_record,
}


def log_file(path: str | os.PathLike[str]) -> SqliteLog:
    """The log at ``path``, a file outside a store folder: read as the kind its name says
    (``bank.sqlite``, ...), else as a minimum tool-call store (``reward_kwargs.store``)."""
    kind = Path(path).stem if Path(path).stem in LOGS else "min_tool_calls"
    schema = None if kind in _SCHEMALESS else SCHEMA_VERSION
    return SqliteLog(path, schema=schema, validate=_VALIDATORS.get(kind))


class MemoryStore:
    """A store folder: one :class:`SqliteLog` per kind (see the module docstring).

    Args:
        root: The folder, created when ``create`` is true (the default).
        fsync: Passed to every log.
        create: Make the folder now. ``False`` requires it to exist (for inspection).
        readonly: Open every log read-only (:class:`SqliteLog` ``readonly``), for a store
            that cannot be written (a read-only disk).

    Raises:
        DataFileError: ``root`` is a file, or is missing and ``create`` is false.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        fsync: bool = False,
        create: bool = True,
        readonly: bool = False,
    ):
        if not isinstance(root, (str, os.PathLike)):
            raise InvalidArgumentError(f"A store path must be a folder path, got {root!r}.")
        self.root = Path(root)
        if self.root.exists() and not self.root.is_dir():
            raise DataFileError(
                f"Store path {str(self.root)!r} is a file; a memory store is a folder of .sqlite files."
            )
        if not self.root.exists():
            if not create:
                raise DataFileError(
                    f"No memory store at {str(self.root)!r}: the folder does not exist. Give the folder "
                    "passed to ExperienceMemory(path=...)."
                )
            self.root.mkdir(parents=True, exist_ok=True)
        self.fsync = fsync
        self.readonly = readonly
        self._logs: dict[str, SqliteLog] = {}

    def path_of(self, kind: str) -> str:
        """The file of ``kind`` (one of :data:`KINDS`)."""
        if kind not in KINDS:
            raise did_you_mean("store kind", kind, KINDS)
        return str(self.root / (HIEXP_FILE if kind == "hiexp_levels" else f"{kind}.sqlite"))

    def log(self, kind: str) -> SqliteLog:
        """The log of ``kind`` (one of :data:`LOGS`); ``min_tool_calls`` is read without a schema check."""
        if kind not in LOGS:
            raise did_you_mean("store log", kind, LOGS)
        if kind not in self._logs:
            schema = None if kind in _SCHEMALESS else SCHEMA_VERSION
            self._logs[kind] = SqliteLog(
                self.path_of(kind),
                fsync=self.fsync,
                schema=schema,
                validate=_VALIDATORS.get(kind),
                legacy=str(self.root / f"{kind}.jsonl"),
                readonly=self.readonly,
            )
        return self._logs[kind]

    def kinds_present(self) -> list[str]:
        """The kinds whose file exists (or an older searchgym's ``<kind>.jsonl``), in :data:`KINDS` order."""
        return [
            k for k in KINDS if os.path.exists(self.path_of(k)) or os.path.exists(self.root / f"{k}.jsonl")
        ]

    def repair(self) -> list[RepairReport]:
        """Check and repair every file of the store (see :meth:`SqliteLog.repair`); HiExp's
        levels file keeps its readable lines (the original stays as ``.corrupt``)."""
        reports = []
        for kind in self.kinds_present():
            if kind == "hiexp_levels":
                kept, dropped = repair_file(Path(self.path_of(kind)))
                reports.append(RepairReport(self.path_of(kind), kept=kept, dropped=dropped))
            else:
                reports.append(self.log(kind).repair())
        return reports

    def holds_data(self) -> bool:
        """Whether any log of the store holds a record."""
        present = self.kinds_present()
        return any(self.log(k).count() > 0 for k in LOGS if k in present)

    def snapshot(self, step: int) -> dict[str, int]:
        """Remember every log as it is after training step ``step``; returns the records each holds.

        Call it when a checkpoint of ``step`` is saved; :meth:`restore` brings the store back
        to it. A snapshot is the id of each log's last record (:meth:`SqliteLog.snapshot`).
        """
        return {kind: self.log(kind).snapshot(step) for kind in LOGS}

    def steps(self) -> list[int]:
        """The training steps that have a snapshot, in the order they were taken."""
        return self.log("trajectories").steps()

    def restore(self, step: int) -> dict[str, int]:
        """Cut the logs back to the snapshot of ``step``; later records go to ``<file>.cut-<step>.jsonl``.

        Objects that read the store (an open :class:`~searchgym.memory.ExperienceMemory`)
        must be opened again afterwards. Returns the records cut per log.

        Raises:
            DataFileError: no snapshot of ``step`` (the message lists the steps there are);
                then no log is cut.
        """
        for kind in LOGS:
            if kind in _ADDED_LATER and not self.log(kind).steps():
                continue
            if not self.log(kind).has_snapshot(step):
                steps = self.log(kind).steps()
                raise DataFileError(
                    f"No snapshot of step {step} in {self.path_of(kind)} (snapshots: {steps or 'none'}). Resume "
                    "from a checkpoint whose step has one, or start a fresh run with a new store path."
                )
        return {kind: self._restore_log(kind, step) for kind in LOGS}

    def _restore_log(self, kind: str, step: int) -> int:
        log = self.log(kind)
        if kind in _ADDED_LATER and not log.steps():  # a store whose snapshots predate this log
            return log.restore(0, aside=f"{log.path}.cut-{step}.jsonl")  # its owner reads the older log
        return log.restore(step)

    def copy_to(self, target: str | os.PathLike[str]) -> None:
        """Copy the store to the new folder ``target``: each log as one consistent state
        (SQLite's backup), HiExp's levels file as it is."""
        folder = Path(target)
        folder.mkdir(parents=True, exist_ok=False)
        for kind in self.kinds_present():
            if kind == "hiexp_levels":
                shutil.copy2(self.path_of(kind), folder / HIEXP_FILE)
            else:
                self.log(kind).backup(folder / f"{kind}.sqlite")

    def close(self) -> None:
        for log in self._logs.values():
            log.close()

    def __repr__(self) -> str:
        return f"MemoryStore({str(self.root)!r})"
