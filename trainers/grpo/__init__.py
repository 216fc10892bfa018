"""The built-in GRPO trainer: any transformers causal LM, trained on searchgym envs.

For CPU runs, single-GPU users and as a readable reference next to the OpenRLHF plugin.
Run it with ``searchgym train --config configs/grpo_synthetic.yaml`` or::

    from searchgym.trainers.run_spec import load_config
    from searchgym.trainers.grpo import train

    state = train(load_config("configs/grpo_synthetic.yaml"))

Modules, by subject:

================  ====================================================================
``advantages``    group advantages: ``group_norm``, ``dr_grpo``, ``tsas`` (pure functions)
``generation``    batched sampling with stop strings and per-row token budgets
``rollout``       multi-turn episodes as token sequences with action masks
``prefix``        one encoded prompt per group, for sampling and the update
``loss``          clipped objective, k3 KL, token weights of the loss averages
``metrics``       the figures of a step's rollouts
``envs``          the shared reward scheme, memory, env factory, question order
``model``         loading the policy, reference model and tokenizer
``checkpoint``    saving and resuming (model, AdamW, schedule, RNG, reward, memory)
``trainer``       :class:`GRPOTrainer`, the loop
================  ====================================================================

Submodules load on first use: ``advantages`` needs neither torch nor transformers (the
incentive study uses it on a bare install); every other module imports torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..advantages import GroupFigures, dr_grpo, group_advantages, group_norm, tsas
    from .checkpoint import TrainerState, latest_checkpoint, list_checkpoints
    from .generation import Sampled, SamplingSettings, sample_actions
    from .loss import clipped_token_loss, k3_kl, token_logprobs, token_weights
    from .metrics import rollout_metrics
    from .rollout import Episode, RolloutCollector, Segment
    from .trainer import GRPOTrainer, step_seed, train

__all__ = [
    # the trainer
    "GRPOTrainer",
    "train",
    "TrainerState",
    "latest_checkpoint",
    "list_checkpoints",
    "step_seed",
    # rollouts
    "RolloutCollector",
    "Episode",
    "Segment",
    "Sampled",
    "SamplingSettings",
    "sample_actions",
    "rollout_metrics",
    # advantages
    "GroupFigures",
    "group_norm",
    "dr_grpo",
    "tsas",
    "group_advantages",
    # loss
    "token_logprobs",
    "clipped_token_loss",
    "k3_kl",
    "token_weights",
]

_HOME = {
    "GroupFigures": "..advantages",
    "dr_grpo": "..advantages",
    "group_advantages": "..advantages",
    "group_norm": "..advantages",
    "tsas": "..advantages",
    "TrainerState": "checkpoint",
    "latest_checkpoint": "checkpoint",
    "list_checkpoints": "checkpoint",
    "Sampled": "generation",
    "SamplingSettings": "generation",
    "sample_actions": "generation",
    "clipped_token_loss": "loss",
    "k3_kl": "loss",
    "token_logprobs": "loss",
    "token_weights": "loss",
    "rollout_metrics": "metrics",
    "Episode": "rollout",
    "RolloutCollector": "rollout",
    "Segment": "rollout",
    "GRPOTrainer": "trainer",
    "step_seed": "trainer",
    "train": "trainer",
}


def __getattr__(name: str) -> Any:
    """Import the submodule that defines ``name`` on first use (PEP 562)."""
    module = _HOME.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(
        importlib.import_module(module if module.startswith(".") else f".{module}", __name__), name
    )
