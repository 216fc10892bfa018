"""Tag protocols: how the policy is told the format, and how its actions are read.

Four are registered: ``search_r1`` (Search-R1), ``research`` (ReSearch / ReCall),
``tool_call`` (LightSearcher, HiExp) and ``sem`` (SEM). :func:`make_protocol` builds one
by name; :func:`register_protocol` adds a user-written one.
"""

from __future__ import annotations

import inspect

from ...error import InvalidArgumentError, did_you_mean
from .base import Protocol, neutralise_tags
from .research import ReSearchProtocol
from .search_r1 import SearchR1Protocol
from .sem import SEMProtocol
from .tool_call import ToolCallProtocol

__all__ = [
    # interface
    "Protocol",
    "neutralise_tags",
    # the four formats
    "SearchR1Protocol",
    "ReSearchProtocol",
    "ToolCallProtocol",
    "SEMProtocol",
    # registry
    "PROTOCOLS",
    "register_protocol",
    "make_protocol",
]

PROTOCOLS: dict[str, type[Protocol]] = {}


def register_protocol(cls: type[Protocol]) -> type[Protocol]:
    """Register a :class:`Protocol` subclass under its ``name``; usable as a class decorator.

    Raises:
        InvalidArgumentError: when ``cls`` is not a concrete subclass of :class:`Protocol`,
            its ``name`` is empty, or another class already holds that name.
    """
    if not (isinstance(cls, type) and issubclass(cls, Protocol)):
        raise InvalidArgumentError(
            f"register_protocol expects a subclass of Protocol, got {cls!r} ({type(cls).__name__})."
        )
    if inspect.isabstract(cls):
        missing = ", ".join(sorted(cls.__abstractmethods__))
        raise InvalidArgumentError(f"{cls.__name__} is abstract: implement {missing} before registering it.")
    name = cls.name
    if not isinstance(name, str) or not name.strip():
        raise InvalidArgumentError(f"{cls.__name__}.name must be a non-empty str, got {name!r}.")
    known = PROTOCOLS.get(name)
    if known is not None and known is not cls:
        raise InvalidArgumentError(
            f"The protocol name {name!r} is taken by {known.__name__}; give {cls.__name__} another name."
        )
    PROTOCOLS[name] = cls
    return cls


def make_protocol(name_or_instance: str | Protocol) -> Protocol:
    """A protocol object from a registered name; a :class:`Protocol` instance is returned as is.

    Raises:
        UnknownNameError: for a name that is not registered (with close matches).
        InvalidArgumentError: for anything that is neither a str nor a Protocol.
    """
    if isinstance(name_or_instance, Protocol):
        return name_or_instance
    if isinstance(name_or_instance, str):
        cls = PROTOCOLS.get(name_or_instance)
        if cls is None:
            raise did_you_mean("protocol", name_or_instance, PROTOCOLS)
        return cls()
    raise InvalidArgumentError(
        f"protocol must be a name ({', '.join(sorted(PROTOCOLS))}) or a Protocol object, "
        f"got {name_or_instance!r} ({type(name_or_instance).__name__})."
    )


for _cls in (SearchR1Protocol, ReSearchProtocol, ToolCallProtocol, SEMProtocol):
    register_protocol(_cls)
del _cls
