"""The run's stores follow OpenRLHF's checkpoints: snapshot at each save, restore on resume.

A LightSearcher run keeps state outside the model: the experience memory's store (its
trajectories, bank versions and update log) and the reward's minimum tool-call store. Both
are append-only logs, so the state at a training step is the length of each file at that
step. When OpenRLHF saves checkpoint ``global_stepN`` (or ``best_global_stepN``), :func:`snapshot_stores` records
those lengths (``step_N.json`` in each store's ``snapshots`` folder). When a run starts,
:func:`prepare_stores` looks at the step OpenRLHF restored:

- step 0 (a fresh run): every store must be empty. A store that holds an earlier run's
  records would hand this run its bank, its few-shot pool and its minima, and the memory's
  restored step count would make it skip updates, so the run is refused with the ways out;
- step N (a resumed run): every store goes back to its snapshot of step N. What was
  written after it (by the rollouts of steps that the checkpoint does not hold) is cut off
  and kept in ``snapshots/after_step_N-<time>/``, so nothing is lost.

The TSAS stage needs no snapshot: it is a function of OpenRLHF's ``global_step``, which
the checkpoint restores. Any store that implements :class:`StepSnapshots` (for example a
store served by a Ray actor) takes part the same way.
"""

from __future__ import annotations

import functools
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from ...envs.errors import SearchGymError
from ...memory.jsonl_format import write_atomically
from .cluster import store_client
from .config import AgentConfig

__all__ = [
    "FileSnapshots",
    "StepSnapshots",
    "StoreStateError",
    "prepare_stores",
    "run_stores",
    "snapshot_stores",
    "wrap_init_checkpoint_states",
    "wrap_save_best_checkpoint",
    "wrap_save_logs_and_checkpoints",
]

_MEMORY_FILES = ("trajectories", "bank", "updates", "min_tool_calls")


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


class FileSnapshots:
    """Append-only files taken back to a step by their lengths at that step.

    Args:
        name: What the files are, for messages.
        files: The files (absent ones count as empty).
        folder: Where the snapshots (``step_N.json``) and the cut-off tails go.
    """

    def __init__(self, name: str, files: list[str], folder: str | os.PathLike[str]):
        self.name = name
        self.files = [os.path.abspath(f) for f in files]
        self.folder = Path(folder)

    def _sizes(self) -> dict[str, int]:
        return {f: os.path.getsize(f) for f in self.files if os.path.exists(f)}

    def _manifest(self, step: int) -> Path:
        return self.folder / f"step_{step}.json"

    def holds_data(self) -> bool:
        return any(size > 0 for size in self._sizes().values())

    def steps(self) -> list[int]:
        """The steps that have a snapshot, in order."""
        if not self.folder.is_dir():
            return []
        found = (p.stem.removeprefix("step_") for p in self.folder.glob("step_*.json"))
        return sorted(int(s) for s in found if s.isdigit())

    def snapshot(self, step: int) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        record = {"step": step, "time": time.time(), "sizes": self._sizes()}
        write_atomically(self._manifest(step), (json.dumps(record, sort_keys=True) + "\n").encode("utf-8"))

    def restore(self, step: int) -> None:
        try:
            sizes: dict[str, int] = json.loads(self._manifest(step).read_text(encoding="utf-8"))["sizes"]
        except (OSError, ValueError, KeyError, TypeError):
            have = ", ".join(map(str, self.steps())) or "none"
            raise StoreStateError(
                f"Resuming at step {step}, but {self.name} has no snapshot of that step in {self.folder} "
                f"(snapshots: {have}). Resume from a checkpoint the same store was saved with, or start a "
                "fresh run into an empty store."
            ) from None
        now = self._sizes()
        for path, size in sizes.items():
            if now.get(path, 0) < size:
                raise StoreStateError(
                    f"{path} is shorter ({now.get(path, 0)} bytes) than at step {step} ({size} bytes): it was "
                    f"replaced or cut since, so {self.name} cannot be restored to step {step}."
                )
        cut = [(p, sizes.get(p, 0)) for p in now if now[p] > sizes.get(p, 0)]
        if not cut:
            return
        tails = self.folder / f"after_step_{step}-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}"
        tails.mkdir(parents=True, exist_ok=True)
        for path, size in cut:
            with open(path, "rb") as handle:
                handle.seek(size)
                (tails / os.path.basename(path)).write_bytes(handle.read())
            os.truncate(path, size)

    def __repr__(self) -> str:
        return f"FileSnapshots({self.name!r}, {self.files!r})"


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
    if memory is not None and memory.kind == "lightsearcher":
        folder = str(memory.path)  # AgentConfig requires a path
        files = [os.path.join(folder, f"{kind}.jsonl") for kind in _MEMORY_FILES]
        stores.append(
            FileSnapshots(f"the memory store agent.memory.path {folder}", files, Path(folder) / "snapshots")
        )
    reward_kwargs = config.env_kwargs.get("reward_kwargs")
    store = reward_kwargs.get("store") if isinstance(reward_kwargs, dict) else None
    in_memory = any(isinstance(s, FileSnapshots) and os.path.abspath(str(store)) in s.files for s in stores)
    if isinstance(store, str) and not in_memory:
        name = f"the minimum tool-call store agent.env_kwargs.reward_kwargs.store {store}"
        stores.append(FileSnapshots(name, [store], store + ".snapshots"))
    return stores


