"""The figures of one step's rollouts, named as in the papers and in ``searchgym eval``.

=====================  ==========================================================
key                    meaning
=====================  ==========================================================
``reward``             mean terminal reward
``em``, ``f1``         mean exact match and F1 of the final answers
``st``, ``sd``         mean and (population) std of searches per episode
``sr``                 share of episodes with at least one search
``format_ok``          share of well-formed episodes (every turn parsed)
``format_ok_turns``    share of well-formed turns, over all the step's turns
``turns``              mean actions per episode
``action_tokens``      mean tokens the policy wrote per episode (the trained tokens)
``total_tokens``       mean tokens per episode (prompt, actions and feedback)
``retrieval_errors``   searches that failed, summed over the step
``context_exhausted``  share of episodes that ran out of context budget
``sr_known``, …        ``sr`` and ``f1`` on known/unknown questions, where the env says
=====================  ==========================================================
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .rollout import Episode

__all__ = ["rollout_metrics"]


def _well_formed_turns(episodes: Sequence[Episode]) -> float:
    turns = [t for e in episodes if e.trajectory is not None for t in e.trajectory.turns]
    return float(np.mean([t.action.format_ok for t in turns])) if turns else 0.0


def rollout_metrics(episodes: Sequence[Episode]) -> dict[str, float]:
    """The step's figures (see the module docstring); empty for no episodes."""
    if not episodes:
        return {}
    info = [e.info for e in episodes]
    searches = np.array([i.get("num_searches", 0) for i in info], dtype=float)
    out = {
        "reward": float(np.mean([e.reward for e in episodes])),
        "em": float(np.mean([i.get("em", 0.0) for i in info])),
        "f1": float(np.mean([i.get("f1", 0.0) for i in info])),
        "st": float(searches.mean()),
        "sd": float(searches.std()),
        "sr": float((searches > 0).mean()),
        "format_ok": float(np.mean([bool(i.get("format_ok", False)) for i in info])),
        "format_ok_turns": _well_formed_turns(episodes),
        "turns": float(np.mean([i.get("turn", 0) for i in info])),
        "action_tokens": float(np.mean([e.action_tokens for e in episodes])),
        "total_tokens": float(np.mean([len(e.token_ids) for e in episodes])),
        "retrieval_errors": float(sum(e.retrieval_errors for e in episodes)),
        "context_exhausted": float(np.mean([e.context_exhausted for e in episodes])),
    }
    for split, flag in (("known", True), ("unknown", False)):
        chosen = [k for k, i in enumerate(info) if i.get("known") is flag]
        if chosen:
            out[f"sr_{split}"] = float((searches[chosen] > 0).mean())
            out[f"f1_{split}"] = float(np.mean([info[k].get("f1", 0.0) for k in chosen]))
    return out
