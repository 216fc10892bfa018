"""What every backend builds from a run: the shared reward scheme, the env, the memory, the wrapper.

The built-in trainer (:mod:`searchgym.trainers.grpo.envs`), the OpenRLHF agents
(:mod:`searchgym.trainers.env_pool`), ``searchgym train --dry-run``
(:mod:`searchgym.trainers.dry_run`) and evaluation build through these functions, so a
run file builds the same env everywhere:

- :func:`build_reward`: the one reward scheme every env of a process shares;
- :func:`build_env`: ``gym.make`` with that scheme, behind the memory wrapper;
- :func:`build_memory`: :meth:`MemoryConfig.build <searchgym.memory.config.MemoryConfig.build>`;
- :func:`wrap`: :meth:`MemoryConfig.wrap <searchgym.memory.config.MemoryConfig.wrap>`;
- :func:`~searchgym.trainers.advantages.build_advantage`: the group advantage.

Nothing here imports torch or ray.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import gymnasium as gym

from ..envs.config import env_keywords
from ..envs.registration import register_envs
from ..envs.rewards import RewardScheme, make_reward, reward_class
from ..memory.config import MemoryConfig
from .advantages import build_advantage

__all__ = [
    "build_advantage",
    "build_env",
    "build_memory",
    "build_reward",
    "reward_name",
    "shared_store",
    "wrap",
]


def reward_name(env_id: str, kwargs: Mapping[str, Any]) -> str:
    """The name of the reward scheme ``gym.make(env_id, **kwargs)`` scores with (the env's
    default when ``kwargs`` names none)."""
    reward = kwargs.get("reward")
    if isinstance(reward, RewardScheme):
        return reward.name
    if reward is None:
        return str((env_keywords(env_id) or {})["reward"].default)
    return str(reward)


def shared_store(env_id: str, kwargs: Mapping[str, Any]) -> tuple[str, Any] | None:
    """The reward scheme's shared-store keyword and the value ``reward_kwargs`` gives it
    (``None`` when unset), or ``None`` for a scheme without a shared store
    (:attr:`~searchgym.envs.rewards.RewardScheme.shared_store`)."""
    reward = kwargs.get("reward")
    cls = type(reward) if isinstance(reward, RewardScheme) else reward_class(reward_name(env_id, kwargs))
    if cls.shared_store is None:
        return None
    return cls.shared_store, dict(kwargs.get("reward_kwargs") or {}).get(cls.shared_store)


def build_reward(env_id: str, kwargs: Mapping[str, Any], store: Any = None) -> RewardScheme:
    """The one reward scheme every env of the run shares.

    Sharing matters for a scheme with a per-question store (LightSearcher's minimum of
    searches must be seen by every rollout of the question).

    Args:
        env_id: The env id.
        kwargs: ``gym.make``'s keyword arguments (``reward``, ``reward_kwargs``).
        store: A store object served elsewhere (a Ray actor's client) for the scheme's
            shared store; ignored by a scheme without one.
    """
    reward = kwargs.get("reward")
    if isinstance(reward, RewardScheme):
        return reward
    options = dict(kwargs.get("reward_kwargs") or {})
    keyword = shared_store(env_id, kwargs)
    if store is not None and keyword is not None:
        options[keyword[0]] = store
    return make_reward(reward_name(env_id, kwargs), **options)


def build_memory(memory: MemoryConfig, **options: Any) -> Any:
    """The run's memory (:meth:`MemoryConfig.build <searchgym.memory.config.MemoryConfig.build>`)."""
    return memory.build(**options)


def wrap(
    env: gym.Env,
    memory: Any,
    memory_config: MemoryConfig | None,
    *,
    record: bool = True,
    seed: int | None = None,
) -> gym.Env:
    """``env`` behind the memory wrapper of ``memory`` (``env`` itself when ``memory`` is None)."""
    if memory is None:
        return env
    return (memory_config or MemoryConfig()).wrap(env, memory, record=record, seed=seed)


def build_env(
    env_id: str,
    kwargs: Mapping[str, Any],
    *,
    reward: RewardScheme | None = None,
    memory: Any = None,
    memory_config: MemoryConfig | None = None,
    record: bool = True,
    seed: int | None = None,
    **make_kwargs: Any,
) -> gym.Env:
    """One env of the run: ``gym.make(env_id, **kwargs)`` with the shared ``reward`` scheme
    (when given), behind the memory wrapper (when there is a memory).

    Args:
        env_id: The env id.
        kwargs: ``gym.make``'s keyword arguments (an :class:`~searchgym.envs.config.EnvConfig`'s ``kwargs()``).
        reward: The run's shared scheme (:func:`build_reward`), replacing ``reward`` and ``reward_kwargs``.
        memory: The run's memory (:func:`build_memory`), or None.
        memory_config: The memory's section (its prompt options).
        record: Whether the wrapper writes finished episodes into the memory.
        seed: Seed of the wrapper's few-shot draws.
        **make_kwargs: More keyword arguments of ``gym.make`` (``disable_env_checker``).
    """
    register_envs()
    options = dict(kwargs)
    if reward is not None:
        options["reward"] = reward
        options.pop("reward_kwargs", None)
    env = gym.make(env_id, **make_kwargs, **options)
    return wrap(env, memory, memory_config, record=record, seed=seed)
