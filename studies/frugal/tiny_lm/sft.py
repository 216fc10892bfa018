"""Supervised warm start (SFT) of the study's tiny policy, cached per seed and settings.

:func:`~tiny_lm.warm_start.warm_start` writes the lessons, statements and demonstrations of :mod:`.demos`,
trains the model on them with a plain masked cross-entropy (AdamW, shuffled mini-batches)
in two stages, and saves the result as a ``save_pretrained`` folder that a GRPO run starts
from:

1. the reading stage (:func:`reading_model`): short copying lessons on worlds of their
   own, shared by every seed;
2. the protocol stage (:func:`sft_examples`): the study world's known facts and
   demonstrations on shadow worlds, with some reading lessons rehearsed. Without the
   rehearsal the first hundred batches (loss 14 on the unseen chat format) wiped out the
   copying skill and it did not come back (measured on seed 0: copying into queries 93%
   before the stage, 0% after 100 batches and still at batch 700); with 30 worlds
   rehearsed it came back to 98%.

Each folder is named by a hash of everything that shapes it (the start model and its
thread count, the world and env settings, the SFT settings, the seed, the torch and
transformers versions), so every arm of a seed shares one warm start and a
second call returns at once.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import random
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from searchgym.envs.synthetic import Fact, generate_world
from searchgym.error import InvalidArgumentError
from searchgym.policies.cached_folder import build_once

from .config import SFTConfig, StudyRunConfig
from .demos import (
    Example,
    chain_demonstrations,
    demo_env,
    demonstrations,
    reading_examples,
    reading_seeds,
    recall_lessons,
    shadow_seeds,
    statements,
)
from .memory_demos import ScriptedMemory

__all__ = [
    "protocol_model",
    "probe_skills",
    "protocol_config",
    "save_warm_start",
    "reading_model",
    "reading_lessons",
    "sft_examples",
    "train_sft",
    "sft_key",
    "model_settings",
    "versions",
    "scripted_memory",
]

logger = logging.getLogger("searchgym.trainers")
_DONE = "searchgym_sft.json"
_NOT_PROTOCOL_STAGE = (
    "enabled",
    "dir",
    "instructions",
    "recall_target",
    "memory_recall_target",
    "memory_topup_share",
    "memory_topup_two_hop",
    "topup_rounds",
    "topup_share",
    "topup_samples",
)
_ENV_KEYS = ("world_seed", "world_kwargs", "topk", "max_turns", "retriever", "eval_fraction", "split_by")


def _env_settings(config: StudyRunConfig) -> dict[str, Any]:
    kwargs = config.env.kwargs
    out = {k: kwargs[k] for k in _ENV_KEYS if k in kwargs}
    options = dict(kwargs.get("retriever_kwargs") or {})
    options.pop("noise_prob", None)  # demonstrations are written noise-free
    out["retriever_kwargs"] = options
    return out


def protocol_instructions(config: StudyRunConfig) -> dict[str, str | None]:
    """The instructions the demonstrations of each of ``sft.protocols`` are written with:
    ``sft.instructions``, else the env's own for its protocol, else the protocol's default
    (None). Arms that agree on these share a warm start, whatever their own protocol."""
    own = config.env.kwargs.get("protocol", "search_r1")
    default = config.env.kwargs.get("instructions")
    return {
        protocol: config.sft.instructions.get(protocol, default if protocol == own else None)
        for protocol in config.sft.protocols
    }


def sft_key(config: StudyRunConfig, source: Path) -> str:
    """Hash of everything that shapes the warm start of ``config``: the start model (its
    folder name, a hash of the tiny model's settings) and how it runs
    (:func:`model_settings`), the world and env settings the demonstrations are written
    from, the SFT settings, the seed, and the library versions (:func:`versions`)."""
    sft = config.sft
    settings = {
        "source": source.name,
        "model": model_settings(config),
        "env": _env_settings(config),
        "instructions": protocol_instructions(config),
        "sft": {k: v for k, v in vars(sft).items() if k not in _NOT_PROTOCOL_STAGE},
        "seed": config.seed,
        "versions": versions(),
        "version": 13,
    }
    return hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()[:16]


def model_settings(config: StudyRunConfig) -> dict[str, Any]:
    """How the warm start's model runs: dtype, device and torch threads (another thread
    count sums floating-point numbers in another order, so it builds other weights)."""
    from searchgym.trainers.grpo.model import cpu_threads

    model = config.model
    return {"dtype": model.dtype, "device": model.device, "threads": cpu_threads(model)}


def versions() -> dict[str, str]:
    """The versions that move a warm start's weights: torch's and transformers' (major.minor)."""
    import transformers

    return {
        "torch": ".".join(torch.__version__.split(".")[:2]),
        "transformers": ".".join(transformers.__version__.split(".")[:2]),
    }