def snapshot_stores(stores: list[StepSnapshots], step: int) -> None:
    """Snapshot every store at ``step`` (called as OpenRLHF saves checkpoint ``global_step{step}``)."""
    for store in stores:
        store.snapshot(step)


def prepare_stores(stores: list[StepSnapshots], step: int, *, checkpoint: str = "openrlhf.ckpt.path") -> None:
    """Make the stores fit a run that starts at ``step`` (0: fresh; else resumed from its checkpoint).

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
            "memory updates. Either start fresh (move or delete those files), or resume the earlier run (set "
            "openrlhf.ckpt.load_enable: true with its checkpoint at openrlhf.ckpt.path), or choose another path "
            "(agent.memory.path, agent.env_kwargs.reward_kwargs.store)."
        )


def wrap_init_checkpoint_states(
    original: Callable[..., Any], config_of: Callable[[], AgentConfig | None]
) -> Callable[..., Any]:
    """``BasePPOTrainer.init_checkpoint_states`` that then fits the stores to the restored step."""

    @functools.wraps(original)
    def init_checkpoint_states(self: Any) -> dict:
        states = original(self)
        config = config_of()
        if config is not None:
            prepare_stores(
                run_stores(config), int(states.get("global_step", 0)), checkpoint=self.args.ckpt.path
            )
        return states

    return init_checkpoint_states


def wrap_save_logs_and_checkpoints(
    original: Callable[..., Any], config_of: Callable[[], AgentConfig | None]
) -> Callable[..., Any]:
    """``BasePPOTrainer.save_logs_and_checkpoints`` that snapshots the stores with each checkpoint."""

    @functools.wraps(original)
    def save_logs_and_checkpoints(
        self: Any, global_step: int, logs_dict: Any = None, client_states: Any = None
    ) -> Any:
        config = config_of()
        if config is not None and global_step % self.args.ckpt.save_steps == 0:
            snapshot_stores(run_stores(config), int(global_step))
        return original(self, global_step, logs_dict, client_states)

    return save_logs_and_checkpoints


def wrap_save_best_checkpoint(
    original: Callable[..., Any], config_of: Callable[[], AgentConfig | None]
) -> Callable[..., Any]:
    """``BasePPOTrainer.save_best_checkpoint`` that snapshots the stores too: a resume may load that checkpoint."""

    @functools.wraps(original)
    def save_best_checkpoint(
        self: Any, eval_metrics: Any, global_step: int, client_states: Any = None
    ) -> Any:
        config = config_of()
        if config is not None:
            snapshot_stores(run_stores(config), int(global_step))
        return original(self, eval_metrics, global_step, client_states)

    return save_best_checkpoint
