"""Run a policy over env episodes and report the papers' metrics."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import gymnasium as gym
import numpy as np
from tqdm.auto import tqdm

from ..checks import check_int
from ..error import InvalidArgumentError
from .base import Policy

__all__ = ["EpisodeRecord", "EvalResult", "evaluate", "summarise", "format_table"]


@dataclass(frozen=True)
class EpisodeRecord:
    """The final figures of one episode."""

    question_id: str
    em: float
    f1: float
    cover_em: float
    num_searches: int
    format_ok: bool
    action_chars: int
    reward: float
    known: bool | None = None
    hops: int | None = None

    @classmethod
    def from_info(cls, info: dict[str, Any], reward: float) -> EpisodeRecord:
        """The record of an episode from the env's last ``info`` and its terminal reward."""
        return cls(
            question_id=str(info.get("question_id", "")),
            em=float(info["em"]),
            f1=float(info["f1"]),
            cover_em=float(info["cover_em"]),
            num_searches=int(info["num_searches"]),
            format_ok=bool(info["format_ok"]),
            action_chars=int(info["action_chars"]),
            reward=float(reward),
            known=info.get("known"),
            hops=info.get("hops"),
        )


@dataclass
class EvalResult:
    """Aggregate metrics, named as in the papers (lower case in JSON).

    ``st`` is the mean number of searches per question, ``sd`` their (population) standard
    deviation, ``sr`` the share of questions with at least one search, ``format_ok`` the
    share of episodes whose every turn was well formed. ``splits`` repeats the figures per
    subset (``known``/``unknown``, ``1-hop``/``2-hop``) where the env reports them.
    """

    policy: str
    episodes: int
    em: float
    f1: float
    cover_em: float
    st: float
    sd: float
    sr: float
    format_ok: float
    action_chars: float
    reward: float
    wall_time_s: float = 0.0
    splits: dict[str, dict[str, float]] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _figures(records: Sequence[EpisodeRecord]) -> dict[str, float]:
    searches = np.array([r.num_searches for r in records], dtype=float)
    return {
        "episodes": len(records),
        "em": float(np.mean([r.em for r in records])),
        "f1": float(np.mean([r.f1 for r in records])),
        "cover_em": float(np.mean([r.cover_em for r in records])),
        "st": float(searches.mean()),
        "sd": float(searches.std()),
        "sr": float((searches > 0).mean()),
        "format_ok": float(np.mean([r.format_ok for r in records])),
        "action_chars": float(np.mean([r.action_chars for r in records])),
        "reward": float(np.mean([r.reward for r in records])),
    }


def summarise(policy: str, records: Sequence[EpisodeRecord], wall_time_s: float = 0.0) -> EvalResult:
    """Aggregate episode records into an :class:`EvalResult`."""
    if not records:
        raise InvalidArgumentError("No episodes to summarise: run at least one episode.")
    splits: dict[str, dict[str, float]] = {}
    for name, keep in (
        ("known", lambda r: r.known is True),
        ("unknown", lambda r: r.known is False),
        ("1-hop", lambda r: r.hops == 1),
        ("2-hop", lambda r: r.hops == 2),
    ):
        subset = [r for r in records if keep(r)]
        if subset:
            splits[name] = _figures(subset)
    f = _figures(records)
    return EvalResult(
        policy=policy,
        episodes=len(records),
        em=f["em"],
        f1=f["f1"],
        cover_em=f["cover_em"],
        st=f["st"],
        sd=f["sd"],
        sr=f["sr"],
        format_ok=f["format_ok"],
        action_chars=f["action_chars"],
        reward=f["reward"],
        wall_time_s=wall_time_s,
        splits=splits,
    )