def sft_examples(config: StudyRunConfig, tokenizer: Any) -> list[Example]:
    """The protocol stage's examples of ``config``, shuffled: recall lessons and episodes of
    the study world's known facts, demonstrations on shadow worlds, and the reading lessons
    of ``sft.replay_worlds`` worlds rehearsed.

    Known-fact episodes are split evenly over ``sft.protocols`` and shadow worlds take the
    protocols in turn, so a warm start shared by arms of two protocols costs no more than
    one for a single protocol. A ``sft.memory_share`` of the episodes carry the experience
    and few-shot parts of the memory arms' prompts, from a :class:`.memory_demos.ScriptedMemory`
    on one more shadow world (never one whose questions are demonstrated).
    """
    sft, rng = config.sft, random.Random(f"sft/{config.seed}")
    env_kwargs = _env_settings(config)
    world_seed = int(env_kwargs.get("world_seed", 0))

    protocols = list(sft.protocols)
    memories = {p: scripted_memory(config, p, rng) if sft.memory_share else None for p in protocols}
    held_out = held_out_chains(world_seed, env_kwargs) if sft.chain_repeats else set()
    examples: list[Example] = []
    for protocol in protocols:
        memory, memory_share = memories[protocol], sft.memory_share
        study_env = demo_env(world_seed, _protocol_env_kwargs(config, protocol), split="train")
        if protocol == protocols[0]:
            examples += recall_lessons(study_env.world, tokenizer, sft.recall_repeats)
        share = sft.fact_repeats / len(protocols)
        passages = sft.passages and protocol == protocols[0]
        examples += statements(
            study_env,
            tokenizer,
            share,
            sft.search_prob,
            rng,
            passages=passages,
            memory=memory,
            memory_share=memory_share,
            recall=sft.recall_think,
            ask_question=sft.asks_question,
        )
        examples += demonstrations(
            study_env,
            tokenizer,
            search_prob=sft.search_prob,
            rng=rng,
            known_only=True,
            min_hops=2,
            memory=memory,
            memory_share=memory_share,
            recall=sft.recall_think,
            ask_hops=sft.asks_hops,
            ask_question=sft.asks_question,
        )
        if sft.chain_repeats:
            examples += chain_demonstrations(
                study_env,
                tokenizer,
                sft.chain_repeats / len(protocols),
                sft.search_prob,
                rng,
                held_out,
                memory=memory,
                memory_share=memory_share,
                recall=sft.recall_think,
            )
    shadow_search = sft.search_prob if sft.shadow_search_prob is None else sft.shadow_search_prob
    for k, shadow in enumerate(shadow_seeds(config.seed, sft.shadow_worlds)):
        protocol = protocols[k % len(protocols)]
        env = demo_env(shadow, _protocol_env_kwargs(config, protocol), split="all")
        examples += demonstrations(
            env,
            tokenizer,
            search_prob=shadow_search,
            rng=rng,
            known_only=False,
            memory=memories[protocol],
            memory_share=sft.memory_share,
            recall=sft.recall_think,
            ask_question=sft.asks_question,
        )
    examples += reading_lessons(sft.replay_worlds, tokenizer)
    rng.shuffle(examples)
    return examples


