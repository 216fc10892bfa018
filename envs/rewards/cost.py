"""A priced-search reward: answer quality minus what the episode spent, optionally gated."""

from __future__ import annotations

import math

from ...checks import check_number
from ...error import InvalidArgumentError, did_you_mean
from ..records import Trajectory
from .base import RewardScheme
from .outcome import check_format_penalty, check_outcome, outcome_score

__all__ = ["CostReward", "GATES"]

GATES = ("none", "hard", "soft")
"""When the cost is charged: always, only for good answers, or in proportion to quality."""


def _sigmoid(x: float) -> float:
    """Logistic function, written to avoid overflow for large ``|x|``."""
    if x >= 0:
        return 1.0 / (1.0 + math.exp(-x))
    z = math.exp(x)
    return z / (1.0 + z)


class CostReward(RewardScheme):
    """Answer score minus a gated price for searching and writing.

    Not from one paper: the suite's own frugality baseline, where each search (and,
    optionally, each thousand characters the policy writes) has a price::

        S = F1(y)  (or EM(y) with outcome="em")
        C = price_per_search · m + price_per_kchar · chars / 1000
        g = 1                                   gate = "none"  (always pay)
          = 1{S >= θ}                           gate = "hard"  (pay only for good answers)
          = sigmoid((S - θ) / temperature)      gate = "soft"  (pay in proportion)
        R = S - λ · g · C
        R = format_penalty                      instead, when set and a turn was malformed

    ``m`` is the number of searches and ``chars`` the characters the policy wrote over all
    turns. Gating keeps a wrong answer from being preferred merely for being cheap: under
    the hard gate a wrong answer scores its S with no charge, so saving searches only
    pays once the answer is good.

    Settled here: the gate reads the same score S as the reward (F1 by default).

    Example: F1 = 1, m = 2, λ = 0.1, hard gate: R = 1 - 0.1·2 = 0.8.

    Args:
        lam: λ >= 0, the weight of the cost.
        price_per_search: Price of one search (>= 0).
        price_per_kchar: Price of a thousand characters written by the policy (>= 0).
        gate: ``"none"``, ``"hard"`` or ``"soft"``.
        theta: Threshold in [0, 1] on S for the gates.
        temperature: Width (> 0) of the soft gate.
        outcome: ``"f1"`` or ``"em"``, the score S.
        format_penalty: Reward of a trajectory with a malformed turn; ``None`` turns it off.
    """

    name = "cost"

    def __init__(
        self,
        lam: float = 0.1,
        price_per_search: float = 1.0,
        price_per_kchar: float = 0.0,
        gate: str = "hard",
        theta: float = 0.8,
        temperature: float = 0.1,
        outcome: str = "f1",
        format_penalty: float | None = -1.0,
    ) -> None:
        self.lam = check_number("lam", lam, low=0.0)
        self.price_per_search = check_number("price_per_search", price_per_search, low=0.0)
        self.price_per_kchar = check_number("price_per_kchar", price_per_kchar, low=0.0)
        if not isinstance(gate, str):
            raise InvalidArgumentError(f"gate must be one of {', '.join(GATES)}, got {gate!r}.")
        if gate not in GATES:
            raise did_you_mean("cost gate", gate, GATES)
        self.gate = gate
        self.theta = check_number("theta", theta, low=0.0, high=1.0)
        self.temperature = check_number("temperature", temperature, low=0.0)
        if self.temperature == 0.0:
            raise InvalidArgumentError("temperature must be > 0 (use gate='hard' for a step), got 0.")
        self.outcome = check_outcome(outcome)
        self.format_penalty = check_format_penalty(format_penalty)

    def cost(self, trajectory: Trajectory) -> float:
        """C: the price of the trajectory's searches and written characters."""
        return (
            self.price_per_search * trajectory.num_searches
            + self.price_per_kchar * trajectory.action_chars / 1000.0
        )

    def gate_weight(self, score: float) -> float:
        """g: the share of the cost charged for an answer of score ``score``."""
        if self.gate == "none":
            return 1.0
        if self.gate == "hard":
            return 1.0 if score >= self.theta else 0.0
        return _sigmoid((score - self.theta) / self.temperature)

    def __call__(self, trajectory: Trajectory) -> float:
        if self.format_penalty is not None and not trajectory.format_ok:
            return self.format_penalty
        score = outcome_score(trajectory, self.outcome)
        return score - self.lam * self.gate_weight(score) * self.cost(trajectory)
