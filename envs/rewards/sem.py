"""SEM's reward: answer at once when sure, search when not."""

from __future__ import annotations

from ...checks import check_number
from ..metrics import f1_score
from ..records import Trajectory
from .base import RewardScheme

__all__ = ["SEMReward"]


class SEMReward(RewardScheme):
    """SEM's reward (docs/methods.md#sem-reward, the paper's Eq. 1), for trajectories of the SEM protocol.

    The policy first reasons and gives an answer a1; if unsure it may then search (several
    times, docs/methods.md#sem-protocol), reason again and give a final answer a2. With τ the confidence threshold::

        R = f · [ 1{F1(a1) >= τ and s = 0 and t = 1} · F1(a1)
                + 1{F1(a1) <  τ and u = 1}          · F1(a2) ]

    read from the turn records as:

    - ``f``: every turn is well formed and the episode ended with an answer turn;
    - ``a1``: the answer of the first turn (given before any search);
    - ``s``: at least one search was made;
    - ``t``: the first turn holds exactly one think block and one answer block;
    - ``u``: ``s`` holds, every turn after the first is a well-formed search except the
      last, which is a well-formed answer (the env's ``max_searches`` bounds the count);
    - ``a2``: the final answer.

    So a correct first answer pays only if the policy stopped there, and a wrong first
    answer pays only through searches followed by a final answer. A confident, correct
    a1 followed by a needless search scores 0, as does a truncated episode (``f = 0``).

    Defaults: τ = 0.8 (the paper gives τ no value; docs/methods.md#sem-reward).

    Args:
        tau: Threshold in [0, 1] on F1(a1) for counting the first answer as right.
    """

    name = "sem"

    def __init__(self, tau: float = 0.8) -> None:
        self.tau = check_number("tau", tau, low=0.0, high=1.0)

    def __call__(self, trajectory: Trajectory) -> float:
        turns = trajectory.turns
        if not turns or not trajectory.format_ok or turns[-1].action.kind != "answer":
            return 0.0  # f = 0
        golds = trajectory.question.golden_answers
        first = turns[0].action
        f1_first = f1_score(first.answer, golds)
        searched = trajectory.num_searches > 0
        if f1_first >= self.tau:
            single_pair = first.think_blocks == 1 and first.answer_blocks == 1
            return f1_first if not searched and single_pair else 0.0
        later = [t.action for t in turns[1:]]
        searches_then_answer = (
            len(later) >= 1
            and all(a.kind == "search" and a.format_ok for a in later[:-1])
            and later[-1].kind == "answer"
            and later[-1].format_ok
        )
        if searched and searches_then_answer:
            return f1_score(trajectory.answer, golds)
        return 0.0