def scripted_memory(config: StudyRunConfig, protocol: str, rng: random.Random) -> ScriptedMemory:
    """The experience memory whose prompts the warm start's ``sft.memory_share`` of episodes
    carry for ``protocol``: scripted episodes of one more shadow world (never one whose
    questions are demonstrated), drawn with ``rng``."""
    sft = config.sft
    world = shadow_seeds(config.seed, sft.shadow_worlds + 1)[-1]
    return ScriptedMemory(
        demo_env(world, _protocol_env_kwargs(config, protocol), split="all"),
        rng,
        recall=sft.recall_think,
        ask_question=sft.asks_question,
    )


def _protocol_env_kwargs(config: StudyRunConfig, protocol: str) -> dict[str, Any]:
    """The demonstration env's settings for ``protocol``, with its warm-start instructions."""
    instructions = protocol_instructions(config)[protocol]
    return {**_env_settings(config), "protocol": protocol, "instructions": instructions}


def held_out_chains(world_seed: int, env_kwargs: Mapping[str, Any]) -> set[tuple[Fact, ...]]:
    """The fact chains of the held-out two-hop questions of ``env_kwargs``'s world."""
    env = demo_env(world_seed, env_kwargs, split="eval")
    chains = {tuple(env.world.chain(q.id)) for q in env.questions if (q.hops or 1) > 1}
    env.close()
    return chains


def reading_lessons(worlds: int, tokenizer: Any) -> list[Example]:
    """The copying lessons of the first ``worlds`` reading worlds (none when 0): query
    lessons from every world, passage lessons from every second one.

    Settled by measurement (world 0, 128x4 model, then the protocol stage): 200 worlds
    given this way (99,000 lessons) copied the subject into 97.5% of queries and the name
    out of 81% of (noise-free) passages; 100 worlds with both kinds each (66,000) copied
    75% into queries.
    """
    examples: list[Example] = []
    for n, seed in enumerate(reading_seeds(worlds)):
        examples += reading_examples(generate_world(seed), tokenizer, passages=n % 2 == 0)
    return examples


def _batches(examples: Sequence[Example], size: int, rng: random.Random) -> list[list[Example]]:
    # Sort a shuffled order by length within windows, so batches carry little padding.
    order = list(examples)
    rng.shuffle(order)
    window = size * 16
    chunks: list[list[Example]] = []
    for first in range(0, len(order), window):
        part = sorted(order[first : first + window], key=lambda e: len(e.token_ids))
        chunks += [part[i : i + size] for i in range(0, len(part), size)]
    rng.shuffle(chunks)
    return chunks


