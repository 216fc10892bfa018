"""The built-in trainer's per-step rollout figures, worked out by hand."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from searchgym.envs.records import Action, Question, Trajectory, Turn  # noqa: E402
from searchgym.trainers.grpo.metrics import rollout_metrics  # noqa: E402
from searchgym.trainers.grpo.rollout import Episode  # noqa: E402

Q = Question(id="q", question="Who?", golden_answers=("Ada",))


def episode(*ok: bool) -> Episode:
    turns = [Turn("t", Action(kind="search" if good else "invalid", format_ok=good)) for good in ok]
    info = {"format_ok": all(ok), "turn": len(ok)}
    return Episode(0, 0, info=info, trajectory=Trajectory(Q, "search_r1", turns))


def test_well_formed_turns_count_every_turn_of_the_step():
    # turns: (bad, good), (bad, bad), (good): 2 of 5 well formed; episodes: 1 of 3 well formed
    figures = rollout_metrics([episode(False, True), episode(False, False), episode(True)])
    assert figures["format_ok_turns"] == pytest.approx(2 / 5)
    assert figures["format_ok"] == pytest.approx(1 / 3)
