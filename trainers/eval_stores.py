"""Evaluation episodes keep out of the run's stores, under every backend.

An evaluation episode plays on the same env as a training one but must not write its
episodes into the experience memory or lower the minimum tool-call store: the backend
tells the two apart (OpenRLHF by the sampling temperature,
:mod:`searchgym.trainers.openrlhf.eval_split`; verl by a mark in the row), and the agent
calls :func:`keep_out_of_stores` on the env for the episode and :func:`put_back` after it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .agent_config import AgentConfig

__all__ = ["ReadOnlyStore", "keep_out_of_stores", "put_back", "stores_written"]


class ReadOnlyStore:
    """A minimum tool-call store that an evaluation episode reads but does not update."""

    def __init__(self, store: Any):
        self.store = store

    def get(self, qid: str) -> int | None:
        return self.store.get(qid)

    def update(self, qid: str, m: int) -> None:
        """Evaluation does not lower the training minimum."""

    def lookup_and_lower(self, qid: str, m: int | None) -> int | None:
        """The training minimum for ``qid``, left as it is."""
        return self.store.lookup_and_lower(qid, None)

    def minima(self) -> dict[str, int]:
        return self.store.minima()


def keep_out_of_stores(env: Any) -> list[tuple[Any, str, Any]]:
    """Stop ``env`` from writing its episodes (memory recording, minimum tool-call store).

    Returns the ``(object, attribute, old value)`` triples that :func:`put_back` restores.
    """
    changed: list[tuple[Any, str, Any]] = []
    layer = env
    while layer is not None:
        if getattr(layer, "memory", None) is not None and getattr(layer, "record", False):
            changed.append((layer, "record", True))
            layer.record = False
        inner = getattr(layer, "env", None)
        layer = inner if inner is not layer else None
    scheme: Any = getattr(env.unwrapped, "reward_scheme", None)
    store = getattr(scheme, "store", None)
    if scheme is not None and store is not None and callable(getattr(store, "update", None)):
        changed.append((scheme, "store", store))
        scheme.store = ReadOnlyStore(store)
    return changed


def put_back(changed: list[tuple[Any, str, Any]]) -> None:
    """Undo :func:`keep_out_of_stores`."""
    for obj, name, value in reversed(changed):
        setattr(obj, name, value)


def stores_written(config: AgentConfig) -> str:
    """What the episodes of ``config`` write into, in words ("" for nothing)."""
    stores = []
    if config.memory is not None and config.memory.learns:
        stores.append(f"the experience memory ({config.memory.path})")
    if config.shared_store_path is not None:
        stores.append(f"the minimum tool-call store ({config.shared_store_path})")
    return " and ".join(stores)
