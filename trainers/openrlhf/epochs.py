"""Whole rollout batches: the prompt file's rows, cut the way OpenRLHF 0.11.2 cuts them.

OpenRLHF's ``SamplesGenerator.generate_samples`` draws ``rollout.batch_size`` prompts per
step and still trains on a shorter last batch when an episode's rows run out. That batch
breaks the data-parallel ranks: ``split_rollout_samples`` cuts its samples into
experiences of ``rollout.micro_batch_size`` and ``RayActorGroup.async_run_method_batch``
deals them in chunks of ``ceil(experiences / dp)``, so 88 prompts × 12 samples in
experiences of 16 reach 8 ranks as ``[9, 9, 9, 9, 9, 9, 9, 3]`` experiences: ranks that
take different numbers of micro-steps wait for each other in ZeRO's collectives, and even
equal shares fill less than one gradient-accumulation window, so the next optimizer step
mixes two rollout batches.

searchgym drops the tail: :func:`whole_batches` counts the rows of
``data.prompt_dataset`` and sets ``--data.max_samples`` to the largest multiple of
``rollout.batch_size`` it holds, which ``prepare_datasets`` applies with
``train_data.select(range(min(max_samples, len(train_data))))``. The rows left out are the
file's last ones, the same in every episode (``searchgym prepare`` shuffles the rows it
writes, so they are a random sample of the questions). ``data.max_samples`` caps the
evaluation set too, which the plan line says when it does.
"""

from __future__ import annotations

import csv
import json
import os
from dataclasses import dataclass
from typing import Any

from ...error import DataFileError
from .flags import FlagError, parsed_value

__all__ = ["EpochPlan", "check_data_files", "count_rows", "whole_batches"]

_COUNTED = (".jsonl", ".json", ".parquet", ".csv")
_LOCAL = (*_COUNTED, ".arrow", ".py")


def _is_local(part: str) -> bool:
    """Whether a dataset entry names a local file or folder (else a Hugging Face Hub dataset)."""
    name = part.split("@")[0].strip()
    return (
        name.lower().endswith(_LOCAL)
        or os.path.isabs(name)
        or name.startswith((".", "~"))
        or os.path.exists(name)
    )


def count_rows(path: str) -> int | None:
    """The rows OpenRLHF's ``blending_datasets`` reads from the local file ``path``.

    JSON Lines count their non-blank lines, a JSON file its top-level list, Parquet its
    metadata's row count and CSV its records after the header. Other forms (a folder, an
    Arrow file, a loading script) give ``None``.

    Raises:
        DataFileError: the file does not exist or cannot be read.
    """
    if not os.path.exists(path):
        raise DataFileError(f"{path!r} does not exist.")
    lower = path.lower()
    if os.path.isdir(path) or not lower.endswith(_COUNTED):
        return None
    try:
        if lower.endswith(".jsonl"):
            with open(path, "rb") as handle:
                return sum(1 for line in handle if line.strip())
        if lower.endswith(".json"):
            with open(path, encoding="utf-8") as handle:
                data = json.load(handle)
            return len(data) if isinstance(data, list) else None
        if lower.endswith(".parquet"):
            import pyarrow.parquet as pq

            return int(pq.ParquetFile(path).metadata.num_rows)
        with open(path, newline="", encoding="utf-8") as handle:
            return max(sum(1 for _ in csv.reader(handle)) - 1, 0)
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise DataFileError(f"{path!r} cannot be read ({exc}).") from exc


@dataclass(frozen=True)
class EpochPlan:
    """How one episode of the prompt file becomes training steps."""

    rows: int
    """Rows in ``data.prompt_dataset``."""
    available: int
    """Rows OpenRLHF reads: ``rows``, or fewer when the config sets a smaller ``data.max_samples``."""
    used: int
    """Rows trained on per episode: whole rollout batches."""
    batch: int
    """``rollout.batch_size``."""
    max_samples: int
    """The ``--data.max_samples`` that keeps ``used`` rows."""

    @property
    def dropped(self) -> int:
        """Rows left out of every episode."""
        return self.available - self.used

    @property
    def steps(self) -> int:
        """Training steps per episode."""
        return self.used // self.batch


def _count_datasets(spec: str) -> tuple[int | None, list[str]]:
    """The rows of a comma-separated dataset list (``None`` when a part cannot be counted)."""
    total: int | None = 0
    uncounted = []
    for part in (p.strip() for p in spec.split(",")):
        if not part:
            continue
        rows = count_rows(part.split("@")[0].strip()) if _is_local(part) else None
        if rows is None:
            uncounted.append(part)
            total = None
        elif total is not None:
            total += rows
    return total, uncounted


