"""The run file: one layout for the built-in trainer, the OpenRLHF plugin, ``--dry-run`` and evaluation.

A run file holds the component sections, which every backend reads the same way, then
one section for what only its backend has::

    extends: base.yaml                 # optional: a base file, merged key by key under this one
    backend: builtin                   # or openrlhf
    env:                               # searchgym.envs.config.EnvConfig
      id: searchgym/MuSiQue-v1
      protocol: tool_call
      reward: lightsearcher
      reward_kwargs: {lam: 0.75}
      topk: 3
      max_turns: 6
    memory: {kind: lightsearcher, update_every: 5}        # searchgym.memory.config.MemoryConfig
    advantage: {estimator: tsas, variant: eq2}            # searchgym.trainers.advantages.AdvantageConfig
    builtin:                           # backend: builtin only (BuiltinConfig)
      output_dir: runs/musique
      steps: 200
      model: {path: Qwen/Qwen2.5-3B-Instruct}
      rollout: {group_size: 5}
      algo: {lr: 1.0e-6}
    openrlhf:                          # backend: openrlhf only: OpenRLHF's flags, nested, plus
      launch: {ray_address: null}      #   how the run is started (LaunchOptions)
      agent: {max_pool: 4096}          #   and the agent's own options (AgentOptions)
      actor: {model_name_or_path: Qwen/Qwen2.5-3B-Instruct}
    verl:                              # backend: verl only: verl's config keys, nested, plus
      agent: {max_turn_tokens: 512}    #   the agent loop's own options (VerlAgentOptions)
      actor_rollout_ref: {model: {path: Qwen/Qwen2.5-3B-Instruct}}

:func:`load_run` is the one loader: it reads the file (and its ``extends`` chain) with
:func:`~searchgym.envs.config_base.read_yaml` and checks every section, so an unknown key,
a wrong type or an impossible combination fails at load with a :class:`ConfigError` that
names the file, the dotted key and what is allowed. A file in an older layout (``env:
{id, kwargs}``, or an ``agent:`` section) fails with one line saying how to convert it
(:func:`convert`, ``searchgym config convert``). docs/config.md lists every field.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from ..envs.config import EnvConfig
from ..envs.config_base import ConfigError, check, check_int, from_dict, plain, read_yaml, to_dict
from ..error import DataFileError, InvalidArgumentError
from ..memory.config import MemoryConfig
from .advantages import AdvantageConfig
from .config import (
    CheckpointConfig,
    ModelConfig,
    RolloutConfig,
    TinyModelConfig,
    TrainConfig,
    UpdateConfig,
    WandbConfig,
)

__all__ = [
    "BACKENDS",
    "AgentOptions",
    "BuiltinConfig",
    "VerlAgentOptions",
    "LaunchOptions",
    "OldLayoutError",
    "RunSpec",
    "convert",
    "describe",
    "file_backend",
    "is_old_layout",
    "load_config",
    "load_run",
    "run_spec_from_dict",
    "spec_key",
    "trainer_keys",
]

BACKENDS = ("builtin", "openrlhf", "verl")
"""The trainers a run file can name in ``backend``."""


@dataclass
class BuiltinConfig:
    """What only the built-in GRPO trainer has (the ``builtin`` section).

    Attributes:
        output_dir: Folder of checkpoints, the saved config, the memory store and W&B files.
        steps: Training steps (one step = rollouts for ``questions_per_step`` questions, then the update).
        seed: Seed of the question order, the env resets, sampling and initialisation.
        log_every: Print a line of metrics every this many steps.
        model: The policy (:class:`~searchgym.trainers.config.ModelConfig`).
        rollout: How rollouts are generated (:class:`~searchgym.trainers.config.RolloutConfig`).
        algo: The update (:class:`~searchgym.trainers.config.UpdateConfig`).
        checkpoint: Checkpoints and resuming (:class:`~searchgym.trainers.config.CheckpointConfig`).
        wandb: Weights & Biases logging (:class:`~searchgym.trainers.config.WandbConfig`).
    """

    output_dir: str = "runs/grpo"
    steps: int = 100
    seed: int = 0
    log_every: int = 1
    model: ModelConfig = field(default_factory=lambda: ModelConfig(tiny=TinyModelConfig()))
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    algo: UpdateConfig = field(default_factory=UpdateConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    wandb: WandbConfig = field(default_factory=WandbConfig)


@dataclass
class AgentOptions:
    """The OpenRLHF agent's own options (``openrlhf.agent``).

    Attributes:
        tokenizer: A tokenizer folder or a registered offline model name (its pulled
            folder) for the chat template, used only when the agent runs outside
            OpenRLHF's executor (which passes its own tokenizer).
        max_pool: Envs kept per process for reuse (they are built once and reset per sample).
    """

    tokenizer: str | None = None
    max_pool: int = 4096

    def __post_init__(self) -> None:
        if self.tokenizer is not None:
            check("tokenizer", self.tokenizer, bool(self.tokenizer.strip()), "a tokenizer path or null")
        check_int("max_pool", self.max_pool)


@dataclass
class LaunchOptions:
    """How ``launch`` starts an OpenRLHF run (``openrlhf.launch``).

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
class VerlAgentOptions:
    """The verl agent loop's own options (``verl.agent``).

    Attributes:
        max_turn_tokens: The most tokens one turn may generate (Light-Search: 512), or null
            for no cap below the rest of ``actor_rollout_ref.rollout.response_length``.
        max_pool: Envs kept per process for reuse (they are built once and reset per row).
    """

    max_turn_tokens: int | None = None
    max_pool: int = 4096

    def __post_init__(self) -> None:
        if self.max_turn_tokens is not None:
            check_int("max_turn_tokens", self.max_turn_tokens, 1)
        check_int("max_pool", self.max_pool)


