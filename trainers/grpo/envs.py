"""The env side of a GRPO run: the shared reward scheme, the memory, the env factory, the question order."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from ...envs.rewards import RewardScheme
from .. import build
from ..config import EnvConfig, MemoryConfig, TrainConfig
from ..ray_store import RemoteMemory, RemoteMinToolCalls, StoreClient, StoreSpec

__all__ = [
    "build_reward",
    "build_memory",
    "env_factory",
    "memory_wrapper",
    "question_schedule",
    "memory_store_dir",
    "memory_kwargs",
    "store_actor_name",
    "store_spec",
]


def build_reward(env: EnvConfig, store: StoreClient | None = None) -> RewardScheme:
    """The one reward scheme every env of the run shares (:func:`searchgym.trainers.build.build_reward`).

    With ``store`` (``memory.backend: ray``), a scheme's shared store lives in the store actor.
    """
    remote = RemoteMinToolCalls(store) if store is not None else None
    return build.build_reward(env.id, env.kwargs, remote)


def memory_kwargs(memory: MemoryConfig, seed: int) -> dict[str, Any]:
    """The keyword arguments of the run's :class:`~searchgym.memory.ExperienceMemory`."""
    return memory.memory_kwargs(seed)


def store_actor_name(memory: MemoryConfig, output_dir: str | os.PathLike[str]) -> str:
    """The store actor's name: ``memory.ray_actor``, else one derived from the run's folder."""
    if memory.ray_actor:
        return memory.ray_actor
    digest = hashlib.sha1(str(Path(output_dir).resolve()).encode()).hexdigest()[:12]
    return f"searchgym-grpo-store-{digest}"


def store_spec(config: TrainConfig, output_dir: str | os.PathLike[str]) -> StoreSpec:
    """What the run's store actor owns: a memory that learns and/or the reward's shared store."""
    memory_dir = memory_store_dir(config.memory, output_dir)
    mins = None
    shared = build.shared_store(config.env.id, config.env.kwargs)
    if shared is not None:
        mins = str(shared[1]) if shared[1] is not None else str(Path(output_dir) / "min_tool_calls.sqlite")
    return StoreSpec(
        memory_path=str(memory_dir) if memory_dir is not None else None,
        memory_kwargs=memory_kwargs(config.memory, config.seed) if memory_dir is not None else {},
        min_tool_calls_path=mins,
    )


def memory_store_dir(memory: MemoryConfig, output_dir: str | os.PathLike[str]) -> Path | None:
    """The store folder of a memory that learns (``memory.path`` or ``{output_dir}/memory``), else None."""
    return memory.store_dir(output_dir)


def build_memory(
    memory: MemoryConfig, output_dir: str | os.PathLike[str], seed: int, store: StoreClient | None = None
) -> Any:
    """The configured memory (:meth:`MemoryConfig.build <searchgym.memory.config.MemoryConfig.build>`):
    with ``store``, a memory that learns is the store actor's :class:`RemoteMemory`."""
    remote = RemoteMemory(store) if store is not None and memory.learns else None
    return build.build_memory(memory, output_dir=output_dir, seed=seed, remote=remote)


def env_factory(
    env: EnvConfig, reward: RewardScheme | None, memory: Any = None, memory_config: MemoryConfig | None = None
) -> Callable[[], gym.Env]:
    """A function that builds one env of the run (:func:`searchgym.trainers.build.build_env`):
    ``gym.make`` with the shared scheme, then the memory wrapper."""

    def make() -> gym.Env:
        return build.build_env(
            env.id,
            env.kwargs,
            reward=reward,
            memory=memory,
            memory_config=memory_config,
            disable_env_checker=True,
        )

    return make


def memory_wrapper(
    env: gym.Env,
    memory: Any,
    memory_config: MemoryConfig | None = None,
    *,
    record: bool = True,
    seed: int | None = None,
) -> gym.Env:
    """``env`` behind the run's :class:`~searchgym.memory.ExperienceWrapper` of ``memory``,
    with ``memory_config``'s options; ``record=False`` never writes into the store."""
    return (memory_config or MemoryConfig()).wrap(env, memory, record=record, seed=seed)


def question_schedule(num_questions: int, per_step: int, step: int, seed: int) -> list[int]:
    """The question indices of training step ``step``: a fresh seeded permutation each epoch.

    Position ``p = step · per_step + j`` of the run takes question ``perm_e[p mod n]`` with
    ``e = p div n`` and ``perm_e`` the permutation of epoch ``e`` drawn from ``(seed, e)``, so
    the schedule of any step is known without replaying the ones before it (resuming needs that).
    """
    out = []
    cache: dict[int, np.ndarray] = {}
    for j in range(per_step):
        position = step * per_step + j
        epoch, offset = divmod(position, num_questions)
        if epoch not in cache:
            cache[epoch] = np.random.default_rng([seed, epoch]).permutation(num_questions)
        out.append(int(cache[epoch][offset]))
    return out
