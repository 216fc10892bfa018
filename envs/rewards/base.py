"""The reward-scheme interface and shared helpers."""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from typing import ClassVar

from ..errors import InvalidArgumentError
from ..records import Trajectory

__all__ = ["RewardScheme", "check_number"]


def check_number(name: str, value: object, low: float | None = None, high: float | None = None) -> float:
    """Validate a finite numeric keyword argument, with a message that shows the value received."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidArgumentError(f"{name} must be a number, got {value!r} ({type(value).__name__}).")
    if not math.isfinite(value):
        raise InvalidArgumentError(f"{name} must be a finite number, got {value!r}.")
    if low is not None and value < low:
        raise InvalidArgumentError(f"{name} must be >= {low}, got {value!r}.")
    if high is not None and value > high:
        raise InvalidArgumentError(f"{name} must be <= {high}, got {value!r}.")
    return float(value)


class RewardScheme(ABC):
    """A terminal reward: a picklable callable of one finished :class:`Trajectory`.

    Subclasses set ``name`` (the registry key), validate their keyword arguments in
    ``__init__``, and implement ``__call__``. A scheme reads only the trajectory record
    (and, for LightSearcher, its own per-question store).
    """

    name: ClassVar[str] = ""

    @abstractmethod
    def __call__(self, trajectory: Trajectory) -> float:
        """The terminal reward of ``trajectory``."""

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={v!r}" for k, v in vars(self).items() if not k.startswith("_"))
        return f"{type(self).__name__}({fields})"
