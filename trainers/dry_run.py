"""What ``searchgym train --dry-run`` checks for the built-in trainer, without training.

:func:`check_run` builds everything a run builds before its first step, except the model
itself: the training env (and the evaluation env) with the run's kwargs and shared reward
scheme, so a misspelled reward, protocol or keyword fails here with "did you mean"; the
question and corpus files they read; the model folder; the memory store; the replay file;
the output folder. It returns lines for the plan (the work the run will do); anything that
would stop the run raises :class:`~searchgym.error.SearchGymError` instead.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

from ..envs.config import env_keywords
from ..error import DataFileError, InvalidArgumentError, SearchGymError, did_you_mean
from ..models import MODELS, ModelNotPulledError, resolve_model
from . import build
from .config import EnvConfig, TrainConfig

__all__ = ["check_device", "check_run", "check_model_path", "work_estimate", "time_estimate", "prefixed"]


def prefixed(exc: SearchGymError, prefix: str) -> SearchGymError:
    """``exc`` with ``prefix: `` before its message, of its own class where that takes one message."""
    message = f"{prefix}: {exc}"
    try:
        return type(exc)(message)
    except TypeError:  # a class with its own constructor (ConfigError)
        return SearchGymError(message)


def _check_env(env: EnvConfig, field: str, memory: Any = None, memory_config: Any = None) -> None:
    """Build (and close) one env of the run as the trainer does, through
    :func:`searchgym.trainers.build.build_env`: ``gym.make`` with the run's one reward scheme,
    behind the memory wrapper when there is a memory (which records nothing here)."""
    keywords = env_keywords(env.id)
    for key in env.kwargs:
        if keywords is not None and key not in keywords:
            raise InvalidArgumentError(f"{field}: {did_you_mean('keyword of ' + env.id, key, keywords)}")
    try:
        reward = build.build_reward(env.id, env.kwargs)
        built = build.build_env(
            env.id,
            env.kwargs,
            reward=reward,
            memory=memory,
            memory_config=memory_config,
            record=False,
            disable_env_checker=True,
        )
    except SearchGymError as exc:
        raise prefixed(exc, field) from None
    built.close()


def _looks_like_hub_name(path: str) -> bool:
    """``org/name`` with no local prefix and no local first folder: a Hugging Face Hub id."""
    parts = path.split("/")
    return len(parts) == 2 and all(parts) and not path.startswith((".", "~")) and not Path(parts[0]).exists()


def check_model_path(path: str) -> str:
    """Check ``builtin.model.path``; return how it is found. A missing local folder is an error;
    a hub id is fine when the local Hugging Face cache holds it, or when downloads are allowed.
    A registered offline model name (``searchgym models list``) must be pulled."""
    if path in MODELS and not os.path.exists(path):
        try:
            return f"offline model {path} in {resolve_model(path)}"
        except ModelNotPulledError as exc:
            raise DataFileError(f"builtin.model.path: {exc}") from None
    folder = Path(path).expanduser()
    if folder.is_dir():
        if not (folder / "config.json").is_file():
            raise DataFileError(
                f"builtin.model.path: {path!r} is a folder but holds no config.json, so it is not a transformers "
                "model folder: point builtin.model.path at the folder that save_pretrained wrote."
            )
        return f"model folder {folder}"
    if _looks_like_hub_name(path):
        from huggingface_hub import try_to_load_from_cache

        if isinstance(try_to_load_from_cache(path, "config.json"), str):
            return f"{path} from the local Hugging Face cache"
        offline = any(
            os.environ.get(v, "") not in ("", "0") for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
        )
        if not offline:
            return (
                f"{path}, downloaded from the Hugging Face Hub when the run starts (not in the local cache)"
            )
    raise DataFileError(
        f"builtin.model.path: {path!r} is not a folder (no such directory"
        + (" here, and the hub is offline" if _looks_like_hub_name(path) else "")
        + "). Point builtin.model.path at a local model folder (one that holds config.json), download the model "
        "there first, or use builtin.model.tiny for the offline tiny model."
    )


def _check_writable(path: Path, field: str) -> None:
    """``path`` is, or can be made, a folder this process writes into (nothing is created)."""
    target = path.resolve()
    while not target.exists():
        target = target.parent
    if not target.is_dir():
        raise InvalidArgumentError(f"{field}: {str(path)!r} cannot be a folder: {target} is a file.")
    if not os.access(target, os.W_OK | os.X_OK):
        raise InvalidArgumentError(f"{field}: {str(path)!r} cannot be written: {target} is not writable.")


def _check_memory(config: TrainConfig) -> Any:
    """The run's memory, built as the trainer builds it (:meth:`MemoryConfig.build`) from its
    store; a store that does not exist yet is made in a temporary folder (the dry run creates
    nothing in ``output_dir``)."""
    memory = config.memory
    store = memory.store_dir(config.output_dir)
    if store is not None and not store.exists():
        _check_writable(store, "memory.path")
        with tempfile.TemporaryDirectory() as tmp:
            return build.build_memory(memory, store_dir=tmp, seed=config.seed)
    return build.build_memory(memory, output_dir=config.output_dir, seed=config.seed)


def work_estimate(config: TrainConfig) -> str:
    """The run's size in episodes and generated tokens, from the config alone."""
    r = config.rollout
    turns = int(
        config.env.kwargs.get("max_turns") or (env_keywords(config.env.id) or {})["max_turns"].default
    )
    episodes = config.steps * r.questions_per_step * r.group_size
    tokens = episodes * turns * r.max_new_tokens
    return (
        f"  expected work: {episodes:,} episodes of up to {turns} turns, at most {tokens:,} generated tokens "
        f"({config.steps} steps)"
    )


