"""Evaluate a trained transformers policy on held-out questions, with the rollouts' own code.

Episodes run through :class:`~searchgym.trainers.grpo.rollout.RolloutCollector` (the same
prompt, feedback and tokenisation as training; greedy decoding by default), one episode
per question, and are scored with :func:`~searchgym.policies.evaluation.summarise`: EM, F1,
ST, SD, SR overall and per split (known/unknown, 1-hop/2-hop). The result's ``settings``
adds the mean sampled tokens per episode (``action_tokens``) and, on SyntheticFacts, the
two skills a warm start must give the study (:func:`skills`).
"""

from __future__ import annotations

import time
from typing import Any

from ...policies.chat import ChatFormatter
from ...policies.evaluation import EpisodeRecord, EvalResult, summarise
from ..config import EnvConfig, TrainConfig
from ..grpo.envs import build_reward, env_factory
from ..grpo.generation import SamplingSettings
from ..grpo.rollout import Episode, RolloutCollector

__all__ = ["evaluate_model", "eval_env_config", "skills"]


def eval_env_config(config: TrainConfig) -> EnvConfig:
    """The training env with ``eval.env_kwargs`` applied (e.g. the held-out split)."""
    return EnvConfig(id=config.env.id, kwargs={**config.env.kwargs, **config.eval.env_kwargs})


def skills(episodes: list[Episode], world: Any) -> dict[str, float | None]:
    """What a SyntheticFacts policy can do, from finished episodes (None where no episode counts).

    * ``direct_em_known``: EM of known one-hop questions answered without a search
      (recall from the weights);
    * ``query_names_subject``: share of first searches whose query holds the first hop's
      subject (copying from the question);
    * ``em_after_search``: EM of one-hop questions answered after a search (copying from
      the passage; the retriever's noise caps it).
    """
    direct, queries, searched = [], [], []
    for episode in episodes:
        info, trajectory = episode.info, episode.trajectory
        if trajectory is None:
            continue
        question = trajectory.question
        chain = world.chain(question.id)
        if info["num_searches"]:
            queries.append(float(chain[0].subject in (info["queries"][0] or "")))
            if question.hops == 1:
                searched.append(float(info["em"]))
        elif question.known and question.hops == 1:
            direct.append(float(info["em"]))

    def mean(values: list[float]) -> float | None:
        return sum(values) / len(values) if values else None

    return {
        "direct_em_known": mean(direct),
        "query_names_subject": mean(queries),
        "em_after_search": mean(searched),
    }


def evaluate_model(
    model: Any, tokenizer: Any, config: TrainConfig, *, name: str = "policy", memory: Any = None
) -> EvalResult:
    """Run one episode per held-out question and summarise them.

    Args:
        model: The policy (a transformers causal LM).
        tokenizer: Its tokenizer.
        config: The run's config: ``env`` and ``eval`` choose the env, ``rollout`` the budgets.
        name: The policy's name in the result.
        memory: The run's experience memory, to give the policy the same prompts as in
            training (nothing is recorded into it).
    """
    env_config = eval_env_config(config)
    make_env = env_factory(env_config, build_reward(env_config), memory, config.memory)
    if memory is not None:
        inner = make_env

        def make_env() -> Any:
            env: Any = inner()
            env.record = False  # evaluation never writes into the store
            return env

    collector = RolloutCollector(
        make_env,
        model,
        tokenizer,
        ChatFormatter(tokenizer),
        max_new_tokens=config.rollout.max_new_tokens,
        max_context_tokens=config.rollout.max_context_tokens,
        sampling=SamplingSettings(config.eval.temperature, 1.0, config.rollout.generation_batch_size),
    )
    try:
        probe: Any = collector.env(0).unwrapped
        total = len(probe.questions)
        count = min(total, config.eval.max_questions) if config.eval.max_questions else total
        start = time.perf_counter()
        episodes = collector.collect(list(range(count)), 1, seed=config.seed)
        result = summarise(
            name, [EpisodeRecord.from_info(e.info, e.reward) for e in episodes], time.perf_counter() - start
        )
    finally:
        collector.close()
    result.settings["action_tokens"] = sum(e.action_tokens for e in episodes) / len(episodes)
    world = getattr(probe, "world", None)
    if world is not None:
        result.settings["skills"] = skills(episodes, world)
    return result
