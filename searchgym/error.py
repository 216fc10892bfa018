"""The searchgym exception family.

Every error raised on bad user input derives from :class:`SearchGymError`, so callers can
catch one type. Messages say what was wrong, the value received, and how to fix it.

This module imports nothing of searchgym: retrieval, storage, envs, memory, policies and
trainers all raise these errors, so the family sits below them all.
"""

from __future__ import annotations

import difflib
import functools
import inspect
from collections.abc import Callable, Iterable
from typing import Any

__all__ = [
    "SearchGymError",
    "UnknownNameError",
    "InvalidArgumentError",
    "DataFileError",
    "RetrievalError",
    "did_you_mean",
    "UnknownArgumentError",
    "keyword_checked",
]


class SearchGymError(Exception):
    """Base class of every searchgym error."""


class UnknownNameError(SearchGymError, KeyError):
    """A name (env, reward scheme, protocol, retriever, policy) is not registered."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class UnknownArgumentError(UnknownNameError, TypeError):
    """A keyword argument the callee does not take (a ``TypeError``, as Python's own)."""


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


def keyword_checked(init: Callable[..., None]) -> Callable[..., None]:
    """Wrap a class's ``__init__`` so an unknown keyword argument is a did-you-mean error.

    Python's own ``TypeError`` ("got an unexpected keyword argument 'top_k'") names neither
    the close match nor the arguments there are; this one does, and is still a ``TypeError``.
    """
    signature = inspect.signature(init)
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in signature.parameters.values()):
        return init
    names = [
        p.name
        for p in signature.parameters.values()
        if p.kind in (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    ][1:]  # not self

    @functools.wraps(init)
    def checked(self: Any, *args: Any, **kwargs: Any) -> None:
        for key in kwargs:
            if key not in names:
                close = difflib.get_close_matches(key, names, n=3, cutoff=0.5)
                hint = f" Did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
                raise UnknownArgumentError(
                    f"Unknown argument {key!r} of {type(self).__name__}.{hint} "
                    f"Choose from: {', '.join(sorted(names))}."
                )
        init(self, *args, **kwargs)

    return checked
