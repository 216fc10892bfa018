"""searchgym's group advantages as verl advantage estimators, and the memory's training steps.

verl 0.9.1 computes advantages on the driver in ``compute_advantage``
(``verl/trainer/ppo/ray_trainer.py``), which calls a registered estimator
(``core_algos.register_adv_est``) with the token-level rewards, the response mask, the
group ids (``uid``) and the algorithm config, and hands ``non_tensor_batch`` to GDPO only.
TSAS needs each rollout's searches and reasoning steps, which the agent loop puts in
``extra_fields`` (so in ``non_tensor_batch``). Hence two pieces:

- :func:`register` registers every searchgym estimator (:data:`~searchgym.trainers.advantages.ESTIMATORS`)
  in verl as ``searchgym_<name>`` (``algorithm.adv_estimator=searchgym_tsas``); each computes
  one group at a time with :func:`~searchgym.trainers.advantages.build_advantage`, the
  function every backend uses, and gives the rollout's advantage to each of its tokens.
- :func:`install` is the patch point: it wraps ``compute_advantage`` (in
  ``ray_trainer`` and in ``ppo/v1/utils``, which imported it) so that a searchgym estimator
  also gets the batch's ``non_tensor_batch`` and the training step. After the advantages it
  steps the experience memory to the training step (:class:`~searchgym.trainers.memory_sync.MemoryStepper`,
  as OpenRLHF's worker hook does), since the driver is the one process that knows the step.

verl's V1 trainer (``trainer.use_v1``, its default) fetches only tensor fields from its
TransferQueue before ``compute_advantage``, so the searches do not reach it there; a run
with an estimator that reads them (``tsas``) sets ``trainer.use_v1=false``
(``searchgym train --backend verl`` says so when it is missing).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import torch

from ...error import InvalidArgumentError
from ..advantages import ESTIMATORS, AdvantageConfig, GroupFigures, build_advantage

__all__ = ["PREFIX", "estimator_name", "install", "register", "searchgym_advantages"]

logger = logging.getLogger(__name__)

PREFIX = "searchgym_"
"""verl's name of a searchgym estimator is this prefix and its searchgym name."""

_FIGURE_KEYS = {"searches": "num_searches", "reasoning": "reasoning_steps"}


def estimator_name(name: str) -> str:
    """verl's ``algorithm.adv_estimator`` for the searchgym estimator ``name``."""
    return PREFIX + name


