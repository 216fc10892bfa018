"""Pieces of running one searchgym episode under an external trainer, shared by its backends.

The OpenRLHF agent (:mod:`searchgym.trainers.openrlhf.agent`) and the verl agent loop
(:mod:`searchgym.trainers.verl.agent_loop`) both start an episode from a training row's
``label`` (:func:`label_to_options`) and end one that ran out of token budget as truncated
(:func:`end_truncated`).
"""

from __future__ import annotations

import json
from typing import Any

from ..error import InvalidArgumentError

__all__ = ["EPISODE_METRIC_KEYS", "end_truncated", "label_to_options", "trajectory_metrics"]

EPISODE_METRIC_KEYS = (
    "num_searches",
    "searched",
    "em",
    "f1",
    "cover_em",
    "format_ok",
    "answered",
    "episode_truncated",
    "turns",
    "reasoning_steps",
    "action_chars",
    "format_errors",
    "retrieval_errors",
    "memory_chars",
    "failed",
)
"""The numbers every backend reports per episode (floats), in this order."""


def label_to_options(label: object) -> dict[str, Any]:
    """A training row's ``label`` as ``reset`` options (``question``, ``golden_answers``, ``id``).

    Accepts the JSON string ``searchgym prepare`` writes, or the same object already decoded.

    Raises:
        InvalidArgumentError: not JSON, not an object, or ``question``/``golden_answers``
            missing or of the wrong type (the message shows the label).
    """
    how = (
        'Each row\'s label must be a JSON object {"id", "question", "golden_answers"}: write the '
        "training file with `searchgym prepare` and pass --data.label_key label."
    )
    data = label
    if isinstance(label, str):
        try:
            data = json.loads(label)
        except json.JSONDecodeError as exc:
            raise InvalidArgumentError(f"The label {label!r:.200} is not JSON ({exc.msg}). {how}") from exc
    if not isinstance(data, dict):
        raise InvalidArgumentError(f"The label {label!r:.200} is not a JSON object. {how}")
    question, golds = data.get("question"), data.get("golden_answers")
    if isinstance(golds, str):
        golds = [golds]
    if not isinstance(question, str) or not question.strip():
        raise InvalidArgumentError(f"The label {label!r:.200} has no non-empty 'question'. {how}")
    if not isinstance(golds, list) or not golds or not all(isinstance(g, str) for g in golds):
        raise InvalidArgumentError(
            f"The label {label!r:.200} needs 'golden_answers', a list of strings. {how}"
        )
    return {"question": question, "golden_answers": list(golds), "id": str(data.get("id", "custom"))}


def end_truncated(env: Any) -> float:
    """End ``env``'s running episode as truncated and return the scheme's reward for it."""
    base = env.unwrapped
    truncate = getattr(base, "truncate", None)
    if callable(truncate):  # a public way to do this, when the env offers one
        return float(truncate())
    trajectory = base.trajectory
    trajectory.truncated = True
    reward = float(base.reward_scheme(trajectory))
    trajectory.reward = reward
    base._done = True
    layer = env
    while layer is not base:  # let the memory wrapper record the finished episode
        memory, record = getattr(layer, "memory", None), getattr(layer, "record", False)
        if memory is not None and record and callable(getattr(memory, "add", None)):
            try:
                memory.add(trajectory)
            except Exception:  # noqa: BLE001 - a memory failure must not lose the sample
                pass
            break
        layer = layer.env
    return reward


def trajectory_metrics(trajectory: Any, done: bool) -> dict[str, float]:
    """The per-episode numbers every backend logs, from the env's trajectory record.

    ``searched`` is Light-Search's search rate (SR) and ``num_searches`` its search turns
    (ST); ``episode_truncated`` is an episode that ended (``done``) without an answer.
    """
    searches = trajectory.num_searches
    answered = bool(trajectory.turns) and trajectory.turns[-1].action.kind == "answer"
    return {
        "num_searches": float(searches),
        "searched": float(searches > 0),
        "em": float(trajectory.em),
        "f1": float(trajectory.f1),
        "cover_em": float(trajectory.cover_em),
        "format_ok": float(trajectory.format_ok),
        "answered": float(answered),
        "episode_truncated": float(done and not answered),
        "turns": float(len(trajectory.turns)),
        "reasoning_steps": float(trajectory.reasoning_steps),
        "action_chars": float(trajectory.action_chars),
    }
