"""Secrets of an OpenRLHF run (the W&B key): passed through the environment, never printed.

OpenRLHF 0.11.2 turns W&B on when ``--logger.wandb.key`` is set, and its ``WandbLogger`` calls
``wandb.login(key=...)`` only when wandb finds no key of its own (``WANDB_API_KEY`` first).
Given on the command line, the key would show in ``ps``, in the printed launch command, in
OpenRLHF's printout of its arguments and in the W&B run's config. So the flag carries
:data:`KEY_PLACEHOLDER`, and the key travels as ``WANDB_API_KEY``: in the launching process's
environment, in the Ray runtime env of the job, and, where a printed command must hold it, as
a ``"$WANDB_API_KEY"`` reference the shell fills in.

In a run file, ``openrlhf.logger.wandb.key: true`` takes the key from ``$WANDB_API_KEY`` where
the run is launched; a literal key is accepted too and handled the same way.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Mapping, Sequence
from typing import Any

from ...error import InvalidArgumentError

__all__ = ["KEY_FLAG", "KEY_PLACEHOLDER", "KEY_VARIABLE", "redacted_shell", "take_wandb_key"]

KEY_FLAG = "logger.wandb.key"
"""The OpenRLHF flag that turns W&B on."""
KEY_VARIABLE = "WANDB_API_KEY"
"""Where wandb looks for the key first."""
KEY_PLACEHOLDER = "True"
"""What ``--logger.wandb.key`` carries: any non-empty value turns W&B on in OpenRLHF."""


def take_wandb_key(
    flat: dict[str, Any], environ: Mapping[str, str] | None = None
) -> tuple[dict[str, str], list[str]]:
    """Replace the W&B key in the dotted ``flat`` flags by :data:`KEY_PLACEHOLDER`.

    Args:
        flat: The run's dotted OpenRLHF flags, changed in place.
        environ: Where ``key: true`` reads the key (default: ``os.environ``).

    Returns:
        The secrets to pass through the environment (``{"WANDB_API_KEY": key}``, or empty),
        and warnings for the dry run.

    Raises:
        InvalidArgumentError: a key that is neither true, false, null nor a string.
    """
    value = flat.get(KEY_FLAG)
    if value is None or value is False or value == "":
        flat.pop(KEY_FLAG, None)
        return {}, []
    if value is True:
        key = (environ if environ is not None else os.environ).get(KEY_VARIABLE, "")
        flat[KEY_FLAG] = KEY_PLACEHOLDER
        if not key:
            return {}, [
                f"searchgym: openrlhf.{KEY_FLAG} is true but ${KEY_VARIABLE} is not set here: export it "
                "before launching, or the run stops before it starts."
            ]
        return {KEY_VARIABLE: key}, []
    if not isinstance(value, str):
        raise InvalidArgumentError(
            f"openrlhf.{KEY_FLAG} must be true (the key from ${KEY_VARIABLE}), a key, or null; got {value!r}."
        )
    flat[KEY_FLAG] = KEY_PLACEHOLDER
    return {KEY_VARIABLE: value}, []


def redacted_shell(parts: Sequence[str], secrets: Mapping[str, str], env: Mapping[str, str] = {}) -> str:
    """``parts`` as one shell line, with ``env`` in front and each secret's value written as
    ``"$NAME"``: pasted into a shell that exports the secret, the line runs the same command."""
    words = [f"{k}={_quote(v, secrets)}" for k, v in env.items()]
    return " ".join(words + [_quote(part, secrets) for part in parts])


def _quote(text: str, secrets: Mapping[str, str]) -> str:
    by_value = {value: name for name, value in secrets.items() if value}
    if not any(value in text for value in by_value):
        return shlex.quote(text)
    pattern = "(" + "|".join(re.escape(v) for v in sorted(by_value, key=len, reverse=True)) + ")"
    out = []
    for i, piece in enumerate(re.split(pattern, text)):
        if i % 2:
            out.append(f'"${by_value[piece]}"')
        elif piece:
            out.append(shlex.quote(piece))
    return "".join(out)
