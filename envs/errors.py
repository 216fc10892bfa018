"""The searchgym exception family.

Every error raised on bad user input derives from :class:`SearchGymError`, so callers can
catch one type. Messages say what was wrong, the value received, and how to fix it.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

__all__ = [
    "SearchGymError",
    "UnknownNameError",
    "InvalidArgumentError",
    "DataFileError",
    "RetrievalError",
    "did_you_mean",
]


class SearchGymError(Exception):
    """Base class of every searchgym error."""


class UnknownNameError(SearchGymError, KeyError):
    """A name (env, reward scheme, protocol, retriever, policy) is not registered."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class InvalidArgumentError(SearchGymError, ValueError):
    """A keyword argument has the wrong type or an out-of-range value."""


class DataFileError(SearchGymError, ValueError):
    """A data or corpus file is missing, empty, or corrupt."""


class RetrievalError(SearchGymError, RuntimeError):
    """A retriever could not answer a query."""


def did_you_mean(kind: str, name: object, known: Iterable[str]) -> UnknownNameError:
    """Build an :class:`UnknownNameError` that lists close matches and all known names."""
    known = sorted(known)
    close = difflib.get_close_matches(str(name), known, n=3, cutoff=0.5)
    hint = f" Did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
    return UnknownNameError(f"Unknown {kind} {name!r}.{hint} Choose one of: {', '.join(known)}.")
