"""``evaluate``'s progress bar counts each episode as it ends and shows the turn a batch is at."""

from __future__ import annotations

from collections.abc import Sequence

import gymnasium as gym

import searchgym  # noqa: F401  (registers the ids)
from searchgym.policies import evaluation
from searchgym.policies.base import Policy
from searchgym.policies.scripted import DirectPolicy, NaiveRAGPolicy


class HalfSearch(Policy):
    """Answers at once for every other episode of the batch; searches first for the rest."""

    name = "half_search"

    def __init__(self, bars: list) -> None:
        self.direct, self.rag = DirectPolicy("search_r1"), NaiveRAGPolicy("search_r1")
        self.bars = bars
        self.seen: list[tuple[int, str]] = []  # (episodes counted, postfix) when each turn starts
        self.calls = 0

    def act(self, observations: Sequence[str]) -> list[str]:
        bar = self.bars[-1]
        self.seen.append((bar.n, bar.postfix or ""))
        self.calls += 1
        if self.calls % 2 == 1:  # a batch's first turn
            return [(self.direct if i % 2 == 0 else self.rag).act([o])[0] for i, o in enumerate(observations)]
        return self.rag.act(observations)


def test_the_bar_moves_per_episode_within_a_batch(monkeypatch):
    bars: list = []

    class Recorded(evaluation.tqdm):  # type: ignore[misc, valid-type]
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **{**kwargs, "disable": False, "file": open("/dev/null", "w")})
            bars.append(self)

    monkeypatch.setattr(evaluation, "tqdm", Recorded)
    policy = HalfSearch(bars)
    result = evaluation.evaluate(
        lambda: gym.make("searchgym/SyntheticFacts-v1", max_turns=3), policy, 8, batch_size=4
    )
    assert result.episodes == 8
    # batch 1: turn 1 starts at 0 done; the two direct answers end in turn 1, so turn 2 starts at 2
    # done; batch 2 starts at 4 and its turn 2 at 6
    assert [n for n, _ in policy.seen] == [0, 2, 4, 6]
    assert [p for _, p in policy.seen] == ["turn 1, 4 running", "turn 2, 2 running"] * 2
    assert bars[-1].n == 8
