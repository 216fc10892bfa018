"""The YAML files of the OpenRLHF plugin, read into validated dataclasses.

One file serves both sides of a run (the shipped ones are in ``configs/openrlhf/``)::

    backend: openrlhf                 # optional; lets `searchgym train` pick the backend
    extends: lightsearcher.yaml       # optional; a base file, merged key by key under this one
    agent:                            # read by the agent on the vLLM actors (SEARCHGYM_AGENT_CONFIG)
      env_id: searchgym/MuSiQue-v1
      env_kwargs: {protocol: tool_call, reward: lightsearcher, ...}
      memory: {kind: lightsearcher, path: runs/memory, update_every: 5}   # optional
      advantage: {scheme: tsas, warmup_steps: 150, alpha: 0.01}           # optional
    launch: {ray_address: null, python: null, env: {}}                    # optional
    openrlhf:                         # nested keys become dotted flags of train_ppo_ray
      actor: {model_name_or_path: Qwen/Qwen2.5-3B-Instruct}
      rollout: {n_samples_per_prompt: 12}

A file without an ``agent`` key is read as the agent section itself (``env_id``,
``env_kwargs``, ...), which is all the agent needs. Unknown keys are errors everywhere.

Relative paths among the agent's file options (``env_kwargs.data_path``, ``corpus_path``,
``index_dir``, ``reward_kwargs.store`` and ``memory.path``) are resolved against
``$SEARCHGYM_AGENT_BASEDIR`` when it is set (``launch`` sets it to the directory it was
started from, because Ray workers do not share the driver's working directory), else
against the current directory.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from ...envs.errors import DataFileError, InvalidArgumentError, UnknownNameError
from ...envs.models import resolve_model
from ..config_base import ConfigError, check, check_finite, check_int, from_dict
from ..memory_config import MemoryConfig
from .eval_split import EvalSign, stores_written

__all__ = [
    "AGENT_CONFIG_VARIABLE",
    "BASEDIR_VARIABLE",
    "AdvantageConfig",
    "AgentConfig",
    "LaunchOptions",
    "MemoryConfig",
    "RunConfig",
    "agent_config_from_env",
    "load_agent_config",
    "load_run_config",
    "read_yaml",
]

AGENT_CONFIG_VARIABLE = "SEARCHGYM_AGENT_CONFIG"
"""Environment variable naming the YAML file the agent reads (on every Ray worker)."""

BASEDIR_VARIABLE = "SEARCHGYM_AGENT_BASEDIR"
"""Environment variable naming the directory that relative paths are resolved against."""

_MAX_EXTENDS = 8
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
class AdvantageConfig:
    """A group-advantage scheme applied inside OpenRLHF's trainer actor (``agent.advantage``).

    Attributes:
        scheme: ``tsas``: Light-Search's two-stage shaping (PAPERS.md §2), applied by the
            worker hook of :mod:`~searchgym.trainers.openrlhf.advantage_hook`. R is the
            env's reward, S the searches and T the ``<think>`` blocks of each rollout.
        warmup_steps: M1, the training step at which stage 2 starts (paper: 150).
        alpha: Weight of the reasoning term in stage 1 (paper: 0.01).
    """

    scheme: Literal["tsas"] = "tsas"
    warmup_steps: int = 150
    alpha: float = 0.01

    def __post_init__(self) -> None:
        check_int("warmup_steps", self.warmup_steps, 0)
        check_finite("alpha", self.alpha)


@dataclass
class AgentConfig:
    """What the agent instances build: the env, and optionally memory and an advantage scheme.

    Attributes:
        env_id: A searchgym env id (``searchgym/HotpotQA-v1``; the short ``HotpotQA-v1`` works).
            The questions come from each training row's ``label``; the env's own data file
            is only read by its constructor.
        env_kwargs: Keyword arguments of ``gym.make`` (protocol, reward, retriever, ...).
        memory: Experience memory (:class:`~searchgym.trainers.memory_config.MemoryConfig`,
            the built-in trainer's ``memory`` section; ``path`` is required), or ``None``
            (``kind: none`` reads as ``None``).
        advantage: A group-advantage scheme for the trainer actor, or ``None``.
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
        from ...envs import check_env_id

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
        reward_kwargs = env_kwargs.get("reward_kwargs")
        if isinstance(reward_kwargs, dict) and isinstance(reward_kwargs.get("store"), str):
            reward_kwargs["store"] = _resolve(reward_kwargs["store"], basedir)
        memory = self.memory
        if memory is not None and memory.path is not None:
            memory = replace(memory, path=_resolve(memory.path, basedir))
        tokenizer = None if self.tokenizer is None else resolve_model(self.tokenizer)
        return replace(self, env_kwargs=env_kwargs, memory=memory, tokenizer=tokenizer)

    @property
    def protocol(self) -> str:
        """The protocol name the env uses (``search_r1`` when ``env_kwargs`` leaves it out)."""
        protocol = self.env_kwargs.get("protocol", "search_r1")
        return protocol if isinstance(protocol, str) else getattr(protocol, "name", str(protocol))


@dataclass
class LaunchOptions:
    """How ``launch`` starts the run (``launch`` section).

    Attributes:
        ray_address: ``None`` starts Ray in the launching process (one machine, or a
            cluster joined through ``RAY_ADDRESS``) with ``python -m
            searchgym.trainers.openrlhf.train_ppo``; a dashboard address
            (``http://head:8265``) submits ``openrlhf.cli.train_ppo_ray`` with ``ray job
            submit`` and the same runtime env.
        python: The Python interpreter of the run (default: the one running ``launch``
            locally, ``python3`` for a submitted job).
        env: Extra environment variables for every Ray worker (e.g. ``SEARCHGYM_DATA_DIR``).
    """

    ray_address: str | None = None
    python: str | None = None
    env: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("ray_address", "python"):
            value = getattr(self, name)
            if value is not None:
                check(name, value, bool(value.strip()), "a non-empty string or null")
        for key, value in self.env.items():
            ok = isinstance(value, (str, int, float)) and not isinstance(value, bool)
            check(f"env.{key}", value, ok, "a string or number")
        self.env = {str(k): str(v) for k, v in self.env.items()}


@dataclass
class RunConfig:
    """A whole OpenRLHF run file: the agent, the launch options and the OpenRLHF flags.

    Attributes:
        backend: Always ``openrlhf`` here; lets ``searchgym train`` pick the backend.
        agent: See :class:`AgentConfig`.
        launch: See :class:`LaunchOptions`.
        openrlhf: The ``openrlhf`` section as written: nested keys, turned into dotted
            flags by ``flags``.
        path: The file read (absolute); set by :func:`load_run_config`, not a key of the file.
    """

    agent: AgentConfig
    backend: Literal["openrlhf"] = "openrlhf"
    launch: LaunchOptions = field(default_factory=LaunchOptions)
    openrlhf: dict[str, Any] = field(default_factory=dict)
    path: str = field(default="", init=False)


def read_yaml(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A YAML mapping with its ``extends`` chain merged in (this file's keys win, key by key).

    ``extends`` names a base file relative to the file that names it. Mappings merge
    recursively; any other value (lists included) replaces the base's.

    Raises:
        DataFileError: a missing or unreadable file, YAML that is not a mapping, or a cycle.
    """
    import yaml

    chain: list[Path] = []
    current = Path(path).expanduser().resolve()
    layers: list[dict[str, Any]] = []
    while True:
        if current in chain:
            raise DataFileError(f"{current}: 'extends' forms a cycle ({' -> '.join(map(str, chain))}).")
        if len(chain) >= _MAX_EXTENDS:
            raise DataFileError(f"{current}: 'extends' is nested more than {_MAX_EXTENDS} deep.")
        chain.append(current)
        if not current.is_file():
            raise DataFileError(f"The config file {str(current)!r} does not exist.")
        try:
            data = yaml.safe_load(current.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
            raise DataFileError(f"{current}: not readable YAML ({exc}).") from exc
        if data is None:
            data = {}
        if not isinstance(data, dict):
            raise DataFileError(f"{current}: the top level must be a mapping, got {type(data).__name__}.")
        layers.append(data)
        base = data.get("extends")
        if base is None:
            break
        if not isinstance(base, str) or not base.strip():
            raise DataFileError(f"{current}: 'extends' must be a file path, got {base!r:.80}.")
        current = (current.parent / base).resolve()
    merged: dict[str, Any] = {}
    for layer in reversed(layers):
        merged = _merge(merged, layer)
    merged.pop("extends", None)
    return merged


def _merge(base: dict[str, Any], top: Mapping[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in top.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def load_agent_config(path: str | os.PathLike[str], basedir: str | None = None) -> AgentConfig:
    """The agent section of ``path`` (or the whole file when it has no ``agent`` key).

    Raises:
        DataFileError: the file cannot be read.
        ConfigError: an unknown key (with "did you mean"), or a value of the wrong type or
            range; the message names the file and the dotted field.
    """
    data = read_yaml(path)
    section = data["agent"] if "agent" in data else data
    try:
        return AgentConfig.from_dict(section, basedir)
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
            f"${AGENT_CONFIG_VARIABLE} is not set: the searchgym agent reads its env from that YAML file "
            "(keys env_id and env_kwargs, or an 'agent' section). `searchgym train --backend openrlhf` sets "
            f"it; when launching OpenRLHF yourself, export {AGENT_CONFIG_VARIABLE}=/abs/path/config.yaml and "
            "pass it to the Ray workers (runtime_env env_vars)."
        )
    return load_agent_config(path)


def load_run_config(path: str | os.PathLike[str], basedir: str | None = None) -> RunConfig:
    """Read and validate a whole run file (see the module docstring).

    Raises:
        DataFileError: the file cannot be read.
        ConfigError: an unknown key (with "did you mean"), a missing ``agent`` section, or a
            value of the wrong type or range; the message names the file and the dotted field.
        InvalidArgumentError: a sampling temperature vLLM would change, or evaluation
            episodes the agent could not tell from training ones
            (:class:`~searchgym.trainers.openrlhf.eval_split.EvalSign`).
    """
    data = read_yaml(path)
    try:
        check(
            "backend",
            data.get("backend", "openrlhf"),
            data.get("backend", "openrlhf") == "openrlhf",
            "'openrlhf'",
            "A built-in trainer config goes to searchgym train --backend builtin.",
        )
        check("agent", None, "agent" in data, "an agent section (env_id, env_kwargs)")
        config = from_dict(RunConfig, data)
    except ConfigError as exc:
        raise exc.within(source=str(path)) from None
    config = replace(config, agent=config.agent.resolved(basedir))
    config.path = str(Path(path).expanduser().resolve())
    try:
        EvalSign.from_flags(config.openrlhf).check(stores_written(config.agent))
    except InvalidArgumentError as exc:
        raise InvalidArgumentError(f"{path}: {exc}") from None
    return config
