"""Nested config sections as dotted keys, shared by the backends' launchers."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..error import InvalidArgumentError

__all__ = ["flatten"]


def flatten(section: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested keys joined with dots: ``{"algo": {"kl": {"use_loss": True}}}`` → ``{"algo.kl.use_loss": True}``."""
    out: dict[str, Any] = {}
    for key, value in section.items():
        if not isinstance(key, str) or not key:
            raise InvalidArgumentError(
                f"config keys must be non-empty strings, got {key!r} under {prefix!r}."
            )
        name = f"{prefix}.{key}" if prefix else key
        if isinstance(value, Mapping):
            out.update(flatten(value, name))
        else:
            out[name] = value
    return out