def train_sft(
    model: Any, examples: Sequence[Example], sft: SFTConfig, *, pad_id: int, seed: int, progress: bool = True
) -> list[float]:
    """Train ``model`` in place on ``examples``; returns the mean loss of each epoch.

    Every trained token weighs the same, whatever its batch: the summed loss is divided by
    a constant, the trained tokens of an average batch. Batches are grouped by length, so
    dividing by each batch's own tokens would weigh a short example's tokens (a direct
    answer) more than a long one's (a search episode). Measured on the study's warm start:
    that way it chose to search on 54% of the questions of every split alike, even on a
    shadow world whose every demonstration searched (41% when sampled); with equal weights,
    on 77% of every split, the share of search demonstrations.
    """
    rng = random.Random(f"sft-batches/{seed}")
    tokens_per_batch = sum(sum(e.loss_mask) for e in examples) / max(1, len(examples)) * sft.batch_size
    optimizer = torch.optim.AdamW(model.parameters(), lr=sft.lr, weight_decay=0.0)
    batches_per_epoch = math.ceil(len(examples) / sft.batch_size)
    total = sft.epochs * batches_per_epoch
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer,
        lambda n: min(1.0, (n + 1) / max(1, total // 20)) * 0.5 * (1 + math.cos(math.pi * n / total)),
    )
    device = next(model.parameters()).device
    losses = []
    model.train()
    bar = tqdm(total=total, desc="sft", unit="batch", disable=not progress)
    try:
        for _ in range(sft.epochs):
            epoch_loss, epoch_tokens = 0.0, 0.0
            for batch in _batches(examples, sft.batch_size, rng):
                width = max(len(e.token_ids) for e in batch)
                ids = torch.tensor([list(e.token_ids) + [pad_id] * (width - len(e.token_ids)) for e in batch])
                mask = torch.tensor([list(e.loss_mask) + [0] * (width - len(e.loss_mask)) for e in batch])
                attention = torch.tensor(
                    [[1] * len(e.token_ids) + [0] * (width - len(e.token_ids)) for e in batch]
                )
                ids, mask, attention = ids.to(device), mask.to(device), attention.to(device)
                logits = model(input_ids=ids, attention_mask=attention).logits[:, :-1]
                target_mask = mask[:, 1:].float()
                nll = torch.nn.functional.cross_entropy(
                    logits.reshape(-1, logits.shape[-1]).float(), ids[:, 1:].reshape(-1), reduction="none"
                ).view_as(target_mask)
                tokens = target_mask.sum().clamp(min=1.0)
                loss = (nll * target_mask).sum() / tokens_per_batch
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
                schedule.step()
                epoch_loss += float(loss.detach()) * tokens_per_batch
                epoch_tokens += float(tokens)
                bar.update(1)
            losses.append(epoch_loss / max(epoch_tokens, 1.0))
            bar.set_postfix(loss=f"{losses[-1]:.3f}")
    finally:
        bar.close()
        model.eval()
    return losses


def _check_env(config: StudyRunConfig) -> None:
    if config.env.id != "searchgym/SyntheticFacts-v1":
        raise InvalidArgumentError(
            f"sft.enabled needs env.id searchgym/SyntheticFacts-v1 (its demonstrations are written from the "
            f"generated world), got {config.env.id!r}. Warm-start other models before training instead."
        )


def reading_model(config: StudyRunConfig, *, progress: bool = True) -> Path:
    """The start model after the reading stage (built on the first call, then cached).

    The stage does not depend on the study seed or the env, so every seed and arm shares
    it, as runs of a paper share one pretrained model; the weights are initialised with
    seed 0. Without ``sft.reading_worlds`` it is the start model itself.
    """
    from searchgym.trainers.grpo.model import load_model, load_tokenizer_for, model_source, resolve_device

    source, sft = model_source(config.model), config.sft
    if not sft.reading_worlds:
        return source
    settings = {
        "source": source.name,
        "reading": [sft.reading_worlds, sft.reading_epochs, sft.lr, sft.batch_size],
        "model": model_settings(config),
        "versions": versions(),
        "version": 3,
    }
    key = hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:16]

    def build(staging: Path) -> dict[str, Any]:
        start = time.perf_counter()
        tokenizer = load_tokenizer_for(config.model, source)
        torch.manual_seed(0)
        model = load_model(config.model, source, resolve_device(config.model.device))
        lessons = reading_lessons(sft.reading_worlds, tokenizer)
        logger.info("SFT reading stage on %d lessons", len(lessons))
        stage = dataclasses.replace(sft, epochs=sft.reading_epochs)
        losses = train_sft(model, lessons, stage, pad_id=tokenizer.pad_token_id, seed=0, progress=progress)
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        return {
            "lessons": len(lessons),
            "epoch_losses": losses,
            "seconds": time.perf_counter() - start,
            "build": build_facts(),
        }

    return build_once(Path(sft.dir) / f"read-{key}", _DONE, build)


