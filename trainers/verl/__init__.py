"""The verl backend (target: verl 0.9.1): searchgym envs as a verl agent loop.

- :mod:`.agent_loop`: ``SearchGymAgentLoop``, registered in verl as ``searchgym`` (imports
  verl, torch and transformers, so it is loaded only when asked for).

Nothing here imports verl until it is used.
"""

from __future__ import annotations

from typing import Any

__all__ = ["SearchGymAgentLoop", "EVAL_MARKER", "METRIC_KEYS"]

_LAZY = {"SearchGymAgentLoop", "EVAL_MARKER", "METRIC_KEYS"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        from . import agent_loop

        return getattr(agent_loop, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
