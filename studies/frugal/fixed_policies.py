"""Every deterministic decision rule of the incentive study, evaluated as the learned ones are.

The policy observes one of four states (:data:`agent.STATES`) and chooses 0, 1 or 2
searches (:data:`agent.ACTIONS`), so there are 3^4 = 81 deterministic rules. Each is
evaluated on the held-out questions of every seed with :func:`incentive.evaluate`, greedily
and at T = 1, exactly as a trained arm is: the figures of a rule are what any scheme that
learns it gets. A learned table is matched to a rule by its argmax per state
(:func:`learned_rule`).
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Sequence
from typing import Any

from studies.frugal.agent import ACTIONS, STATES, Skills

__all__ = ["FixedPolicy", "every_rule", "rule_name", "learned_rule", "evaluate_rules"]

FIGURES = ("em", "st", "sr_known", "sr_unknown")
"""The figures kept per rule and seed (``incentive.FIGURES``' percentages, ST in searches)."""


class FixedPolicy:
    """A deterministic rule: ``actions[state]`` searches in each state.

    ``sample`` draws one number from ``rng`` as :meth:`agent.DecisionPolicy.sample` does, so
    a learned policy whose probabilities are all 0 or 1 and this rule see the same
    recollections and passages."""

    def __init__(self, actions: Sequence[int]):
        if len(actions) != len(STATES) or any(a not in ACTIONS for a in actions):
            raise ValueError(
                f"a rule gives one of {ACTIONS} per state ({len(STATES)} states); got {actions!r}."
            )
        self.actions = tuple(actions)

    def greedy(self, state: int) -> int:
        return self.actions[state]

    def sample(self, state: int, rng: random.Random) -> int:
        rng.random()
        return self.actions[state]


def every_rule() -> list[tuple[int, ...]]:
    """The 81 rules, as searches per state in :data:`agent.STATES` order."""
    return list(itertools.product(ACTIONS, repeat=len(STATES)))


def rule_name(actions: Sequence[int]) -> str:
    """``"1 0 2 2"``: the searches in each state, in :data:`agent.STATES` order."""
    return " ".join(str(a) for a in actions)


def learned_rule(table: dict[str, list[float]]) -> tuple[int, ...]:
    """The rule a learned policy table acts by greedily (ties go to fewer searches, as
    :meth:`agent.DecisionPolicy.greedy` breaks them)."""
    return tuple(max(ACTIONS, key=lambda a, p=table[s]: (p[a], -a)) for s in STATES)


def evaluate_rules(study: dict[str, Any], seeds: Sequence[int], skills: Skills) -> list[dict[str, Any]]:
    """Each rule's figures per seed, greedy and sampled, under the study's ``search_r1`` arm settings."""
    from studies.frugal.incentive import evaluate

    rows = []
    for actions in every_rule():
        policy = FixedPolicy(actions)
        per_seed = []
        for seed in seeds:
            greedy = evaluate(study, {}, seed, skills, policy, greedy=True)  # type: ignore[arg-type]
            sampled = evaluate(study, {}, seed, skills, policy, greedy=False)  # type: ignore[arg-type]
            per_seed.append(
                {"seed": seed, **{k: round(greedy[k], 6) for k in FIGURES},
                 "sampled": {k: round(sampled[k], 6) for k in FIGURES}}
            )  # fmt: skip
        rows.append({"rule": rule_name(actions), "seeds": per_seed})
    return rows