def _protocol_folder(config: StudyRunConfig) -> Path:
    from searchgym.trainers.grpo.model import model_source

    return Path(config.sft.dir) / f"sft-{sft_key(config, model_source(config.model))}"


def protocol_model(config: StudyRunConfig, *, progress: bool = True) -> Path:
    """The model after the protocol stage, ``{sft.dir}/sft-<hash>`` (built once, then cached)."""
    from searchgym.trainers.grpo.model import load_model, load_tokenizer_for, resolve_device

    _check_env(config)
    target = _protocol_folder(config)
    if (target / _DONE).is_file():
        return target
    base = reading_model(config, progress=progress)

    def build(staging: Path) -> dict[str, Any]:
        start = time.perf_counter()
        tokenizer = load_tokenizer_for(config.model, base)
        torch.manual_seed(config.seed)
        model = load_model(config.model, base, resolve_device(config.model.device))
        examples = sft_examples(config, tokenizer)
        kinds = {
            k: sum(e.kind == k for e in examples)
            for k in ("recall", "statement", "direct", "search", "reading")
        }
        logger.info("SFT on %d examples (%s)", len(examples), kinds)
        losses = train_sft(
            model, examples, config.sft, pad_id=tokenizer.pad_token_id, seed=config.seed, progress=progress
        )
        tokens = sum(len(e.token_ids) for e in examples)
        report = {"base": str(base), "examples": kinds, "tokens": tokens, "epoch_losses": losses}
        return save_warm_start(model, tokenizer, config, staging, report, start)

    return build_once(target, _DONE, build)


def save_warm_start(
    model: Any, tokenizer: Any, config: StudyRunConfig, staging: Path, report: dict[str, Any], start: float
) -> dict[str, Any]:
    """Save a built warm start into ``staging``; returns ``report`` with the model's skills
    (:func:`probe_skills`) and the seconds since ``start`` (a ``perf_counter`` time)."""
    skills = probe_skills(model, tokenizer, config)
    model.save_pretrained(staging)
    tokenizer.save_pretrained(staging)
    return {**report, "skills": skills, "seconds": time.perf_counter() - start, "build": build_facts()}


def build_facts() -> dict[str, Any]:
    """What the cache key leaves out but moves a build's weights: the torch version and its
    thread count (floating-point sums run in another order on another count)."""
    return {"torch": torch.__version__, "torch_threads": torch.get_num_threads()}


def probe_skills(model: Any, tokenizer: Any, config: StudyRunConfig) -> dict[str, dict[str, float]]:
    """:func:`~tiny_lm.evaluation.forced_skills` (and, with ``recall_think``,
    :func:`~tiny_lm.evaluation.decision_probe`) per protocol of ``sft.protocols``,
    on the held-out questions; warns when the model copies into fewer than half of its queries."""
    from .evaluation import decision_probe, forced_skills

    skills = {}
    for protocol in config.sft.protocols:
        probe = protocol_config(config, protocol)
        skills[protocol] = forced_skills(model, tokenizer, probe)
        if config.sft.recall_think:
            skills[protocol].update(decision_probe(model, tokenizer, probe))
        logger.info("Warm start skills (%s): %s", protocol, skills[protocol])
        if skills[protocol]["forced_copy"] < 0.5:
            logger.warning(
                "The warm start copies the subject into only %.0f%% of its %s queries: GRPO will not "
                "learn to search from it. Give it more sft.reading_worlds or sft.replay_worlds.",
                100 * skills[protocol]["forced_copy"],
                protocol,
            )
    return skills


def protocol_config(config: StudyRunConfig, protocol: str) -> StudyRunConfig:
    """``config`` with its env in ``protocol`` and the instructions the warm start writes it with."""
    kwargs = {
        **config.env.kwargs,
        "protocol": protocol,
        "instructions": protocol_instructions(config)[protocol],
    }
    return config.replace(env={"id": config.env.id, "kwargs": kwargs})
