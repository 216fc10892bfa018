"""The run's stores follow verl's checkpoints: snapshot at each save, restore on resume.

The experience memory's store and the minimum tool-call store are append-only logs whose
state at a training step is a snapshot (:mod:`searchgym.trainers.store_snapshots`, shared
with the OpenRLHF backend). verl 0.9.1's ``RayPPOTrainer`` saves checkpoint
``global_step_N`` in ``_save_checkpoint`` after step N and, when a run starts, sets
``global_steps`` to the checkpoint's N in ``_load_checkpoint`` (0 when it starts fresh).
:func:`install` wraps both:

- after ``_save_checkpoint``: every store is snapshotted at ``global_steps``;
- after ``_load_checkpoint``: a resumed run's stores go back to their snapshot of N (what
  later rollouts wrote is cut off and kept beside the log); a fresh run refuses stores that
  already hold an earlier run's records (:func:`~searchgym.trainers.store_snapshots.prepare_stores`).
"""

from __future__ import annotations

from typing import Any

from ..store_snapshots import StepSnapshots, prepare_stores, snapshot_stores

__all__ = ["VERL_RESUME", "install"]

VERL_RESUME = (
    "keep verl.trainer.resume_mode: auto with its checkpoint in verl.trainer.default_local_dir), or choose "
    "another path (memory.path, env.reward_kwargs.store)."
)
"""How to resume an earlier verl run, for the message of a fresh run on used stores."""


def install(stores: list[StepSnapshots], trainer_cls: Any = None) -> None:
    """Wrap ``trainer_cls._save_checkpoint`` and ``_load_checkpoint`` (default: verl's
    ``RayPPOTrainer``) so that ``stores`` follow the checkpoints (see the module docstring).
    Calling it again replaces the stores."""
    if trainer_cls is None:
        from verl.trainer.ppo.ray_trainer import RayPPOTrainer as trainer_cls
    save = getattr(trainer_cls._save_checkpoint, "__searchgym_original__", trainer_cls._save_checkpoint)
    load = getattr(trainer_cls._load_checkpoint, "__searchgym_original__", trainer_cls._load_checkpoint)

    def _save_checkpoint(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = save(self, *args, **kwargs)
        snapshot_stores(stores, int(self.global_steps))
        return result

    def _load_checkpoint(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = load(self, *args, **kwargs)
        prepare_stores(
            stores, int(self.global_steps), checkpoint="verl.trainer.default_local_dir", resume=VERL_RESUME
        )
        return result

    _save_checkpoint.__searchgym_original__ = save  # type: ignore[attr-defined]
    _load_checkpoint.__searchgym_original__ = load  # type: ignore[attr-defined]
    trainer_cls._save_checkpoint = _save_checkpoint
    trainer_cls._load_checkpoint = _load_checkpoint
