"""The tiny-LM study's run config: a library :class:`TrainConfig` plus the warm start's ``sft`` section."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from searchgym.envs.config_base import (
    check,
    check_finite,
    check_int,
    from_dict,
    load_yaml,
    read_sections,
)
from searchgym.trainers.config import EnvConfig, TrainConfig

__all__ = ["SFTConfig", "EvalConfig", "StudyRunConfig", "load_run_config"]


@dataclass
class SFTConfig:
    """Supervised warm start before GRPO (:mod:`tiny_lm.sft`).

    Needs a SyntheticFacts env. Two stages: short copying lessons on worlds of their own
    (``reading_worlds``, shared by every seed), then the protocol stage: the study world's
    known facts (short question-answer lessons and episodes in the protocol's format) mixed
    with scripted demonstrations on shadow worlds and rehearsed reading lessons
    (``replay_worlds``). GRPO starts from the result.

    Attributes:
        enabled: Run the warm start (cached: a second run with the same settings reuses it).
        dir: Cache folder of warm-started models.
        recall_repeats: How often each phrasing of each known fact is shown as a short
            ``Question: … Answer: <name>`` lesson (an int). The knob for how well known
            facts are memorised: on the study world (with the study's other settings), 40
            gives 72% correct direct answers and 80 gives 85%.
        fact_repeats: How often each phrasing of each known fact is shown as an episode in
            the protocol's format, searching or answering by a coin flip (a float: 2.5 shows
            it 2 or 3 times). Carries the memorised facts over to the protocol's format.
        chain_repeats: How often each two-hop chain of two known facts is shown as an
            episode, per phrasing of its question, split over ``protocols`` as
            ``fact_repeats`` is; the held-out questions' chains are never shown. With
            ``recall_think`` the recollection asks and answers each hop as a recall lesson
            (``Question: Who founded X? Answer: Y. Question: Where was Y born? Answer: Z.``),
            so a known two-hop question can be answered without a search (``sem`` episodes
            keep their own layout). 0 (default) shows only the world's two-hop training
            questions, once each, recalling the answer alone. Measured on seed 0: 3 of 6
            held-out chains right after RL, none of them left unsearched.
        passages: Also show each known fact's passage as plain text, once per episode of
            the first protocol (off by default: measured, it does not help the model answer).
        search_prob: Share of demonstrations that search, whatever the fact's known flag.
        shadow_worlds: Worlds of other seeds whose questions give the demonstrations of
            facts the model does not know; each question is shown once, so the model learns
            to copy names instead of memorising them.
        shadow_search_prob: Share of shadow demonstrations that search (default:
            ``search_prob``). A direct answer on a shadow world is a name the model cannot
            know, so these teach it to make names up in the protocol's format.
        recall_think: Demonstrations open with the model's recollection,
            ``<think>Recall: <answer>.</think>`` for known facts and ``Recall: unknown.``
            for others, and direct answers to unknown facts say ``unknown``; ``sem``'s first
            answer is the recollection, after one thought shared by both branches
            (:func:`~tiny_lm.demos.write_demo_actions`). The choice to
            search stays a coin flip, so RL can learn to act on what the model recalls.
            Off by default.
        recall_form: How a ``recall_think`` recollection of one fact is written:
            ``"recall"`` (default), ``Recall: <answer>.``; ``"question"``, the question
            restated as asked and answered as a recall lesson is, ``Question: <question>
            Answer: <answer>.`` (``Answer: unknown.`` for facts the model was not shown),
            so the recollection runs through the same words as the lessons that store the
            facts. About 12 tokens longer: give the rollouts 48 new tokens. ``sem``
            episodes keep their own layout.
        memory_share: Share of the protocol-stage episodes (known facts and shadow worlds
            alike) written behind an :class:`~searchgym.memory.ExperienceWrapper`, so that
            their prompts hold an experience bank and a few-shot example as the memory arms'
            do (:mod:`tiny_lm.memory_demos`); 0 (default) writes none.
        protocols: Protocols to write episodes in (e.g. ``[search_r1, sem]`` for one warm
            start shared by arms of both). Known-fact episodes are split evenly over them
            and shadow worlds take them in turn, so more protocols cost no more time.
        instructions: Prompt instructions per protocol for the demonstrations (default:
            ``env.kwargs.instructions`` for the env's own protocol, the protocol's own text
            for the others).
        reading_worlds: Worlds of their own for the first stage of copying lessons: copy a
            question's subject into a query (every world) and an answer out of a passage
            (every second world); 0 skips it. See
            :func:`tiny_lm.sft.reading_lessons`.
        reading_epochs: Passes over the reading lessons.
        replay_worlds: Reading worlds whose lessons the protocol stage rehearses, so that
            copying survives it (measured: 0 loses it, 30 keeps it; module docs).
        recall_target: Memorise the known facts to this level instead of a fixed lesson
            count: after the protocol stage, while the mean share of right sampled direct
            answers per known training fact (:func:`~tiny_lm.evaluation.recall_by_fact`,
            ``topup_samples`` at the rollouts' temperature) is below it, train one more
            slice of the protocol stage's own examples, less its recall lessons
            (:mod:`tiny_lm.topup`). 0 (default) turns it off.
        memory_recall_target: For runs with ``memory.kind: lightsearcher``, then top the warm
            start up again until the same recall, measured behind the warm start's scripted
            experience memory (the memory arms' prompt layout), reaches this level; each
            round trains ``memory_topup_share`` of the protocol stage's examples (less its
            recall lessons) with every episode written behind that memory. 0 (default)
            turns it off.
        memory_topup_share: Share of those examples per round (they are about five times
            longer than the plain ones: 0.1 trains about 1.5M tokens on the study's world).
        memory_topup_two_hop: Copies of each two-hop episode among those examples (1: the
            stage's own mix, where about 10% of them are two-hop episodes). Each round
            still trains ``memory_topup_share`` of the stage's count, so more copies mean
            more two-hop episodes and fewer one-hop ones per round.
        topup_rounds: Most top-up rounds.
        topup_share: Share of those examples trained in each round.
        topup_samples: Sampled answers per question when measuring recall.
        epochs: Passes over the protocol stage.
        lr: Peak AdamW learning rate (short warm-up, cosine decay), for both stages.
        batch_size: Examples per optimizer step.
    """

    enabled: bool = False
    dir: str = "runs/sft"
    recall_repeats: int = 0
    fact_repeats: float = 3.0
    chain_repeats: float = 0.0
    passages: bool = False
    search_prob: float = 0.5
    shadow_worlds: int = 2
    shadow_search_prob: float | None = None
    memory_share: float = 0.0
    recall_think: bool = False
    recall_form: Literal["recall", "question"] = "recall"
    protocols: list[str] = field(default_factory=lambda: ["search_r1"])
    instructions: dict[str, str] = field(default_factory=dict)
    reading_worlds: int = 0
    reading_epochs: int = 1
    replay_worlds: int = 0
    recall_target: float = 0.0
    memory_recall_target: float = 0.0
    memory_topup_share: float = 0.1
    memory_topup_two_hop: int = 1
    topup_rounds: int = 6
    topup_share: float = 0.3
    topup_samples: int = 4
    epochs: int = 1
    lr: float = 3e-3
    batch_size: int = 32

    def __post_init__(self) -> None:
        check_int("recall_repeats", self.recall_repeats, 0)
        check_finite("fact_repeats", self.fact_repeats, low=0.0)
        check_finite("chain_repeats", self.chain_repeats, low=0.0)
        check("passages", self.passages, isinstance(self.passages, bool), "true or false")
        check_finite("search_prob", self.search_prob, low=0.0, high=1.0)
        check_int("shadow_worlds", self.shadow_worlds, 0)
        if self.shadow_search_prob is not None:
            check_finite("shadow_search_prob", self.shadow_search_prob, low=0.0, high=1.0)
        check_finite("memory_share", self.memory_share, low=0.0, high=1.0)
        check("recall_think", self.recall_think, isinstance(self.recall_think, bool), "true or false")
        check(
            "recall_form",
            self.recall_form,
            self.recall_form == "recall" or self.recall_think,
            "'recall' unless recall_think is true",
            "recall_form shapes the recollection of recall_think demonstrations: set recall_think: true.",
        )
        check("protocols", self.protocols, bool(self.protocols), "a non-empty list of protocol names")
        check_int("reading_worlds", self.reading_worlds, 0)
        check_int("reading_epochs", self.reading_epochs)
        check_int("replay_worlds", self.replay_worlds, 0)
        check_int("epochs", self.epochs)
        check_finite("recall_target", self.recall_target, low=0.0, high=1.0)
        check_finite("memory_recall_target", self.memory_recall_target, low=0.0, high=1.0)
        check_int("memory_topup_two_hop", self.memory_topup_two_hop)
        check_int("topup_rounds", self.topup_rounds, 0)
        for name in ("topup_share", "memory_topup_share"):
            share = getattr(self, name)
            check(name, share, math.isfinite(share) and 0 < share <= 1, "a finite number > 0 and <= 1")
        check_int("topup_samples", self.topup_samples)
        check_finite("lr", self.lr, low=0.0)
        check_int("batch_size", self.batch_size)

    @property
    def asks_question(self) -> bool:
        """Whether a one-fact recollection restates the question (``recall_form: question``)."""
        return self.recall_form == "question"

    @property
    def asks_hops(self) -> bool:
        """Whether a known chain's recollection asks each hop (``chain_repeats`` > 0)."""
        return self.chain_repeats > 0


@dataclass
class EvalConfig:
    """Evaluation after training, on held-out questions (the study's ``train.py`` prints the table).

    Attributes:
        enabled: Evaluate the trained policy when training ends.
        env_kwargs: Changes to ``env.kwargs`` for the evaluation env (e.g. ``{split: eval}``).
        max_questions: Evaluate at most this many questions (0: all of them).
        temperature: Sampling temperature (0: greedy decoding).
    """

    enabled: bool = False
    env_kwargs: dict[str, Any] = field(default_factory=lambda: {"split": "eval"})
    max_questions: int = 0
    temperature: float = 0.0

    def __post_init__(self) -> None:
        check_int("max_questions", self.max_questions, 0)
        check_finite("temperature", self.temperature, low=0.0)


@dataclass
class StudyRunConfig(TrainConfig):
    """One run of the study: a :class:`TrainConfig` with a supervised warm start and an
    evaluation after training.

    Attributes:
        sft: See :class:`SFTConfig` (off by default).
        eval: See :class:`EvalConfig` (off by default).
    """

    sft: SFTConfig = field(default_factory=SFTConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)

    def __post_init__(self) -> None:
        read_sections(self, {"sft": SFTConfig, "eval": EvalConfig})
        super().__post_init__()

    def extra_envs(self) -> dict[str, EnvConfig]:
        """With ``eval.enabled``, the evaluation env (``env.kwargs`` updated by ``eval.env_kwargs``)."""
        if not self.eval.enabled:
            return {}
        return {
            "eval.env_kwargs": EnvConfig(id=self.env.id, kwargs={**self.env.kwargs, **self.eval.env_kwargs})
        }

    def writes_ptx_data(self) -> bool:
        """With ``sft.enabled`` and no ``algo.ptx_data``, the run replays its warm start's recall lessons."""
        return self.sft.enabled

    def replace(self, **changes: Any) -> StudyRunConfig:
        replaced = super().replace(**changes)
        assert isinstance(replaced, StudyRunConfig)
        return replaced

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> StudyRunConfig:
        return from_dict(cls, data)


def load_run_config(path: str | os.PathLike[str]) -> StudyRunConfig:
    """Read and check a :class:`StudyRunConfig` from a YAML file (a run's ``config.yaml`` too)."""
    return load_yaml(StudyRunConfig, path)