_VERL_OWN = ("agent",)
"""Keys of the ``verl`` section that are searchgym's, not verl's (verl's config has no
top-level ``agent`` key)."""

_OPENRLHF_OWN = ("launch", "agent")

_BACKEND_NAMES = {"builtin": "the built-in trainer", "openrlhf": "OpenRLHF", "verl": "verl"}
"""Keys of the ``openrlhf`` section that are searchgym's, not OpenRLHF flags (OpenRLHF has
no flag group of these names)."""


@dataclass
class RunSpec:
    """A whole run file (see the module docstring).

    Attributes:
        backend: The trainer: ``builtin`` (GRPO in this process) or ``openrlhf`` (the
            OpenRLHF plugin).
        env: The env (:class:`~searchgym.envs.config.EnvConfig`).
        memory: The experience memory (:class:`~searchgym.memory.config.MemoryConfig`).
        advantage: The group advantage (:class:`~searchgym.trainers.advantages.AdvantageConfig`);
            null: the backend's default (built-in: ``group_norm``; OpenRLHF: its own
            ``algo.advantage.estimator`` flag).
        builtin: ``backend: builtin`` only: :class:`BuiltinConfig`.
        openrlhf: ``backend: openrlhf`` only: OpenRLHF's flags as nested keys (``actor``,
            ``vllm``, ``rollout``, …; each becomes a dotted flag of ``train_ppo_ray``), plus
            ``launch`` (:class:`LaunchOptions`) and
            ``agent`` (:class:`AgentOptions`).
        verl: ``backend: verl`` only: verl's config as nested keys (``actor_rollout_ref``,
            ``data``, ``trainer``, …; each becomes a Hydra override of ``verl.trainer.main_ppo``,
            checked against verl's ``ppo_trainer.yaml``), plus ``agent`` (:class:`VerlAgentOptions`).
    """

    backend: Literal["builtin", "openrlhf", "verl"] = "builtin"
    env: EnvConfig = field(default_factory=EnvConfig)
    memory: MemoryConfig = field(default_factory=MemoryConfig)
    advantage: AdvantageConfig | None = None
    builtin: BuiltinConfig | None = None
    openrlhf: dict[str, Any] | None = None
    verl: dict[str, Any] | None = None
    path: str = field(default="", init=False, compare=False)

    def __post_init__(self) -> None:
        for name in ("builtin", "openrlhf", "verl"):
            if name != self.backend and getattr(self, name) is not None:
                check(
                    name,
                    "...",
                    False,
                    f"no {name} section with backend: {self.backend}",
                    f"Set backend: {name} to run it with {_BACKEND_NAMES[name]}.",
                )
        if self.backend == "builtin":
            if self.builtin is None:
                self.builtin = BuiltinConfig()
        elif self.backend == "openrlhf":
            self._check_openrlhf()
        else:
            self._check_verl()

    def _check_external(self, backend: str) -> None:
        """What a backend whose rollouts run in other processes needs of the shared sections."""
        if self.memory.kind != "none":
            check(
                "memory.path",
                self.memory.path,
                self.memory.path is not None,
                f"the store folder every agent instance shares (required with backend: {backend})",
            )
        if self.advantage is not None:
            check(
                "advantage.reasoning",
                self.advantage.reasoning,
                self.advantage.reasoning == "steps",
                f"'steps' with backend: {backend}",
                "The agent logs the <think> blocks of each rollout, not their tokens.",
            )

    def _check_verl(self) -> None:
        section = self.verl or {}
        try:
            from_dict(VerlAgentOptions, section.get("agent"))
        except ConfigError as exc:
            raise exc.within("verl.agent") from None
        self._check_external("verl")

    def _check_openrlhf(self) -> None:
        section = self.openrlhf or {}
        for key, cls in (("launch", LaunchOptions), ("agent", AgentOptions)):
            try:
                from_dict(cls, section.get(key))
            except ConfigError as exc:
                raise exc.within(f"openrlhf.{key}") from None
        self._check_external("openrlhf")
        if self.advantage is not None:
            native = self.advantage.spec.openrlhf
            given = _flag(section, "algo.advantage.estimator")
            if native is not None and given is not None and given != native:
                raise ConfigError(
                    "openrlhf.algo.advantage.estimator",
                    given,
                    f"{native!r} or left out (advantage.estimator {self.advantage.estimator!r} sets it)",
                )

    # -- the backends' views ------------------------------------------------------------------

    def train_config(self, cls: type[TrainConfig] = TrainConfig) -> TrainConfig:
        """The built-in trainer's :class:`~searchgym.trainers.config.TrainConfig` of this run.

        Raises:
            ConfigError: the run is not for the built-in trainer, or a cross-section check
                fails (named by its run-file key).
        """
        check("backend", self.backend, self.backend == "builtin", "'builtin' for the built-in trainer")
        assert self.builtin is not None
        builtin = to_dict(self.builtin)
        advantage = self.advantage or AdvantageConfig()
        data = {
            "backend": "builtin",
            **{k: v for k, v in builtin.items() if k != "algo"},
            "env": {"id": self.env.id, "kwargs": self.env.kwargs()},
            "algo": {
                **builtin["algo"],
                "advantage": advantage.estimator,
                "tsas_warmup_steps": advantage.warmup_steps,
                "tsas_alpha": advantage.alpha,
                "tsas_variant": advantage.variant,
                "tsas_reasoning": advantage.reasoning,
            },
            "memory": to_dict(self.memory),
        }
        data["checkpoint"]["allow_changes"] = [
            k for key in data["checkpoint"]["allow_changes"] for k in trainer_keys(key)
        ]
        try:
            return from_dict(cls, data)
        except ConfigError as exc:
            raise ConfigError(spec_key(exc.field), exc.value, exc.allowed, exc.hint, exc.source) from None

    def openrlhf_flags(self) -> dict[str, Any]:
        """The ``openrlhf`` section's OpenRLHF flags (nested), with the advantage's own
        OpenRLHF estimator filled in."""
        flags = {k: copy.deepcopy(v) for k, v in (self.openrlhf or {}).items() if k not in _OPENRLHF_OWN}
        native = None if self.advantage is None else self.advantage.spec.openrlhf
        if native is not None:
            flags.setdefault("algo", {}).setdefault("advantage", {})["estimator"] = native
        return flags

    def verl_overrides(self) -> dict[str, Any]:
        """The ``verl`` section's verl config keys (nested), without searchgym's own ``agent``."""
        return {k: copy.deepcopy(v) for k, v in (self.verl or {}).items() if k not in _VERL_OWN}

    def verl_agent_options(self) -> VerlAgentOptions:
        """The ``verl.agent`` options (defaults for a run of another backend)."""
        return from_dict(VerlAgentOptions, (self.verl or {}).get("agent"))

    def agent_options(self) -> AgentOptions:
        """The ``openrlhf.agent`` options (defaults for a run of another backend)."""
        return from_dict(AgentOptions, (self.openrlhf or {}).get("agent"))

    def launch_options(self) -> LaunchOptions:
        """The ``openrlhf.launch`` options (defaults for a run of another backend)."""
        return from_dict(LaunchOptions, (self.openrlhf or {}).get("launch"))

    @property
    def hooked_advantage(self) -> AdvantageConfig | None:
        """The advantage when OpenRLHF cannot compute it itself (searchgym's worker hook
        applies it), else ``None``."""
        if self.advantage is not None and self.advantage.spec.openrlhf is None:
            return self.advantage
        return None


