"""Top the warm start's memory up to a recall level (``sft.recall_target``).

A fixed number of recall lessons memorises different shares of the known facts on
different seeds (the study's warm starts: 96%, 100% and 74% of greedy direct answers right
with ``recall_repeats: 160`` on seeds 0, 1 and 2), and what a frugal scheme can learn
depends on it: a direct answer pays only when the policy's sampled recollection is right
often enough (the break-even of :func:`~tiny_lm.evaluation.decision_probe`).
So a study sets the level it wants and every seed starts from it.

Each round measures, on the *training* split's known one-hop questions, the share of
right sampled direct answers per fact (:func:`~tiny_lm.evaluation.recall_by_fact`,
``sft.topup_samples`` per question at the rollouts' temperature). While their mean is below
the target, the protocol stage goes on for one more slice of its own examples, less its
short ``Question: … Answer:`` recall lessons: ``sft.topup_share`` of them, drawn without
replacement, at a tenth of ``sft.lr``. The facts are stored in that plain form already (on
seed 0, replayed during RL, those lessons kept a loss of 0.002 nats per token);
what a round moves is the
recollection in the protocol's format, from the known facts' episodes, while the shadow
demonstrations ("Recall: unknown.") and the reading lessons keep the stage's proportions.
Held-out questions are never looked at.

Three other top-ups were tried on seed 2 and dropped. Lessons and episodes of only the
facts missed on the training split raised their level from 0.64 to 0.91 in three rounds
but cost the held-out known facts (greedy recall 74% -> 61%). Lessons and episodes of every
known fact, mixed 1:1 with the stage's examples, reached 0.93 in five rounds and 100%
held-out greedy recall, but the unknown questions recalled as "unknown" fell from 74% to
46%: the known facts' share of the training rose from 69% to 84%. Slices of the whole
stage (its recall lessons included) kept the balance but moved seed 2 from 0.64 to only
0.75 in three rounds of 18,600 examples.

A memory arm's prompt (an experience bank and a few-shot episode before the question)
costs the warm start much of its recall: on seed 0's fourth build 0.54 of sampled direct
answers right behind the scripted memory against 0.90 in the plain prompt. The top-up
``behind_memory`` (``sft.memory_recall_target``) measures and trains in that layout.
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

from searchgym.policies.cached_folder import build_once

from .config import StudyRunConfig
from .sft import _DONE, protocol_config, save_warm_start, scripted_memory, sft_examples, train_sft

__all__ = ["recall_topup", "topup_folder"]

logger = logging.getLogger("searchgym.trainers")


def topup_folder(config: StudyRunConfig, base: Path, *, behind_memory: bool = False) -> Path:
    """The folder :func:`recall_topup` builds on ``base`` (named by a hash of its settings)."""
    sft = config.sft
    settings: dict[str, Any] = {
        "base": base.name,
        "topup": [sft.recall_target, sft.topup_rounds, sft.topup_share, sft.topup_samples],
        "temperature": config.rollout.temperature,
        "version": 5,
    }
    if behind_memory:
        settings["memory"] = [sft.memory_recall_target, sft.memory_topup_share]
        if sft.memory_topup_two_hop != 1:  # folders built before the setting keep their names
            settings["memory"].append(sft.memory_topup_two_hop)
    key = hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:16]
    return Path(sft.dir) / f"{'mem' if behind_memory else 'top'}-{key}"


def recall_topup(
    config: StudyRunConfig, base: Path, *, behind_memory: bool = False, progress: bool = True
) -> Path:
    """``base`` topped up to ``sft.recall_target``, as :func:`topup_folder` (built on the
    first call, then cached). The folder's ``searchgym_sft.json`` records the recall level
    before each round.

    With ``behind_memory``, to ``sft.memory_recall_target`` instead, with recall measured
    behind the warm start's scripted experience memory
    (:func:`~tiny_lm.sft.scripted_memory`) and every episode of the
    slices written behind it (``sft.memory_share`` 1), so a memory arm starts from the same
    recall in its own prompt layout as the other arms in theirs; ``sft.memory_topup_two_hop``
    copies of each two-hop episode go into the slices.
    """
    from searchgym.trainers.grpo.model import load_model, load_tokenizer_for, resolve_device

    from .evaluation import recall_by_fact

    sft = config.sft
    target = sft.memory_recall_target if behind_memory else sft.recall_target

    def build(staging: Path) -> dict[str, Any]:
        start = time.perf_counter()
        share, wrap, source = sft.topup_share, None, config
        if behind_memory:
            scripted = scripted_memory(config, sft.protocols[0], random.Random(f"memory-topup/{config.seed}"))
            share, wrap = sft.memory_topup_share, scripted.wrapped
            source = config.replace(sft={**vars(sft), "memory_share": 1.0})
        tokenizer = load_tokenizer_for(config.model, base)
        torch.manual_seed(config.seed)
        model = load_model(config.model, base, resolve_device(config.model.device))
        # every arm that shares the warm start measures alike, in the first protocol
        probe = protocol_config(config, sft.protocols[0])
        examples: list[Any] = []  # the stage's examples less its recall lessons, built when needed
        size = 0
        stage = dataclasses.replace(sft, epochs=1, lr=sft.lr / 10)
        levels = []
        for round_ in range(sft.topup_rounds + 1):
            scores = recall_by_fact(
                model,
                tokenizer,
                probe,
                samples=sft.topup_samples,
                temperature=config.rollout.temperature,
                wrap=wrap,
            )
            levels.append(sum(scores.values()) / max(1, len(scores)))
            logger.info("Recall top-up, round %d: %.3f of known facts recalled", round_, levels[-1])
            if levels[-1] >= target or round_ == sft.topup_rounds:
                break
            if not examples:
                examples = [e for e in sft_examples(source, tokenizer) if e.kind != "recall"]
                size = max(1, round(share * len(examples)))
                if behind_memory:
                    examples += [e for e in examples if e.hops > 1] * (sft.memory_topup_two_hop - 1)
                random.Random(f"topup/{config.seed}").shuffle(examples)
            part = [examples[(round_ * size + k) % len(examples)] for k in range(size)]
            seed = config.seed * 1000 + round_
            train_sft(model, part, stage, pad_id=tokenizer.pad_token_id, seed=seed, progress=progress)
        if levels[-1] < target:
            logger.warning(
                "The recall top-up reached %.3f of known facts after %d rounds, short of its target %.3f; "
                "give it more sft.topup_rounds or a larger share per round.",
                levels[-1],
                sft.topup_rounds,
                target,
            )
        # the share of two-hop episodes in the slices (None: no round trained)
        two_hop = sum(e.hops > 1 for e in examples) / len(examples) if examples else None
        report = {
            "base": str(base),
            "recall_levels": levels,
            "examples_per_round": size,
            "two_hop_share": two_hop,
        }
        return save_warm_start(model, tokenizer, config, staging, report, start)

    return build_once(topup_folder(config, base, behind_memory=behind_memory), _DONE, build)
