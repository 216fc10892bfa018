"""Outcome-only rewards: the exact match of Search-R1 and the F1 of ReSearch/ReCall."""

from __future__ import annotations

from typing import ClassVar

from ...checks import check_number
from ...error import InvalidArgumentError
from ..metrics import exact_match, f1_score
from ..records import Trajectory
from .base import RewardScheme

__all__ = [
    "ExactMatchReward",
    "F1Reward",
    "OUTCOMES",
    "OutcomeReward",
    "check_format_credit",
    "check_format_penalty",
    "check_outcome",
    "malformed_reward",
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


def check_format_credit(value: object, format_penalty: float | None) -> float:
    """Validate a ``format_credit`` keyword: 0 <= credit <= -format_penalty (needs a penalty when > 0).

    The bound keeps every malformed trajectory below a well-formed one with a wrong answer (0).
    """
    credit = check_number("format_credit", value, low=0.0)
    if credit > 0 and (format_penalty is None or credit > -format_penalty):
        raise InvalidArgumentError(
            f"format_credit must lie in [0, -format_penalty] so that a malformed trajectory never "
            f"scores above a well-formed one; got format_credit={credit!r} with "
            f"format_penalty={format_penalty!r}. Set format_penalty (e.g. -1.0) and a credit up to its size."
        )
    return credit


def malformed_reward(trajectory: Trajectory, format_penalty: float, format_credit: float) -> float:
    """``format_penalty + format_credit · (well-formed turns / turns)`` for a malformed trajectory."""
    turns = trajectory.turns
    share = sum(t.action.format_ok for t in turns) / len(turns) if turns else 0.0
    return format_penalty + format_credit * share


class OutcomeReward(RewardScheme):
    """The score of the final answer under one metric: the outcome-only rewards.

    Equation::

        R = M(y)                   M is the class's ``outcome``: "em" (1.0 when the
                                   normalised answer equals a gold alias, else 0.0) or
                                   "f1" (SQuAD token F1, the best over the gold aliases)
        R = format_penalty + format_credit · k / n
                                   instead, when format_penalty is set and some turn was
                                   malformed (k of the n turns well formed)

    An episode that ended without an answer (truncated, or stopped on a search) has
    ``y = None`` and scores 0. The registered schemes are :class:`ExactMatchReward`
    (``em``, the Search-R1 reward) and :class:`F1Reward` (``f1``, the ReSearch/ReCall
    reward); a subclass that sets ``name`` and ``outcome`` adds another.

    Args:
        format_penalty: The reward of a trajectory with a malformed turn. ``None`` (the
            default, as in Search-R1) scores malformed trajectories by their answer like any
            other; ReSearch uses a format term, and ``-1.0`` is a common choice.
        format_credit: Shaping for malformed trajectories: their share of well-formed turns
            times this is added to the penalty, so a policy that writes no well-formed
            first turn still sees which later turns were. 0 (the default) turns it off; at
            most ``-format_penalty``, so a malformed trajectory never beats a well-formed one.

    Raises:
        InvalidArgumentError: A bad argument, or a class whose ``outcome`` is not one of
            ``OUTCOMES``.
    """

    outcome: ClassVar[str] = ""
    """The metric: one of ``OUTCOMES``."""

    def __init__(self, format_penalty: float | None = None, format_credit: float = 0.0) -> None:
        check_outcome(type(self).outcome)
        self.format_penalty = check_format_penalty(format_penalty)
        self.format_credit = check_format_credit(format_credit, self.format_penalty)

    def __call__(self, trajectory: Trajectory) -> float:
        if self.format_penalty is not None and not trajectory.format_ok:
            return malformed_reward(trajectory, self.format_penalty, self.format_credit)
        return outcome_score(trajectory, self.outcome)


class ExactMatchReward(OutcomeReward):
    """Exact match of the final answer, the Search-R1 reward (see :class:`OutcomeReward`)."""

    name = "em"
    outcome = "em"


class F1Reward(OutcomeReward):
    """Token-level F1 of the final answer, the ReSearch/ReCall reward (see :class:`OutcomeReward`)."""

    name = "f1"
    outcome = "f1"
