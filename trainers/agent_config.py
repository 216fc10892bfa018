"""The agent's view of a run file: what every backend's episodes are built from.

A run file (:mod:`searchgym.trainers.run_spec`) serves both sides of a run: the launcher
reads all of it, and every agent (an OpenRLHF agent instance, a verl agent loop) on the Ray
workers reads the file named by ``$SEARCHGYM_AGENT_CONFIG`` with :func:`load_agent_config`,
which needs only the component sections (``env``, ``memory``, ``advantage``).

Relative paths among the agent's file options (``env.data_path``, ``corpus_path``,
``index_dir``, the reward's shared store and ``memory.path``) are resolved against
``$SEARCHGYM_AGENT_BASEDIR`` when it is set (the launchers set it to the directory they were
started from, because Ray workers do not share the driver's working directory), else
against the current directory.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from ..envs.config import env_keywords
from ..envs.config_base import ConfigError, check, check_int, from_dict
from ..envs.rewards import reward_class
from ..error import InvalidArgumentError, UnknownNameError
from ..memory.config import MemoryConfig
from ..models import resolve_model
from .advantages import AdvantageConfig
from .run_spec import RunSpec, load_run

__all__ = [
    "AGENT_CONFIG_VARIABLE",
    "BASEDIR_VARIABLE",
    "AgentConfig",
    "agent_config_from_env",
    "load_agent_config",
]

AGENT_CONFIG_VARIABLE = "SEARCHGYM_AGENT_CONFIG"
"""Environment variable naming the YAML file the agent reads (on every Ray worker)."""

BASEDIR_VARIABLE = "SEARCHGYM_AGENT_BASEDIR"
"""Environment variable naming the directory that relative paths are resolved against."""

_PATH_KEYS = ("data_path", "corpus_path", "index_dir")


def _resolve(path: str, basedir: str | None) -> str:
    expanded = os.path.expanduser(path)
    if os.path.isabs(expanded) or "://" in expanded:
        return expanded
    base = basedir if basedir is not None else os.environ.get(BASEDIR_VARIABLE) or os.getcwd()
    return os.path.normpath(os.path.join(base, expanded))


def _check_agent_memory(memory: MemoryConfig) -> None:
    """What an OpenRLHF run needs of the shared :class:`MemoryConfig` beyond its own checks."""
    check("path", memory.path, memory.path is not None, "the store folder every agent instance shares")
    built_in_only = {"backend": "file", "ray_num_cpus": None, "ray_actor": None, "example_per": "rollout"}
    for name, default in built_in_only.items():
        check(
            name,
            getattr(memory, name),
            getattr(memory, name) == default,
            f"{default!r} (leave it out)",
            "It applies to the built-in trainer; an OpenRLHF run puts its stores in a Ray actor itself "
            "and draws each rollout's example on its own.",
        )


@dataclass
class AgentConfig:
    """What the agent instances build: the env, and optionally memory and an advantage scheme.

    Attributes:
        env_id: A searchgym env id (``searchgym/HotpotQA-v1``; the short ``HotpotQA-v1`` works).
            The questions come from each training row's ``label``; the env's own data file
            is only read by its constructor.
        env_kwargs: Keyword arguments of ``gym.make`` (protocol, reward, retriever, ...).
        memory: Experience memory (:class:`~searchgym.memory.config.MemoryConfig`;
            ``path`` is required), or ``None`` (``kind: none`` reads as ``None``).
        advantage: A group advantage the worker hook applies in OpenRLHF's trainer actor
            (one OpenRLHF does not compute itself, such as ``tsas``), or ``None``.
        tokenizer: A tokenizer folder or a registered offline model name (its pulled
            folder) for the chat template, used only when the agent runs outside
            :class:`~searchgym.trainers.openrlhf.agent.SearchGymAgentExecutor` (which
            passes OpenRLHF's own tokenizer).
        max_pool: Envs kept per process for reuse (they are built once and reset per sample).
    """

    env_id: str
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    memory: MemoryConfig | None = None
    advantage: AdvantageConfig | None = None
    tokenizer: str | None = None
    max_pool: int = 4096

    def __post_init__(self) -> None:
        from ..envs import check_env_id

        try:
            self.env_id = check_env_id(self.env_id)
        except (UnknownNameError, InvalidArgumentError) as exc:
            raise ConfigError("env_id", self.env_id, "a registered searchgym env id", str(exc)) from None
        if self.memory is not None and self.memory.kind == "none":
            self.memory = None
        if self.memory is not None:
            try:
                _check_agent_memory(self.memory)
            except ConfigError as exc:
                raise exc.within("memory") from None
        if self.tokenizer is not None:
            check("tokenizer", self.tokenizer, bool(self.tokenizer.strip()), "a tokenizer path or null")
        check_int("max_pool", self.max_pool)

    @classmethod
    def from_spec(cls, spec: RunSpec, basedir: str | None = None) -> AgentConfig:
        """The agent's config of the run file ``spec``, its relative paths resolved."""
        options = spec.agent_options()
        agent = cls(
            env_id=spec.env.id,
            env_kwargs=spec.env.kwargs(),
            memory=None if spec.memory.kind == "none" else copy.deepcopy(spec.memory),
            advantage=copy.deepcopy(spec.hooked_advantage),
            tokenizer=options.tokenizer,
            max_pool=options.max_pool,
        )
        return agent.resolved(basedir)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None, basedir: str | None = None) -> AgentConfig:
        """Build and check the agent section from plain data, its relative paths resolved.

        Raises:
            ConfigError: naming the dotted field (``agent.memory.kind``), the value and what
                is allowed.
        """
        try:
            return from_dict(cls, data).resolved(basedir)
        except ConfigError as exc:
            raise exc.within("agent") from None

    def resolved(self, basedir: str | None = None) -> AgentConfig:
        """A copy whose relative file options are resolved against ``basedir`` (see the module docstring)."""
        env_kwargs = copy.deepcopy(self.env_kwargs)
        for key in _PATH_KEYS:
            if isinstance(env_kwargs.get(key), str):
                env_kwargs[key] = _resolve(env_kwargs[key], basedir)
        store = self.shared_store_keyword
        reward_kwargs = env_kwargs.get("reward_kwargs")
        if store and isinstance(reward_kwargs, dict) and isinstance(reward_kwargs.get(store), str):
            reward_kwargs[store] = _resolve(reward_kwargs[store], basedir)
        memory = self.memory
        if memory is not None and memory.path is not None:
            memory = replace(memory, path=_resolve(memory.path, basedir))
        tokenizer = None if self.tokenizer is None else resolve_model(self.tokenizer)
        return replace(self, env_kwargs=env_kwargs, memory=memory, tokenizer=tokenizer)

    @property
    def shared_store_keyword(self) -> str | None:
        """The reward scheme's shared-store keyword (:attr:`RewardScheme.shared_store`), or ``None``."""
        reward = self.env_kwargs.get("reward")
        if reward is None:
            reward = (env_keywords(self.env_id) or {})["reward"].default
        return reward_class(reward).shared_store if isinstance(reward, str) else type(reward).shared_store

    @property
    def shared_store_path(self) -> str | None:
        """The path of the reward scheme's shared store, when the run gives one."""
        store = self.shared_store_keyword
        kwargs = self.env_kwargs.get("reward_kwargs")
        if store is None or not isinstance(kwargs, dict):
            return None
        value = kwargs.get(store)
        return value if isinstance(value, str) else None

    @property
    def protocol(self) -> str:
        """The protocol name the env uses (the env's default when ``env_kwargs`` leaves it out)."""
        protocol = self.env_kwargs.get("protocol") or (env_keywords(self.env_id) or {})["protocol"].default
        return protocol if isinstance(protocol, str) else getattr(protocol, "name", str(protocol))