def _flag(section: Mapping[str, Any], dotted: str) -> Any:
    value: Any = section
    for part in dotted.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return None
        value = value[part]
    return value


# -- keys of the trainer's config and of the run file -----------------------------------------

_ADVANTAGE_KEYS = {
    "algo.advantage": "advantage.estimator",
    "algo.tsas_warmup_steps": "advantage.warmup_steps",
    "algo.tsas_alpha": "advantage.alpha",
    "algo.tsas_variant": "advantage.variant",
    "algo.tsas_reasoning": "advantage.reasoning",
}


def spec_key(key: str) -> str:
    """The run-file key of a dotted key of :class:`TrainConfig` (``env.kwargs.reward`` → ``env.reward``)."""
    if key in ("env", "env.kwargs"):
        return "env"
    for prefix, new in (("env.kwargs.", "env."), ("env.", "env."), ("memory", "memory")):
        if key.startswith(prefix):
            return new + key[len(prefix) :]
    for old, new in _ADVANTAGE_KEYS.items():
        if key == old or key.startswith(old + "."):
            return new + key[len(old) :]
    if key == "backend":
        return key
    return "builtin." + key


def trainer_keys(key: str) -> list[str]:
    """The :class:`TrainConfig` keys of a run-file key (the inverse of :func:`spec_key`;
    ``advantage`` is five of them); a trainer key is returned as it is."""
    if key.startswith("builtin."):
        return [key[len("builtin.") :]]
    if key == "advantage":
        return list(_ADVANTAGE_KEYS)
    for old, new in _ADVANTAGE_KEYS.items():
        if key == new or key.startswith(new + "."):
            return [old + key[len(new) :]]
    if key.startswith("env.") and key != "env.id" and not key.startswith("env.kwargs"):
        return ["env.kwargs." + key[len("env.") :]]
    return [key]