def check_data_files(flat: dict[str, Any]) -> None:
    """Refuse a local ``data.prompt_dataset`` or ``eval.dataset`` entry that does not exist.

    Raises:
        DataFileError: naming the flag, the path and how to write the file.
    """
    for key in ("data.prompt_dataset", "eval.dataset"):
        value = flat.get(key)
        if not isinstance(value, str):
            continue
        for part in (p.strip() for p in value.split(",")):
            name = part.split("@")[0].strip()
            if part and _is_local(part) and not os.path.exists(name):
                raise DataFileError(
                    f"openrlhf.{key}: {name!r} does not exist. Write it with `searchgym prepare --dataset NAME "
                    f"--out {name}` (relative paths are taken from the "
                    "directory you launch in)."
                )


def whole_batches(flat: dict[str, Any], args: Any) -> tuple[EpochPlan | None, list[str]]:
    """Set ``flat["data.max_samples"]`` so every episode is whole rollout batches; say what it drops.

    Args:
        flat: The dotted flags (absolute paths); ``data.max_samples`` is set or lowered here.
        args: OpenRLHF's parsed, nested args for the same flags (for the defaults).

    Returns:
        The plan (``None`` when the rows cannot be counted and the config sets a
        ``data.max_samples`` that is a multiple of the batch) and the lines that say it.

    Raises:
        FlagError: dynamic filtering (whose last batch no row count fixes), a dataset of
            fewer rows than one rollout batch, or rows that cannot be counted without a
            ``data.max_samples`` that is a multiple of ``rollout.batch_size``.
        DataFileError: a local dataset that does not exist or cannot be read.
    """
    batch = int(parsed_value(args, "rollout.batch_size", 1024))  # OpenRLHF's default
    limit = flat.get("data.max_samples")
    if parsed_value(args, "algo.dynamic_filtering_enable", False):
        raise FlagError(
            "algo.dynamic_filtering_enable replaces each filtered prompt with the next row, so the last rollout "
            "batch of every episode is short by a number of prompts no row count can predict, and OpenRLHF "
            "0.11.2 still trains on it: the ranks get unequal shares and hang in ZeRO. Set "
            "openrlhf.algo.dynamic_filtering_enable: false."
        )
    spec = str(flat.get("data.prompt_dataset") or "")
    rows, uncounted = _count_datasets(spec)
    if flat.get("data.prompt_probs") is not None:
        rows, uncounted = None, [f"{spec} (blended by data.prompt_probs)"]
    if rows is None:
        if isinstance(limit, int) and limit > 0 and limit % batch == 0:
            return None, [
                f"searchgym: the rows of {', '.join(uncounted)} are not counted here; data.max_samples = "
                f"{limit} is {limit // batch} rollout batches of {batch}, which holds only if the dataset has "
                f"at least {limit} rows."
            ]
        raise FlagError(
            f"The dry run cannot count the rows of {', '.join(uncounted)}, so it cannot make every episode whole "
            f"rollout batches of {batch} (a shorter last batch hangs the ranks). Give a local .jsonl/.parquet "
            f"file, or set openrlhf.data.max_samples to a multiple of {batch} that the dataset reaches."
        )
    available = min(limit, rows) if isinstance(limit, int) and limit > 0 else rows
    used = available - available % batch
    if used == 0:
        raise FlagError(
            f"openrlhf.data.prompt_dataset gives {available} rows, fewer than one rollout batch "
            f"(rollout.batch_size = {batch}): no training step would run. Write more rows or lower "
            "rollout.batch_size."
        )
    flat["data.max_samples"] = used
    plan = EpochPlan(rows=rows, available=available, used=used, batch=batch, max_samples=used)
    lines = [_plan_line(plan, spec, args)]
    eval_rows, _ = _count_datasets(str(flat.get("eval.dataset") or ""))
    if flat.get("eval.dataset") and eval_rows is not None and eval_rows > used:
        lines.append(
            f"searchgym: data.max_samples = {used} also caps the evaluation set (OpenRLHF applies it to both): "
            f"{used} of its {eval_rows} rows are evaluated."
        )
    return plan, lines


def _plan_line(plan: EpochPlan, spec: str, args: Any) -> str:
    n = int(parsed_value(args, "rollout.n_samples_per_prompt", 1))  # OpenRLHF's default
    kept = f" (data.max_samples keeps the first {plan.available:,})" if plan.available < plan.rows else ""
    tail = (
        f"the last {plan.dropped} rows (in file order) are left out of every episode "
        f"(--data.max_samples {plan.max_samples}), so every step is a whole rollout batch"
        if plan.dropped
        else "no row is left out"
    )
    episodes = int(parsed_value(args, "train.num_episodes", 1))
    return (
        f"searchgym: {spec} has {plan.rows:,} rows{kept}: {plan.steps} rollout batches of {plan.batch} prompts "
        f"× {n} samples per episode; {tail}; {plan.steps * episodes} steps over {episodes} episode(s)."
    )