def load_agent_config(path: str | os.PathLike[str], basedir: str | None = None) -> AgentConfig:
    """The agent's config of the run file at ``path`` (its ``env``, ``memory`` and ``advantage``).

    Raises:
        ConfigError: an unreadable file, an older layout (with how to convert it), an
            unknown key (with "did you mean"), or a value of the wrong type or range; the
            message names the file and the dotted field.
    """
    spec = load_run(path)
    try:
        return AgentConfig.from_spec(spec, basedir)
    except ConfigError as exc:
        raise exc.within(source=str(path)) from None


def agent_config_from_env() -> AgentConfig:
    """The agent config named by ``$SEARCHGYM_AGENT_CONFIG``.

    Raises:
        InvalidArgumentError: the variable is not set (the message says how to set it).
    """
    path = os.environ.get(AGENT_CONFIG_VARIABLE)
    if not path:
        raise InvalidArgumentError(
            f"${AGENT_CONFIG_VARIABLE} is not set: the searchgym agent reads its env from that run file "
            "(its env, memory and advantage sections). `searchgym train --backend openrlhf` sets "
            f"it; when launching OpenRLHF yourself, export {AGENT_CONFIG_VARIABLE}=/abs/path/config.yaml and "
            "pass it to the Ray workers (runtime_env env_vars)."
        )
    return load_agent_config(path)
