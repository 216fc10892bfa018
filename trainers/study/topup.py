"""Top the warm start's memory up to a recall level (``sft.recall_target``).

A fixed number of recall lessons memorises different shares of the known facts on
different seeds (the study's warm starts: 96%, 100% and 74% of greedy direct answers right
with ``recall_repeats: 160`` on seeds 0, 1 and 2), and what a frugal scheme can learn
depends on it: a direct answer pays only when the policy's sampled recollection is right
often enough (the break-even of :func:`~searchgym.trainers.study.evaluation.decision_probe`).
So a study sets the level it wants and every seed starts from it.

Each round measures, on the *training* split's known one-hop questions, the share of
right sampled direct answers per fact (:func:`~searchgym.trainers.study.evaluation.recall_by_fact`,
``sft.topup_samples`` per question at the rollouts' temperature). While their mean is below
the target, it trains one pass over ``sft.topup_repeats`` recall lessons per phrasing of
every fact not always answered right, mixed with as many examples drawn from the protocol
stage (so the protocol's format and the copying skill are rehearsed), at a tenth of
``sft.lr``. Held-out questions are never looked at.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import random
import time
from pathlib import Path
from typing import Any

import torch

from ...policies.cached_folder import build_once
from ..config import TrainConfig
from .demos import demo_env, recall_lessons, statements
from .sft import _DONE, probe_skills, protocol_instructions, sft_examples, train_sft

__all__ = ["recall_topup"]

logger = logging.getLogger("searchgym.trainers")


def recall_topup(config: TrainConfig, base: Path, *, progress: bool = True) -> Path:
    """``base`` (the protocol stage's folder) topped up to ``sft.recall_target``, as
    ``{sft.dir}/top-<hash>`` (built on the first call, then cached). The folder's
    ``searchgym_sft.json`` records the recall level before each round."""
    from ..grpo.model import load_model, load_tokenizer_for, resolve_device
    from .evaluation import recall_by_fact

    sft = config.sft
    settings = {
        "base": base.name,
        "topup": [sft.recall_target, sft.topup_rounds, sft.topup_repeats, sft.topup_samples],
        "temperature": config.rollout.temperature,
        "version": 2,
    }
    key = hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:16]

    def build(staging: Path) -> dict[str, Any]:
        start = time.perf_counter()
        tokenizer = load_tokenizer_for(config.model, base)
        torch.manual_seed(config.seed)
        model = load_model(config.model, base, resolve_device(config.model.device))
        rng = random.Random(f"topup/{config.seed}")
        world_seed, instructions = int(config.env.kwargs.get("world_seed", 0)), protocol_instructions(config)

        def protocol_kwargs(name: str) -> dict[str, Any]:
            return {**config.env.kwargs, "protocol": name, "instructions": instructions[name]}

        world = demo_env(world_seed, config.env.kwargs, "train").world
        # every arm that shares the warm start measures alike, in its first protocol
        probe = config.replace(env={"id": config.env.id, "kwargs": protocol_kwargs(sft.protocols[0])})
        rehearsal = sft_examples(config, tokenizer)
        stage = dataclasses.replace(sft, epochs=1, lr=sft.lr / 10)
        levels, trained = [], []
        for round_ in range(sft.topup_rounds + 1):
            scores = recall_by_fact(
                model, tokenizer, probe, samples=sft.topup_samples, temperature=config.rollout.temperature
            )
            levels.append(sum(scores.values()) / max(1, len(scores)))
            logger.info("Recall top-up, round %d: %.3f of known facts recalled", round_, levels[-1])
            if levels[-1] >= sft.recall_target or round_ == sft.topup_rounds:
                break
            missed = [fact for fact, share in scores.items() if share < 1.0]
            lessons = recall_lessons(world, tokenizer, sft.topup_repeats, only=missed)
            for name in sft.protocols:  # ... and as episodes, searching by the stage's coin flip
                env = demo_env(world_seed, protocol_kwargs(name), "train")
                repeats = sft.topup_repeats / len(sft.protocols)
                lessons += statements(
                    env,
                    tokenizer,
                    repeats,
                    sft.search_prob,
                    rng,
                    passages=False,
                    recall=sft.recall_think,
                    only=missed,
                )
            examples = lessons + rng.sample(rehearsal, min(len(rehearsal), len(lessons)))
            seed = config.seed * 1000 + round_
            train_sft(model, examples, stage, pad_id=tokenizer.pad_token_id, seed=seed, progress=progress)
            trained.append({"missed_facts": len(missed), "examples": len(examples)})
        if levels[-1] < sft.recall_target:
            logger.warning(
                "The recall top-up reached %.3f of known facts after %d rounds, short of sft.recall_target %.3f; "
                "give it more sft.topup_rounds or sft.topup_repeats.",
                levels[-1],
                sft.topup_rounds,
                sft.recall_target,
            )
        skills = probe_skills(model, tokenizer, config)
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        return {
            "base": str(base),
            "recall_levels": levels,
            "rounds": trained,
            "skills": skills,
            "seconds": time.perf_counter() - start,
        }

    return build_once(Path(sft.dir) / f"top-{key}", _DONE, build)
