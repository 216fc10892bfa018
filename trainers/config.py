"""Configuration of the built-in GRPO trainer: documented dataclasses, checked on load.

A run file (:mod:`searchgym.trainers.run_spec`) with ``backend: builtin`` becomes one
:class:`TrainConfig`: the trainer's resolved settings, which it saves with each checkpoint
(``config.yaml``) and compares on resume. Its ``env`` holds ``gym.make``'s keyword
arguments (``{id, kwargs}``) and its ``algo`` the advantage beside the update.

Every value is checked when the config is built: an unknown key, a wrong type or an
out-of-range value raises :class:`ConfigError` naming the dotted field, the value and
what is allowed. :func:`save_config` and :meth:`TrainConfig.from_dict` round-trip exactly.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, Literal

from ..envs.config import env_keywords
from ..envs.config_base import (
    ConfigError,
    check,
    check_finite,
    check_int,
    from_dict,
    read_sections,
    save_yaml,
    to_dict,
)
from ..envs.rewards import RewardScheme, reward_class
from ..memory.config import MEMORY_BACKENDS, MEMORY_KINDS, MemoryConfig
from .advantages import ESTIMATORS, AdvantageConfig

__all__ = [
    "ConfigError",
    "EnvConfig",
    "TinyModelConfig",
    "ModelConfig",
    "RolloutConfig",
    "AlgoConfig",
    "UpdateConfig",
    "MemoryConfig",
    "CheckpointConfig",
    "WandbConfig",
    "TrainConfig",
    "save_config",
    "ADVANTAGES",
    "LOSS_AGGREGATIONS",
    "MEMORY_BACKENDS",
    "MEMORY_KINDS",
]

ADVANTAGES = tuple(ESTIMATORS)
"""The group-advantage estimators (see :mod:`searchgym.trainers.advantages`)."""

LOSS_AGGREGATIONS = ("auto", "token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm")
"""How per-token losses become one number (see :mod:`searchgym.trainers.grpo.loss`)."""


@dataclass
class EnvConfig:
    """The environment the rollouts run in.

    Attributes:
        id: A registered searchgym env id (``searchgym/SyntheticFacts-v1``, ``searchgym/HotpotQA-v1``, …).
        kwargs: Keyword arguments of ``gym.make`` (``protocol``, ``reward``, ``reward_kwargs``,
            ``topk``, ``max_turns``, ``data_path``, ``corpus_path``, ``retriever``, …). The
            trainer builds the reward scheme once and shares it between all envs, so
            LightSearcher's per-question minimum is shared as the paper requires.
    """

    id: str = "searchgym/SyntheticFacts-v1"
    kwargs: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        import searchgym  # noqa: F401  (registers the ids; cheap, imports no torch)
        from searchgym.envs.registration import ENV_IDS

        short = {i.split("/", 1)[1]: i for i in ENV_IDS}
        if self.id in short:
            self.id = short[self.id]
        check("id", self.id, self.id in ENV_IDS, "one of " + ", ".join(sorted(ENV_IDS)))
        reserved = {"render_mode"} & set(self.kwargs)
        check("kwargs", self.kwargs, not reserved, "gym.make keyword arguments other than render_mode")


@dataclass
class TinyModelConfig:
    """The offline tiny model of :func:`searchgym.policies.tiny.build_tiny_lm` (for CPU runs and tests).

    Attributes:
        dir: Folder where the model is built once and cached by its arguments.
        vocab_size: BPE vocabulary size.
        hidden_size: Hidden size of the Llama-style model (a multiple of 32).
        num_layers: Transformer layers.
        seed: Seed of the initial weights.
    """

    dir: str = "runs/tiny_lm"
    vocab_size: int = 1000
    hidden_size: int = 128
    num_layers: int = 4
    seed: int = 0

    def __post_init__(self) -> None:
        check_int("vocab_size", self.vocab_size, 300, "(a byte-level BPE needs at least its 256 bytes)")
        check(
            "hidden_size",
            self.hidden_size,
            self.hidden_size >= 32 and self.hidden_size % 32 == 0,
            "a multiple of 32, >= 32",
        )
        check_int("num_layers", self.num_layers)
        check_int("seed", self.seed, 0)


@dataclass
class ModelConfig:
    """The policy: any transformers causal LM.

    Give exactly one of ``path`` and ``tiny``.

    Attributes:
        path: A local model directory, a pulled offline model's name (``smollm2-135m-instruct``;
            see ``searchgym models``), or a hub name when the hub is reachable.
        tiny: Build the offline tiny model instead (see :class:`TinyModelConfig`).
        tokenizer: ``"auto"`` loads with ``PreTrainedTokenizerFast`` when the folder was saved
            as one (as the tiny model is) and with ``AutoTokenizer`` otherwise; ``"fast"``
            always uses ``PreTrainedTokenizerFast`` (``AutoTokenizer`` may pick a
            model-specific class that tokenises a saved vocabulary differently).
        dtype: Weights' dtype for training (``float32`` on CPU). ``bfloat16`` trains the
            bf16 weights directly, with no float32 master copy.
        autocast: Mixed precision: ``bfloat16`` runs generation and the
            update's forward and backward passes under ``torch.autocast`` in bfloat16,
            while the weights and the optimizer stay in ``dtype`` (``float32``); ``off`` (the
            default) runs everything in ``dtype``. On CPUs with AMX or AVX-512 BF16,
            ``bfloat16`` makes the update about twice as fast (docs/train-cli.md).
        device: ``"cpu"``, ``"cuda"``, ``"cuda:N"`` or ``"auto"`` (CUDA when available).
        gradient_checkpointing: Trade compute for memory on long contexts.
        train_layers: Train only the top ``train_layers`` transformer blocks and what follows
            them (the final norm, an output layer not tied to the input embeddings); the
            embeddings and the blocks below stay frozen, so the backward pass stops at the
            lowest trained block. 0 (the default) trains every parameter. On SmolLM2-135M the
            update of the top 10 of 30 blocks takes about half the CPU time of a full update
            (``benchmarks/results/train_layers_cpu.json``).
        cpu_threads: Torch threads of a CPU run (ignored on CUDA). 0 (auto): ``OMP_NUM_THREADS``
            when it is set, else 1 for the tiny model (its small matrices gain nothing from more
            threads and lose much to a loaded machine; docs/train-cli.md) and torch's own
            default (one per core) for a ``model.path``.
    """

    path: str | None = None
    tiny: TinyModelConfig | None = None
    tokenizer: Literal["auto", "fast"] = "auto"
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    autocast: Literal["off", "bfloat16"] = "off"
    device: str = "cpu"
    gradient_checkpointing: bool = False
    train_layers: int = 0
    cpu_threads: int = 0

    def __post_init__(self) -> None:
        check_int("cpu_threads", self.cpu_threads, 0, "(0: auto)")
        check_int("train_layers", self.train_layers, 0, "(0: every layer)")
        if isinstance(self.tiny, Mapping):
            self.tiny = from_dict(TinyModelConfig, self.tiny)
        check(
            "path",
            self.path,
            (self.path is None) != (self.tiny is None),
            "a model directory when model.tiny is not set (give exactly one of model.path and model.tiny)",
        )
        ok = self.device in ("cpu", "cuda", "auto") or (
            self.device.startswith("cuda:") and self.device[5:].isdigit()
        )
        check("device", self.device, ok, "'cpu', 'cuda', 'cuda:N' or 'auto'")


@dataclass
class RolloutConfig:
    """How rollouts are generated: G per question, several turns each.

    Attributes:
        group_size: Rollouts per question (G; Light-Search 5, LightSearcher 12, HiExp 8).
        questions_per_step: Questions per training step (the batch is ``questions_per_step × group_size`` episodes).
        max_new_tokens: Tokens the policy may write per turn; generation also stops at the
            protocol's stop strings and at the end-of-sequence token.
        max_context_tokens: Tokens of one episode in all (prompt, actions, observations).
            When the budget runs out the episode's remaining turns are taken as empty
            (malformed) actions, so the env still ends it and scores it.
        temperature: Sampling temperature (1.0 samples from the policy itself).
        top_p: Nucleus sampling threshold (1.0 = off).
        generation_batch_size: Contexts per ``generate`` call.
    """

    group_size: int = 5
    questions_per_step: int = 4
    max_new_tokens: int = 256
    max_context_tokens: int = 4096
    temperature: float = 1.0
    top_p: float = 1.0
    generation_batch_size: int = 64

    def __post_init__(self) -> None:
        check_int("group_size", self.group_size, 2, "GRPO compares the rollouts of one question.")
        check_int("questions_per_step", self.questions_per_step)
        check_int("max_new_tokens", self.max_new_tokens)
        check_int("max_context_tokens", self.max_context_tokens, 2)
        check_finite("temperature", self.temperature, low=1e-6)
        check_finite("top_p", self.top_p, low=1e-6, high=1.0)
        check_int("generation_batch_size", self.generation_batch_size)


@dataclass
class UpdateConfig:
    """The GRPO update (the ``builtin.algo`` section of a run file).

    Attributes:
        clip_eps: PPO clip range ε (0.2).
        kl_coef: β of the k3 KL estimate to the frozen reference model (0 = no reference model).
        loss_agg: How per-token losses are averaged: ``token_mean`` (over all action tokens
            of the batch), ``seq_mean_token_mean`` (GRPO: per sequence, then over sequences),
            ``seq_mean_token_sum_norm`` (Dr. GRPO: token sums over a constant, the
            generation budget ``max_new_tokens × max_turns``); ``auto`` picks Dr. GRPO's for
            the ``dr_grpo`` advantage and GRPO's otherwise.
        lr: AdamW learning rate.
        lr_schedule: ``constant`` or ``cosine`` (to 0 at the last step), after ``warmup_steps`` of linear warm-up.
        warmup_steps: Optimizer steps of linear learning-rate warm-up.
        weight_decay: AdamW weight decay.
        adam_beta1: AdamW β1.
        adam_beta2: AdamW β2.
        adam_eps: AdamW ε.
        max_grad_norm: Gradient-norm clip (0 = off).
        ppo_epochs: Passes over each step's batch.
        mini_batches: Optimizer steps per pass (the batch is split into this many parts);
            with more than one update per step the clipped ratio starts to act.
        micro_batch_size: Sequences per forward/backward (gradient accumulation; does not
            change the result).
        ptx_coef: γ of PPO-ptx (:mod:`searchgym.trainers.grpo.ptx`): the weight of a
            language-model loss on ``ptx_data`` added to every optimizer step (0 = off;
            OpenRLHF's default is 0.05).
        ptx_data: A JSON-lines file of ``{"prompt", "completion"}`` examples to replay; a
            config whose :meth:`TrainConfig.writes_ptx_data` is true may leave it out.
        ptx_batch_size: Examples replayed per optimizer step.
    """

    clip_eps: float = 0.2
    kl_coef: float = 0.001
    loss_agg: Literal["auto", "token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"] = "auto"
    lr: float = 1e-6
    lr_schedule: Literal["constant", "cosine"] = "constant"
    warmup_steps: int = 0
    weight_decay: float = 0.0
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    adam_eps: float = 1e-8
    max_grad_norm: float = 1.0
    ppo_epochs: int = 1
    mini_batches: int = 1
    micro_batch_size: int = 8
    ptx_coef: float = 0.0
    ptx_data: str | None = None
    ptx_batch_size: int = 16

    def __post_init__(self) -> None:
        check(
            "loss_agg",
            self.loss_agg,
            self.loss_agg in LOSS_AGGREGATIONS,
            "one of " + ", ".join(LOSS_AGGREGATIONS),
        )
        check_finite("clip_eps", self.clip_eps, low=0.0, high=1.0)
        check_finite("kl_coef", self.kl_coef, low=0.0)
        check_finite("lr", self.lr, low=0.0)
        check_int("warmup_steps", self.warmup_steps, 0)
        check_finite("weight_decay", self.weight_decay, low=0.0)
        check_finite("adam_beta1", self.adam_beta1, low=0.0, high=0.999999)
        check_finite("adam_beta2", self.adam_beta2, low=0.0, high=0.999999)
        check_finite("adam_eps", self.adam_eps, low=1e-12)
        check_finite("max_grad_norm", self.max_grad_norm, low=0.0)
        check_int("ppo_epochs", self.ppo_epochs)
        check_int("mini_batches", self.mini_batches)
        check_int("micro_batch_size", self.micro_batch_size)
        check_finite("ptx_coef", self.ptx_coef, low=0.0)
        check_int("ptx_batch_size", self.ptx_batch_size)


@dataclass
class AlgoConfig(UpdateConfig):
    """The GRPO update with its group advantage, as the built-in trainer keeps it (a run
    file gives the advantage in its ``advantage`` section, :class:`~searchgym.trainers.advantages.AdvantageConfig`).

    Attributes:
        advantage: The registered estimator (``group_norm``, ``dr_grpo``, ``tsas``).
        tsas_warmup_steps: ``advantage.warmup_steps``.
        tsas_alpha: ``advantage.alpha``.
        tsas_variant: ``advantage.variant``.
        tsas_reasoning: ``advantage.reasoning``.
    """

    advantage: str = "group_norm"
    tsas_warmup_steps: int = 150
    tsas_alpha: float = 0.01
    tsas_variant: Literal["eq4", "eq2"] = "eq4"
    tsas_reasoning: Literal["steps", "tokens"] = "steps"

    def __post_init__(self) -> None:
        super().__post_init__()
        try:
            self.advantage_config()
        except ConfigError as exc:
            raise ConfigError(_ADVANTAGE_FIELDS[exc.field], exc.value, exc.allowed, exc.hint) from None

    def advantage_config(self) -> AdvantageConfig:
        """The ``advantage`` section these fields hold."""
        return AdvantageConfig(
            estimator=self.advantage,
            warmup_steps=self.tsas_warmup_steps,
            alpha=self.tsas_alpha,
            variant=self.tsas_variant,
            reasoning=self.tsas_reasoning,
        )

    @property
    def resolved_loss_agg(self) -> str:
        """``loss_agg`` with ``auto`` replaced by the estimator's own choice."""
        if self.loss_agg != "auto":
            return self.loss_agg
        return ESTIMATORS[self.advantage].loss_agg


_ADVANTAGE_FIELDS = {
    "estimator": "advantage",
    "warmup_steps": "tsas_warmup_steps",
    "alpha": "tsas_alpha",
    "variant": "tsas_variant",
    "reasoning": "tsas_reasoning",
}


@dataclass
class CheckpointConfig:
    """Checkpoints: model, optimizer, scheduler, RNG states, step, reward and memory state.

    Attributes:
        every: Save after every ``every`` steps (0: only at the end). The last step is always saved.
        keep_last: Checkpoints kept on disk (older ones are deleted).
        resume: ``auto`` (continue from the latest checkpoint in ``output_dir`` if there
            is one), ``never`` (start afresh; refuses an ``output_dir`` that holds
            checkpoints), or a checkpoint folder (refused when ``output_dir`` holds newer
            checkpoints, which the run would overwrite).
        allow_changes: Settings (dotted keys such as ``env.kwargs.reward``, or whole
            sections such as ``rollout``) a resume may change besides those that never
            change a run (``steps``, logging, checkpointing, W&B, the device:
            :data:`~searchgym.trainers.grpo.resume_check.MAY_CHANGE`). A resume under any
            other change is refused with the differing keys named.
    """

    every: int = 50
    keep_last: int = 2
    resume: str = "auto"
    allow_changes: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        check_int("every", self.every, 0)
        check_int("keep_last", self.keep_last)
        check("resume", self.resume, bool(self.resume.strip()), "'auto', 'never' or a checkpoint folder")
        check(
            "allow_changes",
            self.allow_changes,
            all(isinstance(key, str) and key.strip() for key in self.allow_changes),
            "a list of dotted config keys, e.g. [env.kwargs.reward]",
        )


@dataclass
class WandbConfig:
    """Weights & Biases logging (``pip install 'searchgym[wandb]'``).

    Attributes:
        enabled: Log this run to W&B.
        project: W&B project.
        entity: W&B entity (team or user); null for the default.
        name: Run name; null lets W&B choose.
        mode: ``online``, ``offline`` or ``disabled``; null follows ``WANDB_MODE``.
        tags: Run tags.
        dir: Folder for W&B's files (default: ``output_dir``).
    """

    enabled: bool = False
    project: str = "searchgym"
    entity: str | None = None
    name: str | None = None
    mode: Literal["online", "offline", "disabled"] | None = None
    tags: list[str] = field(default_factory=list)
    dir: str | None = None


_SECTIONS = {
    "env": EnvConfig,
    "model": ModelConfig,
    "rollout": RolloutConfig,
    "algo": AlgoConfig,
    "memory": MemoryConfig,
    "checkpoint": CheckpointConfig,
    "wandb": WandbConfig,
}


@dataclass
class TrainConfig:
    """Everything a built-in GRPO run needs (one YAML file).

    Attributes:
        backend: The trainer that reads this file: always ``builtin`` here. (``searchgym
            train`` sends files that say ``backend: openrlhf`` to the OpenRLHF plugin.)
        output_dir: Folder of checkpoints, the saved config, the memory store and W&B files.
        steps: Training steps (one step = rollouts for ``questions_per_step`` questions, then the update).
        seed: Seed of the question order, the env resets, sampling and initialisation.
        log_every: Print a line of metrics every this many steps.
        env: See :class:`EnvConfig`.
        model: See :class:`ModelConfig`.
        rollout: See :class:`RolloutConfig`.
        algo: See :class:`AlgoConfig`.
        memory: See :class:`MemoryConfig`.
        checkpoint: See :class:`CheckpointConfig`.
        wandb: See :class:`WandbConfig`.
    """

    backend: Literal["builtin"] = "builtin"
    output_dir: str = "runs/grpo"
    steps: int = 100
    seed: int = 0
    log_every: int = 1
    env: EnvConfig = field(default_factory=EnvConfig)
    model: ModelConfig = field(default_factory=lambda: ModelConfig(tiny=TinyModelConfig()))
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    memory: MemoryConfig = field(default_factory=MemoryConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    wandb: WandbConfig = field(default_factory=WandbConfig)

    def __post_init__(self) -> None:
        read_sections(self, _SECTIONS)
        check(
            "backend",
            self.backend,
            self.backend == "builtin",
            "'builtin'",
            "An OpenRLHF run file goes to searchgym train --backend openrlhf.",
        )
        check("output_dir", self.output_dir, bool(str(self.output_dir).strip()), "a folder path")
        check_int("steps", self.steps)
        check_int("seed", self.seed, 0)
        check_int("log_every", self.log_every)
        if self.memory.backend == "ray":
            self._check_ray_backend()
        if self.algo.ptx_coef > 0 and self.algo.ptx_data is None and not self.writes_ptx_data():
            raise ConfigError(
                "algo.ptx_data",
                None,
                "a JSON-lines file of prompt/completion examples",
                "algo.ptx_coef > 0 replays examples; only a run that writes its own may leave it out.",
            )

    def writes_ptx_data(self) -> bool:
        """Whether the run writes ``algo.ptx_data`` itself before training (a subclass's warm start)."""
        return False

    def extra_envs(self) -> dict[str, EnvConfig]:
        """Other envs the run builds besides ``env`` (a subclass's evaluation env), by field
        name; ``--dry-run`` builds each of them too."""
        return {}

    def _check_ray_backend(self) -> None:
        shared_store = self.shared_store_keyword()
        if self.memory.kind != "none" and not self.memory.learns:
            raise ConfigError(
                "memory.backend",
                "ray",
                f"'file' for memory.kind {self.memory.kind!r}",
                "That memory is read-only and loaded in this process; no actor serves it.",
            )
        if self.memory.kind == "none" and shared_store is None:
            raise ConfigError(
                "memory.backend",
                "ray",
                "'file' when the run keeps no store",
                "The actor serves a memory that learns and a reward scheme's shared store.",
            )
        store = dict(self.env.kwargs.get("reward_kwargs") or {}).get(shared_store) if shared_store else None
        if shared_store and not (store is None or isinstance(store, (str, os.PathLike))):
            raise ConfigError(
                f"env.kwargs.reward_kwargs.{shared_store}",
                store,
                "a log file path or null with memory.backend 'ray'",
                "The actor opens the reward's store from its path.",
            )

    def shared_store_keyword(self) -> str | None:
        """The reward scheme's shared-store keyword (:attr:`RewardScheme.shared_store`), or None."""
        reward = self.env.kwargs.get("reward")
        if isinstance(reward, RewardScheme):
            return type(reward).shared_store
        if reward is None:
            reward = (env_keywords(self.env.id) or {})["reward"].default
        return reward_class(reward).shared_store

    def to_dict(self) -> dict[str, Any]:
        """The config as plain data; ``TrainConfig.from_dict`` reads it back to an equal config."""
        return to_dict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> TrainConfig:
        """Build and check a config from plain data (unknown keys are errors)."""
        return from_dict(cls, data)

    def replace(self, **changes: Any) -> TrainConfig:
        """A checked copy with top-level fields replaced (sections may be given as mappings)."""
        data = {f.name: getattr(self, f.name) for f in fields(self)}
        data.update(changes)
        return from_dict(
            type(self), {k: to_dict(v) if hasattr(v, "__dataclass_fields__") else v for k, v in data.items()}
        )


def save_config(config: TrainConfig, path: str | os.PathLike[str]) -> str:
    """Write ``config`` as YAML (atomically); :func:`load_config` reads back an equal config."""
    return str(save_yaml(config, path))
