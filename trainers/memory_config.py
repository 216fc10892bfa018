"""The ``memory`` section, one for the built-in trainer and the OpenRLHF plugin.

The built-in trainer reads it as ``memory:`` of its config file, the OpenRLHF plugin as
``agent.memory:`` of its run file. Both name the algorithms the same way (``kind``).
"""

from __future__ import annotations

from dataclasses import dataclass

from .config_base import ConfigError, check, check_choice, check_finite, check_int

__all__ = ["MemoryConfig", "MEMORY_KINDS", "MEMORY_BACKENDS"]

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
