"""Snapshots of append-only logs at training steps, so a resumed run restores them.

A snapshot of step ``N`` records how many records each log held after step ``N``
(``{"schema": 1, "step": N, "counts": {name: records}, "time": ...}``, one line in an
index log). Restoring step ``N`` keeps the first ``counts[name]`` records of each log and
moves the later ones to ``<file>.after-step-N`` (nothing is deleted), then drops the
snapshots of later steps. Records are counted, not bytes, so a repair in between (which
only drops unreadable lines) does not move a snapshot.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from ..errors import DataFileError, InvalidArgumentError
from .jsonl_log import JsonlLog

__all__ = ["LogSnapshots"]


def _check_snapshot(record: dict[str, Any]) -> None:
    step, counts = record.get("step"), record.get("counts")
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"field 'step' must be an int >= 0, got {step!r:.80}")
    if not isinstance(counts, dict) or not all(
        isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in counts.values()
    ):
        raise ValueError(f"field 'counts' must map log names to record counts, got {counts!r:.80}")


class LogSnapshots:
    """Snapshots of ``logs`` kept in the index log at ``index_path``.

    Args:
        index_path: The index file (a JSON-lines log).
        logs: The logs, by the name their counts are stored under.
    """

    def __init__(self, index_path: str, logs: Mapping[str, JsonlLog]):
        self.index = JsonlLog(index_path, validate=_check_snapshot)
        self.logs = dict(logs)

    def steps(self) -> list[int]:
        """The steps that have a snapshot, in the order they were taken."""
        return [r["step"] for r in self.index.read()[0]]

    def snapshot(self, step: int) -> dict[str, int]:
        """Record every log's count of records now as the snapshot of ``step``; returns the counts."""
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise InvalidArgumentError(f"step must be an int >= 0, got {step!r}.")
        counts = {name: len(log.read()[0]) for name, log in self.logs.items()}
        self.index.append({"step": step, "counts": counts, "time": time.time()})
        return counts

    def restore(self, step: int) -> dict[str, int]:
        """Cut every log back to its snapshot of ``step``; returns the records moved aside per log.

        Step 0 without a snapshot means empty logs (a run resumed before its first snapshot).

        Raises:
            DataFileError: no snapshot of ``step`` (the message lists the steps there are).
        """
        snapshots = [r for r in self.index.read()[0] if r["step"] == step]
        if snapshots:
            counts = snapshots[-1]["counts"]
        elif step == 0:
            counts = {}
        else:
            raise DataFileError(
                f"No snapshot of step {step} in {self.index.path} (snapshots: {self.steps() or 'none'}). "
                "Resume from a checkpoint whose step has one, or start a fresh run with a new store path."
            )
        moved = {
            name: log.keep_first(int(counts.get(name, 0)), f"{log.path}.after-step-{step}")
            for name, log in self.logs.items()
        }
        self.index.keep_where(lambda r: r["step"] <= step, f"{self.index.path}.after-step-{step}")
        return moved
