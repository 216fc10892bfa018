"""Weights & Biases logging for the built-in trainer and ``searchgym eval --wandb``.

What goes to the run:

* the run config (``wandb.config``), at start;
* per training step, the rollout figures under ``rollout/`` (``reward``, ``em``, ``f1``,
  ``st``, ``sd``, ``sr``, ``format_ok`` = share of well-formed episodes, ``action_tokens``,
  ``total_tokens``, ``retrieval_errors``, …) and the update's under ``train/`` (``loss``,
  ``kl``, ``clip_frac``, ``grad_norm``, ``lr``, timings);
* at each experience-memory update, the bank as a ``wandb.Table`` (``memory/experience``:
  one row per guidance item with its version, step and group);
* for ``searchgym eval --wandb``, each policy's figures under ``eval/<policy>/`` (slashes in the name become ``_``) and a
  table of all policies and splits (``eval/results``).

wandb is imported when a logger is created; ``pip install 'searchgym[wandb]'``.
``mode="offline"`` (or ``WANDB_MODE=offline``) writes the run under ``dir`` for a later
``wandb sync``.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Any

from ..error import SearchGymError

__all__ = ["WandbLogger", "EVAL_KEYS", "bank_rows"]

EVAL_KEYS = ("em", "f1", "cover_em", "st", "sd", "sr", "format_ok", "action_chars", "reward", "wall_time_s")
"""The figures of an :class:`~searchgym.policies.EvalResult` that are logged."""


def _import_wandb() -> Any:
    try:
        import wandb
    except ImportError as exc:
        raise SearchGymError(
            f"Weights & Biases logging needs the wandb package ({exc}): pip install 'searchgym[wandb]', "
            "or turn wandb off (wandb.enabled: false, or leave out --wandb)."
        ) from exc
    return wandb


def _loggable(value: Any) -> float | None:
    """``value`` as a float W&B can chart (bools as 0/1), or None for anything else."""
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (int, float)) and math.isfinite(value):
        return float(value)
    return None


def bank_rows(bank: Any) -> list[list[Any]]:
    """``[version, step, group, item]`` for every guidance item of an experience bank."""
    return [
        [int(getattr(bank, "version", 0)), int(getattr(bank, "step", 0)), heading, item]
        for heading, items in bank.groups()
        for item in items
    ]


class WandbLogger:
    """One W&B run (see the module docstring).

    Args:
        project: W&B project.
        config: The run config (plain data), shown in W&B's config panel.
        name: Run name (None: W&B picks one).
        entity: Team or user (None: the default).
        mode: ``"online"``, ``"offline"`` or ``"disabled"`` (None: ``WANDB_MODE`` or online).
        tags: Run tags.
        dir: Folder for W&B's local files (created if missing); default ``$WANDB_DIR``, else
            the current directory (resolved at each call, not once per process).
        job_type: ``"train"`` or ``"eval"``.
        run_id: Continue the run with this id (a resumed training run), else a new run.

    Raises:
        SearchGymError: wandb is not installed, or ``wandb.init`` failed.
    """

    def __init__(
        self,
        project: str = "searchgym",
        *,
        config: Mapping[str, Any] | None = None,
        name: str | None = None,
        entity: str | None = None,
        mode: str | None = None,
        tags: Sequence[str] = (),
        dir: str | os.PathLike[str] | None = None,
        job_type: str = "train",
        run_id: str | None = None,
    ):
        wandb = _import_wandb()
        self._wandb = wandb
        if dir is None:
            dir = os.environ.get("WANDB_DIR") or os.getcwd()
        os.makedirs(dir, exist_ok=True)
        options: dict[str, Any] = {
            "project": project,
            "config": dict(config or {}),
            "name": name,
            "entity": entity,
            "mode": mode,
            "tags": list(tags),
            "dir": os.fspath(dir),
            "job_type": job_type,
        }
        if run_id is not None:
            options.update(id=run_id, resume="allow")
        try:
            self.run = wandb.init(**options)
        except Exception as exc:  # noqa: BLE001 - wandb raises many kinds; say what to do
            raise SearchGymError(
                f"wandb.init failed ({exc}). Log in with `wandb login`, or run offline with "
                "WANDB_MODE=offline (wandb.mode: offline)."
            ) from exc

    @property
    def run_id(self) -> str:
        """The run's id (to resume it later)."""
        return str(self.run.id)

    @property
    def run_dir(self) -> str:
        """The run's local files folder."""
        return str(self.run.dir)

    def log(self, metrics: Mapping[str, Any], step: int | None = None) -> None:
        """Log numeric ``metrics`` (non-finite and non-numeric values are left out)."""
        clean = {k: v for k, v in ((k, _loggable(v)) for k, v in metrics.items()) if v is not None}
        if clean:
            self.run.log(clean, step=step)

    def log_step(self, step: int, rollout: Mapping[str, Any], train: Mapping[str, Any] | None = None) -> None:
        """One training step: rollout figures under ``rollout/``, update figures under ``train/``."""
        metrics = {f"rollout/{k}": v for k, v in rollout.items()}
        metrics.update({f"train/{k}": v for k, v in (train or {}).items()})
        self.log(metrics, step=step)

    def log_experience(self, bank: Any, step: int | None = None, key: str = "memory/experience") -> None:
        """The experience bank as a ``wandb.Table`` (columns version, step, group, item)."""
        table = self._wandb.Table(columns=["version", "step", "group", "item"], data=bank_rows(bank))
        self.run.log(
            {key: table, "memory/items": len(bank), "memory/version": int(getattr(bank, "version", 0))},
            step=step,
        )

    def log_eval(self, results: Sequence[Any], step: int | None = None) -> None:
        """``searchgym eval`` results: figures under ``eval/<policy>/`` (slashes in the name become ``_``) and one table of all rows."""
        metrics: dict[str, Any] = {}
        rows = []
        for result in results:
            figures = result.to_dict()
            label = str(result.policy).replace("/", "_")  # a slash would open a W&B section
            for key in EVAL_KEYS:
                metrics[f"eval/{label}/{key}"] = figures.get(key)
            rows.append([result.policy, "all", result.episodes] + [figures.get(k) for k in EVAL_KEYS])
            for split, values in result.splits.items():
                rows.append(
                    [result.policy, split, int(values.get("episodes", 0))]
                    + [values.get(k) for k in EVAL_KEYS]
                )
        table = self._wandb.Table(columns=["policy", "split", "episodes", *EVAL_KEYS], data=rows)
        payload: dict[str, Any] = {
            k: v for k, v in ((k, _loggable(v)) for k, v in metrics.items()) if v is not None
        }
        payload["eval/results"] = table
        self.run.log(payload, step=step)
        for key, value in metrics.items():
            if _loggable(value) is not None:
                self.run.summary[key] = value

    def finish(self, exit_code: int = 0) -> None:
        """Close the run (writes its last files)."""
        self.run.finish(exit_code=exit_code)

    def __enter__(self) -> WandbLogger:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.finish(exit_code=0 if kind is None else 1)
