"""Conformance checks for search envs, for your own CI as much as for ours.

``check_search_env(env)`` runs Gymnasium's ``check_env`` and then the searchgym contract:
the documented ``info`` keys, seeded resets that reproduce, hostile actions that never
raise, and a terminal reward on every episode end. Each failure says how to fix it.
"""

from __future__ import annotations

import gymnasium as gym
from gymnasium.utils.env_checker import check_env

from ..error import SearchGymError

__all__ = ["INFO_KEYS", "HOSTILE_ACTIONS", "ConformanceError", "check_search_env"]

INFO_KEYS = frozenset(
    {
        "question_id", "num_searches", "queries", "retrieved_ids", "answer", "em", "f1", "cover_em",
        "format_ok", "turn", "reasoning_steps", "action_chars",
    }
)  # fmt: skip
"""Keys every searchgym env puts in ``info`` after ``reset`` and after every step."""

HOSTILE_ACTIONS = (
    "",
    "no tags at all",
    "<search>unclosed",
    "<answer><answer>nested</answer></answer>",
    '<think>t</think><tool_call>{"name": "search", "arguments": {"query": </tool_call>',
    "\\boxed{{{",
    "\x00\x01\xff\ufffd" * 100,
    "<search>" + "x" * 200_000 + "</search>",
    "<search>" * 20_000 + "q" + "</search>" * 20_000,
    "<think>" * 20_000
    + "t"
    + "</think>" * 20_000
    + "<answer>\\boxed{" * 20_000
    + "a"
    + "}</answer>" * 20_000,
)
"""Actions a policy may emit that an env must survive without raising."""


class ConformanceError(SearchGymError, AssertionError):
    """An env breaks the searchgym env contract."""


def _fail(message: str) -> None:
    raise ConformanceError(message)


def check_search_env(env: gym.Env, *, seed: int = 0, max_turns_probe: int = 64) -> None:
    """Check ``env`` (a searchgym env, wrapped or not) against the env contract.

    Raises:
        ConformanceError: with a message saying what broke and how to fix it.
    """
    base = env.unwrapped
    check_env(base, skip_render_check=True)
    first = base.reset(seed=seed)
    if base.reset(seed=seed) != first:
        _fail("reset(seed=s) twice gave different results: draw questions only from self.np_random.")
    missing = INFO_KEYS - set(first[1])
    if missing:
        _fail(f"info after reset lacks {sorted(missing)}: build info from the trajectory record.")
    for action in HOSTILE_ACTIONS:
        base.reset(seed=seed)
        for _ in range(max_turns_probe):
            try:
                observation, reward, terminated, truncated, info = base.step(action)
            except Exception as exc:  # noqa: BLE001 - the point is to catch anything
                _fail(f"step({action[:40]!r}...) raised {exc!r}: an env must never raise on an action.")
            if not isinstance(observation, str) or not isinstance(reward, float):
                _fail("step must return a str observation and a float reward.")
            if INFO_KEYS - set(info):
                _fail(f"info after step lacks {sorted(INFO_KEYS - set(info))}.")
            if not info["format_ok"] and "error" not in info:
                _fail("a malformed action must set info['error'] with a plain message.")
            if terminated or truncated:
                break
        else:
            _fail(f"{max_turns_probe} malformed actions did not end the episode: enforce max_turns.")
