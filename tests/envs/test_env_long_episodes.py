"""Long episodes: a step's own cost does not grow with the turns so far, and info stays right."""

from __future__ import annotations

import statistics
import time

import gymnasium as gym

import searchgym  # noqa: F401 - registers the env ids

TURNS = 320


def long_env():
    return gym.make("searchgym/SyntheticFacts-v1", reward="f1", max_turns=TURNS + 10).unwrapped


def test_a_steps_own_cost_at_turn_300_is_about_its_cost_at_turn_4():
    env = long_env()
    env.reset(seed=0)
    docs = env.retriever.search(["capital"], 3)[0]  # real documents; the retrieval itself is not timed
    early, late = [], []
    for _ in range(15):
        env.reset(seed=0)
        for t in range(TURNS):
            start = time.perf_counter()
            env.begin_step(f"<search>query number {t}</search>")  # the env's own work of a step
            env.end_step(docs)
            elapsed = time.perf_counter() - start
            if t < 8:
                early.append(elapsed)
            elif 296 <= t < 304:
                late.append(elapsed)
    # Medians of 120 steps each; a pass over the turns on every step made turn 300 over 10x dearer.
    ratio = statistics.median(late) / statistics.median(early)
    assert ratio < 2.0, f"a step at turn ~300 costs {ratio:.1f}x a step at turn ~4"


def test_info_after_many_turns_matches_the_trajectory_and_each_step_keeps_its_own_snapshot():
    env = long_env()
    env.reset(seed=1)
    actions = [
        "<think>a</think><search>alpha</search>",
        "no tags",
        "<think>b</think><think>c</think><search>beta</search>",
        "<search></search>",
    ]
    infos = []
    for t in range(300):
        *_, info = env.step(actions[t % len(actions)])
        infos.append(info)
    traj = env.trajectory
    last = infos[-1]
    assert last["num_searches"] == traj.num_searches == 150
    assert last["queries"] == traj.queries and last["retrieved_ids"] == traj.retrieved_ids
    assert last["format_ok"] is traj.format_ok is False
    assert last["reasoning_steps"] == traj.reasoning_steps == 75 * 3
    assert last["action_chars"] == traj.action_chars and last["turn"] == 300
    # The info of turn 3 still shows turn 3, not what came after it.
    assert infos[2]["queries"] == ["alpha", "beta"] and len(infos[2]["retrieved_ids"]) == 2
    assert infos[2]["reasoning_steps"] == 3 and infos[0]["format_ok"] is True


def test_the_search_limit_counts_searches_of_a_long_episode():
    env = gym.make("searchgym/SyntheticFacts-v1", reward="f1", max_turns=400, max_searches=250).unwrapped
    env.reset(seed=0)
    for t in range(250):
        *_, truncated, info = env.step(f"<search>q{t}</search>")
        assert not truncated
    *_, truncated, info = env.step("<search>one too many</search>")
    assert truncated and info["num_searches"] == 250 and "limit of 250 searches" in info["error"]
