"""Supervised warm start (SFT) of the study's tiny policy, cached per seed and settings.

:func:`warm_start` writes the lessons, statements and demonstrations of :mod:`.demos`
(a stage of short copying lessons, then the protocol stage), trains the model on them with
a plain masked cross-entropy (AdamW, shuffled mini-batches), and saves the result as a
``save_pretrained`` folder that a GRPO run starts from. The folder is named by a hash of
everything that shapes it (the start model, the env settings, the SFT settings, the seed),
so every arm of a seed shares one warm start and a second call returns at once. Builds go
to a temporary folder renamed into place.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import os
import random
import shutil
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from ...envs.errors import InvalidArgumentError
from ...envs.synthetic import generate_world
from ..config import SFTConfig, TrainConfig
from .demos import (
    Example,
    demo_env,
    demonstrations,
    reading_examples,
    reading_seeds,
    recall_lessons,
    shadow_seeds,
    statements,
)

__all__ = ["warm_start", "sft_examples", "train_sft", "sft_key"]

logger = logging.getLogger("searchgym.trainers")
_DONE = "searchgym_sft.json"
_ENV_KEYS = ("world_seed", "world_kwargs", "instructions", "topk", "max_turns", "retriever", "eval_fraction")


def _env_settings(config: TrainConfig) -> dict[str, Any]:
    kwargs = config.env.kwargs
    out = {k: kwargs[k] for k in _ENV_KEYS if k in kwargs}
    options = dict(kwargs.get("retriever_kwargs") or {})
    options.pop("noise_prob", None)  # demonstrations are written noise-free
    out["retriever_kwargs"] = options
    return out


def sft_key(config: TrainConfig, source: Path) -> str:
    """Hash of everything that shapes the warm start of ``config``."""
    sft = config.sft
    settings = {
        "source": source.name,
        "env": _env_settings(config),
        "sft": {k: v for k, v in vars(sft).items() if k not in ("enabled", "dir")},
        "seed": config.seed,
        "version": 5,
    }
    return hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()[:16]


def sft_examples(config: TrainConfig, tokenizer: Any) -> list[Example]:
    """The protocol stage's examples of ``config``, shuffled: recall lessons and episodes of
    the study world's known facts, and demonstrations on shadow worlds.

    Known-fact episodes are split evenly over ``sft.protocols`` and shadow worlds take the
    protocols in turn, so a warm start shared by arms of two protocols costs no more than
    one for a single protocol.
    """
    sft, rng = config.sft, random.Random(f"sft/{config.seed}")
    env_kwargs = _env_settings(config)
    world_seed = int(env_kwargs.get("world_seed", 0))
    own = config.env.kwargs.get("protocol", "search_r1")

    def protocol_kwargs(protocol: str) -> dict[str, Any]:
        default = env_kwargs.get("instructions") if protocol == own else None
        return {**env_kwargs, "protocol": protocol, "instructions": sft.instructions.get(protocol, default)}

    protocols = list(sft.protocols)
    examples: list[Example] = []
    for protocol in protocols:
        study_env = demo_env(world_seed, protocol_kwargs(protocol), split="train")
        if protocol == protocols[0]:
            examples += recall_lessons(study_env.world, tokenizer, sft.recall_repeats)
        share = sft.fact_repeats / len(protocols)
        passages = sft.passages and protocol == protocols[0]
        examples += statements(study_env, tokenizer, share, sft.search_prob, rng, passages=passages)
        examples += demonstrations(
            study_env, tokenizer, search_prob=sft.search_prob, rng=rng, known_only=True, min_hops=2
        )
    for k, shadow in enumerate(shadow_seeds(config.seed, sft.shadow_worlds)):
        env = demo_env(shadow, protocol_kwargs(protocols[k % len(protocols)]), split="all")
        examples += demonstrations(env, tokenizer, search_prob=sft.search_prob, rng=rng, known_only=False)
    rng.shuffle(examples)
    return examples


def reading_stage(config: TrainConfig, tokenizer: Any) -> list[Example]:
    """The copying lessons of ``sft.reading_worlds`` worlds of their own (empty when 0):
    query lessons from every world, passage lessons from every second one.

    Settled by measurement (world 0, 128x4 model, then the protocol stage): 200 worlds
    given this way (99,000 lessons) copied the subject into 97.5% of queries and the name
    out of 81% of (noise-free) passages; 100 worlds with both kinds each (66,000) copied
    75% into queries.
    """
    examples: list[Example] = []
    for n, seed in enumerate(reading_seeds(config.seed, config.sft.reading_worlds)):
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
    """Train ``model`` in place on ``examples``; returns the mean loss of each epoch."""
    rng = random.Random(f"sft-batches/{seed}")
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
                loss = (nll * target_mask).sum() / tokens
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
                schedule.step()
                epoch_loss += float(loss.detach()) * float(tokens)
                epoch_tokens += float(tokens)
                bar.update(1)
            losses.append(epoch_loss / max(epoch_tokens, 1.0))
            bar.set_postfix(loss=f"{losses[-1]:.3f}")
    finally:
        bar.close()
        model.eval()
    return losses


def warm_start(config: TrainConfig, *, progress: bool = True) -> Path:
    """The warm-started model folder of ``config`` (built on the first call, then cached).

    Args:
        config: A run config with ``sft.enabled``; its env must be SyntheticFacts and its
            model the tiny one or a local folder.

    Returns:
        ``{sft.dir}/sft-<hash>``, a ``save_pretrained`` folder with the tokenizer.
    """
    from ..grpo.model import load_model, load_tokenizer_for, model_source, resolve_device

    if config.env.id != "searchgym/SyntheticFacts-v0":
        raise InvalidArgumentError(
            f"sft.enabled needs env.id searchgym/SyntheticFacts-v0 (its demonstrations are written from the "
            f"generated world), got {config.env.id!r}. Warm-start other models before training instead."
        )
    source = model_source(config.model)
    target = Path(config.sft.dir) / f"sft-{sft_key(config, source)}"
    if (target / _DONE).is_file():
        return target
    start = time.perf_counter()
    tokenizer = load_tokenizer_for(config.model, source)
    torch.manual_seed(config.seed)
    model = load_model(config.model, source, resolve_device(config.model.device))
    reading = reading_stage(config, tokenizer)
    reading_losses: list[float] = []
    if reading:
        logger.info("SFT reading stage on %d examples", len(reading))
        stage = dataclasses.replace(config.sft, epochs=config.sft.reading_epochs)
        reading_losses = train_sft(
            model, reading, stage, pad_id=tokenizer.pad_token_id, seed=config.seed, progress=progress
        )
    examples = sft_examples(config, tokenizer)
    kinds = {k: sum(e.kind == k for e in examples) for k in ("recall", "statement", "direct", "search")}
    kinds["reading"] = len(reading)
    logger.info("SFT on %d examples (%s)", len(examples), kinds)
    losses = train_sft(
        model, examples, config.sft, pad_id=tokenizer.pad_token_id, seed=config.seed, progress=progress
    )
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".sft-", dir=target.parent))
    try:
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        report = {
            "examples": kinds,
            "tokens": sum(len(e.token_ids) for e in examples),
            "reading_epoch_losses": reading_losses,
            "epoch_losses": losses,
            "seconds": time.perf_counter() - start,
        }
        (staging / _DONE).write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
        try:
            os.replace(staging, target)
        except OSError:  # another process finished the same warm start first
            if not (target / _DONE).is_file():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target
