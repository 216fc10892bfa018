"""The ``memory`` section of a run file, and how every backend builds what it configures.

Every backend (the built-in trainer, the OpenRLHF plugin, ``--dry-run``) reads the same
``memory:`` section and builds the memory with :meth:`MemoryConfig.build` and the env
wrapper with :meth:`MemoryConfig.wrap`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..envs.config_base import ConfigError, check, check_choice, check_finite, check_int

__all__ = ["MemoryConfig", "MEMORY_KINDS", "MEMORY_BACKENDS"]

_LEARNING_KINDS = ("lightsearcher",)

MEMORY_KINDS = ("none", "lightsearcher", "hiexp")
"""``none``, LightSearcher's contrastive bank, or a HiExp hierarchy (see :class:`MemoryConfig`)."""

MEMORY_BACKENDS = ("file", "ray")
"""Where the run's stores live (see :class:`MemoryConfig`)."""

_RENAMED_KINDS = {"experience": "lightsearcher"}


@dataclass
class MemoryConfig:
    """Experience memory in front of the policy (the memory wrapper), or none.

    Attributes:
        kind: ``none``, ``lightsearcher`` (LightSearcher's contrastive bank, updated during
            training, :class:`~searchgym.memory.ExperienceMemory`) or ``hiexp`` (a HiExp
            hierarchy built offline and read-only,
            :class:`~searchgym.memory.HierarchicalExperience`).
        path: ``lightsearcher``: the store folder (built-in trainer: default
            ``{output_dir}/memory``; OpenRLHF: required, the folder every agent instance and
            the trainer share); ``hiexp``: the folder or ``hiexp_levels.jsonl`` file to load
            (required).
        update_every: Training steps between bank updates (LightSearcher: 5).
        summarizer: ``rule``, ``transformers:PATH`` or ``openai:MODEL@URL``.
        theta_r: Bad trajectories have reward below it; the few-shot pool at or above it (0.3).
        good_reward: Good trajectories have reward at or above it (1.0).
        use_experience: Put the experience text (and HiExp's strategies and hints) in the prompt.
        few_shot: Put one earlier episode in the prompt as an example.
        example_per: Built-in trainer: ``rollout`` (each rollout draws its own example) or
            ``group`` (the G rollouts of a question in a GRPO step share one draw, so the
            group's baseline compares answers to one prompt, as GRPO assumes).
        top_k: HiExp strategy records in the prompt (5).
        hint_threshold: HiExp hint cosine threshold (0.8).
        backend: Built-in trainer: where the experience memory and LightSearcher's minimum
            tool-call store (``env.kwargs.reward_kwargs.store``) live: ``file`` (default:
            SQLite files this machine's processes open) or ``ray`` (a named Ray actor
            owns them, :mod:`searchgym.trainers.ray_store`; the trainer starts Ray when
            needed). An OpenRLHF run chooses its store actor itself.
        ray_num_cpus: ``backend: ray``: CPUs of the local Ray instance the trainer starts
            (``null``: Ray's default, all of them); unused when Ray already runs.
        ray_actor: ``backend: ray``: the store actor's name (``null``: one derived from
            ``output_dir``, so a resumed run finds its actor).
    """

    kind: str = "none"
    path: str | None = None
    update_every: int = 5
    summarizer: str = "rule"
    theta_r: float = 0.3
    good_reward: float = 1.0
    use_experience: bool = True
    few_shot: bool = True
    example_per: str = "rollout"
    top_k: int = 5
    hint_threshold: float = 0.8
    backend: str = "file"
    ray_num_cpus: int | None = None
    ray_actor: str | None = None

    def __post_init__(self) -> None:
        new = _RENAMED_KINDS.get(self.kind)
        if new is not None:
            raise ConfigError(
                "kind",
                self.kind,
                "one of " + ", ".join(repr(k) for k in MEMORY_KINDS),
                f"Did you mean {new!r}? The kind {self.kind!r} is called {new!r}.",
            )
        check_choice("kind", self.kind, MEMORY_KINDS)
        check_choice("backend", self.backend, MEMORY_BACKENDS)
        check_choice("example_per", self.example_per, ("rollout", "group"))
        if self.ray_num_cpus is not None:
            check_int("ray_num_cpus", self.ray_num_cpus)
        if self.ray_actor is not None:
            check("ray_actor", self.ray_actor, bool(self.ray_actor.strip()), "a non-empty actor name or null")
        if self.path is not None:
            check("path", self.path, bool(self.path.strip()), "a folder or file path, or null")
        if self.kind == "hiexp":
            check(
                "path", self.path, self.path is not None, "the HiExp store folder or hiexp_levels.jsonl file"
            )
        check_int("update_every", self.update_every)
        check(
            "summarizer",
            self.summarizer,
            bool(self.summarizer.strip()),
            "'rule', 'transformers:PATH' or 'openai:MODEL@URL'",
        )
        check_finite("theta_r", self.theta_r)
        check_finite("good_reward", self.good_reward)
        check_int("top_k", self.top_k)
        check_finite("hint_threshold", self.hint_threshold, low=-1.0, high=1.0)

    @property
    def learns(self) -> bool:
        """Whether the memory is written during training (its store is shared by every
        process of the run and follows the checkpoints); a HiExp hierarchy is read-only."""
        return self.kind in _LEARNING_KINDS

    def store_dir(self, output_dir: str | os.PathLike[str] | None = None) -> Path | None:
        """The store folder a learning memory writes: ``path``, else ``{output_dir}/memory``;
        ``None`` for a memory that writes none."""
        if not self.learns:
            return None
        if self.path:
            return Path(self.path)
        if output_dir is None:
            raise ConfigError("path", None, "the store folder of the memory (no output_dir to put it in)")
        return Path(output_dir) / "memory"

    def memory_kwargs(self, seed: int | None = None) -> dict[str, Any]:
        """The keyword arguments of :class:`~searchgym.memory.ExperienceMemory` besides its folder."""
        kwargs: dict[str, Any] = {
            "update_every": self.update_every,
            "summarizer": self.summarizer,
            "theta_r": self.theta_r,
            "good_reward": self.good_reward,
        }
        if seed is not None:
            kwargs["seed"] = seed
        return kwargs

    def build(
        self,
        *,
        output_dir: str | os.PathLike[str] | None = None,
        seed: int | None = None,
        remote: Any = None,
        store_dir: str | os.PathLike[str] | None = None,
    ) -> Any:
        """The configured memory, or ``None`` for ``kind: none``.

        Args:
            output_dir: The run's folder (a learning memory without ``path`` keeps its store there).
            seed: Seed of the memory's few-shot draws.
            remote: A memory served elsewhere (a Ray store actor's
                :class:`~searchgym.trainers.ray_store.RemoteMemory`), used as it is for a
                learning memory.
            store_dir: Open the learning memory's store here instead (``--dry-run`` uses a
                temporary folder).

        Raises:
            DataFileError: a HiExp store that does not exist.
        """
        if self.kind == "none":
            return None
        if self.learns:
            if remote is not None:
                return remote
            from .lightsearcher.experience import ExperienceMemory

            folder = store_dir if store_dir is not None else self.store_dir(output_dir)
            return ExperienceMemory(folder, **self.memory_kwargs(seed))
        from ..error import DataFileError
        from .hiexp.hierarchical import HierarchicalExperience

        if not Path(str(self.path)).exists():
            raise DataFileError(
                f"memory.path: {self.path!r} does not exist (the HiExp store folder or its hiexp_levels.jsonl)."
            )
        return HierarchicalExperience.load(str(self.path))

    def wrap(self, env: Any, memory: Any, *, record: bool = True, seed: int | None = None) -> Any:
        """``env`` behind the :class:`~searchgym.memory.ExperienceWrapper` of ``memory`` with
        this section's prompt options; ``record=False`` never writes into the store."""
        from .wrapper import ExperienceWrapper

        return ExperienceWrapper(
            env,
            memory,
            use_experience=self.use_experience,
            few_shot=self.few_shot,
            record=record,
            top_k=self.top_k,
            hint_threshold=self.hint_threshold,
            seed=seed,
        )
