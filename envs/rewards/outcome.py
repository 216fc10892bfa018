"""Outcome-only rewards: the exact match of Search-R1 and the F1 of ReSearch/ReCall."""

from __future__ import annotations

from ..checks import check_number
from ..errors import InvalidArgumentError
from ..metrics import exact_match, f1_score
from ..records import Trajectory
from .base import RewardScheme

__all__ = [
    "ExactMatchReward",
    "F1Reward",
    "OUTCOMES",
    "check_format_penalty",
    "check_outcome",
    "outcome_score",
]


OUTCOMES = ("em", "f1")
"""The answer scores a scheme may use as its correctness term."""


def check_outcome(value: object) -> str:
    """Validate an ``outcome`` keyword: ``"em"`` or ``"f1"``."""
    if value not in OUTCOMES:
        raise InvalidArgumentError(
            f"outcome must be one of {', '.join(repr(o) for o in OUTCOMES)}, got {value!r}. "
            "Use 'em' for exact match or 'f1' for token F1."
        )
    return str(value)


def outcome_score(trajectory: Trajectory, outcome: str) -> float:
    """EM or F1 of the final answer of ``trajectory`` (0.0 when it has no answer)."""
    if outcome == "em":
        return exact_match(trajectory.answer, trajectory.question.golden_answers)
    return f1_score(trajectory.answer, trajectory.question.golden_answers)


def check_format_penalty(value: float | None) -> float | None:
    """Validate an optional ``format_penalty`` keyword (``None`` or a finite number)."""
    if value is None:
        return None
    return check_number("format_penalty", value)


class ExactMatchReward(RewardScheme):
    """Exact match of the final answer, the Search-R1 reward.

    Equation::

        R = EM(y)                  (1.0 when the normalised answer equals a gold alias, else 0.0)
        R = format_penalty         instead, when it is set and some turn was malformed

    An episode that ended without an answer (truncated, or stopped on a search) has
    ``y = None`` and scores 0.

    Args:
        format_penalty: The reward of a trajectory with a malformed turn. ``None`` (the
            default, as in Search-R1) scores malformed trajectories by their answer like any
            other.
    """

    name = "em"

    def __init__(self, format_penalty: float | None = None) -> None:
        self.format_penalty = check_format_penalty(format_penalty)

    def __call__(self, trajectory: Trajectory) -> float:
        if self.format_penalty is not None and not trajectory.format_ok:
            return self.format_penalty
        return outcome_score(trajectory, "em")


class F1Reward(RewardScheme):
    """Token-level F1 of the final answer, the ReSearch/ReCall reward.

    Equation::

        R = F1(y)                  (SQuAD token F1, the best over the gold aliases)
        R = format_penalty         instead, when it is set and some turn was malformed

    An episode that ended without an answer scores 0.

    Args:
        format_penalty: The reward of a trajectory with a malformed turn (ReSearch uses a
            format term; ``-1.0`` is a common choice). ``None`` (the default) turns it off.
    """

    name = "f1"

    def __init__(self, format_penalty: float | None = None) -> None:
        self.format_penalty = check_format_penalty(format_penalty)

    def __call__(self, trajectory: Trajectory) -> float:
        if self.format_penalty is not None and not trajectory.format_ok:
            return self.format_penalty
        return outcome_score(trajectory, "f1")
