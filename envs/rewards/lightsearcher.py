"""LightSearcher's reward: F1 plus an adaptive penalty on searches beyond the best seen so far.

The per-question record of the fewest searches that led to a good answer outlives one
episode, so it lives in a store (:mod:`~searchgym.envs.rewards.min_tool_calls`) that
several env workers (threads, processes, or nodes through a Ray actor) share.
"""

from __future__ import annotations

import math
import os
from typing import Any

from ...checks import check_int, check_number
from ...error import InvalidArgumentError
from ..records import Trajectory
from .base import RewardScheme
from .min_tool_calls import MinToolCalls, MinToolCallStore

__all__ = ["LightSearcherReward", "MinToolCallStore"]


class LightSearcherReward(RewardScheme):
    """LightSearcher's reward (docs/methods.md#lightsearcher-reward, the paper's Eq. 16-18).

    Equations, for a trajectory with ``m`` searches and final answer ``y``::

        Format = -1 when some turn is malformed, else 0
        Tool   = exp(-λ · max(0, m - n))   when F1(y) >= θ_t
               = 0                          when F1(y) <  θ_t
        R      = -1                         when Format = -1
               = W_α · F1(y) + W_β · Tool   otherwise

    ``n`` is the fewest searches among earlier trajectories of the same question whose F1
    reached θ_t, kept in a :class:`MinToolCallStore`. When the question has no ``n`` yet,
    ``n = m`` (no penalty). After scoring a well-formed trajectory with F1 >= θ_t, the store
    keeps ``n ← min(n, m)``; a wrong answer never changes it. The reward is therefore not a
    function of one trajectory alone: scoring order within a batch matters, as in the paper.

    Settled here: a malformed trajectory (R = -1) does not update the store, since Eq. 16
    is not evaluated for it. A truncated episode has no answer, so F1 = 0 and Tool = 0.

    Example: m = 3, n = 1, F1 = 1 gives Tool = exp(-0.75·2) ≈ 0.22313 and
    R = 0.5 + 0.5·0.22313 ≈ 0.61157.

    Defaults (paper, Sec. 5.1.4): λ = 0.75, θ_t = 0.8, W_α = W_β = 0.5.

    Args:
        lam: Decay λ >= 0 per search beyond ``n``.
        theta_t: F1 threshold in [0, 1] for a good answer.
        w_alpha: Weight of F1.
        w_beta: Weight of the tool term.
        store: The shared store (a :class:`MinToolCallStore`, or any :class:`MinToolCalls`
            such as the Ray actor's client), a log file path for a file-backed one, or
            ``None`` for a fresh in-memory store. An in-memory store is copied, not shared, when the scheme
            is pickled to another process; give every worker the same path to share ``n``.
    """

    name = "lightsearcher"
    shared_store = "store"

    def __init__(
        self,
        lam: float = 0.75,
        theta_t: float = 0.8,
        w_alpha: float = 0.5,
        w_beta: float = 0.5,
        store: MinToolCalls | str | os.PathLike[str] | None = None,
    ) -> None:
        self.lam = check_number("lam", lam, low=0.0)
        self.theta_t = check_number("theta_t", theta_t, low=0.0, high=1.0)
        self.w_alpha = check_number("w_alpha", w_alpha)
        self.w_beta = check_number("w_beta", w_beta)
        if store is None:
            store = MinToolCallStore()
        elif isinstance(store, (str, os.PathLike)):
            store = MinToolCallStore(path=store)
        elif not isinstance(store, MinToolCalls):
            raise InvalidArgumentError(
                f"store must be a MinToolCallStore, a log file path, or None, got {store!r}."
            )
        self.store: MinToolCalls = store

    def tool_score(self, m: int, n: int | None, f1: float) -> float:
        """Eq. 16: ``exp(-λ·max(0, m - n))`` when ``f1 >= θ_t`` (``n = m`` if unknown), else 0."""
        if f1 < self.theta_t:
            return 0.0
        n = m if n is None else n
        return math.exp(-self.lam * max(0, m - n))

    def __call__(self, trajectory: Trajectory) -> float:
        if not trajectory.format_ok:
            return -1.0
        m = trajectory.num_searches
        f1 = trajectory.f1
        qid = trajectory.question.id
        n = self.store.lookup_and_lower(qid, m if f1 >= self.theta_t else None)  # one call
        tool = self.tool_score(m, n, f1)
        return self.w_alpha * f1 + self.w_beta * tool

    def state_dict(self) -> dict[str, Any]:
        """``{"min_tool_calls": {question id: fewest searches}}``."""
        return {"min_tool_calls": self.store.minima()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Merge saved minima into the store (each question keeps the lower count).

        Raises:
            InvalidArgumentError: ``state`` is not ``{"min_tool_calls": {str: int >= 0}}``.
        """
        mins = state.get("min_tool_calls") if isinstance(state, dict) else None
        if not isinstance(mins, dict) or set(state) != {"min_tool_calls"}:
            raise InvalidArgumentError(
                f'A LightSearcher state is {{"min_tool_calls": {{question id: count}}}}, got {state!r:.200}.'
            )
        for qid, n in mins.items():
            check_int(f"min_tool_calls[{qid!r}]", n, 0)
        for qid, n in mins.items():
            self.store.update(qid, n)
