"""The agents' side of the run's stores: the Ray store actor's client, or the files.

A run whose episodes write a store (the experience memory, LightSearcher's minimum
tool-call store) keeps it in one Ray actor (:mod:`searchgym.trainers.ray_store`) when
``$SEARCHGYM_STORE_ACTOR`` names one (the OpenRLHF launcher sets it; see
:mod:`searchgym.trainers.openrlhf.cluster`), else in files every process opens itself.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any

from .agent_config import AgentConfig

__all__ = [
    "FILE_STORES",
    "STORE_ACTOR_VARIABLE",
    "remote_env_kwargs",
    "store_actor_name",
    "store_client",
    "store_spec",
]

STORE_ACTOR_VARIABLE = "SEARCHGYM_STORE_ACTOR"
"""The name of the store actor the agents and the trainer use; ``file`` (or unset): file stores."""

FILE_STORES = ("", "file", "none")


def _min_tool_calls_path(config: AgentConfig) -> str | None:
    """The path of the reward scheme's shared store (LightSearcher's minimum of searches), if any."""
    return config.shared_store_path


def _learning_memory(config: AgentConfig) -> Any:
    return config.memory if config.memory is not None and config.memory.learns else None


def store_spec(config: AgentConfig) -> Any:
    """The :class:`~searchgym.trainers.ray_store.StoreSpec` of ``config``, or ``None`` (no shared store)."""
    from .ray_store import StoreSpec

    memory = _learning_memory(config)
    mins = _min_tool_calls_path(config)
    if memory is None and mins is None:
        return None
    return StoreSpec(
        memory_path=None if memory is None else memory.path,
        memory_kwargs={} if memory is None else memory.memory_kwargs(),
        min_tool_calls_path=mins,
    )


def store_actor_name(config: AgentConfig, launch: str | None = None) -> str | None:
    """The store actor's name for ``config``'s store paths and ``launch``, or ``None`` (no store).

    Without ``launch``: the part every actor of these paths shares, ``searchgym-store-<hash>``
    (the whole name of the actors older searchgym versions started).
    """
    memory = None if _learning_memory(config) is None else config.memory.path  # type: ignore[union-attr]
    mins = _min_tool_calls_path(config)
    if memory is None and mins is None:
        return None
    digest = hashlib.sha1(json.dumps([memory, mins]).encode()).hexdigest()[:12]
    return f"searchgym-store-{digest}" if launch is None else f"searchgym-store-{digest}-{launch}"


def store_client(config: AgentConfig) -> Any:
    """A :class:`~searchgym.trainers.ray_store.StoreClient` when ``$SEARCHGYM_STORE_ACTOR`` names an actor.

    Should no actor of that name live yet, the client starts it (not detached) on first use;
    under OpenRLHF the trainer has started it already
    (:func:`~searchgym.trainers.openrlhf.cluster.claim_store_actor`).
    """
    name = os.environ.get(STORE_ACTOR_VARIABLE, "").strip()
    spec = store_spec(config)
    if name.lower() in FILE_STORES or spec is None:
        return None
    from .ray_store import StoreClient

    return StoreClient(name, spec, detached=False)


def remote_env_kwargs(config: AgentConfig, client: Any) -> dict[str, Any]:
    """``config.env_kwargs`` with the reward scheme's shared store served by the actor of ``client``."""
    kwargs = dict(config.env_kwargs)
    keyword = config.shared_store_keyword
    if client is not None and keyword is not None and _min_tool_calls_path(config) is not None:
        from .ray_store import RemoteMinToolCalls

        kwargs["reward_kwargs"] = {**kwargs["reward_kwargs"], keyword: RemoteMinToolCalls(client)}
    return kwargs
