"""Trajectory records to and from JSON-safe dicts, for the memory stores.

:func:`trajectory_to_dict` writes every field of a :class:`~searchgym.envs.records.Trajectory`
(the question with its ``known``/``hops``, the protocol, each turn's action text, parsed
action, documents and observation, ``truncated`` and the terminal ``reward``);
:func:`trajectory_from_dict` reads it back into an equal record. Derived figures (F1,
number of searches, ...) are not stored: they are properties of the record.

Layout of one serialised trajectory::

    {"question": {"id", "question", "golden_answers": [...], "known", "hops"},
     "protocol": "tool_call",
     "turns": [{"action_text", "observation",
                "action": {"kind", "query", "answer", "error", "format_ok",
                           "think_blocks", "answer_blocks"},
                "docs": [{"id", "title", "text", "score"}, ...]}, ...],
     "truncated": false, "reward": 1.0}
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from ..envs.records import Action, Question, Trajectory, Turn
from ..error import InvalidArgumentError
from ..retrieval.records import Doc

__all__ = ["trajectory_to_dict", "trajectory_from_dict"]

_KINDS = ("search", "answer", "invalid")


def _doc_to_dict(doc: Doc) -> dict[str, Any]:
    return {"id": doc.id, "title": doc.title, "text": doc.text, "score": float(doc.score)}


def _action_to_dict(action: Action) -> dict[str, Any]:
    return {
        "kind": action.kind,
        "query": action.query,
        "answer": action.answer,
        "error": action.error,
        "format_ok": action.format_ok,
        "think_blocks": action.think_blocks,
        "answer_blocks": action.answer_blocks,
    }


def trajectory_to_dict(trajectory: Trajectory) -> dict[str, Any]:
    """A JSON-safe dict holding every field of ``trajectory`` (see the module docstring).

    Raises:
        InvalidArgumentError: ``trajectory`` is not a :class:`Trajectory`, or its reward is
            not a finite number (JSON has no NaN).
    """
    if not isinstance(trajectory, Trajectory):
        raise InvalidArgumentError(
            f"Expected a searchgym Trajectory, got {type(trajectory).__name__}: pass "
            "env.unwrapped.trajectory after the episode ends."
        )
    reward = trajectory.reward
    if reward is not None and not math.isfinite(reward):
        raise InvalidArgumentError(f"The trajectory's reward must be finite to be stored, got {reward!r}.")
    q = trajectory.question
    return {
        "question": {
            "id": q.id,
            "question": q.question,
            "golden_answers": list(q.golden_answers),
            "known": q.known,
            "hops": q.hops,
        },
        "protocol": trajectory.protocol,
        "turns": [
            {
                "action_text": turn.action_text,
                "action": _action_to_dict(turn.action),
                "docs": [_doc_to_dict(d) for d in turn.docs],
                "observation": turn.observation,
            }
            for turn in trajectory.turns
        ],
        "truncated": trajectory.truncated,
        "reward": None if reward is None else float(reward),
    }


# -- reading ---------------------------------------------------------------------------------


class _Reader:
    """Typed field access that names the path of a missing or mistyped field."""

    def __init__(self, data: object, where: str):
        if not isinstance(data, Mapping):
            raise InvalidArgumentError(
                f"Trajectory record field {where or '<root>'!r} must be a JSON object, "
                f"got {type(data).__name__}."
            )
        self.data = data
        self.where = where

    def _path(self, key: str) -> str:
        return f"{self.where}.{key}" if self.where else key

    def get(self, key: str, types: type | tuple[type, ...], *, optional: bool = False) -> Any:
        if key not in self.data:
            if optional:
                return None
            raise InvalidArgumentError(
                f"Trajectory record is missing field {self._path(key)!r}; it was not written by "
                "searchgym.memory.trajectory_to_dict (or was edited by hand)."
            )
        value = self.data[key]
        if value is None and optional:
            return None
        wanted = types if isinstance(types, tuple) else (types,)
        bad_bool = isinstance(value, bool) and bool not in wanted
        if bad_bool or not isinstance(value, wanted):
            names = " or ".join(t.__name__ for t in wanted)
            raise InvalidArgumentError(
                f"Trajectory record field {self._path(key)!r} must be {names}, got {value!r}."
            )
        return value

    def child(self, key: str) -> _Reader:
        return _Reader(self.get(key, Mapping), self._path(key))

    def items(self, key: str) -> list[_Reader]:
        values = self.get(key, list)
        return [_Reader(v, f"{self._path(key)}[{i}]") for i, v in enumerate(values)]


def _read_action(r: _Reader) -> Action:
    kind = r.get("kind", str)
    if kind not in _KINDS:
        raise InvalidArgumentError(
            f"Trajectory record field {r.where}.kind must be one of {_KINDS}, got {kind!r}."
        )
    return Action(
        kind=kind,
        query=r.get("query", str, optional=True),
        answer=r.get("answer", str, optional=True),
        error=r.get("error", str, optional=True),
        format_ok=r.get("format_ok", bool),
        think_blocks=r.get("think_blocks", int),
        answer_blocks=r.get("answer_blocks", int),
    )


def _read_doc(r: _Reader) -> Doc:
    return Doc(
        id=r.get("id", str),
        title=r.get("title", str),
        text=r.get("text", str),
        score=float(r.get("score", (int, float))),
    )


def trajectory_from_dict(data: Mapping[str, Any]) -> Trajectory:
    """Rebuild the :class:`Trajectory` written by :func:`trajectory_to_dict`.

    ``known`` and ``hops`` of the question may be absent (``None``); every other field is
    required.

    Raises:
        InvalidArgumentError: a field is missing or has the wrong type; the message names
            its path, e.g. ``turns[2].action.kind``.
    """
    root = _Reader(data, "")
    q = root.child("question")
    golds = q.get("golden_answers", list)
    if not golds or not all(isinstance(g, str) for g in golds):
        raise InvalidArgumentError(
            f"Trajectory record field 'question.golden_answers' must be a non-empty list of str, got {golds!r}."
        )
    question = Question(
        id=q.get("id", str),
        question=q.get("question", str),
        golden_answers=tuple(golds),
        known=q.get("known", bool, optional=True),
        hops=q.get("hops", int, optional=True),
    )
    turns = [
        Turn(
            action_text=t.get("action_text", str),
            action=_read_action(t.child("action")),
            docs=[_read_doc(d) for d in t.items("docs")],
            observation=t.get("observation", str),
        )
        for t in root.items("turns")
    ]
    reward = root.get("reward", (int, float), optional=True)
    return Trajectory(
        question=question,
        protocol=root.get("protocol", str),
        turns=turns,
        truncated=root.get("truncated", bool),
        reward=None if reward is None else float(reward),
    )
