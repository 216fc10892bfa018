"""The experience memory's training steps under a Ray backend (OpenRLHF, verl).

Under these backends the memory has readers and writers in many processes: every agent
on the rollout workers appends its finished episodes to the shared store and reads the
current bank at ``reset``. Only the bank updates must happen exactly once per
``update_every`` training steps, and only the trainer (the single controller) knows the
step. Under verl the trainer's patch (:mod:`~searchgym.trainers.verl.advantage`) calls
:meth:`MemoryStepper.follow` with verl's step in ``compute_advantage``. Under OpenRLHF the
trainer's worker hook (:mod:`~searchgym.trainers.openrlhf.advantage_hook`) does this after
every ``train_step``:

1. :func:`publish_step` writes ``{"step": N, "time": ...}`` to ``openrlhf_step.json`` in the
   store folder (atomically). ``N`` is the trainer's global step after the step, so a
   resumed run publishes the step its checkpoint restored.
2. :class:`MemoryStepper` calls ``memory.step()`` until the memory has counted the
   published step. The memory's own count is restored from its store when it is opened
   (the step of its last update), so after a restart the stepper catches up without
   repeating an update, and an earlier checkpoint than the store's last update skips
   stepping until training passes it again.

The bank written by an update is read by the agents at their next ``reset`` (the store's
bank file is read incrementally), so the experience in the prompt follows training with
at most one rollout batch of delay. Anyone can read the published step with
:func:`read_published_step`, for example a separate process that runs the updates itself
with its own :class:`MemoryStepper`.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Any

from ..checks import check_int
from ..storage.atomic import write_atomically

__all__ = ["STEP_FILE", "MemoryStepper", "publish_step", "read_published_step"]

logger = logging.getLogger("searchgym.trainers")

STEP_FILE = "openrlhf_step.json"
"""The file in the store folder that holds the last published training step."""


def publish_step(store: str | os.PathLike[str], step: int) -> Path:
    """Write ``step`` to the store's :data:`STEP_FILE` atomically; returns the file."""
    check_int("step", step, 0)
    path = Path(store) / STEP_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    data = json.dumps({"step": step, "time": time.time(), "pid": os.getpid()}) + "\n"
    write_atomically(path, data.encode("utf-8"))
    return path


def read_published_step(store: str | os.PathLike[str]) -> int | None:
    """The step in the store's :data:`STEP_FILE`, or ``None`` when none is published (or unreadable)."""
    path = Path(store) / STEP_FILE
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    step = data.get("step") if isinstance(data, dict) else None
    return step if isinstance(step, int) and not isinstance(step, bool) and step >= 0 else None


class MemoryStepper:
    """Brings a memory's step count up to a training step by calling ``memory.step()``.

    Args:
        memory: An :class:`~searchgym.memory.ExperienceMemory` (its ``steps`` is the count;
            a memory without one, such as HiExp's, has nothing to follow).
    """

    def __init__(self, memory: Any):
        self.memory = memory

    def follow(self, step: int | None) -> list[Any]:
        """Step the memory until it has counted ``step`` steps; returns the update results."""
        if step is None or not hasattr(self.memory, "steps"):
            return []
        results = []
        if self.memory.steps > step:
            logger.info(
                "The memory has counted %d steps, ahead of training step %d (resumed from an earlier "
                "checkpoint); it waits until training passes it.",
                self.memory.steps,
                step,
            )
        if callable(getattr(self.memory, "step_to", None)):  # the Ray store actor: one call
            return list(self.memory.step_to(step))
        while self.memory.steps < step:
            result = self.memory.step()
            if result is not None:
                results.append(result)
        return results

    def publish_and_follow(self, store: str | os.PathLike[str], step: int) -> list[Any]:
        """:func:`publish_step`, then :meth:`follow` the step read back from the store."""
        publish_step(store, step)
        return self.follow(read_published_step(store))
