"""The built-in GRPO trainer: rollouts through searchgym envs, group advantages, clipped updates.

One training step:

1. take the step's questions (:func:`~.envs.question_schedule`);
2. run G rollouts of each (:class:`~.rollout.RolloutCollector`): multi-turn, the
   protocol's stop strings, env text masked out of the loss;
3. compute each group's advantages (``group_norm``, ``dr_grpo`` or ``tsas``);
4. update the policy with PPO's clipped objective and a k3 KL to the frozen reference
   (AdamW; ``ppo_epochs × mini_batches`` optimizer steps; micro-batches accumulate),
   plus, with ``algo.ptx_coef``, a language-model loss on replayed examples (:mod:`.ptx`);
   sampling and the update encode the prompt a group shares once (:mod:`.prefix`);
5. count a step of the experience memory (``memory.step()``, which updates the bank every
   ``update_every`` steps);
6. log the figures (and append them to ``{output_dir}/metrics.jsonl``, :mod:`.metrics_file`),
   warn once when no group has had a nonzero advantage for a while (:mod:`.no_signal`), and
   save a checkpoint when one is due.

Everything random in a step is drawn from generators seeded by ``(seed, step)``, and a
checkpoint holds the model, AdamW, the schedule, the RNG states, the shared reward scheme
and the memory store, so a run resumed from a checkpoint reaches the same parameters as
one that never stopped (bitwise on CPU). Dropout is off throughout (the model stays in
eval mode), as usual for RL fine-tuning of LLMs.
"""

from __future__ import annotations

import logging
import math
import os
import re
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from ...envs.config_base import dump_yaml, plain, save_yaml, to_dict
from ...error import InvalidArgumentError
from ...policies.chat import ChatFormatter
from ..advantages import GroupFigures, group_advantages
from ..config import ConfigError, TrainConfig
from ..ray_store import NAMESPACE as STORE_NAMESPACE
from ..ray_store import StoreClient
from .checkpoint import (
    Checkpoint,
    TrainerState,
    check_optimizer_fits,
    damaged_file,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    prune_checkpoints,
    read_state,
    restore_reward,
    save_checkpoint,
    set_rng_state,
    step_folders,
)
from .envs import (
    build_memory,
    build_reward,
    env_factory,
    memory_store_dir,
    question_schedule,
    store_actor_name,
    store_spec,
)
from .generation import SamplingSettings
from .loss import clipped_token_loss, pad_values, token_weights
from .manifest import new_run_id
from .memory_restore import commit_memory, discard_staged, stage_memory
from .metrics import rollout_metrics
from .metrics_file import append_metrics, start_metrics
from .model import (
    autocast,
    autocast_warning,
    check_same_architecture,
    freeze_lower_layers,
    load_model,
    load_tokenizer_for,
    model_source,
    resolve_device,
    set_cpu_threads,
)
from .no_signal import NoSignalWatch
from .prefix import sequence_logprobs
from .ptx import load_ptx_examples, ptx_nll, sample_ptx
from .resume_check import check_resume, finished_message, saved_config
from .rollout import Episode, RolloutCollector, group_prefix_lengths

__all__ = ["GRPOTrainer", "train", "step_seed"]

logger = logging.getLogger("searchgym.trainers")

_THINK = re.compile(r"<think>(.*?)</think>", re.S)


def step_seed(seed: int, step: int) -> int:
    """The seed of everything random in training step ``step`` of a run seeded with ``seed``."""
    return int(np.random.SeedSequence([seed, step]).generate_state(1)[0])


def _lr_lambda(warmup: int, total: int, schedule: str) -> Any:
    def factor(n: int) -> float:
        if warmup and n < warmup:
            return (n + 1) / warmup
        if schedule == "cosine":
            progress = (n - warmup) / max(1, total - warmup)
            return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))
        return 1.0

    return factor