def time_estimate(config: TrainConfig) -> str | None:
    """How long the remaining steps take, from the step times that the newest checkpoint in
    ``output_dir`` records (an earlier or interrupted run of this config); None when there is none."""
    import json
    import statistics

    states = sorted(Path(config.output_dir, "checkpoints").glob("step_*/trainer_state.json"))
    if not states:
        return None
    try:
        state = json.loads(states[-1].read_text(encoding="utf-8"))
        times = [float(r["train"]["step_s"]) for r in state["history"] if "step_s" in r.get("train", {})]
        done = int(state["step"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None  # the real run reports an unreadable checkpoint itself
    remaining = config.steps - done
    if not times or remaining <= 0:
        return None
    per_step = statistics.median(times)
    return (
        f"  expected time: about {per_step * remaining:.0f} s for the {remaining} remaining steps "
        f"(median {per_step:.2f} s per step over the {len(times)} steps recorded in {states[-1].parent})"
    )


def check_device(device: str) -> str | None:
    """Check that ``builtin.model.device`` exists on this machine; return how it is found (None for the CPU)."""
    if not device.startswith("cuda"):
        return None
    import torch

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    index = int(device[5:]) if device.startswith("cuda:") else 0
    if index >= count:
        raise InvalidArgumentError(
            f"builtin.model.device: {device!r}, but this machine has "
            + (f"{count} CUDA device(s)" if count else "no CUDA device")
            + ". Set builtin.model.device: auto (CUDA when there is one) or cpu, or run on a machine with the GPU."
        )
    return f"  device: {device} ({torch.cuda.get_device_name(index)})"


def check_run(config: TrainConfig) -> list[str]:
    """Build and check what a run of ``config`` builds before training; return the plan's extra lines.

    Raises:
        SearchGymError: naming the field and the fix, for anything that would stop the run.
    """
    lines = []
    _check_writable(Path(config.output_dir), "builtin.output_dir")
    if config.model.path is not None:
        lines.append(f"  model: {check_model_path(config.model.path)}")
    device = check_device(config.model.device)
    if device is not None:
        lines.append(device)
    if config.model.autocast != "off":  # the check needs torch, which a plain dry run does not load
        from .grpo.model import autocast_warning, resolve_device

        if (warning := autocast_warning(config.model, resolve_device(config.model.device))) is not None:
            lines.append(f"  warning: {warning}")
    if config.algo.ptx_data is not None and not Path(config.algo.ptx_data).is_file():
        raise DataFileError(f"builtin.algo.ptx_data: {config.algo.ptx_data!r} is not a file.")
    memory = _check_memory(config)
    _check_env(config.env, "env", memory, config.memory)
    extra = config.extra_envs()
    for field, env in extra.items():
        _check_env(env, field)
    lines.append(
        "  checked: the env"
        + "".join(f" and the {field.split('.')[0]} env" for field in extra)
        + ", data and corpus files, model, memory store and output folder"
    )
    lines.append(work_estimate(config))
    lines.append(
        time_estimate(config)
        or "  expected time: not estimated before a first run (a run's checkpoints record its step times)"
    )
    return lines
