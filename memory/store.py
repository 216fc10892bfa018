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
                                  "description", "thinking", "sources"}`` (written by
                                  :meth:`HierarchicalExperience.save <searchgym.memory.HierarchicalExperience.save>`)
``min_tool_calls.jsonl``          LightSearcher's per-question minimum of searches, written by
                                  :class:`~searchgym.envs.rewards.min_tool_calls.MinToolCallStore`:
                                  ``{"id", "n"}`` (no ``schema``: version 0)
``snapshots.jsonl``               the record counts of the logs at each checkpointed training step
                                  (:meth:`MemoryStore.snapshot`)
================================  ===================================================================

Lines are as :mod:`~searchgym.envs.storage.jsonl_format` describes them, each file a
:class:`~searchgym.envs.storage.jsonl_log.JsonlLog` that many processes append to at once
and that survives a writer killed mid-write. Point
``LightSearcherReward(store=MemoryStore(PATH).path_of("min_tool_calls"))`` at the minimum
file to keep it beside the bank.

A complete line that does not parse, or is not a record of its file's kind, is skipped by
readers, copied to ``<file>.rejected`` and logged with its file and line; training goes on.
:meth:`MemoryStore.repair` (``searchgym memory repair PATH``) rewrites every file of the
store keeping every readable record, so readers stop meeting such lines.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..envs.errors import DataFileError, InvalidArgumentError, did_you_mean
from ..envs.rewards.min_tool_calls import check_min_record
from ..envs.storage.jsonl_format import SCHEMA_VERSION, Validator
from ..envs.storage.jsonl_log import JsonlLog, RepairReport
from ..envs.storage.snapshots import LogSnapshots
from .hiexp.levels_file import record_from_json
from .lightsearcher.bank import ExperienceBank
from .serialize import trajectory_from_dict

__all__ = ["KINDS", "MemoryStore"]

KINDS = ("trajectories", "bank", "updates", "hiexp_levels", "min_tool_calls", "snapshots")
"""The files a store may hold, ``<kind>.jsonl`` each."""

_SCHEMALESS = ("min_tool_calls",)


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


_VALIDATORS: dict[str, Validator] = {
    "trajectories": _check_trajectory,
    "bank": _check_bank,
    "updates": _check_update,
    "hiexp_levels": record_from_json,  # HierarchicalExperience.load's reader: repair keeps what it loads
    "min_tool_calls": check_min_record,
}

_SNAPSHOT_KINDS = ("trajectories", "bank", "updates", "min_tool_calls")
"""The logs a snapshot counts (HiExp's levels are built offline, not during training)."""


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
        if kind == "snapshots":
            return self._snapshots().index
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
        """Repair every file of the store (see :meth:`JsonlLog.repair`)."""
        return [self.log(k).repair() for k in self.kinds_present()]

    def _snapshots(self) -> LogSnapshots:
        logs = {k: self.log(k) for k in _SNAPSHOT_KINDS}
        return LogSnapshots(self.path_of("snapshots"), logs)

    def snapshot(self, step: int) -> dict[str, int]:
        """Record how many records each log holds after training step ``step``; returns the counts.

        Call it when a checkpoint of ``step`` is saved; :meth:`restore` brings the store back
        to it (see :mod:`~searchgym.envs.storage.snapshots`).
        """
        return self._snapshots().snapshot(step)

    def restore(self, step: int) -> dict[str, int]:
        """Cut the logs back to the snapshot of ``step``; later records go to ``<file>.after-step-N``.

        Objects that read the store (an open :class:`~searchgym.memory.ExperienceMemory`)
        must be opened again afterwards. Returns the lines moved aside per log.

        Raises:
            DataFileError: no snapshot of ``step`` (the message lists the steps there are).
        """
        return self._snapshots().restore(step)

    def close(self) -> None:
        for log in self._logs.values():
            log.close()

    def __repr__(self) -> str:
        return f"MemoryStore({str(self.root)!r})"
