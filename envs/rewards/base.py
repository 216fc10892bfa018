"""The reward-scheme interface and shared helpers."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar

from ...error import InvalidArgumentError
from ..records import Trajectory

__all__ = ["RewardScheme"]


class RewardScheme(ABC):
    """A terminal reward: a picklable callable of one finished :class:`Trajectory`.

    Subclasses set ``name`` (the registry key), validate their keyword arguments in
    ``__init__``, and implement ``__call__``. A scheme reads only the trajectory record
    (and, for LightSearcher, its own per-question store).

    A scheme that learns across episodes (LightSearcher) overrides :meth:`state_dict` and
    :meth:`load_state_dict`, so a checkpoint stores its state as JSON data, never as a pickle.
    """

    name: ClassVar[str] = ""
    shared_store: ClassVar[str | None] = None
    """The keyword argument that takes the scheme's per-question store, which every rollout
    of a run must share (a log file path, or a
    :class:`~searchgym.envs.rewards.min_tool_calls.MinToolCalls` such as a Ray actor's
    client); ``None`` for a scheme that keeps no such store. Trainers ask this instead of
    knowing scheme names."""

    @abstractmethod
    def __call__(self, trajectory: Trajectory) -> float:
        """The terminal reward of ``trajectory``."""

    def state_dict(self) -> dict[str, Any]:
        """What the scheme learned so far, as JSON-serialisable data (``{}``: it learns nothing)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned.

        Raises:
            InvalidArgumentError: ``state`` is not a state of this scheme.
        """
        if state != {}:
            raise InvalidArgumentError(
                f"{type(self).__name__} keeps no state, got {sorted(state) if isinstance(state, dict) else state!r}."
            )

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={v!r}" for k, v in vars(self).items() if not k.startswith("_"))
        return f"{type(self).__name__}({fields})"
