"""The YAML files of the OpenRLHF plugin, read into validated dataclasses.

One file serves both sides of a run (the shipped ones are in ``configs/openrlhf/``)::

    backend: openrlhf                 # optional; lets `searchgym train` pick the backend
    extends: lightsearcher.yaml       # optional; a base file, merged key by key under this one
    agent:                            # read by the agent on the vLLM actors (SEARCHGYM_AGENT_CONFIG)
      env_id: searchgym/MuSiQue-v0
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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...envs.errors import DataFileError, InvalidArgumentError, did_you_mean
from ...envs.models import resolve_model

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


def _check_keys(where: str, data: Mapping[str, Any], allowed: tuple[str, ...]) -> None:
    for key in data:
        if key not in allowed:
            raise did_you_mean(f"key in {where}", key, allowed)


def _mapping(where: str, value: object) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise InvalidArgumentError(f"{where} must be a mapping, got {value!r:.120} ({type(value).__name__}).")
    return dict(value)


def _str(where: str, value: object, *, optional: bool = False) -> str | None:
    if value is None and optional:
        return None
    if not isinstance(value, str) or not value.strip():
        raise InvalidArgumentError(f"{where} must be a non-empty string, got {value!r:.120}.")
    return value


def _tokenizer(where: str, value: object) -> str | None:
    """A tokenizer folder, with a registered offline model name turned into its pulled folder."""
    text = _str(where, value, optional=True)
    return None if text is None else resolve_model(text)


def _int(where: str, value: object, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise InvalidArgumentError(f"{where} must be an int >= {low}, got {value!r:.120}.")
    return value


def _number(where: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidArgumentError(f"{where} must be a number, got {value!r:.120}.")
    return float(value)


def _bool(where: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise InvalidArgumentError(f"{where} must be true or false, got {value!r:.120}.")
    return value


def _resolve(path: str, basedir: str | None) -> str:
    expanded = os.path.expanduser(path)
    if os.path.isabs(expanded) or "://" in expanded:
        return expanded
    base = basedir if basedir is not None else os.environ.get(BASEDIR_VARIABLE) or os.getcwd()
    return os.path.normpath(os.path.join(base, expanded))


@dataclass(frozen=True)
class MemoryConfig:
    """Experience memory inside the agent instances (``agent.memory``).

    Attributes:
        kind: ``lightsearcher`` (:class:`~searchgym.memory.ExperienceMemory`, updated every
            ``update_every`` OpenRLHF training steps) or ``hiexp`` (a
            :class:`~searchgym.memory.HierarchicalExperience` built offline and saved at
            ``path``).
        path: The store folder every agent instance and the trainer share.
        update_every: LightSearcher: training steps between bank updates (paper: 5).
        summarizer: LightSearcher: ``rule``, ``transformers:PATH`` or ``openai:MODEL@URL``.
        use_experience: Put the experience (or HiExp's strategies and hints) in the prompt.
        few_shot: Put one earlier episode in the prompt as an example.
        top_k: HiExp: strategy records in the prompt (HiExp: 5).
        hint_threshold: HiExp: cosine threshold of the hints after a search (HiExp: 0.8).
    """

    kind: str
    path: str
    update_every: int = 5
    summarizer: str = "rule"
    use_experience: bool = True
    few_shot: bool = True
    top_k: int = 5
    hint_threshold: float = 0.8

    KINDS = ("lightsearcher", "hiexp")

    @classmethod
    def from_dict(cls, data: object, basedir: str | None = None) -> MemoryConfig:
        where = "agent.memory"
        d = _mapping(where, data)
        _check_keys(where, d, tuple(cls.__dataclass_fields__))
        for key in ("kind", "path"):
            if key not in d:
                raise InvalidArgumentError(f"{where}.{key} is required (got keys {sorted(d)}).")
        kind = d["kind"]
        if kind not in cls.KINDS:
            raise did_you_mean(f"{where}.kind", kind, cls.KINDS)
        return cls(
            kind=kind,
            path=_resolve(str(_str(f"{where}.path", d["path"])), basedir),
            update_every=_int(f"{where}.update_every", d.get("update_every", 5), 1),
            summarizer=str(_str(f"{where}.summarizer", d.get("summarizer", "rule"))),
            use_experience=_bool(f"{where}.use_experience", d.get("use_experience", True)),
            few_shot=_bool(f"{where}.few_shot", d.get("few_shot", True)),
            top_k=_int(f"{where}.top_k", d.get("top_k", 5), 1),
            hint_threshold=_number(f"{where}.hint_threshold", d.get("hint_threshold", 0.8)),
        )


@dataclass(frozen=True)
class AdvantageConfig:
    """A group-advantage scheme applied inside OpenRLHF's trainer actor (``agent.advantage``).

    Attributes:
        scheme: ``tsas``: Light-Search's two-stage shaping (PAPERS.md §2), applied by the
            worker hook of :mod:`~searchgym.trainers.openrlhf.advantage_hook`. R is the
            env's reward, S the searches and T the ``<think>`` blocks of each rollout.
        warmup_steps: M1, the training step at which stage 2 starts (paper: 150).
        alpha: Weight of the reasoning term in stage 1 (paper: 0.01).
    """

    scheme: str = "tsas"
    warmup_steps: int = 150
    alpha: float = 0.01

    SCHEMES = ("tsas",)

    @classmethod
    def from_dict(cls, data: object) -> AdvantageConfig:
        where = "agent.advantage"
        d = _mapping(where, data)
        _check_keys(where, d, tuple(cls.__dataclass_fields__))
        scheme = d.get("scheme", "tsas")
        if scheme not in cls.SCHEMES:
            raise did_you_mean(f"{where}.scheme", scheme, cls.SCHEMES)
        return cls(
            scheme=scheme,
            warmup_steps=_int(f"{where}.warmup_steps", d.get("warmup_steps", 150), 0),
            alpha=_number(f"{where}.alpha", d.get("alpha", 0.01)),
        )


@dataclass(frozen=True)
class AgentConfig:
    """What the agent instances build: the env, and optionally memory and an advantage scheme.

    Attributes:
        env_id: A searchgym env id (``searchgym/HotpotQA-v0``; the short ``HotpotQA-v0`` works).
            The questions come from each training row's ``label``; the env's own data file
            is only read by its constructor.
        env_kwargs: Keyword arguments of ``gym.make`` (protocol, reward, retriever, ...).
        memory: Experience memory, or ``None``.
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

    @classmethod
    def from_dict(cls, data: object, basedir: str | None = None) -> AgentConfig:
        from ...envs import check_env_id

        where = "agent"
        d = _mapping(where, data)
        _check_keys(where, d, tuple(cls.__dataclass_fields__))
        if "env_id" not in d:
            raise InvalidArgumentError(
                f"{where}.env_id is required, e.g. 'searchgym/HotpotQA-v0' (got keys {sorted(d)})."
            )
        env_id = check_env_id(d["env_id"])
        env_kwargs = copy.deepcopy(_mapping(f"{where}.env_kwargs", d.get("env_kwargs")))
        for key in _PATH_KEYS:
            if isinstance(env_kwargs.get(key), str):
                env_kwargs[key] = _resolve(env_kwargs[key], basedir)
        reward_kwargs = env_kwargs.get("reward_kwargs")
        if isinstance(reward_kwargs, dict) and isinstance(reward_kwargs.get("store"), str):
            reward_kwargs["store"] = _resolve(reward_kwargs["store"], basedir)
        memory = d.get("memory")
        advantage = d.get("advantage")
        return cls(
            env_id=env_id,
            env_kwargs=env_kwargs,
            memory=None if memory is None else MemoryConfig.from_dict(memory, basedir),
            advantage=None if advantage is None else AdvantageConfig.from_dict(advantage),
            tokenizer=_tokenizer(f"{where}.tokenizer", d.get("tokenizer")),
            max_pool=_int(f"{where}.max_pool", d.get("max_pool", 4096), 1),
        )

    @property
    def protocol(self) -> str:
        """The protocol name the env uses (``search_r1`` when ``env_kwargs`` leaves it out)."""
        protocol = self.env_kwargs.get("protocol", "search_r1")
        return protocol if isinstance(protocol, str) else getattr(protocol, "name", str(protocol))


@dataclass(frozen=True)
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
    env: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, data: object) -> LaunchOptions:
        where = "launch"
        d = _mapping(where, data)
        _check_keys(where, d, tuple(cls.__dataclass_fields__))
        env = _mapping(f"{where}.env", d.get("env"))
        for key, value in env.items():
            if not isinstance(value, (str, int, float)) or isinstance(value, bool):
                raise InvalidArgumentError(
                    f"{where}.env.{key} must be a string or number, got {value!r:.80}."
                )
        return cls(
            ray_address=_str(f"{where}.ray_address", d.get("ray_address"), optional=True),
            python=_str(f"{where}.python", d.get("python"), optional=True),
            env={str(k): str(v) for k, v in env.items()},
        )


