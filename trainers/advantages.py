"""Group advantages: one number per rollout, computed within the G rollouts of one question.

Three estimators, each a pure function of one group's figures:

==============  ==============================================================  ===========================
name            advantage of rollout i                                          from
==============  ==============================================================  ===========================
``group_norm``  (R_i − mean R) / (std R + ε), std with Bessel's correction       GRPO (DeepSeekMath); OpenRLHF
``dr_grpo``     R_i − mean R                                                     Dr. GRPO; OpenRLHF
``tsas``        Light-Search's two-stage shaping: docs/methods.md#light-search  :func:`searchgym.tsas_advantages`
==============  ==============================================================  ===========================

``group_norm`` divides by the sample standard deviation (divide by G − 1) plus ε = 1e-9,
exactly as OpenRLHF 0.11.2 does (``rewards.std(-1)`` in torch), so the two backends agree;
a group whose rewards are all equal gets exactly zero advantages (OpenRLHF's
floating-point mean leaves ~1e-7 there). Each rollout's advantage is then
given to every one of its action tokens.

The estimators are registered in :data:`ESTIMATORS` (:func:`register_estimator`); a run
names one in its ``advantage`` section (:class:`AdvantageConfig`), and every backend gets
the function of a group with :func:`build_advantage`: the built-in trainer for each group
it samples, the OpenRLHF worker hook for an estimator OpenRLHF does not compute itself.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from ..checks import check_number
from ..envs.config_base import check_choice, check_finite, check_int
from ..envs.rewards import TSAS_VARIANTS, tsas_advantages, tsas_stage
from ..error import InvalidArgumentError

__all__ = [
    "ESTIMATORS",
    "AdvantageConfig",
    "Estimator",
    "GroupAdvantage",
    "GroupFigures",
    "build_advantage",
    "register_estimator",
    "group_norm",
    "dr_grpo",
    "tsas",
    "group_advantages",
    "GROUP_NORM_EPS",
]

GROUP_NORM_EPS = 1e-9
"""ε added to the group's standard deviation (OpenRLHF's value)."""


@dataclass(frozen=True)
class GroupFigures:
    """What the estimators read from the G rollouts of one question, one entry per rollout.

    Attributes:
        rewards: The env's terminal reward R_i.
        searches: Searches S_i (``info["num_searches"]``); used by ``tsas``.
        reasoning: Reasoning T_i (``<think>`` blocks, or tokens inside them); used by ``tsas``.
    """

    rewards: tuple[float, ...]
    searches: tuple[float, ...] = ()
    reasoning: tuple[float, ...] = ()


def _checked(rewards: Sequence[float]) -> list[float]:
    if len(rewards) < 1:
        raise InvalidArgumentError("A group needs at least one reward, got none.")
    return [check_number(f"rewards[{i}]", r) for i, r in enumerate(rewards)]


def dr_grpo(rewards: Sequence[float]) -> list[float]:
    """Dr. GRPO's advantages: ``R_i − mean_j R_j`` (no division by the std).

    A group of equal rewards gets exactly zero (not the rounding error of the mean).
    """
    r = _checked(rewards)
    if max(r) == min(r):
        return [0.0] * len(r)
    mean = sum(r) / len(r)
    return [x - mean for x in r]


def group_norm(rewards: Sequence[float], eps: float = GROUP_NORM_EPS) -> list[float]:
    """GRPO's advantages: ``(R_i − mean R) / (std R + eps)``, std with Bessel's correction.

    A group of one has std 0 (its advantage is 0).
    """
    r = _checked(rewards)
    centred = dr_grpo(r)
    n = len(r)
    std = math.sqrt(sum(c * c for c in centred) / (n - 1)) if n > 1 else 0.0
    return [c / (std + eps) for c in centred]


def tsas(
    figures: GroupFigures,
    step: int,
    warmup_steps: int = 150,
    alpha: float = 0.01,
    variant: Literal["eq4", "eq2"] = "eq4",
) -> list[float]:
    """Light-Search's shaped advantages for training step ``step`` (stage 2 from ``warmup_steps`` on).

    See :func:`searchgym.envs.rewards.tsas_advantages` for the equations; this picks the
    stage with :func:`~searchgym.envs.rewards.tsas_stage` (stage 1 while ``step < M1``).
    """
    stage = tsas_stage(step, warmup_steps)
    return tsas_advantages(
        figures.rewards, figures.searches, figures.reasoning, stage, alpha=alpha, variant=variant
    )


def group_advantages(
    estimator: str,
    figures: GroupFigures,
    *,
    step: int = 0,
    tsas_warmup_steps: int = 150,
    tsas_alpha: float = 0.01,
    tsas_variant: Literal["eq4", "eq2"] = "eq4",
) -> list[float]:
    """The advantages of one group under ``estimator`` (a registered name, see :data:`ESTIMATORS`).

    Raises:
        InvalidArgumentError: an unknown estimator, or figures of unequal lengths for ``tsas``.
    """
    if estimator not in ESTIMATORS:
        raise InvalidArgumentError(f"estimator must be one of {', '.join(ESTIMATORS)}; got {estimator!r}.")
    config = AdvantageConfig(estimator, tsas_warmup_steps, tsas_alpha, tsas_variant)
    return build_advantage(config)(figures, step)


# -- the registry ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Estimator:
    """A registered group-advantage estimator.

    Attributes:
        name: The registry key (``advantage.estimator``).
        compute: ``compute(figures, step, config)``: the group's advantages at training step ``step``.
        openrlhf: The OpenRLHF estimator (``--algo.advantage.estimator``) that computes the
            same advantages inside OpenRLHF, or ``None`` when searchgym's worker hook applies
            it there (it then runs under the estimator the ``openrlhf`` section names, which
            only sets OpenRLHF's per-token path).
        uses: The figures it reads besides the rewards (``searches``, ``reasoning``).
        stage: ``stage(step, config)``: the estimator's stage at ``step``, logged by the
            OpenRLHF hook; ``None`` for an estimator without stages.
        loss_agg: The built-in trainer's loss aggregation for ``builtin.algo.loss_agg: auto``.
    """

    name: str
    compute: Callable[[GroupFigures, int, AdvantageConfig], list[float]]
    openrlhf: str | None = None
    uses: tuple[str, ...] = ()
    stage: Callable[[int, AdvantageConfig], int] | None = None
    loss_agg: str = "seq_mean_token_mean"


ESTIMATORS: dict[str, Estimator] = {}
"""Registered group-advantage estimators by name."""


def register_estimator(estimator: Estimator) -> Estimator:
    """Register ``estimator`` under its name (the same object again is a no-op).

    Raises:
        InvalidArgumentError: another estimator already has the name.
    """
    existing = ESTIMATORS.get(estimator.name)
    if existing is not None and existing is not estimator:
        raise InvalidArgumentError(
            f"The advantage estimator name {estimator.name!r} is taken; choose another."
        )
    ESTIMATORS[estimator.name] = estimator
    return estimator


register_estimator(Estimator("group_norm", lambda f, step, c: group_norm(f.rewards), openrlhf="group_norm"))
register_estimator(
    Estimator(
        "dr_grpo",
        lambda f, step, c: dr_grpo(f.rewards),
        openrlhf="dr_grpo",
        loss_agg="seq_mean_token_sum_norm",
    )
)
register_estimator(
    Estimator(
        "tsas",
        lambda f, step, c: tsas(f, step, c.warmup_steps, c.alpha, c.variant),
        uses=("searches", "reasoning"),
        stage=lambda step, c: tsas_stage(step, c.warmup_steps),
    )
)


@dataclass
class AdvantageConfig:
    """The group advantage (the ``advantage`` section), the same for every backend.

    Attributes:
        estimator: ``group_norm`` ((R − mean) / std over the group), ``dr_grpo``
            (R − mean), or ``tsas`` (Light-Search's two-stage shaping, docs/methods.md#light-search).
        warmup_steps: ``tsas``: M1, the first step of stage 2 (paper: 150).
        alpha: ``tsas``: α, the weight of the reasoning term in stage 1 (paper: 0.01).
        variant: ``tsas``: stage 2 as Eq. 4 is printed (``eq4``) or the Eq. 2-faithful
            reading (``eq2``: searches cost only rollouts above the group mean), docs/methods.md#light-search-readings.
        reasoning: ``tsas``: T counts ``<think>`` blocks (``steps``, the paper's choice) or
            the tokens inside them (``tokens``, built-in trainer only).
    """

    estimator: str = "group_norm"
    warmup_steps: int = 150
    alpha: float = 0.01
    variant: Literal["eq4", "eq2"] = "eq4"
    reasoning: Literal["steps", "tokens"] = "steps"

    def __post_init__(self) -> None:
        check_choice("estimator", self.estimator, tuple(ESTIMATORS))
        check_choice("variant", self.variant, TSAS_VARIANTS)
        check_int("warmup_steps", self.warmup_steps, 0)
        check_finite("alpha", self.alpha)

    @property
    def spec(self) -> Estimator:
        """The registered estimator."""
        return ESTIMATORS[self.estimator]


class GroupAdvantage:
    """The advantages of one group under a configured estimator: ``advantage(figures, step)``.

    Picklable (it holds only its config), so it can travel to Ray workers.
    """

    def __init__(self, config: AdvantageConfig):
        self.config = config

    def __call__(self, figures: GroupFigures, step: int = 0) -> list[float]:
        """The advantage of each rollout of the group at training step ``step``."""
        return self.config.spec.compute(figures, step, self.config)

    def stage(self, step: int) -> int | None:
        """The estimator's stage at ``step`` (``None`` for an estimator without stages)."""
        stage = self.config.spec.stage
        return None if stage is None else stage(step, self.config)


def build_advantage(config: AdvantageConfig | None) -> GroupAdvantage:
    """The group advantage of ``config`` (``None``: ``group_norm``), for every backend."""
    return GroupAdvantage(config if config is not None else AdvantageConfig())
