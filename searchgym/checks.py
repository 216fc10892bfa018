"""Argument checks for every folder (retrieval, envs, memory, policies, trainers), in one place.

Each check returns the value it accepted (ints as ``int``, numbers as ``float``) or raises
:class:`ArgumentError`, an :class:`~searchgym.error.InvalidArgumentError` whose
message shows the argument, what it accepts and the value received::

    max_turns must be an int >= 1, got 0.

The trainers' configs turn the same checks into their own field-path messages through
:attr:`ArgumentError.allowed`.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Sequence
from typing import Any, Literal, overload

import numpy as np

from .error import InvalidArgumentError

__all__ = [
    "ArgumentError",
    "check_int",
    "check_number",
    "check_probability",
    "check_string",
    "check_choice",
    "close_match",
]


class ArgumentError(InvalidArgumentError):
    """An argument failed a check.

    Attributes:
        name: The argument (``max_turns``, ``retriever_kwargs['k']``).
        value: The value received.
        allowed: What the argument accepts, in words (``an int >= 1``).
        note: Words added after ``allowed`` (what the value means).
        hint: A sentence after the value (a close match, how to fix it).
    """

    def __init__(self, name: str, value: object, allowed: str, note: str = "", hint: str = ""):
        self.name, self.value, self.allowed, self.note, self.hint = name, value, allowed, note, hint
        super().__init__(f"{name} must be {allowed}{note}, got {value!r:.200}.{' ' + hint if hint else ''}")


def _is_int(value: object) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def _bounds(low: float | None, high: float | None, above: float | None = None) -> str:
    parts = [f"> {above:g}" if above is not None else "", f">= {low:g}" if low is not None else ""]
    parts.append(f"<= {high:g}" if high is not None else "")
    return " and ".join(p for p in parts if p)


@overload
def check_int(
    name: str,
    value: object,
    low: int | None = ...,
    high: int | None = ...,
    *,
    optional: Literal[False] = False,
    note: str = "",
) -> int: ...
@overload
def check_int(
    name: str,
    value: object,
    low: int | None = ...,
    high: int | None = ...,
    *,
    optional: Literal[True],
    note: str = "",
) -> int | None: ...
def check_int(
    name: str,
    value: object,
    low: int | None = None,
    high: int | None = None,
    *,
    optional: bool = False,
    note: str = "",
) -> int | None:
    """``value`` as an ``int`` when it is an int (numpy ints too, never a bool) in
    ``[low, high]``; ``None`` when ``optional`` and ``value`` is None."""
    if value is None and optional:
        return None
    ok = _is_int(value) and (low is None or value >= low) and (high is None or value <= high)  # type: ignore[operator]
    if not ok:
        if low is not None and high is not None:
            allowed = f"an int in [{low}, {high}]"
        else:
            allowed = " ".join(p for p in ("an int", _bounds(low, high)) if p)
        raise ArgumentError(name, value, allowed + (" or None" if optional else ""), note)
    return int(value)  # type: ignore[call-overload]


@overload
def check_number(
    name: str,
    value: object,
    low: float | None = ...,
    high: float | None = ...,
    *,
    above: float | None = ...,
    optional: Literal[False] = False,
    note: str = "",
) -> float: ...
@overload
def check_number(
    name: str,
    value: object,
    low: float | None = ...,
    high: float | None = ...,
    *,
    above: float | None = ...,
    optional: Literal[True],
    note: str = "",
) -> float | None: ...
def check_number(
    name: str,
    value: object,
    low: float | None = None,
    high: float | None = None,
    *,
    above: float | None = None,
    optional: bool = False,
    note: str = "",
) -> float | None:
    """``value`` as a ``float`` when it is a finite int or float (never a bool) with
    ``low <= value <= high`` and ``value > above``; ``None`` when ``optional`` and None."""
    if value is None and optional:
        return None
    number = isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(
        value, (bool, np.bool_)
    )
    ok = (
        number
        and math.isfinite(value)  # type: ignore[arg-type]
        and (low is None or value >= low)  # type: ignore[operator]
        and (high is None or value <= high)  # type: ignore[operator]
        and (above is None or value > above)  # type: ignore[operator]
    )
    if not ok:
        if low is not None and high is not None and above is None:
            allowed = f"a finite number in [{low:g}, {high:g}]"
        else:
            allowed = " ".join(p for p in ("a finite number", _bounds(low, high, above)) if p)
        raise ArgumentError(name, value, allowed + (" or None" if optional else ""), note)
    return float(value)  # type: ignore[arg-type]


def check_probability(name: str, value: object, note: str = "") -> float:
    """``value`` as a ``float`` when it is a number in ``[0, 1]``."""
    return check_number(name, value, 0.0, 1.0, note=note)


@overload
def check_string(name: str, value: object, *, optional: Literal[False] = False, note: str = "") -> str: ...
@overload
def check_string(name: str, value: object, *, optional: Literal[True], note: str = "") -> str | None: ...
def check_string(name: str, value: object, *, optional: bool = False, note: str = "") -> str | None:
    """``value`` when it is a string with something besides white space; ``None`` when
    ``optional`` and None."""
    if value is None and optional:
        return None
    if not isinstance(value, str) or not value.strip():
        raise ArgumentError(name, value, "a non-empty string" + (" or None" if optional else ""), note)
    return value


def close_match(value: object, choices: Sequence[Any], cutoff: float = 0.5) -> str:
    """``Did you mean 'x'?`` for the choice closest to ``value``, or ``""``."""
    names = [str(c) for c in choices]
    close = difflib.get_close_matches(str(value), names, n=1, cutoff=cutoff)
    return f"Did you mean {close[0]!r}?" if close else ""


def check_choice(name: str, value: Any, choices: Sequence[Any], note: str = "") -> Any:
    """``value`` when it is one of ``choices``; the error suggests the closest one."""
    try:
        if value in choices:
            return value
    except TypeError:  # an unhashable value against a set or mapping of choices
        pass
    allowed = "one of " + ", ".join(repr(c) for c in choices)
    raise ArgumentError(name, value, allowed, note, close_match(value, choices))
