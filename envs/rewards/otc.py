"""OTC (a baseline): answer correctness scaled by a tool-use reward.

From "Acting Less is Reasoning More! Teaching Model to Act Efficiently" (Wang et al. 2025,
arXiv 2504.14870, first titled "OTC: Optimal Tool Calls via Reinforcement Learning"). The
suite compares against it; it is not one of the methods the project proposes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from ...checks import check_int, check_number
from ...error import InvalidArgumentError
from ..records import Trajectory
from .base import RewardScheme
from .outcome import check_format_penalty, check_outcome, outcome_score

__all__ = ["OTCReward", "otc_ppo_tool_reward", "otc_grpo_tool_rewards"]

DEFAULT_C = 1.0
"""Smoothing constant c. The paper names c without a value we could find; 1 is our choice."""


def _check_c(c: object) -> float:
    value = check_number("c", c, low=0.0)
    if value == 0.0:
        raise InvalidArgumentError("c must be > 0 (it keeps cos(m*pi/(2m+c)) above 0), got 0.")
    return value


def otc_ppo_tool_reward(m: int, c: float = DEFAULT_C) -> float:
    """``cos(m·π / (2m + c))``: 1 with no search, decaying towards 0 as ``m`` grows."""
    return math.cos(m * math.pi / (2 * m + c))


def _otc_grpo_tool_reward(m: int, n: int, c: float) -> float:
    """The GRPO-form tool reward of ``m`` calls when the group's fewest correct is ``n``."""
    if n == 0:
        # f(m, 0) = m; r = 1 when m = 0 too (f = n = 0), else the PPO-form decay.
        return 1.0 if m == 0 else otc_ppo_tool_reward(m, c)
    f = 2 * n * m / (m + n)
    return math.sin(f * math.pi / (2 * n))


def otc_grpo_tool_rewards(
    searches: Sequence[int], correct: Sequence[bool], c: float = DEFAULT_C
) -> list[float]:
    """The OTC-GRPO tool reward of every rollout of one GRPO group.

    ``n`` is estimated as the fewest searches among the group's correct rollouts, then for
    each rollout with ``m`` searches (the paper's piecewise definition)::

        f(m, n) = 0              if m = n = 0
                = m              if n = 0
                = 2nm / (m + n)  otherwise            (maps m = n to n, m -> inf to 2n)
        r_tool  = 1                      if f(m, n) = n = 0
                = cos(m·π / (2m + c))    if n = 0
                = sin(f(m, n)·π / (2n))  otherwise

    so the rollout that matches the fewest correct count gets 1, fewer or more calls get
    less. The rollout's reward is then ``correct_i × r_tool_i`` (the paper's α = 1).

    Settled here: when no rollout of the group is correct, ``n`` does not exist; every
    rollout then gets the PPO form ``cos(m·π / (2m + c))`` (its reward is 0 anyway once
    multiplied by correctness).

    Args:
        searches: Search count of each rollout.
        correct: Whether each rollout's answer is correct (EM = 1 in the paper).
        c: Smoothing constant of the cosine branch (> 0).

    Returns:
        ``r_tool`` for each rollout, in order.

    Raises:
        InvalidArgumentError: On an empty group, unequal lengths, a negative or non-int
            count, a non-bool correctness flag, or a bad ``c``.
    """
    c = _check_c(c)
    if len(searches) != len(correct) or not searches:
        raise InvalidArgumentError(
            "searches and correct must be non-empty and of equal length (one entry per rollout), "
            f"got {len(searches)} and {len(correct)}."
        )
    counts = [check_int(f"searches[{i}]", s, 0, note=" (a search count)") for i, s in enumerate(searches)]
    for i, flag in enumerate(correct):
        if not isinstance(flag, bool):
            raise InvalidArgumentError(
                f"correct[{i}] must be a bool, got {flag!r}; pass e.g. [em == 1.0 for em in ems]."
            )
    good = [m for m, ok in zip(counts, correct, strict=True) if ok]
    if not good:
        return [otc_ppo_tool_reward(m, c) for m in counts]
    n = min(good)
    return [_otc_grpo_tool_reward(m, n, c) for m in counts]


class OTCReward(RewardScheme):
    """OTC-PPO, a baseline: correctness times a reward for using few tool calls.

    Equation (the PPO form, which needs no group)::

        r_tool = cos(m·π / (2m + c))        m = number of searches, c = smoothing constant
        R      = correctness(y) × r_tool    correctness = EM (or F1 with outcome="f1")
        R      = format_penalty             instead, when it is set and a turn was malformed

    With ``c = 1``: m = 0 → 1, m = 1 → cos(π/3) = 0.5, m = 2 → cos(2π/5) ≈ 0.309; a wrong
    answer scores 0 whatever the calls. The GRPO form, which compares a rollout with the
    fewest calls among the correct rollouts of its group, is
    :func:`otc_grpo_tool_rewards`.

    Defaults: the paper multiplies by a scale α (1 here) and gives c no value we could find
    in its text, so ``c = 1`` is our choice; raise it to punish calls more slowly.

    Args:
        outcome: ``"em"`` (the paper) or ``"f1"``, the correctness term.
        c: Smoothing constant (> 0); smaller punishes each call harder.
        format_penalty: Reward of a trajectory with a malformed turn; ``None`` turns it off.
    """

    name = "otc"

    def __init__(
        self, outcome: str = "em", c: float = DEFAULT_C, format_penalty: float | None = None
    ) -> None:
        self.outcome = check_outcome(outcome)
        self.c = _check_c(c)
        self.format_penalty = check_format_penalty(format_penalty)

    def __call__(self, trajectory: Trajectory) -> float:
        if self.format_penalty is not None and not trajectory.format_ok:
            return self.format_penalty
        correctness = outcome_score(trajectory, self.outcome)
        return correctness * otc_ppo_tool_reward(trajectory.num_searches, self.c)