@dataclass(frozen=True)
class RunConfig:
    """A whole OpenRLHF run file: the agent, the launch options and the OpenRLHF flags."""

    path: str
    """The file read (absolute)."""
    agent: AgentConfig
    launch: LaunchOptions
    openrlhf: dict[str, Any]
    """The ``openrlhf`` section as written: nested keys, turned into dotted flags by ``flags``."""

    TOP_KEYS = ("backend", "extends", "agent", "launch", "openrlhf")


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
    """The agent section of ``path`` (or the whole file when it has no ``agent`` key)."""
    data = read_yaml(path)
    section = data["agent"] if "agent" in data else data
    return AgentConfig.from_dict(section, basedir)


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
        UnknownNameError: an unknown key (with close matches).
        InvalidArgumentError: a value of the wrong type or range (the message names the key).
    """
    data = read_yaml(path)
    _check_keys("the run config", data, RunConfig.TOP_KEYS)
    backend = data.get("backend", "openrlhf")
    if backend != "openrlhf":
        raise InvalidArgumentError(
            f"backend must be 'openrlhf' in an OpenRLHF run config, got {backend!r}; use the built-in "
            "trainer's config format for backend 'builtin'."
        )
    if "agent" not in data:
        raise InvalidArgumentError(f"{path}: the run config needs an 'agent' section (env_id, env_kwargs).")
    openrlhf = _mapping("openrlhf", data.get("openrlhf"))
    return RunConfig(
        path=str(Path(path).expanduser().resolve()),
        agent=AgentConfig.from_dict(data["agent"], basedir),
        launch=LaunchOptions.from_dict(data.get("launch")),
        openrlhf=openrlhf,
    )
