"""Checkpoints of a GRPO run: everything needed to continue it as if it had not stopped.

A checkpoint is a folder ``{output_dir}/checkpoints/step_{N:06d}`` holding:

====================  ===========================================================
``model/``            the policy (``save_pretrained``) and its tokenizer: loadable
                      on its own, e.g. ``searchgym eval --policy hf:…/model``
``optimizer.pt``      AdamW's state
``scheduler.pt``      the learning-rate schedule's state
``rng.pt``            Python, NumPy and torch (CPU and CUDA) generator states
``reward.pkl``        the shared reward scheme (LightSearcher's per-question minima)
``memory/``           a copy of the experience-memory store, when there is one
``config.yaml``       the run's config
``trainer_state.json``  the step and the metrics of every step so far (written last)
====================  ===========================================================

A checkpoint is written into a hidden temporary folder and renamed into place, so a run
killed while saving leaves the previous checkpoint intact and never a partial one.
"""

from __future__ import annotations

import json
import os
import pickle
import random
import shutil
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ...envs.errors import DataFileError

__all__ = [
    "TrainerState",
    "checkpoint_path",
    "list_checkpoints",
    "latest_checkpoint",
    "save_checkpoint",
    "read_state",
    "rng_state",
    "set_rng_state",
    "prune_checkpoints",
    "load_pickle",
]

_STATE = "trainer_state.json"


@dataclass
class TrainerState:
    """Progress of a run.

    Attributes:
        step: Training steps completed.
        history: The metrics of each completed step, in order.
    """

    step: int = 0
    history: list[dict[str, Any]] = field(default_factory=list)


def checkpoint_path(output_dir: str | os.PathLike[str], step: int) -> Path:
    """The folder of the checkpoint after ``step`` completed steps."""
    return Path(output_dir) / "checkpoints" / f"step_{step:06d}"


def list_checkpoints(output_dir: str | os.PathLike[str]) -> list[tuple[int, Path]]:
    """Complete checkpoints in ``output_dir``, ``(step, folder)``, oldest first."""
    root = Path(output_dir) / "checkpoints"
    found = []
    if root.is_dir():
        for child in root.iterdir():
            if child.name.startswith("step_") and child.name[5:].isdigit() and (child / _STATE).is_file():
                found.append((int(child.name[5:]), child))
    return sorted(found)


def latest_checkpoint(output_dir: str | os.PathLike[str]) -> Path | None:
    """The newest complete checkpoint, or None."""
    found = list_checkpoints(output_dir)
    return found[-1][1] if found else None


def rng_state() -> dict[str, Any]:
    """The states of Python's, NumPy's and torch's global generators."""
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what :func:`rng_state` returned."""
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(
    output_dir: str | os.PathLike[str],
    state: TrainerState,
    *,
    model: Any,
    tokenizer: Any,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    config_yaml: str,
    reward_scheme: Any = None,
    memory_dir: str | os.PathLike[str] | None = None,
) -> Path:
    """Write the checkpoint of ``state.step`` atomically and return its folder."""
    target = checkpoint_path(output_dir, state.step)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        model.save_pretrained(staging / "model")
        tokenizer.save_pretrained(staging / "model")
        torch.save(optimizer.state_dict(), staging / "optimizer.pt")
        torch.save(scheduler.state_dict(), staging / "scheduler.pt")
        torch.save(rng_state(), staging / "rng.pt")
        if reward_scheme is not None:
            with open(staging / "reward.pkl", "wb") as fh:
                pickle.dump(reward_scheme, fh)
        if memory_dir is not None and Path(memory_dir).is_dir():
            shutil.copytree(memory_dir, staging / "memory")
        (staging / "config.yaml").write_text(config_yaml, encoding="utf-8")
        (staging / _STATE).write_text(json.dumps(asdict(state), indent=1) + "\n", encoding="utf-8")
        if target.exists():
            shutil.rmtree(target)
        os.replace(staging, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def read_state(checkpoint: str | os.PathLike[str]) -> TrainerState:
    """The :class:`TrainerState` saved in a checkpoint folder.

    Raises:
        DataFileError: the folder is not a complete checkpoint.
    """
    file = Path(checkpoint) / _STATE
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
        return TrainerState(step=int(data["step"]), history=list(data.get("history", [])))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise DataFileError(
            f"{str(checkpoint)!r} is not a complete checkpoint ({file.name} unreadable: {exc}). "
            "Pass a folder under {output_dir}/checkpoints/, or resume: auto."
        ) from exc


def load_pickle(file: str | os.PathLike[str]) -> Any:
    """Unpickle a file this module wrote (only ever load checkpoints you trust)."""
    with open(file, "rb") as fh:
        return pickle.load(fh)


def prune_checkpoints(output_dir: str | os.PathLike[str], keep_last: int) -> list[Path]:
    """Delete all but the newest ``keep_last`` checkpoints; return the deleted folders."""
    found = list_checkpoints(output_dir)
    doomed = [path for _, path in found[: max(0, len(found) - keep_last)]]
    for path in doomed:
        shutil.rmtree(path, ignore_errors=True)
    return doomed
