"""``{output_dir}/metrics.jsonl``: every step's figures in a local file, and a plot of them.

One JSON object a line, one line a step, with the keys W&B gets: ``step``, then
``rollout/*`` (:func:`~.metrics.rollout_metrics`), ``train/*`` (the update's figures) and,
with a memory, ``memory/*``. A line is appended and flushed after each step. A resumed run
first rewrites the file from its checkpoint's history, so the file holds each step once,
as the run that continues computed it (steps done after the checkpoint and lost are
dropped, and redone).

Read it with ``pandas.read_json(path, lines=True)``, or plot it with ``searchgym plot RUN_DIR``.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ...error import DataFileError

__all__ = [
    "METRICS_FILE",
    "PLOT_KEYS",
    "flat_record",
    "start_metrics",
    "append_metrics",
    "read_metrics",
    "plot_metrics",
]

METRICS_FILE = "metrics.jsonl"
"""The file's name in a run's ``output_dir``."""

PLOT_KEYS = (
    "rollout/reward",
    "rollout/f1",
    "rollout/st",
    "rollout/format_ok",
    "rollout/action_tokens",
    "train/kl",
    "train/loss",
    "train/grad_norm",
)
"""The figures :func:`plot_metrics` draws by default, one panel each."""


def flat_record(record: Mapping[str, Any]) -> dict[str, Any]:
    """A history record (``{"step", "rollout": {...}, "train": {...}}``) as one flat line.

    Example:
        >>> flat_record({"step": 3, "rollout": {"reward": 0.5}, "train": {"kl": 0.01}})
        {'step': 3, 'rollout/reward': 0.5, 'train/kl': 0.01}
    """
    out: dict[str, Any] = {"step": record["step"]}
    for section, values in record.items():
        if isinstance(values, Mapping):
            out.update({f"{section}/{key}": value for key, value in values.items()})
    return out


def start_metrics(output_dir: str | os.PathLike[str], history: Sequence[Mapping[str, Any]]) -> Path:
    """Write the file afresh with the steps of ``history`` (a fresh run: none) and return it.

    Written to a temporary file and renamed, so the file is never half written.
    """
    path = Path(output_dir) / METRICS_FILE
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w", encoding="utf-8") as handle:
        for record in history:
            handle.write(json.dumps(flat_record(record)) + "\n")
    os.replace(tmp, path)
    return path


def append_metrics(path: Path, record: Mapping[str, Any]) -> None:
    """Append one step's line and flush it."""
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(json.dumps(flat_record(record)) + "\n")


def read_metrics(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The lines of a metrics file (or of ``RUN_DIR/metrics.jsonl`` for a folder).

    Raises:
        DataFileError: no such file, or a line that is not a JSON object with a ``step``.
    """
    file = Path(path)
    if file.is_dir():
        file = file / METRICS_FILE
    if not file.is_file():
        raise DataFileError(
            f"{str(file)!r} does not exist: give the output_dir of a run of `searchgym train` (the built-in "
            f"trainer writes {METRICS_FILE} there, one line a step) or the file itself."
        )
    rows = []
    with open(file, encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError as exc:
                raise DataFileError(f"{str(file)!r} line {number} is not JSON ({exc}).") from None
            if not isinstance(row, dict) or not isinstance(row.get("step"), int):
                raise DataFileError(f"{str(file)!r} line {number} is not an object with an integer 'step'.")
            rows.append(row)
    return rows


def plot_metrics(
    run: str | os.PathLike[str],
    out: str | os.PathLike[str] | None = None,
    keys: Sequence[str] = PLOT_KEYS,
) -> Path:
    """Plot a run's figures against the step, one panel a figure, into a PNG.

    Args:
        run: A run's ``output_dir`` or its ``metrics.jsonl``.
        out: The PNG (default: ``metrics.png`` beside the metrics file).
        keys: The figures to draw; those the file lacks are skipped.

    Returns:
        The PNG written.

    Raises:
        DataFileError: the file is missing, unreadable, empty, or holds none of ``keys``.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    file = Path(run) / METRICS_FILE if Path(run).is_dir() else Path(run)
    rows = read_metrics(file)
    present = [key for key in keys if any(_plottable(row.get(key)) for row in rows)]
    if not present:
        raise DataFileError(
            f"{str(file)!r} has no steps with any of {', '.join(keys)} "
            f"({len(rows)} lines): train a step first, or name other figures."
        )
    columns = min(len(present), 4)
    lines = math.ceil(len(present) / columns)
    figure, axes = plt.subplots(lines, columns, figsize=(3.2 * columns, 2.4 * lines), squeeze=False)
    for index, ax in enumerate(axes.flat):
        if index >= len(present):
            ax.axis("off")
            continue
        key = present[index]
        points = [(row["step"], float(row[key])) for row in rows if _plottable(row.get(key))]
        ax.plot([s for s, _ in points], [v for _, v in points], marker="." if len(points) < 30 else None)
        ax.set_title(key, fontsize=9)
        ax.set_xlabel("step", fontsize=8)
        ax.tick_params(labelsize=7)
    figure.suptitle(str(file.parent.name), fontsize=10)
    figure.tight_layout()
    target = Path(out) if out is not None else file.with_name("metrics.png")
    figure.savefig(target, dpi=100)
    plt.close(figure)
    return target


def _plottable(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