# -- old layouts -------------------------------------------------------------------------------


class OldLayoutError(ConfigError):
    """A run file in a layout searchgym no longer reads; the message says how to convert it."""

    def __init__(self, source: str, layout: str):
        self.layout = layout
        super().__init__(
            "layout",
            layout,
            "the run layout of docs/config.md",
            f"Convert it with: searchgym config convert {source} -o NEW.yaml",
            source,
        )

    def within(self, prefix: str | None = None, source: str | None = None) -> ConfigError:
        return self


def is_old_layout(data: Mapping[str, Any]) -> str | None:
    """Which older layout ``data`` is in (``builtin`` or ``openrlhf``), or ``None``."""
    if "agent" in data or "env_id" in data or "env_kwargs" in data:
        return "openrlhf"
    env = data.get("env")
    builtin_keys = {
        "output_dir",
        "steps",
        "seed",
        "log_every",
        "model",
        "rollout",
        "algo",
        "checkpoint",
        "wandb",
    }
    if (isinstance(env, Mapping) and "kwargs" in env) or builtin_keys & set(data):
        return "builtin"
    return None


def _env_section(env_id: str, kwargs: Mapping[str, Any]) -> dict[str, Any]:
    return {"id": env_id, **copy.deepcopy(dict(kwargs))}


