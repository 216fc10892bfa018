"""``launch``: a run file (``configs/openrlhf/*.yaml``) → an ``openrlhf.cli.train_ppo_ray`` run.

The ``openrlhf`` section becomes dotted flags (:mod:`~searchgym.trainers.openrlhf.flags`),
checked by OpenRLHF's own parser and pre-training checks; ``--train.agent_func_path``
defaults to the shipped agent file, ``--data.input_key``/``--data.label_key`` to the
``prompt``/``label`` columns ``searchgym prepare`` writes. The agent on the Ray workers
finds its env through ``SEARCHGYM_AGENT_CONFIG``, which names the run file itself, so the
Ray job's runtime env carries that variable (and ``SEARCHGYM_AGENT_BASEDIR``, the launch
directory relative paths are resolved against). When the config selects TSAS or a
LightSearcher memory, the runtime env also names the worker hook
(:data:`~searchgym.trainers.openrlhf.advantage_hook.HOOK`). The stores live in a Ray actor,
and a cluster run ships the package and run file (:mod:`~searchgym.trainers.openrlhf.cluster`).

Two ways to start, by ``launch.ray_address``:

- unset: ``python -m searchgym.trainers.openrlhf.train_ppo FLAGS``, which calls
  ``ray.init(runtime_env=...)`` (joining ``$RAY_ADDRESS`` when set) and then runs
  ``openrlhf.cli.train_ppo_ray`` as ``__main__``;
- a dashboard address: ``ray job submit --address ADDR --runtime-env-json JSON --
  python3 -m openrlhf.cli.train_ppo_ray FLAGS``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field, replace
from typing import Any, TextIO

from ...error import InvalidArgumentError, SearchGymError
from ...models import resolve_model
from ..agent_config import AGENT_CONFIG_VARIABLE, BASEDIR_VARIABLE
from ..store_snapshots import prepare_stores, run_stores
from .advantage_hook import HOOK, TSAS_ESTIMATORS, needs_hook
from .batch_checks import check_batch_arithmetic, step_line
from .checkpoints import disk_lines
from .cluster import agent_file_path, cluster_runtime_env
from .config import RunConfig, load_run_config
from .epochs import check_data_files, whole_batches
from .flags import check_flags, flatten, nested, openrlhf_parser, to_argv
from .resume import OPENRLHF_RESUME
from .secrets import KEY_VARIABLE, redacted_shell, take_wandb_key

__all__ = [
    "OPENRLHF_ENV_DEFAULTS",
    "RUNTIME_ENV_VARIABLE",
    "LaunchPlan",
    "agent_file_path",
    "compose",
    "launch",
]

RUNTIME_ENV_VARIABLE = "SEARCHGYM_RAY_RUNTIME_ENV"
"""Environment variable through which ``launch`` hands the runtime env to ``train_ppo``."""

OPENRLHF_ENV_DEFAULTS = {
    "TOKENIZERS_PARALLELISM": "true",
    "NCCL_DEBUG": "WARN",
    "RAY_ENABLE_ZERO_COPY_TORCH_TENSORS": "1",
}
"""The env vars ``train_ppo_ray`` gives ``ray.init`` itself; ``train_ppo`` keeps them (a
submitted job leaves them to OpenRLHF's own ``ray.init``, since Ray refuses a variable set twice)."""

_DEFAULT_FLAGS = {"data.input_key": "prompt", "data.label_key": "label"}
_DATA_FLAGS = ("data.prompt_dataset", "eval.dataset")
_OUTPUT_FLAGS = ("ckpt.path", "ckpt.output_dir", "logger.tensorboard_dir")
_MODEL_FLAGS = ("actor.model_name_or_path", "critic.model_name_or_path", "reward.model_name_or_path")


def _resolve_model_names(flat: dict[str, Any]) -> None:
    """Turn registered offline model names (``smollm2-135m-instruct``) into their pulled folders.

    ``reward.model_name_or_path`` may list several comma-separated models; each part resolves.

    Raises:
        ModelNotPulledError: a registered name not pulled yet (the message gives the pull command).
    """
    for key in _MODEL_FLAGS:
        value = flat.get(key)
        if isinstance(value, str) and value:
            flat[key] = ",".join(resolve_model(part.strip()) for part in value.split(","))


def _absolute_paths(flat: dict[str, Any], basedir: str) -> None:
    """Make relative local paths absolute: Ray workers do not share the launcher's directory.

    Dataset flags may list several comma-separated datasets, local files or hub names; a
    part becomes absolute only when it exists under ``basedir``. Output folders become
    absolute whenever they are relative.
    """
    for key in _DATA_FLAGS:
        value = flat.get(key)
        if isinstance(value, str):
            parts = [p.strip() for p in value.split(",")]
            flat[key] = ",".join(
                os.path.join(basedir, p)
                if p and not os.path.isabs(p) and os.path.exists(os.path.join(basedir, p))
                else p
                for p in parts
            )
    for key in _OUTPUT_FLAGS:
        value = flat.get(key)
        if isinstance(value, str) and value and not os.path.isabs(os.path.expanduser(value)):
            flat[key] = os.path.normpath(os.path.join(basedir, value))


@dataclass(frozen=True)
class LaunchPlan:
    """A composed run: the command, its environment, and what was checked."""

    command: list[str]
    """The program and its arguments."""
    env: dict[str, str]
    """Variables to set for the command (on top of the current environment)."""
    runtime_env: dict[str, Any]
    """The Ray runtime env of the job."""
    flags: list[str]
    """The OpenRLHF flags alone."""
    warnings: list[str] = field(default_factory=list)
    """OpenRLHF's printed warnings about the flags, and searchgym's."""
    notes: list[str] = field(default_factory=list)
    """What the run will do: the rows per episode and the tail left out, each step's shares."""
    secrets: dict[str, str] = field(default_factory=dict, repr=False)
    """Variables the command needs that are never printed (``WANDB_API_KEY``); set them in its
    environment. A submitted job's runtime env in ``command`` holds them too."""
    staged: tuple[str, ...] = ()
    """Temporary folders holding the files a cluster run ships (the package, the run file);
    Ray uploads them when the run starts. :meth:`cleanup` removes them."""

    def cleanup(self) -> None:
        """Remove :attr:`staged` (after the run, or when the plan is not run)."""
        for folder in self.staged:
            shutil.rmtree(folder, ignore_errors=True)

    def shell(self) -> str:
        """The command as one shell line, with its variables in front and each secret written as
        ``"$NAME"`` (the shell that runs the line fills it in)."""
        return redacted_shell(self.command, self.secrets, self.env)


def _check_plugin_flags(config: RunConfig, flat: dict[str, Any]) -> list[str]:
    """searchgym's own checks of the flags against the agent config."""
    warnings = []
    estimator = flat.get("algo.advantage.estimator", "gae")
    if config.agent.advantage is not None and estimator not in TSAS_ESTIMATORS:
        raise InvalidArgumentError(
            f"agent.advantage selects TSAS, which replaces OpenRLHF's group baseline: set "
            f"openrlhf.algo.advantage.estimator to one of {', '.join(TSAS_ESTIMATORS)} (got {estimator!r})."
        )
    if flat.get("data.apply_chat_template"):
        warnings.append(
            "searchgym: data.apply_chat_template has no effect: the agent renders the prompt from the env "
            "with the tokenizer's chat template itself."
        )
    if flat.get("data.label_key") != "label" and flat.get("data.label_key") is not None:
        warnings.append(
            f"searchgym: data.label_key is {flat['data.label_key']!r}; that column must hold the JSON "
            '{"id", "question", "golden_answers"} that `searchgym prepare` writes under \'label\'.'
        )
    if not flat.get("data.prompt_dataset"):
        raise InvalidArgumentError(
            "openrlhf.data.prompt_dataset is not set: write the training rows with `searchgym prepare "
            "--dataset NAME --out train.jsonl` and give that file."
        )
    return warnings


def _check_fresh_stores(config: RunConfig, flat: dict[str, Any], basedir: str) -> None:
    """Refuse a run that will start fresh on stores an earlier run wrote (the trainer checks again)."""
    checkpoint = os.path.join(basedir, str(flat.get("ckpt.path") or "./ckpt/checkpoints_ppo_ray"))
    if flat.get("ckpt.load_enable") and os.path.isdir(os.path.join(checkpoint, "_actor")):
        return  # a resume: the trainer restores the stores to the checkpoint's step
    prepare_stores(run_stores(config.agent), 0, checkpoint=checkpoint, resume=OPENRLHF_RESUME)


def compose(config: RunConfig, basedir: str | None = None) -> LaunchPlan:
    """The command that runs ``config`` (see the module docstring).

    Raises:
        UnknownNameError: an ``openrlhf`` key that is no OpenRLHF flag.
        ModelNotPulledError: a model flag names a registered offline model not pulled yet.
        InvalidArgumentError: a flag value OpenRLHF's parser or checks reject, or a flag
            that does not fit the agent config (e.g. TSAS under ``gae``).
        StoreStateError: a run that starts fresh on a store an earlier run wrote.
    """
    basedir = os.path.abspath(basedir or os.getcwd())
    flat = flatten(config.openrlhf)
    flat.setdefault("train.agent_func_path", agent_file_path())
    for key, value in _DEFAULT_FLAGS.items():
        flat.setdefault(key, value)
    warnings = _check_plugin_flags(config, flat)
    _resolve_model_names(flat)
    _absolute_paths(flat, basedir)
    secrets, secret_warnings = take_wandb_key(flat)
    warnings += secret_warnings
    cluster_env: dict[str, Any] = {"env_vars": {}}  # the store actor; a cluster run's shipped files
    staged: list[str] = []
    warnings += cluster_runtime_env(config, flat, cluster_env, created=staged)
    try:
        plan = _compose_checked(config, flat, basedir, warnings, secrets, cluster_env)
    except BaseException:
        for folder in staged:
            shutil.rmtree(folder, ignore_errors=True)
        raise
    return replace(plan, staged=tuple(staged))


def _compose_checked(
    config: RunConfig,
    flat: dict[str, Any],
    basedir: str,
    warnings: list[str],
    secrets: dict[str, str],
    cluster_env: dict[str, Any],
) -> LaunchPlan:
    """:func:`compose` after the runtime env is staged: the checks and the command."""
    _check_fresh_stores(config, flat, basedir)
    check_data_files(flat)
    info = openrlhf_parser()
    notes: list[str] = []
    if info is None:
        warnings.append("searchgym: openrlhf is not installed here, so the flags were not checked.")
        notes += whole_batches(flat, nested(flat))[1]
        argv = to_argv(flat, info)
    else:
        args, printed = check_flags(to_argv(flat, info), info)
        check_batch_arithmetic(args)
        epochs, lines = whole_batches(flat, args)  # sets data.max_samples
        notes += lines
        argv = to_argv(flat, info)
        args, printed = check_flags(argv, info)
        notes.append(step_line(args))
        steps = None if epochs is None else epochs.steps * args.train.num_episodes
        notes += disk_lines(args, steps)
        warnings += [f"openrlhf: {line}" for line in printed]

    env_vars = {AGENT_CONFIG_VARIABLE: config.path, BASEDIR_VARIABLE: basedir}
    for name in ("SEARCHGYM_DATA_DIR",):
        if os.environ.get(name):
            env_vars[name] = os.environ[name]
    env_vars.update(config.launch.env)
    env_vars.update(cluster_env.pop("env_vars"))
    runtime_env: dict[str, Any] = {"env_vars": dict(env_vars), **cluster_env}
    if needs_hook(config.agent) or flat.get("ckpt.save_hf"):  # the hook also rotates save_hf's copies
        runtime_env["worker_process_setup_hook"] = HOOK

    if config.launch.ray_address is None:
        local_env = dict(runtime_env)
        local_env["env_vars"] = {**OPENRLHF_ENV_DEFAULTS, **env_vars}
        python = config.launch.python or sys.executable
        command = [python, "-m", "searchgym.trainers.openrlhf.train_ppo", *argv]
        env = {RUNTIME_ENV_VARIABLE: json.dumps(local_env, sort_keys=True)}
        return LaunchPlan(command, env, local_env, argv, warnings, notes, secrets)
    python = config.launch.python or "python3"
    runtime_env["env_vars"].update(secrets)  # the job's workers get the key from here alone
    command = [
        "ray",
        "job",
        "submit",
        "--address",
        config.launch.ray_address,
        "--runtime-env-json",
        json.dumps(runtime_env, sort_keys=True),
        "--",
        python,
        "-m",
        "openrlhf.cli.train_ppo_ray",
        *argv,
    ]
    runtime_env["env_vars"] = {k: v for k, v in runtime_env["env_vars"].items() if k not in secrets}
    return LaunchPlan(command, {}, runtime_env, argv, warnings, notes, secrets)


def _missing_runtime() -> list[str]:
    return [
        name for name in ("openrlhf", "ray", "vllm", "deepspeed") if importlib.util.find_spec(name) is None
    ]


def launch(config_path: str | os.PathLike[str], dry_run: bool = False, *, out: TextIO | None = None) -> int:
    """Compose the OpenRLHF run of ``config_path``; print it (``dry_run``) or run it.

    Args:
        config_path: A run file (``configs/openrlhf/*.yaml``).
        dry_run: Print the command (and OpenRLHF's warnings about the flags) instead of running it.
        out: Where to print (default: standard output).

    Returns:
        0 after a dry run, else the exit code of the run.

    Raises:
        SearchGymError: a bad config (the message names the key), or a machine without the
            packages a run needs (vLLM, DeepSpeed: the message says how to install them).
    """
    out = out or sys.stdout
    config = load_run_config(config_path)
    plan = compose(config)
    try:
        return _run_plan(config, plan, dry_run, out)
    finally:
        plan.cleanup()  # Ray has uploaded the shipped files by the time the command returns


def _run_plan(config: RunConfig, plan: LaunchPlan, dry_run: bool, out: TextIO) -> int:
    for line in plan.warnings + plan.notes:
        print(f"# {line}", file=sys.stderr)
    if dry_run:
        if plan.staged:
            print(
                "# searchgym: the files the runtime env ships (working_dir, py_modules) are staged anew at "
                "launch; this dry run removed its copy.",
                file=sys.stderr,
            )
        print(plan.shell(), file=out)
        out.flush()
        return 0
    if plan.flags.count("--logger.wandb.key") and KEY_VARIABLE not in plan.secrets:
        raise InvalidArgumentError(
            f"openrlhf.logger.wandb.key is true but ${KEY_VARIABLE} is not set: export {KEY_VARIABLE}=... "
            "(your key from https://wandb.ai/authorize) and launch again, or set the key to null."
        )
    if config.launch.ray_address is None:
        missing = _missing_runtime()
        if missing:
            raise SearchGymError(
                f"An OpenRLHF run needs {', '.join(missing)}, which this Python does not have. On a GPU "
                "machine: pip install 'openrlhf[vllm]==0.11.2' (which brings vllm, deepspeed and ray), then "
                "rerun. --dry-run prints the command without running it."
            )
    elif shutil.which(plan.command[0]) is None:
        raise SearchGymError(
            f"launch.ray_address submits the run with `{plan.command[0]} job submit`, and this machine has no "
            f"{plan.command[0]!r} command: pip install 'ray[default]' (the Ray version of the cluster), then "
            "rerun. --dry-run prints the command without running it."
        )
    print(plan.shell(), file=out)
    out.flush()
    env = {**os.environ, **plan.env, **plan.secrets}
    return subprocess.run(plan.command, env=env, check=False).returncode
