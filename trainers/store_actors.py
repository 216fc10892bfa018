"""The store actors living in a Ray cluster: list them, find those that serve a store, end one.

A store actor (:class:`~searchgym.trainers.ray_store.StoreServer`) keeps its SQLite files
open. One that outlives its run (a detached actor, as the built-in trainer and older
searchgym versions start) would serve the next run the first run's state, and keep writing
to its files after they are moved. So a run looks here before it starts its own actor: an
actor that serves one of its store paths belongs to another run, and the run stops with
the name of that actor and the command that ends it (``searchgym memory actors --kill
NAME``). Every call needs ``ray.init`` first (connected to the cluster).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from ..error import SearchGymError, UnknownNameError, did_you_mean
from .ray_store import NAMESPACE

__all__ = [
    "KILL_COMMAND",
    "StoreActorInfo",
    "StoreInUseError",
    "actors_serving",
    "kill_store_actor",
    "list_store_actors",
]

KILL_COMMAND = "searchgym memory actors --kill"
"""The command that ends a store actor (followed by its name)."""


class StoreInUseError(SearchGymError):
    """Another run's store actor serves a store this run would write."""


@dataclass(frozen=True)
class StoreActorInfo:
    """One store actor as :meth:`StoreServer.describe <searchgym.trainers.ray_store.StoreServer.describe>` tells it.

    Attributes:
        name: Its name in the ``searchgym`` Ray namespace.
        memory_path: The experience memory's folder it serves, or ``None``.
        min_tool_calls_path: The minimum tool-call store it serves, or ``None``.
        settings: The memory's settings (``update_every``, ...).
        owner: The run it belongs to (:class:`~searchgym.trainers.ray_store.StoreOwner` as a
            dict), or ``None`` when none was recorded.
        detached: Whether it outlives its run (``None``: unknown).
        pid: Its process id, or ``None``.
        host: Its machine, or ``""``.
        started: When it started (seconds since the epoch), or ``None``.
        error: Why it could not describe itself (an actor of an older searchgym, or one that
            did not answer), else ``None``.
    """

    name: str
    memory_path: str | None = None
    min_tool_calls_path: str | None = None
    settings: dict[str, Any] = field(default_factory=dict)
    owner: dict[str, Any] | None = None
    detached: bool | None = None
    pid: int | None = None
    host: str = ""
    started: float | None = None
    error: str | None = None

    @property
    def run_id(self) -> str | None:
        """The run it belongs to, or ``None``."""
        return None if self.owner is None else self.owner.get("run_id")

    def paths(self) -> set[str]:
        """The store paths it serves, absolute."""
        return {os.path.abspath(p) for p in (self.memory_path, self.min_tool_calls_path) if p}

    def who(self) -> str:
        """Whose it is, in a few words: ``run 3f2a... (pid 812 on node-0, since 2025-01-02 10:00)``."""
        if self.error is not None:
            return f"unknown run: {self.error}"
        since = time.strftime("%Y-%m-%d %H:%M", time.localtime(self.started)) if self.started else "?"
        run = f"run {self.run_id}" if self.run_id else "no run recorded"
        owner = self.owner or {}
        where = (
            f"started by pid {owner['pid']} on {owner['host']}" if owner else f"pid {self.pid} on {self.host}"
        )
        return f"{run}, {where}, since {since}{', detached' if self.detached else ''}"


def list_store_actors(timeout: float = 10.0) -> list[StoreActorInfo]:
    """Every living actor in the ``searchgym`` namespace, described, by name.

    Args:
        timeout: Seconds to wait for each actor's answer.
    """
    import ray
    from ray.exceptions import GetTimeoutError, RayActorError

    names = sorted(
        a["name"] for a in ray.util.list_named_actors(all_namespaces=True) if a.get("namespace") == NAMESPACE
    )
    out = []
    for name in names:
        try:
            handle = ray.get_actor(name, namespace=NAMESPACE)
        except ValueError:
            continue  # it ended meanwhile
        try:
            data = ray.get(handle.describe.remote(), timeout=timeout)
        except AttributeError:
            out.append(
                StoreActorInfo(name, error="an actor of an older searchgym, which cannot describe itself")
            )
            continue
        except GetTimeoutError:
            out.append(StoreActorInfo(name, error=f"it did not answer within {timeout:g} s"))
            continue
        except RayActorError:
            continue
        out.append(
            StoreActorInfo(
                name,
                memory_path=data.get("memory_path"),
                min_tool_calls_path=data.get("min_tool_calls_path"),
                settings=dict(data.get("settings") or {}),
                owner=data.get("owner"),
                detached=data.get("detached"),
                pid=data.get("pid"),
                host=data.get("host", ""),
                started=data.get("started"),
            )
        )
    return out


def actors_serving(
    paths: Iterable[str], actors: Iterable[StoreActorInfo], *, names: Iterable[str] = ()
) -> list[StoreActorInfo]:
    """The actors among ``actors`` that serve one of ``paths``, or that could not say what they
    serve and are called one of ``names`` (the names this store's actors have had)."""
    wanted = {os.path.abspath(p) for p in paths}
    legacy = tuple(names)
    return [
        a
        for a in actors
        if a.paths() & wanted or (a.error is not None and any(a.name.startswith(n) for n in legacy))
    ]


def kill_store_actor(name: str) -> StoreActorInfo:
    """End the store actor ``name`` (its files stay); returns what it was.

    Raises:
        UnknownNameError: no store actor of that name (the message lists those there are).
    """
    import ray

    actors = {a.name: a for a in list_store_actors()}
    if name not in actors:
        if not actors:
            raise UnknownNameError(
                f"No store actor {name!r}: this Ray cluster has none (namespace {NAMESPACE!r})."
            )
        raise did_you_mean("store actor", name, sorted(actors))
    ray.kill(ray.get_actor(name, namespace=NAMESPACE), no_restart=True)
    return actors[name]
