"""Light-Search's two-stage, performance-gated advantage shaping for one GRPO group.

Unlike the reward schemes, this acts on the advantages of the G rollouts of one question,
so it needs the whole group and is a plain function rather than a :class:`RewardScheme`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

from ...checks import check_int, check_number
from ...error import InvalidArgumentError

__all__ = ["TSAS_VARIANTS", "tsas_advantages", "tsas_stage"]

TSAS_VARIANTS = ("eq4", "eq2")
"""Readings of stage 2: Eq. 4 as printed, and the Eq. 2-faithful one (docs/methods.md#light-search-readings)."""


def _sigmoid(x: float) -> float:
    if x >= 0:
        return 1.0 / (1.0 + math.exp(-x))
    z = math.exp(x)
    return z / (1.0 + z)


def _check_values(name: str, values: Sequence[float], non_negative: bool) -> list[float]:
    low, note = (0.0, " (it is a count)") if non_negative else (None, "")
    return [check_number(f"{name}[{i}]", value, low, note=note) for i, value in enumerate(values)]


def tsas_stage(step: int, warmup_steps: int = 150) -> int:
    """The stage for training step ``step``: 1 while ``step < warmup_steps`` (M1), else 2."""
    check_int("step", step, 0)
    check_int("warmup_steps", warmup_steps, 0)
    return 1 if step < warmup_steps else 2


def tsas_advantages(
    rewards: Sequence[float],
    searches: Sequence[float],
    reasoning: Sequence[float],
    stage: int,
    alpha: float = 0.01,
    variant: Literal["eq4", "eq2"] = "eq4",
) -> list[float]:
    """Shaped advantages of the G rollouts of one question (docs/methods.md#light-search).

    For rollout ``i`` with task reward ``R_i`` (F1 in training), ``S_i`` searches and
    ``T_i`` reasoning steps (``<think>`` blocks by default, or reasoning tokens)::

        Stage 1 (warm-up, step < M1):
            A_i  = (R_i - mean R) + log(S_i + 1) + α · log(T_i + 1)
        Stage 2 (annealing, step >= M1):
            A+_i = R_i - mean R
            S+_i = log(S_i + 1) - std(S)
            T+_i = log(T_i + 1)
            σ_i  = sigmoid(A+_i) - 0.5
            A_i  = A+_i + σ_i · S+_i + σ_i · T+_i

    In stage 1 searching and reasoning are encouraged outright; in stage 2 (Eq. 4 as
    printed) they add to the advantage of rollouts that beat the group mean and subtract
    from those below it, so a right search outranks a right direct answer.

    The paper's Eq. 2 instead defines stage 2 as a cost charged to successful trajectories
    only, ``R2 = R − g(R)·C``. docs/methods.md#light-search-readings settles that reading as ``variant="eq2"``
    (stage 1 unchanged)::

        σ+_i = max(0, sigmoid(A+_i) - 0.5)
        A_i  = A+_i - σ+_i · (S+_i + T+_i)

    so a rollout above the group mean pays for its searches and reasoning, and one below
    it is left at ``A+_i``.

    Settled in docs/methods.md#light-search: mean and std are over the group, std is the population std
    (divide by G), logs are natural, and stage 1 uses ``log(T + 1)`` where the paper writes
    ``log(T)`` so that T = 0 is defined. ``α`` appears in stage 1 only.

    Defaults: α = 0.01; the paper uses G = 5 rollouts and M1 = 150 warm-up steps (see
    :func:`tsas_stage`).

    Args:
        rewards: ``R_i`` for each rollout.
        searches: ``S_i`` (>= 0) for each rollout.
        reasoning: ``T_i`` (>= 0) for each rollout.
        stage: 1 or 2.
        alpha: Weight of the reasoning term in stage 1.
        variant: ``"eq4"`` (the paper's Eq. 4 as printed, the default) or ``"eq2"`` (the
            Eq. 2-faithful stage 2).

    Returns:
        ``A_i`` for each rollout, in order.

    Raises:
        InvalidArgumentError: On empty or unequal-length inputs, a non-finite value, a
            negative count, a stage other than 1 or 2, or an unknown variant.
    """
    if not (len(rewards) == len(searches) == len(reasoning)) or not rewards:
        raise InvalidArgumentError(
            "rewards, searches and reasoning must be non-empty and of equal length (one entry per "
            f"rollout of the group), got {len(rewards)}, {len(searches)} and {len(reasoning)}."
        )
    if stage not in (1, 2) or isinstance(stage, bool) or not isinstance(stage, int):
        raise InvalidArgumentError(f"stage must be 1 (warm-up) or 2 (annealing), got {stage!r}.")
    if variant not in TSAS_VARIANTS:
        raise InvalidArgumentError(
            f"variant must be 'eq4' (Eq. 4 as printed) or 'eq2' (Eq. 2-faithful), got {variant!r}."
        )
    alpha = check_number("alpha", alpha)
    r = _check_values("rewards", rewards, non_negative=False)
    s = _check_values("searches", searches, non_negative=True)
    t = _check_values("reasoning", reasoning, non_negative=True)

    mean_r = sum(r) / len(r)
    centred = [x - mean_r for x in r]
    if stage == 1:
        return [
            a + math.log(si + 1) + alpha * math.log(ti + 1) for a, si, ti in zip(centred, s, t, strict=True)
        ]

    mean_s = sum(s) / len(s)
    std_s = math.sqrt(sum((x - mean_s) ** 2 for x in s) / len(s))
    out = []
    for a, si, ti in zip(centred, s, t, strict=True):
        s_plus, t_plus = math.log(si + 1) - std_s, math.log(ti + 1)
        if variant == "eq4":
            gate = _sigmoid(a) - 0.5
            out.append(a + gate * s_plus + gate * t_plus)
        else:
            gate = max(0.0, _sigmoid(a) - 0.5)
            out.append(a - gate * (s_plus + t_plus))
    return out