def convert(data: Mapping[str, Any]) -> dict[str, Any]:
    """A run file's data in an older layout, in the run layout (``extends`` kept as it is).

    The built-in trainer's ``env: {id, kwargs}``, top-level settings and ``algo.advantage`` /
    ``algo.tsas_*`` become ``env``, ``builtin`` and ``advantage``; the OpenRLHF plugin's
    ``agent: {env_id, env_kwargs, memory, advantage, tokenizer, max_pool}`` and ``launch``
    become ``env``, ``memory``, ``advantage`` and ``openrlhf.agent`` / ``openrlhf.launch``. A
    file already in the run layout is returned unchanged.

    Raises:
        ConfigError: ``data`` is not a mapping.
    """
    if not isinstance(data, Mapping):
        raise ConfigError("config", data, "a mapping")
    layout = is_old_layout(data)
    rest: dict[str, Any] = copy.deepcopy(dict(data))
    if layout is None:
        return rest
    data = rest
    out: dict[str, Any] = {}
    if "extends" in data:
        out["extends"] = data.pop("extends")
    if layout == "builtin":
        out["backend"] = data.pop("backend", "builtin")
        env = data.pop("env", None)
        if isinstance(env, Mapping):
            out["env"] = _env_section(env.get("id", "searchgym/SyntheticFacts-v1"), env.get("kwargs") or {})
            out["env"].update({k: v for k, v in env.items() if k not in ("id", "kwargs")})
        if "memory" in data:
            out["memory"] = data.pop("memory")
        algo = data.get("algo")
        if isinstance(algo, dict):
            advantage = {
                new.split(".")[1]: algo.pop(old.split(".")[1])
                for old, new in _ADVANTAGE_KEYS.items()
                if old.split(".")[1] in algo
            }
            if advantage:
                out["advantage"] = advantage
            if not algo:
                data.pop("algo")
        checkpoint = data.get("checkpoint")
        if isinstance(checkpoint, dict) and isinstance(checkpoint.get("allow_changes"), list):
            checkpoint["allow_changes"] = [
                spec_key(k) if isinstance(k, str) else k for k in checkpoint["allow_changes"]
            ]
        if data:
            out["builtin"] = data
        return out
    out["backend"] = data.pop("backend", "openrlhf")
    agent = data.pop("agent", None)
    if agent is None:  # an agent-only file: the agent section itself
        agent = {k: data.pop(k) for k in list(data) if k not in ("launch", "openrlhf")}
    agent = dict(agent)
    if "env_id" in agent or "env_kwargs" in agent:
        out["env"] = _env_section(agent.pop("env_id", None), agent.pop("env_kwargs", None) or {})
        if out["env"]["id"] is None:
            del out["env"]["id"]
    if "memory" in agent:
        memory = agent.pop("memory")
        out["memory"] = {"kind": "none"} if memory is None else memory  # null switched a base's memory off
    advantage = agent.pop("advantage", None)
    if isinstance(advantage, Mapping):
        advantage = dict(advantage)
        out["advantage"] = {"estimator": advantage.pop("scheme", "tsas"), **advantage}
    openrlhf = dict(data.pop("openrlhf", None) or {})
    if "launch" in data:
        openrlhf["launch"] = data.pop("launch")
    if agent:
        openrlhf["agent"] = agent
    if openrlhf or out["backend"] == "openrlhf":
        out["openrlhf"] = openrlhf
    out.update(data)  # anything else stays, for the loader to name
    return out


# -- the loader --------------------------------------------------------------------------------


def run_spec_from_dict(data: Mapping[str, Any] | None, source: str | None = None) -> RunSpec:
    """Build and check a :class:`RunSpec` from plain data (a run file's, ``extends`` merged).

    Raises:
        OldLayoutError: ``data`` is in an older layout (the message says how to convert it).
        ConfigError: an unknown key, a wrong type or an impossible combination, naming the
            dotted key and what is allowed (and ``source``, when given).
    """
    data = dict(data or {})
    if is_old_layout(data) is not None:
        raise OldLayoutError(source or "FILE", str(is_old_layout(data)))
    try:
        spec = from_dict(RunSpec, data)
    except ConfigError as exc:
        raise exc.within(source=source) from None
    return spec


