"""Argument checks shared by the memory modules, with messages that show the value received."""

from __future__ import annotations

import math
from typing import Literal, overload

from ..envs.errors import InvalidArgumentError

__all__ = ["check_int", "check_finite"]


@overload
def check_int(
    name: str, value: object, low: int, *, optional: Literal[False] = False, note: str = ""
) -> int: ...
@overload
def check_int(
    name: str, value: object, low: int, *, optional: Literal[True], note: str = ""
) -> int | None: ...
def check_int(name: str, value: object, low: int, *, optional: bool = False, note: str = "") -> int | None:
    """``value`` when it is an int (not a bool) ``>= low``, or ``None`` when ``optional``.

    Raises:
        InvalidArgumentError: "``{name} must be an int >= {low}[ or None]{note}, got {value!r}.``"
    """
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise InvalidArgumentError(
            f"{name} must be an int >= {low}{' or None' if optional else ''}{note}, got {value!r}."
        )
    return value


def check_finite(name: str, value: object) -> float:
    """``value`` as a float when it is a finite int or float (not a bool).

    Raises:
        InvalidArgumentError: "``{name} must be a finite number, got {value!r}.``"
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise InvalidArgumentError(f"{name} must be a finite number, got {value!r}.")
    return float(value)
