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
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from ...envs.checks import check_number
from ...envs.errors import InvalidArgumentError
from ...envs.rewards import tsas_advantages, tsas_stage

__all__ = ["GroupFigures", "group_norm", "dr_grpo", "tsas", "group_advantages", "GROUP_NORM_EPS"]

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
    """The advantages of one group under ``estimator`` (``group_norm``, ``dr_grpo`` or ``tsas``).

    Raises:
        InvalidArgumentError: an unknown estimator, or figures of unequal lengths for ``tsas``.
    """
    if estimator == "group_norm":
        return group_norm(figures.rewards)
    if estimator == "dr_grpo":
        return dr_grpo(figures.rewards)
    if estimator == "tsas":
        return tsas(figures, step, tsas_warmup_steps, tsas_alpha, tsas_variant)
    raise InvalidArgumentError(f"estimator must be one of group_norm, dr_grpo, tsas; got {estimator!r}.")
