"""Envs for the agents of every backend: built once per process from the agent config, then reused.

OpenRLHF builds one agent instance per sample and verl one agent loop per row, and a
rollout process runs hundreds of them at once. Building a benchmark env reads its question file, so instances borrow a built env
from a per-process :class:`EnvPool` at ``reset`` and give it back when the episode ends.
Retrievers are shared by every env of a process anyway (``searchgym.retrieval``), and
so is the experience memory: one object per store folder, opened by :func:`open_memory`.
"""

from __future__ import annotations

import json
import threading
from typing import Any

import gymnasium as gym

from ..error import InvalidArgumentError
from ..memory.config import MemoryConfig
from . import build
from .agent_config import AgentConfig
from .ray_store import RemoteMemory
from .store_client import remote_env_kwargs, store_client

__all__ = ["EnvPool", "build_env", "env_pool", "open_memory"]

_LOCK = threading.Lock()
_MEMORIES: dict[tuple[Any, ...], Any] = {}
_POOLS: dict[str, EnvPool] = {}


def open_memory(config: MemoryConfig, agent: AgentConfig | None = None) -> Any:
    """The process-wide memory object for ``config`` (one per store folder and kind), built by
    :meth:`MemoryConfig.build <searchgym.memory.config.MemoryConfig.build>` as every backend builds it.

    A memory that learns (LightSearcher's) opens its store (the agents add finished episodes
    and read the bank; the trainer actor's hook calls ``step``); a HiExp hierarchy is loaded
    from its store. With ``agent`` and ``$SEARCHGYM_STORE_ACTOR`` set, a memory that learns
    is the Ray store actor's (:class:`~searchgym.trainers.ray_store.RemoteMemory`).
    """
    key = (
        config.kind,
        config.path,
        config.update_every,
        config.summarizer,
        config.theta_r,
        config.good_reward,
    )
    with _LOCK:
        memory = _MEMORIES.get(key)
        if memory is None:
            client = store_client(agent) if agent is not None and config.learns else None
            remote = RemoteMemory(client) if client is not None else None
            memory = build.build_memory(config, remote=remote)
            _MEMORIES[key] = memory
        return memory


def build_env(config: AgentConfig) -> gym.Env:
    """A new env for ``config``, built by :func:`searchgym.trainers.build.build_env`:
    ``gym.make(env_id, **env_kwargs)``, wrapped with memory if set."""
    memory = open_memory(config.memory, config) if config.memory is not None else None
    return build.build_env(
        config.env_id,
        remote_env_kwargs(config, store_client(config)),
        memory=memory,
        memory_config=config.memory,
    )


class EnvPool:
    """Built envs of one agent config, lent to one episode at a time (thread-safe).

    Args:
        config: What to build.
        max_idle: Envs kept for reuse; more are built when more episodes run at once, and
            the surplus is dropped when they come back.
    """

    def __init__(self, config: AgentConfig, max_idle: int | None = None):
        self.config = config
        self.max_idle = config.max_pool if max_idle is None else max_idle
        self._idle: list[gym.Env] = []
        self._lock = threading.Lock()
        self.built = 0
        """Envs built so far (for tests and logs)."""

    def acquire(self) -> gym.Env:
        """An env no other episode is using (built now when none is idle)."""
        with self._lock:
            if self._idle:
                return self._idle.pop()
        env = build_env(self.config)
        with self._lock:
            self.built += 1
        return env

    def release(self, env: gym.Env) -> None:
        """Give back an env from :meth:`acquire`; it is reset before its next episode."""
        with self._lock:
            if len(self._idle) < self.max_idle:
                self._idle.append(env)
                return
        env.close()

    def __len__(self) -> int:
        """Idle envs."""
        with self._lock:
            return len(self._idle)


def _config_key(config: AgentConfig) -> str:
    try:
        return json.dumps(
            {
                "env_id": config.env_id,
                "env_kwargs": config.env_kwargs,
                "memory": None if config.memory is None else config.memory.__dict__,
            },
            sort_keys=True,
            default=repr,
        )
    except (TypeError, ValueError) as exc:
        raise InvalidArgumentError(
            f"agent.env_kwargs must be plain YAML values, got {config.env_kwargs!r:.200}."
        ) from exc


def env_pool(config: AgentConfig) -> EnvPool:
    """The process-wide pool of ``config``'s envs."""
    key = _config_key(config)
    with _LOCK:
        pool = _POOLS.get(key)
        if pool is None:
            pool = _POOLS[key] = EnvPool(config)
        return pool
