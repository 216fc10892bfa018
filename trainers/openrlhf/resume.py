"""The run's stores follow OpenRLHF's checkpoints (:mod:`searchgym.trainers.store_snapshots`).

A LightSearcher run keeps state outside the model: the experience memory's store (its
trajectories, bank versions and update log) and the reward's minimum tool-call store. Both
are append-only SQLite logs, so the state at a training step is each log's last record id
at that step. When OpenRLHF saves checkpoint ``global_stepN`` (or ``best_global_stepN``),
:func:`snapshot_stores` records those ids under the step the checkpoint resumes at (the
``global_step`` of its client states, :func:`checkpoint_step`) (in each log's ``snapshots`` table, as the store
actor does). When a run starts, :func:`prepare_stores` looks at the step OpenRLHF restored:

- step 0 (a fresh run): every store must be empty. A store that holds an earlier run's
  records would hand this run its bank, its few-shot pool and its minima, and the memory's
  restored step count would make it skip updates, so the run is refused with the ways out;
- step N (a resumed run): every store goes back to its snapshot of step N. What was
  written after it (by the rollouts of steps that the checkpoint does not hold) is cut off
  and kept in ``<log file>.cut-N.jsonl``, so nothing is lost.

Each run has an id (:func:`new_run_id`), which every checkpoint it saves records in its
client states (:data:`RUN_ID_KEY`); a resumed run takes it from its checkpoint, and its
store actor records it (``searchgym memory actors`` shows it).

The TSAS stage needs no snapshot: it is a function of OpenRLHF's ``global_step``, which
the checkpoint restores. Any store that implements
:class:`~searchgym.trainers.store_snapshots.StepSnapshots` (for example a store served by a
Ray actor) takes part the same way.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from ..agent_config import AgentConfig
from ..store_snapshots import prepare_stores, run_stores, snapshot_stores
from .cluster import claim_store_actor

__all__ = [
    "OPENRLHF_RESUME",
    "RUN_ID_KEY",
    "checkpoint_run_id",
    "checkpoint_step",
    "new_run_id",
    "wrap_init_checkpoint_states",
    "wrap_save_best_checkpoint",
    "wrap_save_logs_and_checkpoints",
]


RUN_ID_KEY = "searchgym_run_id"
"""The key of a checkpoint's ``client_states`` that holds the id of the run that saved it."""


def new_run_id() -> str:
    """A new run's id: its start time and 6 random hex digits (``20250102-100000-3f2a9c``)."""
    import time
    import uuid

    return f"{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"


def checkpoint_run_id(states: dict[str, Any]) -> str | None:
    """The run id a checkpoint's ``client_states`` records, or ``None`` (a checkpoint of an older searchgym)."""
    run_id = states.get(RUN_ID_KEY)
    return run_id if isinstance(run_id, str) and run_id else None


OPENRLHF_RESUME = (
    "set openrlhf.ckpt.load_enable: true with its checkpoint at openrlhf.ckpt.path), or choose another path "
    "(agent.memory.path, agent.env_kwargs.reward_kwargs.store)."
)


def wrap_init_checkpoint_states(
    original: Callable[..., Any], config_of: Callable[[], AgentConfig | None]
) -> Callable[..., Any]:
    """``BasePPOTrainer.init_checkpoint_states`` that then starts the run's store actor and fits
    the stores to the restored step.

    The run is the checkpoint's (:data:`RUN_ID_KEY` of its client states) when it resumes,
    else a new one; its id goes into every checkpoint it saves and into its store actor
    (:func:`~searchgym.trainers.openrlhf.cluster.claim_store_actor`, which refuses a store
    that another run's actor serves).
    """

    @functools.wraps(original)
    def init_checkpoint_states(self: Any) -> dict:
        states = original(self)
        config = config_of()
        step = int(states.get("global_step", 0))
        self._searchgym_run_id = (checkpoint_run_id(states) if step > 0 else None) or new_run_id()
        if config is not None:
            claim_store_actor(config, self._searchgym_run_id, checkpoint=str(self.args.ckpt.path))
            prepare_stores(run_stores(config), step, checkpoint=self.args.ckpt.path, resume=OPENRLHF_RESUME)
        return states

    return init_checkpoint_states


def checkpoint_step(global_step: int, client_states: Any) -> int:
    """The training step a checkpoint resumes at: the ``global_step`` of its ``client_states``.

    That is what ``init_checkpoint_states`` hands back on resume, so the stores' snapshot
    must carry that step. It can differ from the step in the checkpoint's tag: OpenRLHF's
    async trainer saves ``best_global_step{eval step}`` with the trainer's current step,
    which is one or more steps past the evaluation. Without ``client_states`` it is the
    ``global_step`` passed in.
    """
    states = client_states if isinstance(client_states, dict) else {}
    step = states.get("global_step", global_step)
    return int(step if isinstance(step, int) and not isinstance(step, bool) else global_step)


def _with_run_id(trainer: Any, client_states: Any) -> Any:
    """``client_states`` with the run's id under :data:`RUN_ID_KEY` (a new dict for ``None``)."""
    run_id = getattr(trainer, "_searchgym_run_id", None)
    if run_id is None or not (client_states is None or isinstance(client_states, dict)):
        return client_states
    states = {} if client_states is None else client_states
    states[RUN_ID_KEY] = run_id
    return states


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
            snapshot_stores(run_stores(config), checkpoint_step(global_step, client_states))
        return original(self, global_step, logs_dict, _with_run_id(self, client_states))

    return save_logs_and_checkpoints


def wrap_save_best_checkpoint(
    original: Callable[..., Any], config_of: Callable[[], AgentConfig | None]
) -> Callable[..., Any]:
    """``BasePPOTrainer.save_best_checkpoint`` that snapshots the stores too: a resume may load that checkpoint.

    The snapshot carries the step the checkpoint resumes at (:func:`checkpoint_step`), not
    the evaluation's step in its tag: the two differ under OpenRLHF's async trainer.
    """

    @functools.wraps(original)
    def save_best_checkpoint(
        self: Any, eval_metrics: Any, global_step: int, client_states: Any = None
    ) -> Any:
        config = config_of()
        if config is not None:
            snapshot_stores(run_stores(config), checkpoint_step(global_step, client_states))
        return original(self, eval_metrics, global_step, _with_run_id(self, client_states))

    return save_best_checkpoint