class GRPOTrainer:
    """Trains a transformers causal LM on a searchgym env with GRPO (see the module docstring).

    Args:
        config: The run's :class:`~searchgym.trainers.config.TrainConfig`.
        progress: Show a progress bar over steps.

    Example:
        >>> from searchgym.trainers.run_spec import load_config
        >>> trainer = GRPOTrainer(load_config("configs/grpo_synthetic.yaml"))  # doctest: +SKIP
        >>> state = trainer.train()  # doctest: +SKIP
    """

    def __init__(self, config: TrainConfig, *, progress: bool = True):
        if not isinstance(config, TrainConfig):
            raise InvalidArgumentError(f"GRPOTrainer needs a TrainConfig, got {type(config).__name__}.")
        self.config = config
        self.output_dir = Path(config.output_dir)
        self.progress = progress
        self.state = TrainerState()
        self.resumed_from: Path | None = None
        self.finished = False
        """Whether the checkpoint resumed already had ``config.steps`` steps (nothing to train)."""
        self._ready = False
        self.wandb: Any = None
        self.store: StoreClient | None = None

    # -- setup ---------------------------------------------------------------------------------

    def _checkpoint_to_resume(self) -> Path | None:
        resume = self.config.checkpoint.resume
        if resume == "never":
            if list_checkpoints(self.output_dir):
                raise ConfigError(
                    "checkpoint.resume",
                    resume,
                    "'auto', 'never' or a checkpoint folder",
                    f"{self.output_dir} already holds checkpoints: use resume: auto to continue that run, "
                    "or choose another output_dir.",
                )
            return None
        if resume == "auto":
            return latest_checkpoint(self.output_dir)
        path = Path(resume)
        step = read_state(path).step  # raises a clear error for anything but a complete checkpoint
        newer = [folder.name for s, folder in step_folders(self.output_dir) if s > step]
        if newer:
            raise ConfigError(
                "checkpoint.resume",
                resume,
                "'auto', 'never' or a checkpoint folder",
                f"{self.output_dir} holds checkpoints newer than step {step} ({', '.join(newer)}), which this "
                "run would overwrite: use resume: auto to continue from the newest, move them aside, or choose "
                "another output_dir.",
            )
        return path

    def setup(self) -> None:
        """Load the models, build the envs, optimizer and memory, and resume if asked (idempotent)."""
        if self._ready:
            return
        cfg = self.config
        self.output_dir.mkdir(parents=True, exist_ok=True)
        checkpoint = self._checkpoint_to_resume()
        self.device = resolve_device(cfg.model.device)
        set_cpu_threads(cfg.model, self.device)
        if (warning := autocast_warning(cfg.model, self.device)) is not None:
            logger.warning(warning)
        # Every file of the checkpoint is read and checked before anything is built from it.
        saved = load_checkpoint(checkpoint, map_location=self.device) if checkpoint is not None else None
        if saved is not None:
            self._check_resume(saved)
            if saved.state.step >= cfg.steps:  # nothing to train; still loaded, to evaluate or inspect
                self.finished = True
                logger.warning(finished_message(self.output_dir, saved.folder, saved.state.step, cfg.steps))
        source = model_source(cfg.model)
        torch.manual_seed(cfg.seed)
        np.random.seed(cfg.seed % 2**32)
        if checkpoint is None:
            self.state = TrainerState(run_id=new_run_id())
            self.tokenizer = load_tokenizer_for(cfg.model, source)
            self.model = load_model(cfg.model, source, self.device)
        else:
            # The policy and its tokenizer come from the checkpoint; its model must be the
            # architecture of the run's own (the reference model is loaded from that).
            check_same_architecture(checkpoint / "model", source)
            try:
                self.tokenizer = load_tokenizer_for(cfg.model, checkpoint / "model")
                self.model = load_model(cfg.model, checkpoint / "model", self.device)
            except Exception as exc:  # transformers' errors vary: a damaged folder is one error
                raise damaged_file(
                    checkpoint / "model", f"cannot be loaded ({type(exc).__name__}: {exc})"
                ) from exc
        freeze_lower_layers(self.model, cfg.model.train_layers)
        self.ptx = None
        if cfg.algo.ptx_coef > 0:
            if cfg.algo.ptx_data is None:
                raise ConfigError(
                    "algo.ptx_data",
                    None,
                    "a JSON-lines file",
                    "algo.ptx_coef > 0 replays the examples of this file.",
                )
            self.ptx = load_ptx_examples(cfg.algo.ptx_data, self.tokenizer)
        self.ref_model = None
        if cfg.algo.kl_coef > 0:
            self.ref_model = load_model(cfg.model, source, self.device)
            self.ref_model.requires_grad_(False)
        self.optimizer = torch.optim.AdamW(
            [p for p in self.model.parameters() if p.requires_grad],
            lr=cfg.algo.lr,
            betas=(cfg.algo.adam_beta1, cfg.algo.adam_beta2),
            eps=cfg.algo.adam_eps,
            weight_decay=cfg.algo.weight_decay,
        )
        updates = cfg.steps * cfg.algo.ppo_epochs * cfg.algo.mini_batches
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, _lr_lambda(cfg.algo.warmup_steps, updates, cfg.algo.lr_schedule)
        )
        self.store = self._store_client() if cfg.memory.backend == "ray" else None
        self.reward_scheme = build_reward(cfg.env, self.store)
        self.memory_dir = memory_store_dir(cfg.memory, self.output_dir)
        if saved is not None:
            self._restore(saved)
        self.memory = build_memory(cfg.memory, self.output_dir, cfg.seed, self.store)
        if self.memory is not None and hasattr(self.memory, "steps"):
            self.memory.steps = self.state.step
        self.formatter = ChatFormatter(self.tokenizer)
        self.collector = RolloutCollector(
            env_factory(cfg.env, self.reward_scheme, self.memory, cfg.memory),
            self.model,
            self.tokenizer,
            self.formatter,
            max_new_tokens=cfg.rollout.max_new_tokens,
            max_context_tokens=cfg.rollout.max_context_tokens,
            sampling=SamplingSettings(
                cfg.rollout.temperature, cfg.rollout.top_p, cfg.rollout.generation_batch_size
            ),
            group_prompt_seeds=cfg.memory.example_per == "group",
        )
        probe: Any = self.collector.env(0).unwrapped
        self.num_questions = len(probe.questions)
        self.max_turns = int(getattr(probe, "max_turns", 1))
        save_yaml(cfg, self.output_dir / "config.yaml", lenient=True)
        self.metrics_file = start_metrics(self.output_dir, self.state.history)
        self.no_signal = NoSignalWatch()
        if cfg.wandb.enabled:
            self._start_wandb()
        self._ready = True

    def _check_resume(self, saved: Checkpoint) -> None:
        """Refuse a resume whose config changes the run (:func:`~.resume_check.check_resume`)."""
        file = saved.folder / "config.yaml"
        if not file.is_file():
            logger.warning("Checkpoint %s has no config.yaml: its settings cannot be compared.", saved.folder)
            return
        check_resume(
            saved.folder,
            saved_config(file, type(self.config)),
            plain(self.config),
            output_dir=self.output_dir,
            allow=self.config.checkpoint.allow_changes,
        )

    def _store_client(self) -> StoreClient:
        """Start Ray if needed and a fresh store actor for this run (``memory.backend: ray``).

        An actor of the same name left in the cluster is ended first: it holds the state of
        files that a resume replaces. The new one starts on the first call, after the resume.
        """
        import ray

        cfg = self.config
        if not ray.is_initialized():
            options: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False}
            if cfg.memory.ray_num_cpus is not None and not os.environ.get("RAY_ADDRESS"):
                options["num_cpus"] = cfg.memory.ray_num_cpus
            ray.init(**options)
        name = store_actor_name(cfg.memory, self.output_dir)
        try:
            ray.kill(ray.get_actor(name, namespace=STORE_NAMESPACE), no_restart=True)
            logger.info("Ended the store actor %r left by an earlier run.", name)
        except ValueError:
            pass
        spec = store_spec(cfg, self.output_dir)
        logger.info(
            "Stores served by the Ray actor %r (namespace %r): memory %s, minimum tool calls %s.",
            name,
            STORE_NAMESPACE,
            spec.memory_path,
            spec.min_tool_calls_path,
        )
        return StoreClient(name, spec)

    def _restore(self, saved: Checkpoint) -> None:
        """Apply a checked checkpoint; nothing on disk changes until every check has passed."""
        checkpoint = saved.folder
        check_optimizer_fits(saved, self.optimizer)
        live = Path(os.path.realpath(self.memory_dir)) if self.memory_dir is not None else None
        staged = stage_memory(checkpoint, saved.manifest, live) if live is not None else None
        try:
            if self.store is not None and staged is not None and live is not None:
                commit_memory(staged, live)  # the actor starts on the restored files at its first call
                staged = None
            restore_reward(self.reward_scheme, saved)
            self.state = saved.state
            self.optimizer.load_state_dict(saved.optimizer)
            self.scheduler.load_state_dict(saved.scheduler)
            set_rng_state(saved.rng)
            if staged is not None and live is not None:
                commit_memory(staged, live)
                staged = None
        finally:
            discard_staged(staged)
        self.resumed_from = checkpoint
        if not self.finished:
            logger.info("Resumed from %s at step %d.", checkpoint, self.state.step)

    def _start_wandb(self) -> None:
        from ..wandb_logger import WandbLogger

        options = self.config.wandb
        id_file = self.output_dir / "wandb_run_id"
        run_id = (
            id_file.read_text(encoding="utf-8").strip() if id_file.is_file() and self.state.step else None
        )
        self.wandb = WandbLogger(
            options.project,
            config=to_dict(self.config),
            name=options.name,
            entity=options.entity,
            mode=options.mode,
            tags=options.tags,
            dir=options.dir or str(self.output_dir),
            job_type="train",
            run_id=run_id,
        )
        id_file.write_text(self.wandb.run_id + "\n", encoding="utf-8")

    # -- one step ------------------------------------------------------------------------------

    def _reasoning(self, episode: Episode) -> float:
        if self.config.algo.tsas_reasoning == "steps":
            return float(episode.info.get("reasoning_steps", 0))
        text = "".join(episode.actions())
        return float(
            sum(len(self.tokenizer(m, add_special_tokens=False)["input_ids"]) for m in _THINK.findall(text))
        )

    def advantages(self, episodes: Sequence[Episode], step: int) -> list[float]:
        """The advantage of each episode, computed group by group."""
        algo = self.config.algo
        out: list[float] = []
        groups: dict[int, list[Episode]] = {}
        for episode in episodes:
            groups.setdefault(episode.group, []).append(episode)
        for group in sorted(groups):
            members = groups[group]
            figures = GroupFigures(
                rewards=tuple(e.reward for e in members),
                searches=tuple(float(e.info.get("num_searches", 0)) for e in members),
                reasoning=tuple(self._reasoning(e) for e in members),
            )
            out.extend(
                group_advantages(
                    algo.advantage,
                    figures,
                    step=step,
                    tsas_warmup_steps=algo.tsas_warmup_steps,
                    tsas_alpha=algo.tsas_alpha,
                    tsas_variant=algo.tsas_variant,
                )
            )
        return out

    def _token_logprobs(
        self, model: Any, episodes: Sequence[Episode], rows: Sequence[int], shared: Sequence[int] | None
    ) -> torch.Tensor:
        """:func:`~.prefix.sequence_logprobs` of the episodes ``rows``: with ``shared``
        (:func:`~.rollout.group_prefix_lengths` of ``episodes``), a group's prompt is encoded once."""
        return sequence_logprobs(
            model,
            [episodes[i].token_ids for i in rows],
            self.tokenizer.pad_token_id,
            self.device,
            self.config.rollout.temperature,
            None if shared is None else [shared[i] for i in rows],
            wanted=[episodes[i].action_mask[1:] for i in rows],  # the loss reads the sampled tokens only
        )

    def _shared_prompts(self, episodes: Sequence[Episode]) -> list[int] | None:
        """Each episode's prompt tokens shared by its group (None with ``share_prefix`` off)."""
        return group_prefix_lengths(episodes) if self.collector.sampling.share_prefix else None

    def _logprobs(self, model: Any, episodes: Sequence[Episode]) -> list[torch.Tensor]:
        """Per-episode token log-probabilities (no gradient), in micro-batches of similar length."""
        out: list[torch.Tensor] = [torch.empty(0)] * len(episodes)
        size = self.config.algo.micro_batch_size
        order = by_length(episodes, range(len(episodes)))
        shared = self._shared_prompts(episodes)
        with torch.no_grad():
            for first in range(0, len(order), size):
                chunk = order[first : first + size]
                lp = self._token_logprobs(model, episodes, chunk, shared)
                for row, i in enumerate(chunk):
                    out[i] = lp[row, : len(episodes[i].token_ids) - 1].cpu()
        return out

    def update(self, episodes: Sequence[Episode], advantages: Sequence[float], step: int) -> dict[str, float]:
        """The optimizer steps of one training step; returns the update's figures."""
        algo, cfg = self.config.algo, self.config
        rng = np.random.default_rng(step_seed(cfg.seed, step) + 1)
        masks = [e.action_mask[1:] for e in episodes]
        ref = self._logprobs(self.ref_model, episodes) if self.ref_model is not None else None
        on_policy = algo.ppo_epochs * algo.mini_batches == 1
        old = None if on_policy else self._logprobs(self.model, episodes)
        shared = self._shared_prompts(episodes)
        norm_length = cfg.rollout.max_new_tokens * self.max_turns
        totals = {
            "loss": 0.0,
            "pg_loss": 0.0,
            "kl_sum": 0.0,
            "clip_sum": 0.0,
            "tokens": 0.0,
            "grad_norm": 0.0,
            "ptx_loss": 0.0,
        }
        updates = 0
        params = [p for p in self.model.parameters() if p.requires_grad]
        for _ in range(algo.ppo_epochs):
            order = rng.permutation(len(episodes)) if algo.mini_batches > 1 else np.arange(len(episodes))
            for chunk in np.array_split(order, algo.mini_batches):
                part = by_length(episodes, (int(i) for i in chunk))  # less padding per micro-batch
                if not part:
                    continue
                weights = token_weights([masks[i] for i in part], algo.resolved_loss_agg, norm_length)
                self.optimizer.zero_grad(set_to_none=True)
                for first in range(0, len(part), algo.micro_batch_size):
                    micro = part[first : first + algo.micro_batch_size]
                    local = weights[first : first + algo.micro_batch_size]
                    self._accumulate(episodes, micro, local, masks, advantages, ref, old, totals, shared)
                if self.ptx is not None:
                    batch = sample_ptx(self.ptx, algo.ptx_batch_size, rng)
                    nll = ptx_nll(self.model, batch, self.tokenizer.pad_token_id, self.device)
                    (algo.ptx_coef * nll).backward()
                    totals["ptx_loss"] += float(nll.detach())
                norm = torch.nn.utils.clip_grad_norm_(
                    params, algo.max_grad_norm if algo.max_grad_norm > 0 else float("inf")
                )
                totals["grad_norm"] += float(norm)
                self.optimizer.step()
                self.scheduler.step()
                updates += 1
        tokens = max(totals["tokens"], 1.0)
        figures = {
            "loss": totals["loss"] / max(updates, 1),
            "pg_loss": totals["pg_loss"] / max(updates, 1),
            "kl": totals["kl_sum"] / tokens,
            "clip_frac": totals["clip_sum"] / tokens,
            "grad_norm": totals["grad_norm"] / max(updates, 1),
            "lr": float(self.scheduler.get_last_lr()[0]),
            "updates": float(updates),
        }
        if self.ptx is not None:
            figures["ptx_loss"] = totals["ptx_loss"] / max(updates, 1)
        return figures

    def _accumulate(
        self,
        episodes: Sequence[Episode],
        micro: list[int],
        weights: list[list[float]],
        masks: list[list[int]],
        advantages: Sequence[float],
        ref: list[torch.Tensor] | None,
        old: list[torch.Tensor] | None,
        totals: dict[str, float],
        shared: Sequence[int] | None = None,
    ) -> None:
        """Forward and backward one micro-batch; add its share of the loss to the gradients."""
        cfg = self.config
        logprobs = self._token_logprobs(self.model, episodes, micro, shared)
        width = logprobs.shape[1]
        w = pad_values(weights, width, self.device)
        mask = pad_values([masks[i] for i in micro], width, self.device)
        adv = torch.tensor([float(advantages[i]) for i in micro], device=self.device)[:, None].expand(
            -1, width
        )
        old_lp = (
            logprobs.detach()
            if old is None
            else pad_values([old[i].tolist() for i in micro], width, self.device)
        )
        ref_lp = None if ref is None else pad_values([ref[i].tolist() for i in micro], width, self.device)
        per_token, parts = clipped_token_loss(
            logprobs, old_lp, adv, clip_eps=cfg.algo.clip_eps, ref_logprobs=ref_lp, kl_coef=cfg.algo.kl_coef
        )
        loss = (per_token * w).sum()
        loss.backward()
        totals["loss"] += float(loss.detach())
        totals["pg_loss"] += float((parts["pg"] * w).sum())
        totals["kl_sum"] += float((parts["kl"] * mask).sum())
        totals["clip_sum"] += float((parts["clipped"] * mask).sum())
        totals["tokens"] += float(mask.sum())

    def train_step(self, step: int) -> dict[str, Any]:
        """Run training step ``step`` (0-based) and return its figures."""
        self.setup()
        if self.finished:
            raise InvalidArgumentError(
                finished_message(self.output_dir, self.resumed_from, self.state.step, self.config.steps)
            )
        cfg = self.config
        start = time.perf_counter()
        questions = question_schedule(self.num_questions, cfg.rollout.questions_per_step, step, cfg.seed)
        with autocast(cfg.model, self.device):
            episodes = self.collector.collect(questions, cfg.rollout.group_size, step_seed(cfg.seed, step))
        rollout_s = time.perf_counter() - start
        advantages = self.advantages(episodes, step)
        with autocast(cfg.model, self.device):
            train = self.update(episodes, advantages, step)
        train["rollout_s"] = rollout_s
        train["update_s"] = time.perf_counter() - start - rollout_s
        update = self.memory.step() if self.memory is not None else None
        bank = getattr(update, "bank", None) if getattr(update, "outcome", None) == "written" else None
        train["step_s"] = time.perf_counter() - start
        train["signal"] = float(np.mean([abs(a) > 1e-12 for a in advantages])) if advantages else 0.0
        warning = self.no_signal.observe(step + 1, advantages, [e.reward for e in episodes])
        if warning is not None:
            logger.warning(warning)
        rollout = rollout_metrics(episodes)
        record = {"step": step + 1, "rollout": rollout, "train": train}
        if update is not None:
            record["memory"] = {"outcome": update.outcome, "version": getattr(bank, "version", None)}
        if self.wandb is not None:
            self.wandb.log_step(step + 1, rollout, train)
            if bank is not None:
                self.wandb.log_experience(bank, step=step + 1)
        self.last_episodes = episodes
        return record

    # -- the loop ------------------------------------------------------------------------------

    def save(self) -> Path:
        """Write a checkpoint of the current state."""
        return save_checkpoint(
            self.output_dir,
            self.state,
            model=self.model,
            tokenizer=self.tokenizer,
            optimizer=self.optimizer,
            scheduler=self.scheduler,
            config_yaml=dump_yaml(self.config, lenient=True),
            reward_scheme=self.reward_scheme,
            memory_dir=self.memory_dir,
        )

    def train(self, steps: int | None = None) -> TrainerState:
        """Train until ``config.steps`` steps are done (or ``steps`` more, if given), checkpointing on the way.

        Returns:
            The final :class:`~.checkpoint.TrainerState` (step and per-step figures).
        """
        self.setup()
        if self.finished:
            return self.state
        cfg = self.config
        end = cfg.steps if steps is None else min(cfg.steps, self.state.step + steps)
        bar = tqdm(
            total=cfg.steps, initial=self.state.step, desc="grpo", unit="step", disable=not self.progress
        )
        try:
            while self.state.step < end:
                record = self.train_step(self.state.step)
                self.state.step += 1
                self.state.history.append(record)
                append_metrics(self.metrics_file, record)
                r, t = record["rollout"], record["train"]
                bar.update(1)
                bar.set_postfix(
                    reward=f"{r['reward']:.3f}", f1=f"{r['f1']:.2f}", st=f"{r['st']:.2f}", kl=f"{t['kl']:.4f}"
                )
                if self.state.step % cfg.log_every == 0:
                    split_sr = (
                        f" (known {r['sr_known']:.2f}, unknown {r['sr_unknown']:.2f})"
                        if "sr_known" in r and "sr_unknown" in r
                        else ""
                    )
                    logger.info(
                        "step %d: reward %.3f f1 %.3f st %.2f sr %.2f%s format %.2f tokens %.1f loss %.4f kl %.5f (%.2f s)",
                        self.state.step,
                        r["reward"],
                        r["f1"],
                        r["st"],
                        r["sr"],
                        split_sr,
                        r["format_ok"],
                        r["action_tokens"],
                        t["loss"],
                        t["kl"],
                        t["step_s"],
                    )
                every = cfg.checkpoint.every
                if (every and self.state.step % every == 0) or self.state.step == cfg.steps:
                    self.save()
                    prune_checkpoints(self.output_dir, cfg.checkpoint.keep_last)
        finally:
            bar.close()
        return self.state

    def close(self) -> None:
        """Close the envs, the stores' connections and the W&B run."""
        if getattr(self, "collector", None) is not None:
            self.collector.close()
        for holder in (
            getattr(self, "memory", None),
            getattr(getattr(self, "reward_scheme", None), "store", None),
        ):
            close_store = getattr(holder, "close", None)
            if callable(close_store):  # the last connection to a SQLite store removes its WAL files
                close_store()
        if self.wandb is not None:
            self.wandb.finish()
            self.wandb = None
        if self.store is not None:  # its files stay; a resume starts it again
            import ray

            if ray.is_initialized():
                try:
                    ray.kill(ray.get_actor(self.store.name, namespace=STORE_NAMESPACE), no_restart=True)
                except ValueError:  # never started
                    pass
            self.store = None


def train(config: TrainConfig, *, progress: bool = True) -> TrainerState:
    """Run a whole GRPO training job from a config; returns the final state."""
    trainer = GRPOTrainer(config, progress=progress)
    try:
        return trainer.train()
    finally:
        trainer.close()


def by_length(episodes: Sequence[Episode], indices: Iterable[int]) -> list[int]:
    """``indices`` sorted by their episode's length, so micro-batches pad little.

    The loss weights are set per mini-batch before it is split, so the gradient does not
    depend on which episodes share a micro-batch; only the padding does.
    """
    return sorted(indices, key=lambda i: len(episodes[i].token_ids))
