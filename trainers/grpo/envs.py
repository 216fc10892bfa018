"""The env side of a GRPO run: the shared reward scheme, the memory, the env factory, the question order."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from ...envs.rewards import RewardScheme, make_reward
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


def build_reward(env: EnvConfig, store: StoreClient | None = None) -> RewardScheme | None:
    """The one reward scheme every env of the run shares (None when ``kwargs.reward`` is an object).

    Sharing matters for LightSearcher, whose per-question minimum of searches must be seen
    by every rollout of the question. With ``store`` (``memory.backend: ray``), its minimum
    of searches lives in the store actor.
    """
    reward = env.kwargs.get("reward", "f1")
    if isinstance(reward, RewardScheme):
        return reward
    kwargs = dict(env.kwargs.get("reward_kwargs") or {})
    if store is not None and reward == "lightsearcher":
        kwargs["store"] = RemoteMinToolCalls(store)
    return make_reward(reward, **kwargs)


def memory_kwargs(memory: MemoryConfig, seed: int) -> dict[str, Any]:
    """The keyword arguments of the run's :class:`~searchgym.memory.ExperienceMemory`."""
    return {
        "update_every": memory.update_every,
        "summarizer": memory.summarizer,
        "theta_r": memory.theta_r,
        "good_reward": memory.good_reward,
        "seed": seed,
    }


def store_actor_name(memory: MemoryConfig, output_dir: str | os.PathLike[str]) -> str:
    """The store actor's name: ``memory.ray_actor``, else one derived from the run's folder."""
    if memory.ray_actor:
        return memory.ray_actor
    digest = hashlib.sha1(str(Path(output_dir).resolve()).encode()).hexdigest()[:12]
    return f"searchgym-grpo-store-{digest}"


def store_spec(config: TrainConfig, output_dir: str | os.PathLike[str]) -> StoreSpec:
    """What the run's store actor owns: the experience memory and/or LightSearcher's minimum store."""
    memory_dir = memory_store_dir(config.memory, output_dir)
    mins = None
    if config.env.kwargs.get("reward", "f1") == "lightsearcher":
        store = dict(config.env.kwargs.get("reward_kwargs") or {}).get("store")
        mins = str(store) if store is not None else str(Path(output_dir) / "min_tool_calls.sqlite")
    return StoreSpec(
        memory_path=str(memory_dir) if memory_dir is not None else None,
        memory_kwargs=memory_kwargs(config.memory, config.seed) if memory_dir is not None else {},
        min_tool_calls_path=mins,
    )


def memory_store_dir(memory: MemoryConfig, output_dir: str | os.PathLike[str]) -> Path | None:
    """The experience store folder of a run (``memory.path`` or ``{output_dir}/memory``), else None."""
    if memory.kind != "lightsearcher":
        return None
    return Path(memory.path) if memory.path else Path(output_dir) / "memory"


def build_memory(
    memory: MemoryConfig, output_dir: str | os.PathLike[str], seed: int, store: StoreClient | None = None
) -> Any:
    """The configured memory: an ExperienceMemory (a RemoteMemory with ``store``), a loaded
    HiExp hierarchy, or None."""
    if memory.kind == "none":
        return None
    if memory.kind == "lightsearcher":
        if store is not None:
            return RemoteMemory(store)
        from ...memory import ExperienceMemory

        return ExperienceMemory(memory_store_dir(memory, output_dir), **memory_kwargs(memory, seed))
    from ...memory import HierarchicalExperience

    assert memory.path is not None  # MemoryConfig requires it for hiexp
    return HierarchicalExperience.load(memory.path)


def env_factory(
    env: EnvConfig, reward: RewardScheme | None, memory: Any = None, memory_config: MemoryConfig | None = None
) -> Callable[[], gym.Env]:
    """A function that builds one env of the run: ``gym.make`` with the shared scheme, then the memory wrapper."""
    kwargs = dict(env.kwargs)
    if reward is not None:
        kwargs["reward"] = reward
        kwargs.pop("reward_kwargs", None)

    def make() -> gym.Env:
        built = gym.make(env.id, disable_env_checker=True, **kwargs)
        return built if memory is None else memory_wrapper(built, memory, memory_config)

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
    from ...memory import ExperienceWrapper

    options = memory_config or MemoryConfig()
    return ExperienceWrapper(
        env,
        memory,
        use_experience=options.use_experience,
        few_shot=options.few_shot,
        record=record,
        top_k=options.top_k,
        hint_threshold=options.hint_threshold,
        seed=seed,
    )


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
