"""A run file with ``backend: verl`` → a ``verl.trainer.main_ppo`` run (``searchgym train --backend verl``).

The ``verl`` section holds verl's own config keys, nested as in ``ppo_trainer.yaml``; each
becomes a Hydra override (``actor_rollout_ref.rollout.n=5``). searchgym adds the overrides
that put its agent loop in (:func:`searchgym_overrides`):

- ``actor_rollout_ref.rollout.agent.agent_loop_config_path``: the packaged
  ``agent_loop.yaml`` (the loop ``searchgym``), and ``default_agent_loop=searchgym`` for rows
  without an ``agent_name`` column;
- the Ray runtime env: ``SEARCHGYM_AGENT_CONFIG`` (the run file), ``SEARCHGYM_AGENT_BASEDIR``
  (where relative paths are resolved) and the worker hook (:mod:`.hook`) that registers the
  advantage estimators and makes the stores follow the checkpoints;
- with an ``advantage`` section: ``algorithm.adv_estimator=searchgym_<estimator>``, and
  ``trainer.use_v1=false`` when the estimator reads searches or reasoning steps (see
  :mod:`.advantage`).

:func:`compose` checks every override against verl's schema on a CPU: Hydra composes
``ppo_trainer.yaml`` with them (an unknown key or a bad value fails, with the run-file key
named), and the algorithm, rollout and trainer sections are built into verl's own config
dataclasses, which check their types and ranges. The command runs
``python -m searchgym.trainers.verl.main_ppo`` (verl's ``main_ppo`` with the estimators
registered in the driver too).
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from ...envs.config_base import ConfigError
from ...error import InvalidArgumentError, SearchGymError
from ..agent_config import AGENT_CONFIG_VARIABLE, BASEDIR_VARIABLE, AgentConfig
from ..dotted_keys import flatten
from ..run_spec import RunSpec, load_run
from .hook import HOOK

__all__ = [
    "AGENT_LOOP_FILE",
    "VerlPlan",
    "check_overrides",
    "compose",
    "launch",
    "overrides_of",
    "searchgym_overrides",
]

AGENT_LOOP_FILE = str(Path(__file__).with_name("agent_loop.yaml"))
"""The packaged agent-loop config (the loop ``searchgym``)."""

_PLAIN = re.compile(r"^[A-Za-z0-9_./:@-]+$")


def _value(value: Any) -> str:
    """``value`` in Hydra's override grammar."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_value(v) for v in value) + "]"
    if isinstance(value, Mapping):
        return "{" + ",".join(f"{k}:{_value(v)}" for k, v in value.items()) + "}"
    text = str(value)
    if _PLAIN.match(text) and text not in ("null", "true", "false"):
        return text
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def overrides_of(section: Mapping[str, Any]) -> list[str]:
    """Hydra overrides of a nested section (``{"trainer": {"n_gpus_per_node": 8}}`` → ``trainer.n_gpus_per_node=8``)."""
    return [f"{key}={_value(value)}" for key, value in flatten(section).items()]


_PATH_KEYS = ("data.train_files", "data.val_files", "trainer.default_local_dir")
"""verl keys holding local paths, made absolute against the launch folder (Ray workers may
not start in it)."""


def absolute_paths(flat: dict[str, Any], basedir: str) -> dict[str, Any]:
    """``flat`` with the relative local paths of :data:`_PATH_KEYS` made absolute against ``basedir``."""

    def fix(path: Any) -> Any:
        if not isinstance(path, str) or "://" in path or os.path.isabs(os.path.expanduser(path)):
            return path
        return os.path.normpath(os.path.join(basedir, path))

    out = dict(flat)
    for key in _PATH_KEYS:
        if key in out:
            value = out[key]
            out[key] = [fix(v) for v in value] if isinstance(value, list) else fix(value)
    return out


_REWARD_MODEL = "reward.reward_model.enable"
"""verl's switch for a reward model, which a searchgym run leaves off (see :func:`searchgym_overrides`)."""


