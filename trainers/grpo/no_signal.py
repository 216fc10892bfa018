"""A warning for a run that learns nothing: every group's advantages zero, step after step.

GRPO learns from the spread of rewards within a group. When every rollout of a group
scores the same, the group's advantages are all zero and its gradient is only the KL term;
when that holds for every group of a step, the step updates nothing. A few such steps are
normal early on with a hard task; many in a row usually mean that the reward cannot tell the
rollouts apart (every answer malformed and scored −1, say).
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["NO_SIGNAL_STEPS", "NoSignalWatch"]

NO_SIGNAL_STEPS = 5
"""Consecutive steps without a nonzero advantage after which :class:`NoSignalWatch` warns."""

_ZERO = 1e-12


class NoSignalWatch:
    """Counts consecutive steps whose advantages are all zero; says so once, after ``patience``.

    Args:
        patience: Steps in a row without signal before the warning.

    Example:
        >>> watch = NoSignalWatch(patience=2)
        >>> watch.observe(1, [0.0, 0.0], [-1.0, -1.0]) is None
        True
        >>> print(watch.observe(2, [0.0, 0.0], [-1.0, -1.0]))  # doctest: +ELLIPSIS
        No learning signal for 2 steps in a row (steps 1-2): ... every rollout scored -1 ...
        >>> watch.observe(3, [0.0], [-1.0]) is None  # once per run
        True
    """

    def __init__(self, patience: int = NO_SIGNAL_STEPS):
        self.patience = patience
        self.run = 0
        self.warned = False
        self._rewards: set[float] = set()

    def observe(self, step: int, advantages: Sequence[float], rewards: Sequence[float]) -> str | None:
        """Record training step ``step`` (1-based); return the warning the first time it is due."""
        if any(abs(a) > _ZERO for a in advantages):
            self.run, self._rewards = 0, set()
            return None
        self.run += 1
        self._rewards.update(round(float(r), 6) for r in rewards)
        if self.warned or self.run < self.patience:
            return None
        self.warned = True
        if len(self._rewards) == 1:
            scored = f"every rollout scored {next(iter(self._rewards)):g}"
        else:
            scored = "the rollouts of each group scored alike"
        return (
            f"No learning signal for {self.run} steps in a row (steps {step - self.run + 1}-{step}): every "
            f"group's advantages are zero ({scored}), so the policy gradient is zero and these steps "
            "trained nothing. Likely cause: the reward cannot tell the rollouts apart, e.g. a format "
            "reward of -1 for every malformed answer. Check the format and the reward on a few samples "
            "(format_ok in the step lines and in metrics.jsonl is the share of well-formed answers), or "
            "raise rollout.group_size or rollout.temperature for more varied rollouts."
        )
