"""Reward schemes, registered by name, and the group-level shaping functions.

>>> from searchgym.envs.rewards import make_reward
>>> scheme = make_reward("lightsearcher", lam=0.5)
>>> scheme.name
'lightsearcher'

Every scheme is a picklable callable of one :class:`~searchgym.envs.records.Trajectory`
returning a float. Functions that need a whole GRPO group (OTC-GRPO's tool reward,
Light-Search's advantage shaping) are plain functions, exported here too.
"""

from __future__ import annotations

import inspect

from ...checks import check_number
from ...error import InvalidArgumentError, did_you_mean
from .base import RewardScheme
from .cost import CostReward
from .lightsearcher import LightSearcherReward
from .min_tool_calls import MinToolCalls, MinToolCallStore
from .otc import OTCReward, otc_grpo_tool_rewards, otc_ppo_tool_reward
from .outcome import ExactMatchReward, F1Reward, OutcomeReward
from .sem import SEMReward
from .tsas import TSAS_VARIANTS, tsas_advantages, tsas_stage

__all__ = [
    # registry
    "REWARDS",
    "register_reward",
    "make_reward",
    "reward_class",
    "check_reward_kwargs",
    # interface
    "RewardScheme",
    "check_number",
    # schemes
    "OutcomeReward",
    "ExactMatchReward",
    "F1Reward",
    "OTCReward",
    "LightSearcherReward",
    "SEMReward",
    "CostReward",
    "MinToolCallStore",
    "MinToolCalls",
    # group-level functions
    "otc_ppo_tool_reward",
    "otc_grpo_tool_rewards",
    "TSAS_VARIANTS",
    "tsas_advantages",
    "tsas_stage",
]

REWARDS: dict[str, type[RewardScheme]] = {}
"""Registered reward schemes by name."""


def register_reward(cls: type[RewardScheme]) -> type[RewardScheme]:
    """Register a :class:`RewardScheme` subclass under its ``name``; usable as a decorator.

    Registering the same class again is a no-op; another class under a taken name is an
    error.

    Raises:
        InvalidArgumentError: ``cls`` is not a RewardScheme subclass, has no ``name``, or its
            name is taken by another class.
    """
    if not (isinstance(cls, type) and issubclass(cls, RewardScheme)):
        raise InvalidArgumentError(f"register_reward expects a RewardScheme subclass, got {cls!r}.")
    name = cls.name
    if not isinstance(name, str) or not name:
        raise InvalidArgumentError(
            f"{cls.__name__} has no registry name; set the class attribute name = '...'."
        )
    existing = REWARDS.get(name)
    if existing is not None and existing is not cls:
        raise InvalidArgumentError(
            f"Reward scheme name {name!r} is already taken by {existing.__module__}.{existing.__qualname__}; "
            f"give {cls.__name__} another name."
        )
    REWARDS[name] = cls
    return cls


for _cls in (ExactMatchReward, F1Reward, OTCReward, LightSearcherReward, SEMReward, CostReward):
    register_reward(_cls)
del _cls


def _accepted_kwargs(cls: type[RewardScheme]) -> list[str] | None:
    """Keyword names ``cls`` accepts, or ``None`` when it takes ``**kwargs``."""
    params = inspect.signature(cls.__init__).parameters.values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return None
    return [
        p.name
        for p in params
        if p.name != "self"
        and p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    ]


def reward_class(name: object) -> type[RewardScheme]:
    """The registered scheme class called ``name``.

    Raises:
        UnknownNameError: no scheme has that name (the message lists close matches).
    """
    cls = REWARDS.get(name) if isinstance(name, str) else None
    if cls is None:
        raise did_you_mean("reward scheme", name, REWARDS)
    return cls


def check_reward_kwargs(name: str, kwargs: object) -> None:
    """Check ``kwargs`` against the parameters of the scheme ``name`` without building it.

    A scheme's parameters are its constructor's keyword arguments, documented in its
    docstring's ``Args:``.

    Raises:
        UnknownNameError: an unknown scheme name, with close matches.
        InvalidArgumentError: ``kwargs`` is not a mapping, or names a parameter the scheme
            does not take (with "did you mean" and the list of those it takes).
    """
    cls = reward_class(name)
    if not isinstance(kwargs, dict):
        raise InvalidArgumentError(f"reward_kwargs must be a mapping, got {kwargs!r:.80}.")
    accepted = _accepted_kwargs(cls)
    if accepted is None:
        return
    for key in kwargs:
        if key not in accepted:
            raise did_you_mean(f"parameter of the reward scheme {name!r}", key, accepted)


def make_reward(name_or_scheme: str | RewardScheme, **kwargs: object) -> RewardScheme:
    """Build a registered reward scheme by name, or pass an instance through.

    Args:
        name_or_scheme: A registered name (see ``REWARDS``) or a :class:`RewardScheme`.
        **kwargs: Keyword arguments of the scheme (only with a name).

    Returns:
        The scheme.

    Raises:
        UnknownNameError: The name is not registered (the message lists close matches).
        InvalidArgumentError: Keyword arguments given with an instance, a keyword the scheme
            does not accept, a bad value, or an argument of another type.
    """
    if isinstance(name_or_scheme, RewardScheme):
        if kwargs:
            raise InvalidArgumentError(
                f"make_reward got an already built {type(name_or_scheme).__name__} together with keyword "
                f"arguments {sorted(kwargs)}; pass its name instead, e.g. "
                f"make_reward({name_or_scheme.name!r}, ...), or build the instance with them."
            )
        return name_or_scheme
    if not isinstance(name_or_scheme, str):
        raise InvalidArgumentError(
            "make_reward expects a registered name or a RewardScheme instance, got "
            f"{name_or_scheme!r} ({type(name_or_scheme).__name__}). Known names: {', '.join(sorted(REWARDS))}."
        )
    cls = REWARDS.get(name_or_scheme)
    if cls is None:
        raise did_you_mean("reward scheme", name_or_scheme, REWARDS)
    accepted = _accepted_kwargs(cls)
    if accepted is not None:
        unknown = sorted(set(kwargs) - set(accepted))
        if unknown:
            raise InvalidArgumentError(
                f"Reward scheme {name_or_scheme!r} does not accept {', '.join(unknown)}; "
                f"it accepts: {', '.join(accepted) if accepted else '(no arguments)'}."
            )
    return cls(**kwargs)