def searchgym_overrides(spec: RunSpec, run_file: str, basedir: str, stores: str = "") -> dict[str, Any]:
    """The overrides searchgym adds for ``spec`` (dotted key → value; see the module docstring).

    ``stores`` names what the run's episodes write (:func:`~searchgym.trainers.eval_stores.stores_written`);
    such a run needs the legacy trainer (``trainer.use_v1=false``), whose checkpoints the
    stores follow (:mod:`.checkpoints`).

    A reward model (``reward.reward_model.enable``) is refused: the episode's reward is the
    env's (``reward_score``), which verl's agent-loop worker and legacy trainer keep, but verl's
    V1 trainer runs a colocated reward model on every batch and overwrites ``rm_scores``.

    Raises:
        ConfigError: the ``verl`` section sets one of them to something else, or turns a
            reward model on.
    """
    flat = flatten(spec.verl_overrides())
    if flat.get(_REWARD_MODEL) is True:
        raise ConfigError(
            f"verl.{_REWARD_MODEL}",
            True,
            "false or left out",
            "The reward of a searchgym run is the env's reward scheme, which the agent loop hands "
            "verl as reward_score; with a reward model on the training GPUs verl's V1 trainer "
            "scores every batch with the model and overwrites it. Put the reward in env.reward.",
        )
    ours: dict[str, Any] = {
        "actor_rollout_ref.rollout.agent.agent_loop_config_path": AGENT_LOOP_FILE,
        "+ray_kwargs.ray_init.runtime_env.env_vars." + AGENT_CONFIG_VARIABLE: run_file,
        "+ray_kwargs.ray_init.runtime_env.env_vars." + BASEDIR_VARIABLE: basedir,
        "+ray_kwargs.ray_init.runtime_env.worker_process_setup_hook": HOOK,
    }
    if "actor_rollout_ref.rollout.agent.default_agent_loop" not in flat:
        ours["actor_rollout_ref.rollout.agent.default_agent_loop"] = "searchgym"
    if spec.advantage is not None:
        from .advantage import estimator_name

        ours["algorithm.adv_estimator"] = estimator_name(spec.advantage.estimator)
        if spec.advantage.spec.uses:
            ours["trainer.use_v1"] = False
    if stores:
        ours["trainer.use_v1"] = False
    for key, value in ours.items():
        given = flat.get(key.lstrip("+"))
        if given is not None and given != value:
            why = "searchgym sets it"
            if key == "algorithm.adv_estimator" and spec.advantage is not None:
                why = f"advantage.estimator {spec.advantage.estimator!r} sets it"
            elif key == "trainer.use_v1":
                why = (
                    f"the run writes {stores}, which follows the legacy trainer's checkpoints"
                    if stores
                    else "the estimator reads non_tensor_batch, which only the legacy trainer hands over"
                )
            raise ConfigError(f"verl.{key.lstrip('+')}", given, f"{value!r} or left out ({why})")
    return ours


@dataclass
class VerlPlan:
    """A composed verl run.

    Attributes:
        command: The argv of the run.
        overrides: Its Hydra overrides (the run file's, then searchgym's).
        notes: Lines for the user (printed as ``#`` comments).
    """

    command: list[str]
    overrides: list[str]
    notes: list[str] = field(default_factory=list)

    def shell(self) -> str:
        """The command as one shell line."""
        return " ".join(shlex.quote(part) for part in self.command)


def _config_dir() -> str:
    import verl.trainer.config as verl_config

    return os.path.dirname(verl_config.__file__)


def _compose(overrides: list[str]) -> Any:
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    with initialize_config_dir(config_dir=_config_dir(), version_base=None):
        return hydra_compose(config_name="ppo_trainer", overrides=overrides)


def _kind(value: Any) -> str | None:
    """The kind of a verl default value that an override must keep, or ``None`` (any)."""
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    return None


def _fits(value: Any, kind: str) -> bool:
    if kind == "a boolean":
        return isinstance(value, bool)
    if kind == "an integer":  # 0.0 for a default of 0 is fine; 5.5 is not
        return (
            isinstance(value, int) or (isinstance(value, float) and value.is_integer())
        ) and not isinstance(value, bool)
    if kind == "a number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return isinstance(value, str)


def check_types(section: Mapping[str, Any]) -> None:
    """Each key of the ``verl`` section has a value of the kind of verl's default for it
    (an integer for ``trainer.n_gpus_per_node``); keys whose default is null take anything.

    Raises:
        ConfigError: a value of another kind, or a key verl does not have (with "did you mean").
    """
    import difflib

    from omegaconf import DictConfig, OmegaConf

    base = _compose([])
    for key, value in flatten(section).items():
        parent, _, leaf = key.rpartition(".")
        node = OmegaConf.select(base, parent) if parent else base
        if not isinstance(node, DictConfig) or leaf not in node.keys():
            keys = list(node.keys()) if isinstance(node, DictConfig) else []
            close = difflib.get_close_matches(leaf, [str(k) for k in keys], n=1)
            hint = f"Did you mean verl.{parent + '.' if parent else ''}{close[0]}?" if close else ""
            raise ConfigError(f"verl.{key}", value, "a key of verl's ppo_trainer.yaml (verl 0.9.1)", hint)
        default = OmegaConf.select(base, key, throw_on_missing=False)
        kind = _kind(default)
        if kind is not None and value is not None and not _fits(value, kind):
            raise ConfigError(f"verl.{key}", value, f"{kind} (verl's default is {default!r})")