def load_run(path: str | os.PathLike[str]) -> RunSpec:
    """Read and check a run file (see the module docstring).

    Raises:
        ConfigError: a missing or unreadable file, a file in an older layout (one line
            saying how to convert it), an unknown key, a wrong type or an impossible
            combination; the message names the file, the dotted key and what is allowed.
    """
    file = Path(path)
    try:
        data = read_yaml(file)
    except DataFileError as exc:
        raise ConfigError("config", str(file), "a readable YAML run file", str(exc), str(file)) from None
    spec = run_spec_from_dict(data, str(file))
    spec.path = str(file.expanduser().resolve())
    return spec


def load_config(path: str | os.PathLike[str], cls: type[TrainConfig] = TrainConfig) -> TrainConfig:
    """The built-in trainer's config of the run file at ``path`` (``backend: builtin``).

    Raises:
        ConfigError: as :func:`load_run`, or a run file for another backend.
    """
    spec = load_run(path)
    try:
        check(
            "backend",
            spec.backend,
            spec.backend == "builtin",
            "'builtin'",
            "An OpenRLHF run file goes to searchgym train --backend openrlhf.",
        )
        return spec.train_config(cls)
    except ConfigError as exc:
        raise exc.within(source=str(path)) from None


def file_backend(path: str | os.PathLike[str]) -> str | None:
    """The ``backend`` a run file names (``None`` when it names none or cannot be read: the
    real load reports why)."""
    try:
        data = read_yaml(path)
    except (DataFileError, InvalidArgumentError):
        return None
    value = data.get("backend")
    return value if isinstance(value, str) else None


def describe(config: TrainConfig, checks: list[str] | None = None) -> str:
    """What a run of ``config`` would do, in a few lines, without loading anything heavy.

    ``searchgym train --dry-run`` prints this for the built-in backend, with the lines of
    :func:`searchgym.trainers.dry_run.check_run` as ``checks``, followed by the checked
    config as a run file.
    """
    from pathlib import Path

    import yaml

    r, a, m = config.rollout, config.algo, config.model
    if m.tiny is not None:
        source = f"tiny model built in {m.tiny.dir} ({m.tiny.hidden_size}x{m.tiny.num_layers})"
    else:
        source = str(m.path)
    found = sorted(
        int(p.parent.name[5:])
        for p in Path(config.output_dir, "checkpoints").glob("step_*/trainer_state.json")
        if p.parent.name[5:].isdigit()
    )
    resume = config.checkpoint.resume
    if resume == "auto":
        start = f"resume from step {found[-1]} ({config.output_dir}/checkpoints)" if found else "a fresh run"
    elif resume == "never":
        start = "a fresh run" if not found else f"refused: {config.output_dir} already holds checkpoints"
    else:
        start = f"resume from {resume}"
    episodes = r.questions_per_step * r.group_size
    lines = [
        f"builtin GRPO: {config.steps} steps on {config.env.id} ({start})",
        f"  policy: {source} on {m.device} ({m.dtype}{'' if m.autocast == 'off' else ', autocast ' + m.autocast})",
        f"  rollouts: {r.questions_per_step} questions x {r.group_size} = {episodes} episodes per step, "
        f"{r.max_new_tokens} new tokens per turn, {r.max_context_tokens} per episode",
        f"  update: {a.advantage} advantages, {a.resolved_loss_agg}, clip {a.clip_eps:g}, kl {a.kl_coef:g} (k3), "
        f"AdamW lr {a.lr:g} ({a.lr_schedule}), {a.ppo_epochs * a.mini_batches} optimizer step(s) per step"
        + (f", ptx {a.ptx_coef:g} on {a.ptx_data or 'the warm start recall lessons'}" if a.ptx_coef else ""),
        f"  memory: {config.memory.kind}"
        + (" (stores in a Ray actor)" if config.memory.backend == "ray" else "")
        + f"; checkpoints every {config.checkpoint.every or config.steps} steps "
        f"in {config.output_dir}; wandb: {'on' if config.wandb.enabled else 'off'}",
        *(checks or []),
        "",
        yaml.safe_dump(convert(plain(config)), sort_keys=False).rstrip(),
    ]
    return "\n".join(lines)