def evaluate(
    make_env: Callable[[], gym.Env],
    policy: Policy,
    episodes: int,
    *,
    seed: int = 0,
    batch_size: int = 16,
    progress: bool = True,
) -> EvalResult:
    """Run ``episodes`` episodes of ``policy`` and aggregate their final figures.

    Questions are drawn without replacement in a seeded order (cycling when ``episodes``
    exceeds the dataset). Episodes run ``batch_size`` at a time so that ``policy.act``
    sees a batch of contexts, as a language-model policy would.

    Args:
        make_env: builds one env (called ``min(batch_size, episodes)`` times).
        policy: the policy to run.
        episodes: number of episodes (questions).
        seed: seed of the question order and of each episode's ``reset``.
        batch_size: episodes run side by side.
        progress: show a progress bar.
    """
    check_int("episodes", episodes, 1)
    check_int("batch_size", batch_size, 1)
    envs = [make_env() for _ in range(min(batch_size, episodes))]
    questions = getattr(envs[0].unwrapped, "questions", None)
    if not questions:
        raise InvalidArgumentError(
            f"evaluate needs searchgym envs (with a .questions list); make_env built {envs[0]!r}."
        )
    num_questions = len(questions)
    order = np.random.default_rng(seed).permutation(num_questions)
    indices = [int(order[i % num_questions]) for i in range(episodes)]
    records: list[EpisodeRecord] = []
    start = time.perf_counter()
    with tqdm(total=episodes, desc=f"eval {policy.name}", disable=not progress, unit="ep") as bar:
        for first in range(0, episodes, len(envs)):
            batch = indices[first : first + len(envs)]
            records.extend(_run_batch(envs[: len(batch)], policy, batch, seed + first, bar))
    for env in envs:
        env.close()
    return summarise(policy.name, records, time.perf_counter() - start)


def _run_batch(
    envs: Sequence[gym.Env], policy: Policy, indices: Sequence[int], seed: int, bar: Any = None
) -> list[EpisodeRecord]:
    """Run one batch of episodes to their ends; ``bar`` (a tqdm bar) counts each finished
    episode as it finishes and shows the turn the batch is at."""
    contexts: list[str] = []
    finals: list[EpisodeRecord | None] = [None] * len(envs)
    for i, (env, index) in enumerate(zip(envs, indices, strict=True)):
        observation, _ = env.reset(seed=seed + i, options={"index": index})
        contexts.append(observation)
    active = list(range(len(envs)))
    turn = 0
    while active:
        turn += 1
        if bar is not None:
            bar.set_postfix_str(f"turn {turn}, {len(active)} running")
        actions = policy.act([contexts[i] for i in active])
        if not isinstance(actions, (list, tuple)) or len(actions) != len(active):
            raise InvalidArgumentError(
                f"{type(policy).__name__}.act returned {actions!r:.200}; expected a list of "
                f"{len(active)} action strings, one per context."
            )
        still = []
        for i, action in zip(active, actions, strict=True):
            observation, reward, terminated, truncated, info = envs[i].step(action)
            contexts[i] += action + observation
            if terminated or truncated:
                finals[i] = EpisodeRecord.from_info(info, float(reward))
                if bar is not None:
                    bar.update(1)
            else:
                still.append(i)
        active = still
    return [record for record in finals if record is not None]


_COLUMNS = [
    ("EM", "em", 100),
    ("F1", "f1", 100),
    ("CoverEM", "cover_em", 100),
    ("ST", "st", 1),
    ("SD", "sd", 1),
    ("SR", "sr", 100),
    ("Format", "format_ok", 100),
    ("Chars", "action_chars", 1),
    ("Reward", "reward", 1),
]


def format_table(results: Sequence[EvalResult]) -> str:
    """A markdown table, one row per result and per split (scores in %, as the papers print them)."""
    header = ["Policy", "Split", "N"] + [c[0] for c in _COLUMNS] + ["Time (s)"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for result in results:
        rows = [("all", result.to_dict() | {"episodes": result.episodes})] + list(result.splits.items())
        for split, figures in rows:
            cells = [result.policy, split, str(int(figures["episodes"]))]
            cells += [f"{figures[key] * scale:.2f}" for _, key, scale in _COLUMNS]
            cells.append(f"{result.wall_time_s:.2f}" if split == "all" else "")
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