def check_overrides(overrides: list[str]) -> Any:
    """Compose verl's ``ppo_trainer.yaml`` with ``overrides`` and build its checked sections;
    returns the composed config.

    Raises:
        ConfigError: an override verl's schema refuses (naming the ``verl.`` key), or a value
            verl's config dataclasses refuse.
    """
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    try:
        config = _compose(overrides)
    except (HydraException, OmegaConfBaseException) as exc:
        text = str(exc).strip().splitlines()
        found = re.search(r"override '([^']+)'", str(exc)) or re.search(r"Key '([^']+)'", str(exc))
        key = found.group(1).lstrip("+") if found else "verl"
        raise ConfigError(
            f"verl.{key}" if found else "verl",
            next((o for o in overrides if o.lstrip("+").startswith(key + "=")), key),
            "a key and value of verl's ppo_trainer.yaml (verl 0.9.1)",
            " ".join(text[:2]),
        ) from None
    from verl.utils.config import omega_conf_to_dataclass

    for name, section in (
        ("algorithm", config.algorithm),
        ("actor_rollout_ref.rollout", config.actor_rollout_ref.rollout),
    ):
        try:
            omega_conf_to_dataclass(section)
        except Exception as exc:  # noqa: BLE001 - verl's dataclasses raise what their checks raise
            raise ConfigError(
                f"verl.{name}", "...", "values verl's config classes accept", str(exc)
            ) from None
    return config


def compose(spec: RunSpec, basedir: str | None = None) -> VerlPlan:
    """The verl run of ``spec`` (``backend: verl``), its overrides checked by verl (see the module docstring).

    Raises:
        ConfigError: a bad run file or an override verl refuses (the message names the key).
    """
    if spec.backend != "verl":
        raise ConfigError("backend", spec.backend, "'verl' for searchgym train --backend verl")
    basedir = basedir or os.getcwd()
    from ..eval_stores import stores_written

    agent = AgentConfig.from_spec(spec, basedir)  # the agent loop's own checks (memory, stores)
    run_file = spec.path or ""
    stores = stores_written(agent)
    ours = searchgym_overrides(spec, run_file, basedir, stores)
    check_types(spec.verl_overrides())
    own = absolute_paths(flatten(spec.verl_overrides()), basedir)
    overrides = [f"{k}={_value(v)}" for k, v in {**own, **ours}.items()]
    config = check_overrides(overrides)
    notes = [f"checked against verl's ppo_trainer.yaml ({_verl_version()})"]
    if spec.advantage is not None:
        notes.append(
            f"advantage: searchgym's {spec.advantage.estimator} as verl's {ours['algorithm.adv_estimator']}"
        )
    if stores:
        notes.append(
            f"the stores ({stores}) follow the checkpoints of verl's legacy trainer (trainer.use_v1=false)"
        )
    elif config.trainer.get("use_v1") is False:
        notes.append("trainer.use_v1=false: the legacy trainer hands non_tensor_batch to compute_advantage")
    command = [sys.executable, "-m", "searchgym.trainers.verl.main_ppo", *overrides]
    return VerlPlan(command, overrides, notes)


def _verl_version() -> str:
    try:
        from importlib.metadata import version

        return f"verl {version('verl')}"
    except Exception:  # noqa: BLE001 - only for a note
        return "verl"


def launch(config_path: str | os.PathLike[str], dry_run: bool = False, *, out: TextIO | None = None) -> int:
    """Compose the verl run of ``config_path``; print it (``dry_run``) or run it.

    Returns:
        0 after a dry run, else the exit code of the run.

    Raises:
        SearchGymError: a bad run file (the message names the key), verl missing, or a
            machine without what a run needs (vLLM).
    """
    out = out or sys.stdout
    spec = load_run(config_path)
    try:
        import verl  # noqa: F401
    except ImportError:
        raise InvalidArgumentError(
            "backend: verl needs verl: pip install 'searchgym[verl]' (verl 0.9.1 without its GPU "
            "dependencies; enough for --dry-run), and on a GPU machine pip install 'verl[vllm]==0.9.1'."
        ) from None
    try:
        plan = compose(spec)
    except ConfigError as exc:
        raise exc.within(source=str(config_path)) from None
    for line in plan.notes:
        print(f"# {line}", file=sys.stderr)
    if not dry_run:
        import importlib.util

        if importlib.util.find_spec("vllm") is None:
            raise SearchGymError(
                "A verl run needs vllm, which this Python does not have. On a GPU machine: pip install "
                "'verl[vllm]==0.9.1', then rerun. --dry-run prints the command without running it."
            )
    print(plan.shell(), file=out)
    out.flush()
    if dry_run:
        return 0
    return subprocess.run(plan.command, check=False).returncode