def searchgym_advantages(
    config: AdvantageConfig,
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Any,
    non_tensor_batch: Mapping[str, Any] | None = None,
    step: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """verl's ``(advantages, returns)`` of ``config``'s estimator: one value per rollout,
    computed within each ``uid`` group, given to every response token.

    Raises:
        InvalidArgumentError: the estimator reads searches or reasoning steps and
            ``non_tensor_batch`` lacks them (the message says how to get them there).
    """
    spec = config.spec
    rewards = (token_level_rewards * response_mask).sum(dim=-1).tolist()
    figures: dict[str, list[float]] = {}
    for use in spec.uses:
        key = _FIGURE_KEYS[use]
        column = None if non_tensor_batch is None else non_tensor_batch.get(key)
        if column is None:
            raise InvalidArgumentError(
                f"advantage.estimator {config.estimator!r} reads each rollout's {key}, which the searchgym "
                "agent loop puts in extra_fields, but compute_advantage did not get them: run with "
                "trainer.use_v1=false and call searchgym.trainers.verl.advantage.install() in the driver "
                "(python -m searchgym.trainers.verl.main_ppo does both)."
            )
        figures[use] = [float(v) for v in column]
    groups: dict[Any, list[int]] = {}
    for i, uid in enumerate(list(index)):
        groups.setdefault(uid, []).append(i)
    advantage = build_advantage(config)
    scores = [0.0] * len(rewards)
    for rows in groups.values():
        values = advantage(
            GroupFigures(
                rewards=tuple(rewards[i] for i in rows),
                searches=tuple(figures["searches"][i] for i in rows) if "searches" in figures else (),
                reasoning=tuple(figures["reasoning"][i] for i in rows) if "reasoning" in figures else (),
            ),
            step,
        )
        for i, value in zip(rows, values, strict=True):
            scores[i] = value
    advantages = torch.tensor(scores, dtype=torch.float32).unsqueeze(-1) * response_mask
    return advantages, advantages


class _Estimator:
    """A verl estimator function for one searchgym estimator (its config from the run)."""

    def __init__(self, name: str):
        self.name = name
        self.config: AdvantageConfig | None = None
        """The run's ``advantage`` section (set by :func:`install`); defaults otherwise."""

    def __call__(
        self,
        token_level_rewards: torch.Tensor,
        response_mask: torch.Tensor,
        index: Any = None,
        config: Any = None,
        non_tensor_batch: Mapping[str, Any] | None = None,
        step: int = 0,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if index is None:
            raise InvalidArgumentError(f"{estimator_name(self.name)} needs the batch's uid groups (index).")
        own = self.config if self.config is not None else AdvantageConfig(self.name)
        return searchgym_advantages(own, token_level_rewards, response_mask, index, non_tensor_batch, step)


_ESTIMATORS: dict[str, _Estimator] = {}


def register() -> dict[str, _Estimator]:
    """Register every searchgym estimator in verl's ``ADV_ESTIMATOR_REGISTRY`` (again: a no-op)."""
    from verl.trainer.ppo import core_algos

    for name in ESTIMATORS:
        fn = _ESTIMATORS.get(name)
        if fn is None:
            fn = _ESTIMATORS[name] = _Estimator(name)
        if core_algos.ADV_ESTIMATOR_REGISTRY.get(estimator_name(name)) is not fn:
            core_algos.register_adv_est(estimator_name(name))(fn)
    return _ESTIMATORS


def _step_of(data: Any) -> int:
    """The training step of a batch: ``meta_info["global_steps"]``, else the rollout servers'
    ``global_steps`` in the agent loop's fields, else 0."""
    step = data.meta_info.get("global_steps") if isinstance(data.meta_info, Mapping) else None
    if step is None:
        column = data.non_tensor_batch.get("global_steps")
        known = [int(v) for v in (column if column is not None else []) if v is not None]
        step = max(known) if known else 0
    return int(step)


def _follow(memory: Any, step: int) -> None:
    if memory is not None:
        from ..memory_sync import MemoryStepper

        MemoryStepper(memory).follow(step)


def install(advantage: AdvantageConfig | None = None, memory: Any = None) -> None:
    """Patch verl's ``compute_advantage`` (see the module docstring); calling it again updates
    the config and memory.

    Args:
        advantage: The run's ``advantage`` section (its estimator's parameters).
        memory: The experience memory to step once per training step, or ``None``.
    """
    from verl.trainer.ppo import ray_trainer

    estimators = register()
    if advantage is not None:
        estimators[advantage.estimator].config = advantage
    original = getattr(ray_trainer.compute_advantage, "__searchgym_original__", ray_trainer.compute_advantage)

    def compute_advantage(data: Any, adv_estimator: Any, *args: Any, **kwargs: Any) -> Any:
        name = getattr(adv_estimator, "value", adv_estimator)
        step = _step_of(data)
        if not (isinstance(name, str) and name.startswith(PREFIX) and name[len(PREFIX) :] in estimators):
            data = original(data, adv_estimator, *args, **kwargs)
            _follow(memory, step)
            return data
        fn = estimators[name[len(PREFIX) :]]
        if "response_mask" not in data.batch.keys():
            from verl.trainer.ppo.ray_trainer import compute_response_mask

            data.batch["response_mask"] = compute_response_mask(data)
        index = data.non_tensor_batch["uid"]
        advantages, returns = fn(
            data.batch["token_level_rewards"],
            data.batch["response_mask"],
            index=index,
            non_tensor_batch=data.non_tensor_batch,
            step=step,
        )
        data.batch["advantages"], data.batch["returns"] = advantages, returns
        _follow(memory, step)
        return data

    compute_advantage.__searchgym_original__ = original  # type: ignore[attr-defined]
    ray_trainer.compute_advantage = compute_advantage
    try:
        from verl.trainer.ppo.v1 import utils as v1_utils
    except ImportError:  # pragma: no cover - verl without the V1 trainer
        return
    v1_utils.compute_advantage = compute_advantage
