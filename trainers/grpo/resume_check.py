"""What a resume may change: the run's config against the one its checkpoint was written with.

A run resumed under other settings would continue a run it is not (another reward, group
size or learning rate from step 41 on), and a finished run resumed as it is trains nothing.
:func:`config_changes` lists the settings that differ, leaving out those that do not change
what the run computes (:data:`MAY_CHANGE`), and :func:`check_resume` turns a difference
into one line that names each key, both values and how to go on.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...error import InvalidArgumentError, SearchGymError
from ..run_spec import spec_key

if TYPE_CHECKING:
    from ..config import TrainConfig

__all__ = [
    "ABSENT",
    "MAY_CHANGE",
    "ResumeMismatchError",
    "config_changes",
    "check_resume",
    "finished_message",
    "flatten",
    "saved_config",
]

MAY_CHANGE = (
    "steps",
    "output_dir",
    "log_every",
    "checkpoint.every",
    "checkpoint.keep_last",
    "checkpoint.resume",
    "checkpoint.allow_changes",
    "wandb",
    "model.device",
    "model.cpu_threads",
    "memory.ray_num_cpus",
    "memory.ray_actor",
)
"""Settings (dotted keys, or whole sections) a resume may change: how long the run goes on,
where and how often it logs and saves, and where it runs. Anything else is the run itself.
``steps`` is how a finished run is extended (with ``algo.lr_schedule: cosine``, the schedule
then stretches to the new length)."""


class ResumeMismatchError(InvalidArgumentError):
    """A resume whose config differs from its checkpoint's in settings that change the run.

    Attributes:
        changes: ``{dotted key: (checkpoint value, new value)}``.
    """

    def __init__(self, message: str, changes: Mapping[str, tuple[Any, Any]]):
        super().__init__(message)
        self.changes = dict(changes)


class _Absent:
    def __repr__(self) -> str:
        return "(absent)"


ABSENT: Any = _Absent()
"""The value :func:`config_changes` gives a side that lacks the key."""


def flatten(data: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested mappings as ``{dotted key: value}``; lists and scalars are values.

    Example:
        >>> flatten({"env": {"kwargs": {"reward": "f1"}}, "steps": 4})
        {'env.kwargs.reward': 'f1', 'steps': 4}
    """
    out: dict[str, Any] = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            out.update(flatten(value, name + "."))
        else:
            out[name] = value
    return out


def _may_change(key: str, allowed: Iterable[str]) -> bool:
    return any(key == a or key.startswith(a + ".") for a in allowed)


def config_changes(
    saved: Mapping[str, Any], new: Mapping[str, Any], allow: Iterable[str] = ()
) -> dict[str, tuple[Any, Any]]:
    """The settings of ``new`` that differ from ``saved`` and may not change on a resume.

    Give both as :func:`~searchgym.envs.config_base.to_dict` of a config, so that a
    setting newer than the checkpoint holds its default on both sides; a key only one side
    has (an ``env.kwargs`` option added or dropped) is a change.

    Args:
        saved: The checkpoint's config, as plain data.
        new: The run's config, as plain data.
        allow: More dotted keys or sections that may change (``checkpoint.allow_changes``).

    Returns:
        ``{dotted key: (checkpoint value, new value)}``, sorted by key; a side without the
        key holds :data:`ABSENT`.
    """
    allowed = (*MAY_CHANGE, *allow)
    old, now = flatten(saved), flatten(new)
    changes: dict[str, tuple[Any, Any]] = {}
    for key in sorted(set(old) | set(now)):
        before, after = old.get(key, ABSENT), now.get(key, ABSENT)
        if before != after and not _may_change(key, allowed):
            changes[key] = (before, after)
    return changes


def _value(value: Any) -> str:
    text = repr(value) if isinstance(value, str) else str(value)
    return text if len(text) <= 60 else text[:57] + "..."


def check_resume(
    checkpoint: Path,
    saved: Mapping[str, Any],
    new: Mapping[str, Any],
    *,
    output_dir: Path,
    allow: Iterable[str] = (),
) -> None:
    """Refuse a resume under settings that change the run.

    Args:
        checkpoint: The checkpoint folder (named in the message).
        saved: Its config, as plain data.
        new: The run's config, as plain data.
        output_dir: The run's output folder (named in the advice).
        allow: More keys that may change (``checkpoint.allow_changes``).

    Raises:
        ResumeMismatchError: one line: each differing key as ``key: old → new``, and how to
            start afresh or continue anyway.
    """
    changes = config_changes(saved, new, allow)
    if not changes:
        return
    listed = "; ".join(
        f"{spec_key(key)}: {_value(old)} → {_value(now)}" for key, (old, now) in changes.items()
    )
    raise ResumeMismatchError(
        f"{output_dir} holds a run written with another config (checkpoint {checkpoint.name}): {listed}. "
        f"Resuming would continue that run under other settings. To start afresh, choose another "
        f"output_dir (or move {output_dir / 'checkpoints'} aside); to continue it anyway, list these keys "
        f"under builtin.checkpoint.allow_changes.",
        changes,
    )


def saved_config(file: Path, config_type: type[TrainConfig]) -> dict[str, Any]:
    """A checkpoint's ``config.yaml`` as plain data, with the defaults of settings it lacks.

    The file is read through ``config_type.from_dict`` so that a setting newer than the
    checkpoint holds its default; a file that no longer loads (a setting since removed) is
    compared as written.
    """
    from ...envs.config_base import plain, read_yaml

    data = read_yaml(file, extends=False)
    try:
        return plain(config_type.from_dict(data))
    except SearchGymError:
        return data


def finished_message(output_dir: Path, checkpoint: Path | None, step: int, steps: int) -> str:
    """The line for a resume of a run that already has ``steps`` steps (nothing to train)."""
    where = f" (checkpoint {checkpoint.name})" if checkpoint is not None else ""
    return (
        f"{output_dir} is a finished run: it has {step} steps{where} and the config asks for {steps}, so "
        f"there is nothing to train. To train further, raise steps above {step} and run again; to start "
        f"afresh, choose another output_dir."
    )
