"""The run's stores follow the trainer's checkpoints: snapshot at each save, restore on resume.

A LightSearcher run keeps state outside the model: the experience memory's store (its
trajectories, bank versions and update log) and the reward's minimum tool-call store. Both
are append-only SQLite logs, so the state at a training step is each log's last record id
at that step. When the backend saves the checkpoint of step N, :func:`snapshot_stores`
records those ids under N (in each log's ``snapshots`` table, as the store actor does).
When a run starts, :func:`prepare_stores` looks at the step the backend restored:

- step 0 (a fresh run): every store must be empty. A store that holds an earlier run's
  records would hand this run its bank, its few-shot pool and its minima, and the memory's
  restored step count would make it skip updates, so the run is refused with the ways out;
- step N (a resumed run): every store goes back to its snapshot of step N. What was
  written after it (by the rollouts of steps that the checkpoint does not hold) is cut off
  and kept in ``<log file>.cut-N.jsonl``, so nothing is lost.

Any store that implements :class:`StepSnapshots` (for example a store served by a Ray
actor) takes part the same way. The backends call these at their own checkpoint points:
:mod:`searchgym.trainers.openrlhf.resume`, :mod:`searchgym.trainers.verl.checkpoints`.
"""

from __future__ import annotations

import os
from typing import Protocol

from ..envs.rewards.min_tool_calls import MinToolCallStore
from ..error import DataFileError, SearchGymError
from ..memory.store import MemoryStore
from .agent_config import AgentConfig
from .store_client import store_client

__all__ = [
    "FileStoreSnapshots",
    "StepSnapshots",
    "StoreStateError",
    "prepare_stores",
    "run_stores",
    "snapshot_stores",
]


class StoreStateError(SearchGymError):
    """A store does not fit the run: an earlier run's records in a fresh run, or no snapshot to resume from."""


class StepSnapshots(Protocol):
    """A store that can go back to the state it had after a training step."""

    name: str
    """What the store is, for messages (``agent.memory.path /runs/x/memory``)."""

    def holds_data(self) -> bool:
        """Whether the store holds any record (a fresh run needs it empty)."""
        ...

    def snapshot(self, step: int) -> None:
        """Remember the state after ``step`` training steps."""
        ...

    def restore(self, step: int) -> None:
        """Go back to the state remembered at ``step``; raise :class:`StoreStateError` when there is none."""
        ...


class FileStoreSnapshots:
    """A store on this machine's disk (a memory folder or a minimum tool-call file) as a :class:`StepSnapshots`.

    Args:
        name: What the store is, for messages.
        store: The store; its logs keep their snapshots themselves.
    """

    def __init__(self, name: str, store: MemoryStore | MinToolCallStore):
        self.name = name
        self.store = store

    def holds_data(self) -> bool:
        return self.store.holds_data()

    def steps(self) -> list[int]:
        """The steps that have a snapshot, in order."""
        return sorted(set(self.store.steps()))

    def snapshot(self, step: int) -> None:
        self.store.snapshot(step)

    def restore(self, step: int) -> None:
        try:
            self.store.restore(step)
        except DataFileError as exc:
            raise StoreStateError(
                f"Resuming at step {step}, but {self.name} has no snapshot of that step (snapshots: "
                f"{', '.join(map(str, self.steps())) or 'none'}). Resume from a checkpoint the same store was "
                f"saved with, or start a fresh run into an empty store. ({exc})"
            ) from None

    def __repr__(self) -> str:
        return f"FileStoreSnapshots({self.name!r}, {self.store!r})"


def run_stores(config: AgentConfig) -> list[StepSnapshots]:
    """The stores of ``config`` that training writes: the LightSearcher memory, the minimum tool-call store.

    Under the store actor (``$SEARCHGYM_STORE_ACTOR``) that is one client: the actor owns both
    stores on the head node's disk, which the trainer's node may not see.
    """
    client = store_client(config)
    if client is not None:
        return [client]
    stores: list[StepSnapshots] = []
    memory = config.memory
    inside: str | None = None
    if memory is not None and memory.learns:
        folder = MemoryStore(str(memory.path))  # AgentConfig requires a path
        inside = os.path.abspath(folder.path_of("min_tool_calls"))
        stores.append(FileStoreSnapshots(f"the memory store memory.path {memory.path}", folder))
    store = config.shared_store_path
    if store is not None and os.path.abspath(store) != inside:
        name = f"the minimum tool-call store env.reward_kwargs.{config.shared_store_keyword} {store}"
        stores.append(FileStoreSnapshots(name, MinToolCallStore(store)))
    return stores


def snapshot_stores(stores: list[StepSnapshots], step: int) -> None:
    """Snapshot every store at ``step`` (called as the backend saves the checkpoint of ``step``)."""
    for store in stores:
        store.snapshot(step)


def prepare_stores(
    stores: list[StepSnapshots],
    step: int,
    *,
    checkpoint: str,
    resume: str,
) -> None:
    """Make the stores fit a run that starts at ``step`` (0: fresh; else resumed from its checkpoint).

    Args:
        stores: The run's stores (:func:`run_stores`).
        step: The training step the run starts at.
        checkpoint: Where the backend looks for checkpoints (for the message).
        resume: How to resume the earlier run (in the backend's keys), ending with ``)``, then
            the paths to change (for the message).

    Raises:
        StoreStateError: a fresh run on a store that holds records, or a resumed run whose
            stores have no snapshot of ``step``. The message says how to go on.
    """
    if step > 0:
        for store in stores:
            store.restore(step)
        return
    used = [store.name for store in stores if store.holds_data()]
    if used:
        raise StoreStateError(
            f"This run starts fresh (no checkpoint loaded from {checkpoint}), but {' and '.join(used)} already "
            "holds an earlier run's records; training on it would inherit that run's bank and minima and skip "
            "memory updates. Either start fresh (move or delete those files), or resume the earlier run ("
            + resume
        )
